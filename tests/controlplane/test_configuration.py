"""Each variable of the README's configuration table does what the table says (the bad values
are in test_settings.py; what needs a real server or sandboxes is in tests/sessions/).

Settings read at call time are changed in-process (the `settings` fixture); those read once, at
import, through `manage.py` in a subprocess with the environment under test."""

import asyncio
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from controlplane.models import ApiKey, ApiKeyScope
from policies_app import services as policy_services
from policies_app.decisions import decide
from policies_app.models import DecisionRecord

ROOT = Path(__file__).resolve().parents[2]
KEY = "configuration-test-secret-key-" + "x" * 40
# The README's variables: a subprocess starts from their defaults, plus what the test sets.
TABLE = {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "DATABASE_URL", "REDIS_URL", "DOCKER_HOST"}
POLICY = "mode: enforce\ncommands:\n  - {id: pytest, bin: pytest}\n"


def environment(data: Path, **variables: str) -> dict:
    inherited = {k: v for k, v in os.environ.items() if k not in TABLE and not k.startswith("AIRLOCK_")}
    return {**inherited, "SECRET_KEY": KEY, "AIRLOCK_DATA_DIR": str(data), **variables}


def manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def shell(env: dict, code: str) -> subprocess.CompletedProcess:
    done = manage(env, "shell", "--no-imports", "-c", code)
    assert done.returncode == 0, done.stderr
    return done


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


# What a visitor of a missing page and a visitor under a foreign host name get, as JSON.
VISITS = """
import json
from django.test import Client
missing = Client(HTTP_HOST="localhost").get("/no-such-page")
foreign = Client(HTTP_HOST="evil.example").get("/")
login = Client(HTTP_HOST="localhost").get("/login/")
print(json.dumps({"missing": [missing.status_code, missing.content.decode()], "foreign": foreign.status_code,
                  "csrf_cookie_secure": bool(login.cookies["csrftoken"]["secure"])}))
"""


def test_debug_shows_django_s_technical_pages_and_lifts_the_production_rules(tmp_path, db):
    env = environment(tmp_path, DEBUG="true", ALLOWED_HOSTS="*")
    del env["SECRET_KEY"]  # neither a key nor host names are needed in debug mode
    seen = json.loads(shell(env, VISITS).stdout)
    status, page = seen["missing"]
    assert status == 404 and "Using the URLconf defined in" in page
    assert seen["foreign"] != 400  # `*` is accepted: any host name is served
    assert seen["csrf_cookie_secure"] is False  # AIRLOCK_SECURE_COOKIES follows DEBUG
    production = Client(HTTP_HOST="localhost").get("/no-such-page")  # this suite runs with DEBUG off
    assert production.status_code == 404 and b"URLconf" not in production.content


def test_the_secret_key_comes_from_the_data_directory_unless_secret_key_is_set(tmp_path):
    stored = "stored-secret-key-" + "s" * 50
    (tmp_path / "secret_key").write_text(stored + "\n")
    env = environment(tmp_path)
    code = "from django.core import signing; print(signing.dumps('airlock'))"
    del env["SECRET_KEY"]
    signed = shell(env, code).stdout.strip()
    assert signing.loads(signed, key=stored) == "airlock"
    signed = shell({**env, "SECRET_KEY": KEY}, code).stdout.strip()
    assert signing.loads(signed, key=KEY) == "airlock"
    with pytest.raises(signing.BadSignature):
        signing.loads(signed, key=stored)
    (tmp_path / "secret_key").write_text("too-short\n")
    refused = manage(env, "check")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == ("airlock: configuration error: SECRET_KEY is missing or shorter than 50 "
                                      "characters while DEBUG is off; generate one with: python3 -c 'import "
                                      "secrets; print(secrets.token_urlsafe(64))'")


def test_airlock_log_level_applies_to_django_s_loggers_too(tmp_path):
    default = shell(environment(tmp_path), VISITS).stderr
    assert "WARNING django.request Not Found: /no-such-page" in default
    quiet = shell(environment(tmp_path, AIRLOCK_LOG_LEVEL="error"), VISITS).stderr
    assert "Not Found" not in quiet and "WARNING" not in quiet
    assert "ERROR django.security.DisallowedHost Invalid HTTP_HOST header: 'evil.example'" in quiet


def test_airlock_key_touch_interval_s_spaces_out_last_used_writes(acme, make_key, api, settings):
    created = make_key(acme)
    settings.AIRLOCK_KEY_TOUCH_INTERVAL_S = 3600
    assert api(created.key).get("/api/v1/whoami").status_code == 200
    first = ApiKey.objects.get(pk=created.api_key.pk).last_used_at
    assert first is not None
    api(created.key).get("/api/v1/whoami")
    assert ApiKey.objects.get(pk=created.api_key.pk).last_used_at == first  # within the interval: no write
    settings.AIRLOCK_KEY_TOUCH_INTERVAL_S = 0
    api(created.key).get("/api/v1/whoami")
    assert ApiKey.objects.get(pk=created.api_key.pk).last_used_at > first


@pytest.fixture
def policy(acme):
    policy = policy_services.policy_create(tenant=acme, name="default", actor=None)
    version = policy_services.version_create(policy=policy, source=POLICY, actor=None)
    policy_services.version_publish(version=version, actor=None, note="test")
    return policy


def test_airlock_decision_retention_days_is_what_prune_decisions_keeps(acme, policy, settings):
    settings.AIRLOCK_DECISION_RETENTION_DAYS = 7
    ages = {}
    for days in (3, 8):
        record = decide(tenant=acme, policy=policy, request={"bin": "make"}).record
        DecisionRecord.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(days=days))
        ages[days] = record.pk
    out = StringIO()
    call_command("prune_decisions", stdout=out)
    assert "older than 7 days" in out.getvalue()
    assert list(DecisionRecord.objects.values_list("pk", flat=True)) == [ages[3]]
    with pytest.raises(CommandError, match="--days must be at least 1"):  # not "unset", then the setting
        call_command("prune_decisions", "--days", "0", stdout=out)
    assert DecisionRecord.objects.count() == 1


def test_airlock_metrics_cache_s_serves_the_same_text_for_that_long(acme, policy, make_key, api, settings):
    from sessions import prometheus

    prometheus._cache.clear()  # the cache outlives tests: acme's id recurs
    reader = api(make_key(acme, scopes=[ApiKeyScope.METRICS]).key)
    settings.AIRLOCK_METRICS_CACHE_S = 60
    before = reader.get("/metrics").content.decode()
    decide(tenant=acme, policy=policy, request={"bin": "make"})  # a denial: bin_not_allowed
    denial = 'airlock_denials{reason="bin_not_allowed",tenant="acme"} 1.0'
    assert denial not in before and reader.get("/metrics").content.decode() == before
    settings.AIRLOCK_METRICS_CACHE_S = 0
    prometheus._cache.clear()
    assert denial in reader.get("/metrics").content.decode()


def test_airlock_cost_currency_names_the_unit_of_the_cost_metric(acme, make_key, api, settings):
    from sessions import prometheus

    prometheus._cache.clear()
    settings.AIRLOCK_COST_CURRENCY = "EUR"
    text = api(make_key(acme, scopes=[ApiKeyScope.METRICS]).key).get("/metrics").content.decode()
    assert re.search(r"# HELP airlock_session_cost_per_minute .*per session-minute \(EUR\)", text)


def test_airlock_static_root_is_where_collectstatic_puts_the_files(tmp_path):
    target = tmp_path / "static"
    done = manage(environment(tmp_path, AIRLOCK_STATIC_ROOT=str(target)), "collectstatic", "--no-input", "-v", "0")
    assert done.returncode == 0, done.stderr
    assert (target / "favicon.svg").read_bytes() == (ROOT / "static" / "favicon.svg").read_bytes()
    assert (target / "admin" / "css" / "base.css").is_file()  # the apps' files too, for the front proxy


def test_airlock_channel_prefix_keeps_deployments_that_share_a_redis_apart(tmp_path):
    if not _reachable("127.0.0.1", 6379):
        if os.environ.get("CI") == "true":
            pytest.fail("Redis is required in CI at 127.0.0.1:6379")
        pytest.skip("Redis is not running at 127.0.0.1:6379")
    from channels_redis.core import RedisChannelLayer

    url, prefix = "redis://127.0.0.1:6379/0", f"airlock-config-{uuid.uuid4().hex[:8]}"
    channel = f"probe-{uuid.uuid4().hex[:8]}"
    shell(environment(tmp_path, REDIS_URL=url, AIRLOCK_CHANNEL_PREFIX=prefix),
          "from asgiref.sync import async_to_sync; from channels.layers import get_channel_layer; "
          f"async_to_sync(get_channel_layer().send)('{channel}', {{'type': 'probe', 'n': 1}})")

    async def receive(layer_prefix: str):
        layer = RedisChannelLayer(hosts=[url], prefix=layer_prefix)
        try:
            return await asyncio.wait_for(layer.receive(channel), 0.5)
        except TimeoutError:
            return None
        finally:
            await layer.close_pools()

    def run(coroutine):  # on a thread of its own, whatever loop this thread may have
        with ThreadPoolExecutor(1) as thread:
            return thread.submit(asyncio.run, coroutine).result()

    assert run(receive(f"airlock-other-{uuid.uuid4().hex[:8]}")) is None  # another deployment
    assert run(receive(prefix)) == {"type": "probe", "n": 1}


def test_database_url_options_reach_the_postgresql_connection(tmp_path):
    on_postgres = os.environ.get("DATABASE_URL", "").startswith("postgres")
    url = os.environ["DATABASE_URL"] if on_postgres else "postgres://postgres@127.0.0.1:5432/test"
    if not on_postgres and not _reachable("127.0.0.1", 5432):  # the PostgreSQL pass always has it
        pytest.skip("PostgreSQL is not running at 127.0.0.1:5432")
    options = "application_name=airlock-config-test&connect_timeout=5"
    env = environment(tmp_path, DATABASE_URL=f"{url}{'&' if '?' in url else '?'}{options}")
    done = shell(env, "from django.db import connection\nwith connection.cursor() as cursor:\n"
                      "    cursor.execute('SHOW application_name'); print(cursor.fetchone()[0])")
    assert done.stdout.strip() == "airlock-config-test"


class _FakeEngine(http.server.BaseHTTPRequestHandler):
    """Answers every Docker API call 500 and remembers it was asked."""

    asked: list = []

    def do_GET(self):
        self.asked.append(self.path)
        body = json.dumps({"message": "fake engine"}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_docker_host_is_the_engine_the_docker_driver_talks_to(monkeypatch):
    from sessions.runtimes.base import RuntimeUnavailable
    from sessions.runtimes.docker_driver import DockerDriver

    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeEngine)
    _FakeEngine.asked = []
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{engine.server_address[1]}")
        with pytest.raises(RuntimeUnavailable, match="Docker daemon is not reachable"):
            DockerDriver().check()
    finally:
        engine.shutdown()
        engine.server_close()
    assert any(path.endswith(("/_ping", "/version")) for path in _FakeEngine.asked), _FakeEngine.asked


def test_airlock_require_docker_turns_the_skip_of_docker_tests_into_a_failure(monkeypatch):
    from tests.runtimes.conftest import unavailable

    monkeypatch.delenv("AIRLOCK_REQUIRE_DOCKER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="docker unavailable"):
        unavailable("docker", RuntimeError("no daemon"))
    monkeypatch.setenv("AIRLOCK_REQUIRE_DOCKER", "1")
    for name in ("docker", "gvisor"):
        with pytest.raises(pytest.fail.Exception, match=f"{name} is required here"):
            unavailable(name, RuntimeError("no daemon"))


def test_airlock_require_browser_turns_the_skip_of_browser_tests_into_a_failure(monkeypatch, tmp_path):
    from tests.browser import conftest as browser

    monkeypatch.setattr(browser, "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.delenv("AIRLOCK_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Chromium is not installed"):
        browser._require_chromium()
    monkeypatch.setenv("AIRLOCK_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="Chromium is not installed"):
        browser._require_chromium()


def test_demo_setup_prints_the_address_of_airlock_host_and_port(db, monkeypatch):
    monkeypatch.setenv("AIRLOCK_HOST", "127.0.0.2")
    monkeypatch.setenv("AIRLOCK_PORT", "8123")
    out = StringIO()
    call_command("demo_setup", stdout=out)
    assert "Dashboard  http://127.0.0.2:8123/" in out.getvalue()
    assert "http://127.0.0.2:8123/api/v1/whoami" in out.getvalue()


def test_session_cookies_are_secure_and_last_the_default_eight_hours(db):
    get_user_model().objects.create_user("dana", password="a-long-enough-password")
    client = Client(enforce_csrf_checks=True)
    token = client.get("/login/").cookies["csrftoken"]
    assert token["secure"]
    response = client.post("/login/", {"username": "dana", "password": "a-long-enough-password",
                                       "csrfmiddlewaretoken": token.value})
    assert response.status_code == 302
    cookie = response.cookies["sessionid"]
    assert cookie["secure"] and cookie["max-age"] == 28800


def test_x_forwarded_proto_is_not_trusted_by_default(db):
    client = Client(enforce_csrf_checks=True)
    token = client.get("/login/").cookies["csrftoken"].value
    # A proxy-terminated HTTPS form post: without AIRLOCK_BEHIND_TLS_PROXY the request is plain
    # HTTP, so its https:// origin is foreign (the server test shows the other side).
    refused = client.post("/login/", {"username": "x", "password": "y", "csrfmiddlewaretoken": token},
                          HTTP_ORIGIN="https://testserver", HTTP_X_FORWARDED_PROTO="https")
    assert refused.status_code == 403


def test_airlock_egress_test_hosts_maps_names_to_loopback_upstreams_only(tmp_path):
    env = environment(tmp_path, AIRLOCK_EGRESS_TEST_HOSTS="pypi.test=127.0.0.1:8081,Git.Test=[::1]:9000")
    mapped = shell(env, "from django.conf import settings; print(sorted(settings.AIRLOCK_EGRESS_TEST_HOSTS.items()))")
    assert mapped.stdout.strip() == "[('git.test', ('::1', 9000)), ('pypi.test', ('127.0.0.1', 8081))]"
    for bad in ("pypi.test=10.0.0.1:80", "pypi.test=127.0.0.1", "=127.0.0.1:80", "pypi.test=127.0.0.1:0"):
        refused = manage(environment(tmp_path, AIRLOCK_EGRESS_TEST_HOSTS=bad), "check")
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, bad
        assert "AIRLOCK_EGRESS_TEST_HOSTS" in refused.stderr and "loopback only" in refused.stderr, bad
