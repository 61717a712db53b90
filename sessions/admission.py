"""How much of the server one tenant may hold at once (docs/architecture.md, "Admission").

A call that waits for a runner (a session's sandbox being made or destroyed, a command with
`wait`, a workspace file) holds one of the server's AIRLOCK_API_THREADS threads for as long as
it waits. One tenant may hold at most AIRLOCK_API_WAITING_PER_TENANT of them: one more is
answered 429 at once, and its thread is free again, so no tenant can take the whole pool and
stall every other tenant's calls. The count is this process's, as the pool is."""

import contextlib
import threading
from collections import Counter

from django.conf import settings


class Refused(Exception):
    """A call refused for the tenant's load, with its API error code, message and HTTP status."""

    decision = None

    def __init__(self, code: str, detail: str, status: int = 429):
        super().__init__(detail)
        self.code, self.detail, self.status = code, detail, status


_lock = threading.Lock()
_waiting: Counter = Counter()


@contextlib.contextmanager
def waiting_call(tenant):
    """Hold one of the tenant's waiting calls while the block runs, or raise Refused."""
    limit = settings.AIRLOCK_API_WAITING_PER_TENANT
    with _lock:
        if _waiting[tenant.pk] >= limit:
            raise Refused("too_many_waiting_calls",
                          f"tenant {tenant.slug} already has {limit} calls waiting for a runner, the most one tenant "
                          "may hold (AIRLOCK_API_WAITING_PER_TENANT); wait for one to end, or send commands without "
                          "`wait` and follow them on the session's WebSocket")
        _waiting[tenant.pk] += 1
    try:
        yield
    finally:
        with _lock:
            _waiting[tenant.pk] -= 1
            if not _waiting[tenant.pk]:
                del _waiting[tenant.pk]
