"""`GET /metrics`: the operations metrics in Prometheus' text format.

It answers only with a token: `Authorization: Bearer <AIRLOCK_METRICS_TOKEN>` reads every
tenant; a tenant's API key with scope `metrics:read` reads its own tenant only. Anything else
gets 401 (no or a wrong token) or 403 (a key without the scope), and nothing of a tenant.
Figures cover the last WINDOW, but sessions by state, which counts every session; the
host-wide count of reaped orphan sandboxes goes only to the metrics token. One text is served
for AIRLOCK_METRICS_CACHE_S seconds."""

import hmac
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db.models import Sum
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from rest_framework.authentication import get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from controlplane.api.auth import ApiKeyAuthentication
from controlplane.models import ApiKeyScope, Tenant
from sessions.metrics import sessions_by_state, tenant_metrics, warm_pools
from sessions.models import Runner

WINDOW = timedelta(hours=24)
_cache: dict[tuple[bool, tuple[int, ...]], tuple[float, bytes]] = {}
_cache_lock = threading.Lock()


class TenantCollector:
    def __init__(self, tenants: list[Tenant], *, everything: bool):
        self.tenants, self.everything = tenants, everything

    def collect(self):
        now = timezone.now()
        gauges = {
            "start": GaugeMetricFamily("airlock_session_start_seconds", "Session start (created to ready), "
                                       "quantiles over the last 24 h", labels=["tenant", "quantile"]),
            "prepare": GaugeMetricFamily("airlock_session_prepare_seconds", "Preparation (sandbox and workspace "
                                         "ready, in the runner), quantiles over the last 24 h",
                                         labels=["tenant", "quantile"]),
            "start_pool": GaugeMetricFamily("airlock_session_start_by_pool_seconds", "Session start of Docker and "
                                            "gVisor sessions from a warm pool or cold, quantiles over the last 24 h",
                                            labels=["tenant", "start", "quantile"]),
            "warm": GaugeMetricFamily("airlock_warm_pool_hit_ratio", "Docker and gVisor sessions whose sandbox "
                                      "came from a warm pool, last 24 h", labels=["tenant"]),
            "cache": GaugeMetricFamily("airlock_rootfs_cache_hit_ratio", "Sandboxes whose root filesystem (or "
                                       "image) was in the local cache, last 24 h", labels=["tenant"]),
            "cost": GaugeMetricFamily("airlock_session_cost_per_minute", "CPU-seconds and storage MB-hours times "
                                      f"their rates, per session-minute ({settings.AIRLOCK_COST_CURRENCY}), last 24 h",
                                      labels=["tenant"]),
            "retry": GaugeMetricFamily("airlock_retry_ratio", "Denied or failed commands sent again (same intent, "
                                       "same conversation) within 5 minutes, last 24 h", labels=["tenant"]),
            "denials": GaugeMetricFamily("airlock_denials", "Denials (enforce mode) by reason, last 24 h",
                                         labels=["tenant", "reason"]),
            "started": GaugeMetricFamily("airlock_sessions_started", "Sessions created in the last 24 h",
                                         labels=["tenant"]),
            "state": GaugeMetricFamily("airlock_sessions", "Sessions by state (all kept sessions)",
                                       labels=["tenant", "state"]),
            "stored": GaugeMetricFamily("airlock_persistence_stored_bytes", "Sealed bytes of snapshots and "
                                        "artifacts stored now", labels=["tenant"]),
            "objects": GaugeMetricFamily("airlock_persistence_objects", "Snapshots and artifacts stored now",
                                         labels=["tenant", "kind"]),
            "storage_cost": GaugeMetricFamily("airlock_persistence_cost_per_month", "What keeping them a month "
                                              f"costs ({settings.AIRLOCK_COST_CURRENCY}, AIRLOCK_COST_PER_GB_MONTH)",
                                              labels=["tenant"]),
        }
        states = sessions_by_state(self.tenants)
        for tenant in self.tenants:
            metrics = tenant_metrics(tenant, now - WINDOW, now)
            slug = tenant.slug
            for quantile, key in (("0.5", "p50"), ("0.95", "p95")):
                if metrics.start_ms.get(key) is not None:
                    gauges["start"].add_metric([slug, quantile], metrics.start_ms[key] / 1000)
                if metrics.prepare_ms.get(key) is not None:
                    gauges["prepare"].add_metric([slug, quantile], metrics.prepare_ms[key] / 1000)
                for start, figures in (("warm", metrics.start_warm_ms), ("cold", metrics.start_cold_ms)):
                    if figures.get(key) is not None:
                        gauges["start_pool"].add_metric([slug, start, quantile], figures[key] / 1000)
            for name, value in (("cache", metrics.cache_hit_rate), ("warm", metrics.warm_hit_rate),
                                ("cost", metrics.cost_per_minute), ("retry", metrics.retry_rate)):
                if value is not None:
                    gauges[name].add_metric([slug], value)
            gauges["started"].add_metric([slug], metrics.sessions)
            for reason, count in metrics.denials_by_reason.items():
                gauges["denials"].add_metric([slug, reason], count)
            for state, count in sorted(states.get(tenant.pk, {}).items()):
                gauges["state"].add_metric([slug, state], count)
            gauges["stored"].add_metric([slug], metrics.stored["bytes"])
            for kind in ("snapshots", "artifacts"):
                gauges["objects"].add_metric([slug, kind[:-1]], metrics.stored[kind])
            gauges["storage_cost"].add_metric([slug], metrics.storage_cost_per_month)
        yield from gauges.values()
        if self.everything:
            reaped = CounterMetricFamily("airlock_sandboxes_reaped", "Orphan sandboxes (no active session) "
                                         "destroyed by the runners")
            reaped.add_metric([], Runner.objects.aggregate(total=Sum("reaped"))["total"] or 0)
            yield reaped
            size = GaugeMetricFamily("airlock_warm_pool_size", "Sandboxes the live runners' warm pools keep "
                                     "(AIRLOCK_WARM_POOL)", labels=["driver"])
            ready = GaugeMetricFamily("airlock_warm_pool_ready", "Started sandboxes waiting in the live runners' "
                                      "warm pools", labels=["driver"])
            for driver, pool in warm_pools().items():
                size.add_metric([driver], pool["size"])
                ready.add_metric([driver], pool["ready"])
            yield size
            yield ready


def _tenants_for(request) -> tuple[list[Tenant] | None, bool, int, str]:
    """The tenants this request may read and whether it may read the host's figures too (the
    metrics token), or None with the status and reason of the refusal."""
    header = get_authorization_header(request).split()
    token = settings.AIRLOCK_METRICS_TOKEN
    if len(header) == 2 and header[0].lower() == b"bearer":
        if token and hmac.compare_digest(header[1], token.encode()):
            return list(Tenant.objects.order_by("slug")), True, 200, ""
        try:
            found = ApiKeyAuthentication().authenticate(request)
        except AuthenticationFailed as exc:
            return None, False, 401, str(exc.detail)
        if found is not None:
            principal, _ = found
            if ApiKeyScope.METRICS not in principal.scopes:
                return None, False, 403, "this API key lacks the scope metrics:read"
            return [principal.tenant], False, 200, ""
    return None, False, 401, "send Authorization: Bearer <AIRLOCK_METRICS_TOKEN>, or an API key with scope metrics:read"


@require_GET
def metrics(request):
    tenants, everything, status, reason = _tenants_for(request)
    if tenants is None:
        response = HttpResponse(f"{reason}\n", status=status, content_type="text/plain; charset=utf-8")
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="airlock-metrics"'
        return response
    return HttpResponse(_exposition(tenants, everything=everything), content_type=CONTENT_TYPE_LATEST)


def _exposition(tenants: list[Tenant], *, everything: bool) -> bytes:
    """The text for these tenants, computed at most once per AIRLOCK_METRICS_CACHE_S: scrapers (several
    Prometheus replicas, a 15 s interval) do not each recompute every tenant's figures."""
    key, now = (everything, tuple(tenant.pk for tenant in tenants)), time.monotonic()
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TenantCollector(tenants, everything=everything))
    text = generate_latest(registry)
    with _cache_lock:
        if len(_cache) >= 256:
            _cache.clear()
        _cache[key] = (now + settings.AIRLOCK_METRICS_CACHE_S, text)
    return text
