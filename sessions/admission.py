"""How much one tenant may hold at once, and one runner (docs/architecture.md, "Admission").

- Waiting calls. A call that waits for a runner (a session's sandbox being made or destroyed, a
  command with `wait`, a workspace file) holds one of the server's AIRLOCK_API_THREADS threads
  for as long as it waits. One tenant may hold at most AIRLOCK_API_WAITING_PER_TENANT of them:
  one more is answered 429 at once, and its thread is free again, so no tenant can take the
  whole pool and stall every other tenant's calls. The count is this process's, as the pool is.
  Reading a snapshot or artifact whole (download, verify) also holds one of the tenant's
  AIRLOCK_BLOB_READS_PER_TENANT: that work is the host's CPU, not a thread's wait.
- Sessions and commands. A tenant has at most AIRLOCK_MAX_SESSIONS_PER_TENANT active sessions
  and AIRLOCK_MAX_COMMANDS_PER_TENANT commands queued or running; one more is refused 429, and
  the refusal is recorded like a denial (reason `tenant_limit`), naming the limit. Counted in
  the database, under the tenant's row lock: every server process sees the same count.
- Memory. A runner's active sessions reserve their limits' memory (`reserved_mb`) out of its
  AIRLOCK_RUNNER_MEMORY_MB; a session is placed only on a runner with room, and a runner refuses
  one that would not fit, so busy sandboxes cannot together exhaust the host. One tenant's
  sessions reserve at most AIRLOCK_TENANT_MEMORY_SHARE of all live runners' memory, so no tenant
  can leave the others without room."""

import contextlib
import threading
from collections import Counter

from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum
from django.db.models.functions import Coalesce

from controlplane import rows
from sessions.models import ACTIVE_STATES, CommandRun, CommandState, Session
from sessions.runtimes.base import Limits


class Refused(Exception):
    """A call refused for the tenant's load, with its API error code, message and HTTP status."""

    decision = None

    def __init__(self, code: str, detail: str, status: int = 429):
        super().__init__(detail)
        self.code, self.detail, self.status = code, detail, status


_lock = threading.Lock()
_waiting: Counter = Counter()
_reading: Counter = Counter()


@contextlib.contextmanager
def waiting_call(tenant):
    """Hold one of the tenant's waiting calls while the block runs, or raise Refused."""
    limit = settings.AIRLOCK_API_WAITING_PER_TENANT
    with _held(_waiting, tenant, limit, lambda: Refused(
            "too_many_waiting_calls",
            f"tenant {tenant.slug} already has {limit} calls waiting for a runner, the most one tenant may hold "
            "(AIRLOCK_API_WAITING_PER_TENANT); wait for one to end, or send commands without `wait` and follow them "
            "on the session's WebSocket")):
        yield


@contextlib.contextmanager
def blob_read(tenant):
    """Hold one of the tenant's blob reads (a snapshot or artifact checked whole, to download or
    verify it: ~0.3 s of CPU per 100 MB), or raise Refused. Without it, one tenant's parallel
    downloads of a large snapshot took the host's CPU from every other tenant (a session create
    went from 0.04 to ~2 s with 16 of them)."""
    limit = settings.AIRLOCK_BLOB_READS_PER_TENANT
    with _held(_reading, tenant, limit, lambda: Refused(
            "too_many_blob_reads",
            f"tenant {tenant.slug} already has {limit} snapshot or artifact reads under way, the most one tenant may "
            "have at once (AIRLOCK_BLOB_READS_PER_TENANT); retry when one has ended")):
        yield


@contextlib.contextmanager
def _held(counts: Counter, tenant, limit: int, refusal):
    with _lock:
        if counts[tenant.pk] >= limit:
            raise refusal()
        counts[tenant.pk] += 1
    try:
        yield
    finally:
        with _lock:
            counts[tenant.pk] -= 1
            if not counts[tenant.pk]:
                del counts[tenant.pk]


# -- what a tenant may have at once, and what a runner may hold -------------------------------

TMP_MB = Limits().tmp_mb  # every sandbox's /tmp (not a policy setting)


def reserved_mb(limits: dict) -> int:
    """The host memory a session of these (policy document) limits may hold: its memory limit,
    its /workspace and its /tmp (both in memory)."""
    return limits["memory_mb"] + limits["disk_mb"] + TMP_MB


def lock_tenant(tenant) -> None:
    """Take the tenant's row for the rest of the transaction, so that counting what it has and
    adding to it is one step (SQLite's writers are one at a time already)."""
    if connection.features.has_select_for_update:
        rows.select(type(tenant), ("pk",), {"pk": tenant.pk}, for_update=True)


def sessions_refusal(tenant, need_mb: int, runners_mb: int) -> str | None:
    """Why the tenant may not open one more session of `need_mb` now, or None: it has its most
    active sessions, or they would reserve more than its share of the live runners' memory
    (`runners_mb`; so that no tenant's sessions can leave the others no room)."""
    active = Session.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).aggregate(
        count=Count("pk"), held=Coalesce(Sum("reserved_mb"), 0))
    limit = settings.AIRLOCK_MAX_SESSIONS_PER_TENANT
    if active["count"] >= limit:
        return (f"tenant {tenant.slug} has {limit} active sessions, the most AIRLOCK_MAX_SESSIONS_PER_TENANT "
                "allows")
    share = int(runners_mb * settings.AIRLOCK_TENANT_MEMORY_SHARE)
    if active["held"] + need_mb > share:
        return (f"tenant {tenant.slug}'s sessions reserve {active['held']} MB and this one needs {need_mb} MB: more "
                f"than the {share} MB one tenant may hold (AIRLOCK_TENANT_MEMORY_SHARE of the runners' "
                f"{runners_mb} MB)")
    return None


def commands_refusal(tenant) -> str | None:
    """Why the tenant may not queue one more command now, or None."""
    limit = settings.AIRLOCK_MAX_COMMANDS_PER_TENANT
    waiting = {"session__tenant": tenant.pk, "state": (CommandState.QUEUED, CommandState.RUNNING)}
    if rows.count(CommandRun, waiting) >= limit:
        return (f"tenant {tenant.slug} has {limit} commands queued or running, the most "
                "AIRLOCK_MAX_COMMANDS_PER_TENANT allows")
    return None


LIMIT_HINT = ("wait for one to end and try again (the answer says Retry-After), or ask the deployment's operator to "
              "raise the limit named")
