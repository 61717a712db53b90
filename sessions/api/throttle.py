"""Each tenant's API requests are paced: AIRLOCK_API_RATE_PER_TENANT a second on average, in
bursts of twice that (docs/architecture.md, "Admission"). A request past its tenant's rate waits
for its turn, which costs the server nothing, up to MAX_WAIT_S; one that would wait longer is
answered 429 at once, before any of the request's work. So a tenant that floods the API delays
only itself, and what it costs the server is bounded whatever it sends.

Who a request is from comes from its bearer token (an API key, or a session token: whose it is
never changes), looked up once and remembered by the token's hash, the last _MAX_TOKENS of them.
The lookup itself is paced in the bucket of tokenless requests, so a flood of made-up tokens
costs lookups at that rate only; a request with no token, or one this deployment did not issue,
is paced in that bucket too. The view still authenticates every request: this only decides when
it may run."""

import asyncio
import collections
import hashlib
import json

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from controlplane import security
from controlplane.api.auth import key_tenant_id
from controlplane.api.handler import TENANT
from sessions.models import TOKEN_PREFIX
from sessions.rate import Rate
from sessions.selectors import session_by_token

MAX_WAIT_S = 2.0
ANONYMOUS = 0  # the bucket of requests without a token of this deployment
_MAX_TOKENS = 10_000


def _tenant_of(token: str) -> int:
    close_old_connections()  # this thread's connection follows CONN_MAX_AGE like a request's
    if token.startswith(TOKEN_PREFIX):
        session = session_by_token(token)
        return session.tenant_id if session is not None else ANONYMOUS
    return key_tenant_id(token) or ANONYMOUS


class TenantThrottle:
    """ASGI middleware in front of the agent API."""

    def __init__(self, app):
        self.app = app
        self.rates: dict[int, Rate] = {}
        self.tenants: collections.OrderedDict[str, int] = collections.OrderedDict()  # token hash -> tenant

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            tenant = await self._tenant(scope)
            if tenant is None:
                return await _too_many(scope, send, self._rate(ANONYMOUS).per_s)
            rate = self._rate(tenant)
            wait = rate.take(max_wait=MAX_WAIT_S)
            if wait is None:
                return await _too_many(scope, send, rate.per_s)
            if wait:
                await asyncio.sleep(wait)
            scope = {**scope, TENANT: tenant}  # the handler shares its threads out by tenant
        return await self.app(scope, receive, send)

    async def _tenant(self, scope) -> int | None:
        """The request's tenant (ANONYMOUS when it has none), or None when finding out would
        exceed the tokenless bucket's pace."""
        token = _bearer(scope)
        if not token:
            return ANONYMOUS
        digest = hashlib.sha256(token.encode("latin-1")).hexdigest()
        known = self.tenants.get(digest)
        if known is not None:
            self.tenants.move_to_end(digest)
            return known
        wait = self._rate(ANONYMOUS).take(max_wait=MAX_WAIT_S)  # a lookup costs: paced like a tokenless call
        if wait is None:
            return None
        if wait:
            await asyncio.sleep(wait)
        try:
            tenant = await sync_to_async(_tenant_of, thread_sensitive=False)(token)
        except DatabaseError:  # the database is away: paced as tokenless; the view answers for it
            return ANONYMOUS
        self.tenants[digest] = tenant
        self.tenants.move_to_end(digest)
        while len(self.tenants) > _MAX_TOKENS:
            self.tenants.popitem(last=False)
        return tenant

    def _rate(self, tenant: int) -> Rate:
        per_s = settings.AIRLOCK_API_RATE_PER_TENANT
        rate = self.rates.get(tenant)
        if rate is None or rate.per_s != per_s:
            rate = self.rates[tenant] = Rate(per_s, 2 * per_s)
        return rate


def _bearer(scope) -> str:
    """The token as the views read it (DRF splits the header on any whitespace)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            parts = value.decode("latin-1").split()
            return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""
    return ""


async def _too_many(scope, send, per_s: float) -> None:
    body = json.dumps({"error": "too_many_requests", "detail": f"these requests arrive faster than the {per_s:g} a "
                       "second their tenant may send (AIRLOCK_API_RATE_PER_TENANT), even after waiting "
                       f"{MAX_WAIT_S:g} s for a turn; slow down, or ask the operator to raise it"}).encode()
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1"),
               (b"content-length", str(len(body)).encode()), *security.raw_headers(scope)]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
