"""`Authorization: Bearer alk_<prefix>_<secret>` for the agent-facing API.

A failed authentication says which way it failed (missing, malformed, unknown, revoked, expired)
in a 401 JSON body; the secret itself never reaches a log or an error."""

from django.conf import settings
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from controlplane.models import ApiKey
from controlplane.selectors import api_key_by_prefix
from controlplane.services import api_key_touch


class ApiKeyFailed(exceptions.AuthenticationFailed):
    def __init__(self, code: str, detail: str):
        super().__init__(detail=detail, code=code)


class ApiPrincipal:
    """The authenticated caller of an API request: a tenant's key, with its scopes."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, api_key: ApiKey):
        self.api_key = api_key
        self.tenant = api_key.tenant
        self.scopes = frozenset(api_key.scopes)

    def __str__(self) -> str:
        return f"apikey:{ApiKey.PREFIX}{self.api_key.prefix}"


class ApiKeyAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header:
            return None
        if header[0].lower() != self.keyword or len(header) != 2:
            raise ApiKeyFailed("malformed_credentials", "use the header 'Authorization: Bearer <key>'")
        api_key = api_key_for(header[1].decode("latin-1"))
        return ApiPrincipal(api_key), api_key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="airlock"'


def api_key_for(token: str) -> ApiKey:
    """The live key a token is, or ApiKeyFailed saying why not (an API request's, or a session
    stream's: sessions/consumers.py)."""
    prefix, secret = _split_key(token)
    api_key = api_key_by_prefix(prefix) if prefix else None
    if api_key is None or not api_key.secret_matches(secret):
        raise ApiKeyFailed("invalid_key", "the API key is not valid")
    now = timezone.now()
    state = api_key.state_at(now)
    if state == "revoked":
        raise ApiKeyFailed("revoked_key", "the API key was revoked; ask a tenant admin for a new one")
    if state == "expired":
        raise ApiKeyFailed("expired_key", "the API key expired; ask a tenant admin for a new one")
    api_key_touch(api_key=api_key, now=now, interval_s=settings.AIRLOCK_KEY_TOUCH_INTERVAL_S)
    return api_key


def _split_key(token: str) -> tuple[str, str]:
    if not token.startswith(ApiKey.PREFIX):
        return "", ""
    prefix, _, secret = token[len(ApiKey.PREFIX):].partition("_")
    return (prefix, secret) if prefix and secret else ("", "")


def key_tenant_id(token: str) -> int | None:
    """The tenant of a genuine API key (revoked and expired ones too), or None: who a request
    is from, for pacing it, before its view authenticates it (sessions/api/throttle.py)."""
    prefix, secret = _split_key(token)
    api_key = api_key_by_prefix(prefix) if prefix else None
    return api_key.tenant_id if api_key is not None and api_key.secret_matches(secret) else None
