"""Operations metrics (seed S10), per tenant and period: how fast sessions start and get ready,
how often the root filesystem came from the local cache, what a minute of sandbox costs, how
often an agent retries what was refused or failed, denials by reason and sessions by state.

Figures are computed from the database at read time, over the newest MAX_ROWS sessions and
decisions of the period (the Metrics page and /metrics say so when a sample is cut)."""

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone

from controlplane.models import Tenant
from policies_app.models import DecisionRecord, DecisionRollup
from policies_app.rollups import argument_pattern, bucket_of, by_hour
from sessions.models import CommandRun, CommandState, Runner, Session
from sessions.persistence import services as persistence
from sessions.runtimes import POOLED_DRIVERS

MAX_ROWS = 20_000
RETRY_WINDOW = timedelta(minutes=5)  # the same intent again within this long counts as a retry


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..100) of `values`, None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


@dataclass
class Metrics:
    since: datetime
    until: datetime
    sessions: int = 0
    start_ms: dict = field(default_factory=dict)  # {"p50": …, "p95": …}
    prepare_ms: dict = field(default_factory=dict)
    cache_hits: int = 0
    cache_lookups: int = 0
    start_warm_ms: dict = field(default_factory=dict)  # sessions whose sandbox came from a warm pool
    start_cold_ms: dict = field(default_factory=dict)  # the others on a driver that has pools
    warm_hits: int = 0
    warm_lookups: int = 0  # sessions on a driver with pools (docker, gvisor)
    cpu_s: float = 0.0
    storage_mb_hours: float = 0.0
    session_minutes: float = 0.0
    cost: float = 0.0
    setbacks: int = 0  # denials and failed commands
    retried: int = 0  # of them, sent again within RETRY_WINDOW
    denials_by_reason: dict = field(default_factory=dict)
    sessions_by_state: dict = field(default_factory=dict)
    starts_over_time: list = field(default_factory=list)  # [{at, sessions, p95_ms}]
    sampled: bool = False  # more than MAX_ROWS rows: the figures are of the newest ones
    # What is stored now (snapshots and artifacts, sealed) and what keeping it costs (seed S10's storage cost).
    stored: dict = field(default_factory=lambda: {"snapshots": 0, "artifacts": 0, "bytes": 0})

    @property
    def storage_cost_per_month(self) -> float:
        return self.stored["bytes"] / 1e9 * settings.AIRLOCK_COST_PER_GB_MONTH

    @property
    def cache_hit_rate(self) -> float | None:
        return self.cache_hits / self.cache_lookups if self.cache_lookups else None

    @property
    def warm_hit_rate(self) -> float | None:
        return self.warm_hits / self.warm_lookups if self.warm_lookups else None

    @property
    def cost_per_minute(self) -> float | None:
        return self.cost / self.session_minutes if self.session_minutes else None

    @property
    def retry_rate(self) -> float | None:
        return self.retried / self.setbacks if self.setbacks else None


def tenant_metrics(tenant: Tenant, since: datetime, until: datetime | None = None) -> Metrics:
    until = until or timezone.now()
    metrics = Metrics(since=since, until=until)
    _sessions(metrics, tenant)
    _retries(metrics, tenant)
    # Counted as the Denials page counts (rollups.py): by the hour up to 48 h, else by the day.
    start = bucket_of(since, by_hour(since, until))
    denials = (DecisionRollup.objects.filter(tenant=tenant, effect="deny", group_kind="", hour__gte=start,
                                             hour__lt=until).values("reason_code").annotate(n=Sum("count")))
    metrics.denials_by_reason = {row["reason_code"]: row["n"] for row in denials.order_by("-n")}
    states = Session.objects.filter(tenant=tenant, created_at__gte=since, created_at__lt=until)
    metrics.sessions_by_state = {row["state"]: row["n"] for row in states.values("state").annotate(n=Count("id"))}
    metrics.stored = persistence.usage(tenant).get(tenant.pk, metrics.stored)
    return metrics


def _sessions(metrics: Metrics, tenant: Tenant) -> None:
    rows = list(Session.objects.filter(tenant=tenant, created_at__gte=metrics.since, created_at__lt=metrics.until)
                .order_by("-created_at")
                .values_list("created_at", "ready_at", "ended_at", "prepare_ms", "cache_hit", "cpu_s",
                             "disk_bytes", "driver", "warm")[:MAX_ROWS + 1])
    metrics.sampled |= len(rows) > MAX_ROWS
    rows = rows[:MAX_ROWS]
    metrics.sessions = len(rows)
    starts, prepares, by_pool = [], [], {True: [], False: []}
    hourly = by_hour(metrics.since, metrics.until)
    buckets = defaultdict(list)
    for created, ready, ended, prepare_ms, cache_hit, cpu_s, disk_bytes, driver, warm in rows:
        if prepare_ms is not None:
            prepares.append(prepare_ms)
        if cache_hit is not None:
            metrics.cache_lookups += 1
            metrics.cache_hits += cache_hit
        if ready is not None:
            start_ms = (ready - created).total_seconds() * 1000
            starts.append(start_ms)
            buckets[bucket_of(created, hourly)].append(start_ms)
            if warm is not None and driver in POOLED_DRIVERS:
                metrics.warm_lookups += 1
                metrics.warm_hits += warm
                by_pool[warm].append(start_ms)
            minutes = ((ended or metrics.until) - ready).total_seconds() / 60
            metrics.session_minutes += minutes
            metrics.cpu_s += cpu_s or 0.0
            metrics.storage_mb_hours += (disk_bytes or 0) / 2**20 * minutes / 60
    metrics.start_ms = {"p50": percentile(starts, 50), "p95": percentile(starts, 95)}
    metrics.prepare_ms = {"p50": percentile(prepares, 50), "p95": percentile(prepares, 95)}
    metrics.start_warm_ms = {"p50": percentile(by_pool[True], 50), "p95": percentile(by_pool[True], 95)}
    metrics.start_cold_ms = {"p50": percentile(by_pool[False], 50), "p95": percentile(by_pool[False], 95)}
    metrics.cost = (metrics.cpu_s * settings.AIRLOCK_COST_PER_CPU_SECOND
                    + metrics.storage_mb_hours * settings.AIRLOCK_COST_PER_MB_HOUR)
    # Every hour (or day) of the period, the empty ones too: a chart that skips them misleads.
    step = timedelta(hours=1) if hourly else timedelta(days=1)
    at, metrics.starts_over_time = bucket_of(metrics.since, hourly), []
    while at < metrics.until:
        values = buckets.get(at, [])
        metrics.starts_over_time.append({"at": at, "sessions": len(values), "p95_ms": percentile(values, 95)})
        at += step


def warm_pools() -> dict[str, dict]:
    """The warm pools of the live runners, summed by driver: {driver: {size, ready}}."""
    pools: dict[str, dict] = {}
    for runner_pools in Runner.objects.filter(stopped_at__isnull=True).values_list("pools", flat=True):
        for driver, status in (runner_pools or {}).items():
            total = pools.setdefault(driver, {"size": 0, "ready": 0})
            total["size"] += int(status.get("size", 0))
            total["ready"] += int(status.get("ready", 0))
    return dict(sorted(pools.items()))


def _retries(metrics: Metrics, tenant: Tenant) -> None:
    """A setback is a denied command or one that failed (a non-zero exit, a timeout, a kill); it
    is retried when the same intent (program and argument pattern) comes again in the same
    conversation within RETRY_WINDOW."""
    decisions = list(DecisionRecord.objects.filter(tenant=tenant, kind="exec", created_at__gte=metrics.since,
                                                   created_at__lt=metrics.until)
                     .order_by("-created_at")
                     .values_list("id", "conversation_id", "session_id", "request", "allowed", "created_at")
                     [:MAX_ROWS + 1])
    metrics.sampled |= len(decisions) > MAX_ROWS
    decisions = decisions[:MAX_ROWS]
    oldest = decisions[-1][-1] if decisions else metrics.until
    failed = set(CommandRun.objects.filter(session__tenant=tenant, created_at__gte=max(oldest, metrics.since),
                                           created_at__lt=metrics.until)
                 .exclude(state__in=[CommandState.QUEUED, CommandState.RUNNING])
                 .exclude(state=CommandState.EXITED, exit_code=0).order_by("-created_at")
                 .values_list("decision_id", flat=True)[:MAX_ROWS])
    by_intent = defaultdict(list)  # (conversation, intent) -> times, oldest first
    setbacks = []
    for decision_id, conversation, session_id, request, allowed, at in reversed(decisions):
        key = (conversation or str(session_id or ""), argument_pattern(request))
        by_intent[key].append(at)
        if not allowed or decision_id in failed:
            setbacks.append((key, at))
    metrics.setbacks = len(setbacks)
    for key, at in setbacks:
        times = by_intent[key]
        after = bisect.bisect_right(times, at)
        metrics.retried += after < len(times) and times[after] <= at + RETRY_WINDOW


def sessions_by_state(tenants: list[Tenant]) -> dict[int, Counter]:
    """Every session of these tenants, counted by state (for /metrics)."""
    counts: dict[int, Counter] = defaultdict(Counter)
    for row in (Session.objects.filter(tenant__in=tenants).values("tenant_id", "state")
                .annotate(n=Count("id"))):
        counts[row["tenant_id"]][row["state"]] = row["n"]
    return counts
