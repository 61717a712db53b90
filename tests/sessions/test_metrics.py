"""Operations metrics against a hand-counted fixture, per tenant, on the page and at /metrics."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import ApiKeyScope
from policies_app.decisions import decide
from sessions.metrics import percentile, tenant_metrics
from sessions.models import CommandRun, Runner, Session, hash_token, new_token
from tests.sessions.conftest import publish

TOKEN = "m" * 32


def add_session(tenant, version, *, ago, start_ms=None, prepare_ms=None, cache_hit=None, cpu_s=None,
                disk_mb=0, minutes=10, state="ended", driver="bubblewrap", warm=None):
    created = timezone.now() - ago
    ready = created + timedelta(milliseconds=start_ms) if start_ms is not None else None
    return Session.objects.create(
        tenant=tenant, conversation_id="conv", policy_version=version, driver=driver, state=state, warm=warm,
        token_hash=hash_token(new_token()), created_by="test", created_at=created, ready_at=ready,
        ended_at=(ready or created) + timedelta(minutes=minutes), expires_at=created + timedelta(hours=1),
        prepare_ms=prepare_ms, cache_hit=cache_hit, cpu_s=cpu_s, disk_bytes=disk_mb * 2**20)


@pytest.fixture
def fleet(acme, globex, settings):
    """acme, last 24 h: 4 sessions (3 ready: start 100 / 200 / 1000 ms, prepare 50 / 60 / 500 ms,
    cache hit, hit, miss; 1 + 2 + 3 CPU-s; 10 MiB each for 10 minutes; 1 failed). Commands:
    `make test` denied 3 times in conv-a at 0, +1 and +10 min (one retry); `pytest tests/a.py`
    failed and `pytest tests/b.py` came 2 minutes later (a retry); `pytest tests/ok.py` passed.
    globex: 1 session and 2 denials of its own."""
    settings.AIRLOCK_COST_PER_CPU_SECOND, settings.AIRLOCK_COST_PER_MB_HOUR = 0.01, 0.001
    version = publish(acme, "commands:\n  - {id: pytest, bin: pytest}\n")
    policy = version.policy
    first = add_session(acme, version, ago=timedelta(hours=3), start_ms=100, prepare_ms=50, cache_hit=True, cpu_s=1,
                        disk_mb=10)
    add_session(acme, version, ago=timedelta(hours=2), start_ms=200, prepare_ms=60, cache_hit=True, cpu_s=2,
                disk_mb=10, state="killed")
    add_session(acme, version, ago=timedelta(hours=1), start_ms=1000, prepare_ms=500, cache_hit=False, cpu_s=3,
                disk_mb=10)
    add_session(acme, version, ago=timedelta(minutes=30), state="failed")
    add_session(acme, version, ago=timedelta(days=3), start_ms=9000, prepare_ms=9000, cpu_s=100)  # out of the period
    start = timezone.now() - timedelta(hours=2)
    for minutes in (0, 1, 10):
        decide(tenant=acme, policy=policy, request={"bin": "make", "args": ["test"]}, conversation_id="conv-a",
               session_id=first.pk, at=start + timedelta(minutes=minutes))
    for minutes, path, exit_code in ((20, "tests/a.py", 1), (22, "tests/b.py", 0), (40, "tests/ok.py", 0)):
        at = start + timedelta(minutes=minutes)
        record = decide(tenant=acme, policy=policy, request={"bin": "pytest", "args": [path]}, conversation_id="conv-b",
                        session_id=first.pk, at=at).record
        CommandRun.objects.create(session=first, argv=["pytest", path], timeout_s=10, decision=record, state="exited",
                                  exit_code=exit_code, created_at=at)
    other = publish(globex, "commands: []\n")
    add_session(globex, other, ago=timedelta(hours=1), start_ms=5, prepare_ms=5, cache_hit=True, cpu_s=50)
    for _ in range(2):
        decide(tenant=globex, policy=other.policy, request={"bin": "curl", "args": []}, conversation_id="conv-a")


def test_percentiles_are_nearest_rank():
    assert percentile([100, 200, 1000], 50) == 200 and percentile([100, 200, 1000], 95) == 1000
    assert percentile(list(range(1, 101)), 95) == 95 and percentile([], 50) is None


def test_every_metric_matches_the_hand_count(acme, fleet):
    now = timezone.now()
    m = tenant_metrics(acme, now - timedelta(hours=24), now)
    assert m.sessions == 4
    assert m.start_ms == {"p50": 200, "p95": 1000}
    assert m.prepare_ms == {"p50": 60, "p95": 500}
    assert (m.cache_hits, m.cache_lookups) == (2, 3)
    assert m.cpu_s == 6 and m.session_minutes == pytest.approx(30)
    assert m.storage_mb_hours == pytest.approx(3 * 10 * 10 / 60)
    assert m.cost_per_minute == pytest.approx((6 * 0.01 + 5 * 0.001) / 30)
    assert (m.setbacks, m.retried) == (4, 2) and m.retry_rate == 0.5
    assert m.denials_by_reason == {"bin_not_allowed": 3}
    assert m.sessions_by_state == {"ended": 2, "killed": 1, "failed": 1}
    assert sum(bucket["sessions"] for bucket in m.starts_over_time) == 3
    assert len(m.starts_over_time) in (24, 25)  # every hour of the day, the empty ones too
    assert [bucket["sessions"] for bucket in m.starts_over_time].count(0) >= 21


def test_the_metrics_page_shows_one_tenants_figures_with_charts(acme, bob, charlie, client_for, fleet):
    html = client_for(bob).get("/t/acme/metrics/").content.decode()
    assert 'data-testid="metric-sessions">4<' in html and "200 / 1000 ms" in html and "60 / 500 ms" in html
    assert 'data-testid="metric-cache">66.7 %<' in html and 'data-testid="metric-retry">50.0 %<' in html
    assert '<canvas id="starts-chart"' in html
    reasons = html[html.index('data-testid="denials-by-reason"'):].split("</table>")[0]
    assert "bin_not_allowed" in reasons and ">3<" in reasons and "default_deny" not in reasons  # not globex's
    assert client_for(bob).get("/t/acme/metrics/?period=forever").status_code == 400
    assert client_for(charlie).get("/t/acme/metrics/").status_code == 404
    cost = html[html.index('data-testid="metric-cost">'):].split("</strong>")[0]
    assert cost.endswith(">0.0022 USD")  # (6 CPU-s * 0.01 + 5 MB-h * 0.001) / 30 min, readable


def test_an_empty_tenants_metrics_say_so_instead_of_empty_charts(acme, bob, client_for):
    html = client_for(bob).get("/t/acme/metrics/").content.decode()
    assert 'data-testid="no-starts"' in html and '<canvas id="starts-chart"' not in html
    assert "no denials in this period" in html and "no sessions in this period" in html


@pytest.mark.parametrize("amount, shown", [(0, "0.00"), (0.0022, "0.0022"), (0.000123, "0.00012"), (0.5, "0.50"),
                                           (1234.5, "1,234.50"), (None, "—")])
def test_money_is_written_as_a_person_reads_it(amount, shown):
    from controlplane.templatetags.airlock import money

    assert money(amount) == shown


def test_prometheus_metrics_need_a_token_and_a_key_reads_only_its_tenant(acme, globex, fleet, settings, api,
                                                                         make_key):
    settings.AIRLOCK_METRICS_TOKEN = TOKEN
    Runner.objects.create(id="r1", hostname="h", pid=1, reaped=2)
    Runner.objects.create(id="r2", hostname="h", pid=2, reaped=1)
    assert api().get("/metrics").status_code == 401
    assert api("not-the-token").get("/metrics").status_code == 401
    assert api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ]).key).get("/metrics").status_code == 403
    everything = api(TOKEN).get("/metrics")
    assert everything.status_code == 200 and everything["Content-Type"].startswith("text/plain")
    text = everything.content.decode()
    assert 'airlock_session_start_seconds{quantile="0.95",tenant="acme"} 1.0' in text
    assert 'airlock_denials{reason="bin_not_allowed",tenant="acme"} 3.0' in text
    assert 'airlock_sessions{state="killed",tenant="acme"} 1.0' in text
    assert 'airlock_retry_ratio{tenant="acme"} 0.5' in text and 'tenant="globex"' in text
    assert "airlock_sandboxes_reaped_total 3.0" in text  # the host's, for the metrics token only
    own = api(make_key(acme, scopes=[ApiKeyScope.METRICS]).key).get("/metrics").content.decode()
    assert 'tenant="acme"' in own and "globex" not in own and "reaped" not in own
    assert 'airlock_rootfs_cache_hit_ratio{tenant="acme"} 0.6666' in own


def test_warm_pool_figures_split_starts_warm_and_cold_and_count_hits_on_pooling_drivers(acme, settings, api,
                                                                                         client_for, bob):
    """acme: 3 Docker sessions from the pool (start 20 / 30 / 40 ms), 1 gVisor one cold (600 ms),
    and bubblewrap ones, which have no pool and count for neither. Two live runners keep pools;
    a stopped one's do not count."""
    settings.AIRLOCK_METRICS_TOKEN = TOKEN
    version = publish(acme, "commands: []\n")
    for start_ms in (20, 30, 40):
        add_session(acme, version, ago=timedelta(hours=1), start_ms=start_ms, driver="docker", warm=True)
    add_session(acme, version, ago=timedelta(hours=1), start_ms=600, driver="gvisor", warm=False)
    add_session(acme, version, ago=timedelta(hours=1), start_ms=5, driver="bubblewrap", warm=False)
    add_session(acme, version, ago=timedelta(hours=1), driver="docker", state="failed")  # never ready
    Runner.objects.create(id="r1", hostname="h", pid=1, pools={"docker": {"size": 4, "ready": 3}})
    Runner.objects.create(id="r2", hostname="h", pid=2, pools={"docker": {"size": 4, "ready": 4},
                                                             "gvisor": {"size": 2, "ready": 0}})
    Runner.objects.create(id="r3", hostname="h", pid=3, pools={"docker": {"size": 9, "ready": 9}},
                          stopped_at=timezone.now())
    now = timezone.now()
    m = tenant_metrics(acme, now - timedelta(hours=24), now)
    assert (m.warm_hits, m.warm_lookups, m.warm_hit_rate) == (3, 4, 0.75)
    assert m.start_warm_ms == {"p50": 30, "p95": 40} and m.start_cold_ms == {"p50": 600, "p95": 600}
    html = client_for(bob).get("/t/acme/metrics/").content.decode()
    assert "75.0 %" in html and "docker 7/8, gvisor 0/2" in html and "warm 30 / 40 · cold 600 / 600 ms" in html
    text = api(TOKEN).get("/metrics").content.decode()
    assert 'airlock_warm_pool_hit_ratio{tenant="acme"} 0.75' in text
    assert 'airlock_session_start_by_pool_seconds{quantile="0.95",start="warm",tenant="acme"} 0.04' in text
    assert 'airlock_session_start_by_pool_seconds{quantile="0.5",start="cold",tenant="acme"} 0.6' in text
    assert 'airlock_warm_pool_size{driver="docker"} 8.0' in text
    assert 'airlock_warm_pool_ready{driver="docker"} 7.0' in text


def test_without_a_configured_token_only_a_metrics_key_is_let_in(acme, fleet, settings, api, make_key):
    settings.AIRLOCK_METRICS_TOKEN = ""
    assert api("").get("/metrics").status_code == 401
    assert api("anything").get("/metrics").status_code == 401
    assert api(make_key(acme, scopes=[ApiKeyScope.METRICS]).key).get("/metrics").status_code == 200


def test_a_long_periods_denials_count_whole_days_as_the_denials_page_does(acme, fleet):
    from policies_app.denials import DenialQuery, summary
    from policies_app.rollups import compact

    policy = acme.policies.get(name="default")
    decide(tenant=acme, policy=policy, request={"bin": "make", "args": []},
           at=timezone.now() - timedelta(days=7) + timedelta(minutes=30))
    compact()
    now = timezone.now()
    page = summary(DenialQuery(tenant=acme, since=now - timedelta(days=7), until=now))["total"]
    assert sum(tenant_metrics(acme, now - timedelta(days=7), now).denials_by_reason.values()) == page == 4
