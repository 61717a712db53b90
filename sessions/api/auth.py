"""The session token: `Authorization: Bearer ast_…`, the narrow identity of one session (S11).
It reaches that session only, and only while it is active: ending, killing or expiring the
session revokes it."""

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from controlplane.api.auth import ApiPrincipal
from sessions.lifecycle import PAST_TTL, not_live
from sessions.models import TOKEN_PREFIX, Session
from sessions.selectors import session_by_token, session_get


class SessionPrincipal:
    is_authenticated = True
    is_anonymous = False

    def __init__(self, session: Session):
        self.session = session
        self.tenant = session.tenant
        self.scopes = frozenset()

    def __str__(self) -> str:
        return f"session:{self.session.pk}"


class SessionTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if len(header) != 2 or header[0].lower() != b"bearer" or not header[1].startswith(TOKEN_PREFIX.encode()):
            return None  # not a session token: the API key authentication has its turn
        session = session_by_token(header[1].decode("latin-1"))
        if session is None:
            raise exceptions.AuthenticationFailed("the session token is not valid", code="invalid_token")
        why = not_live(session.state, session.expires_at, creating=True)
        if why == PAST_TTL:
            raise exceptions.AuthenticationFailed("the session's time to live ran out", code="session_ended")
        if why is not None:
            raise exceptions.AuthenticationFailed(
                f"the session token was revoked when the session became {why}", code="session_ended")
        return SessionPrincipal(session), f"session:{session.pk}"

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="airlock"'


def session_for(request, session_id) -> Session:
    """The session a request may reach: a session token's own session, or a session of the API
    key's tenant (with the `sessions` scope). Everything else is 403 or 404."""
    principal = request.user
    if isinstance(principal, SessionPrincipal):
        if str(principal.session.pk) != str(session_id):
            raise exceptions.PermissionDenied("a session token is valid only for its own session", code="wrong_session")
        return principal.session
    if isinstance(principal, ApiPrincipal) and "sessions" in principal.scopes:
        return session_get(principal.tenant, session_id)
    raise exceptions.PermissionDenied("the API key lacks the scope 'sessions'", code="permission_denied")
