"""The configuration table (README.md) seen where it acts: a real server started with a
non-default environment (settings read once, at import), and the runner in-process with
settings changed before it starts (those it reads as it goes)."""

import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from http.cookies import SimpleCookie
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from controlplane.models import ApiKeyScope
from sessions.models import Runner
from sessions.runner import records
from sessions.runtimes import get_driver, rootfs
from sessions.runtimes.base import Limits, SandboxSpec
from tests.http import call_api
from tests.live import _free_port, stop_server
from tests.sessions.conftest import Agent, running_runner
from tests.sessions.test_cluster import CPUS_PY, _allowed_cpus, _manage, threads_cpus, wait_until

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.2"  # loopback, but not the default 127.0.0.1: AIRLOCK_HOST is seen to matter
TABLE = {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "DATABASE_URL", "REDIS_URL", "DOCKER_HOST"}
SECRETS = ("swordfish-0451", "tuna-salad-9981")
SERVER_CPU = max(os.sched_getaffinity(0))  # not `auto`'s choice by pid: the test knows which one it asked for
GLOBEX = """
from controlplane import services
from controlplane.management.commands.demo_setup import DEMO_POLICY
from controlplane.models import ApiKeyScope
from policies_app import services as policies
tenant = services.tenant_create(slug="globex", name="Globex")
policy = policies.policy_create(tenant=tenant, name="default", actor=None)
policies.version_publish(version=policies.version_create(policy=policy, source=DEMO_POLICY, actor=None),
                         actor=None, note="test")
print(services.api_key_create(tenant=tenant, name="agent", scopes=[ApiKeyScope.SESSIONS], actor=None).key)
"""
# A command that marks its start, waits until the test opens its gate (a file the test writes into
# the sandbox's workspace from the host: file calls would queue behind busy threads), marks its end.
GATED = b"""import os, time
open('started', 'w').close()
while not os.path.exists('go'):
    time.sleep(0.05)
open('ended', 'w').close()
"""


def _git_repository(path: Path, files: dict) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(path), *args],
                       check=True, capture_output=True)
    return path


@dataclass
class Deployment:
    port: int
    base: Path
    data: Path
    database: Path
    log: Path
    printed: str  # what demo_setup printed
    key: str  # the demo tenant's API key
    globex_key: str
    password: str
    pid: int  # the server's

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def http(self, method: str, path: str, *, host: str | None = None, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, list[str], str]:
        """(status, Set-Cookie headers, body), with the Host header of our choosing."""
        connection = http.client.HTTPConnection(HOST, self.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers={"Host": host or f"{HOST}:{self.port}",
                                                                 **(headers or {})})
            response = connection.getresponse()
            return response.status, response.headers.get_all("Set-Cookie") or [], response.read().decode()
        finally:
            connection.close()

    def login_form(self) -> tuple[str, str]:
        """(the csrftoken cookie, the form's token) of a fresh login page."""
        status, cookies, page = self.http("GET", "/login/")
        assert status == 200
        return (_cookie(cookies, "csrftoken").value,
                re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1))

    def log_in(self, password: str, **headers: str) -> tuple[int, list[str]]:
        cookie, token = self.login_form()
        form = urllib.parse.urlencode({"username": "admin", "password": password, "csrfmiddlewaretoken": token})
        status, cookies, _ = self.http("POST", "/login/", body=form.encode(), headers={
            "Content-Type": "application/x-www-form-urlencoded", "Cookie": f"csrftoken={cookie}", **headers})
        return status, cookies

    def open(self, key: str | None = None, **body) -> dict:
        status, session = call_api(self.url, "POST", "/api/v1/sessions", bearer=key or self.key,
                                   body={"conversation_id": "configuration", **body})
        assert status == 201, session
        return session

    def put(self, session: dict, path: str, data: bytes) -> tuple[int, object]:
        return call_api(self.url, "PUT", f"/api/v1/sessions/{session['id']}/files/{path}", bearer=session["token"],
                        raw=data)

    def get(self, session: dict, path: str) -> tuple[int, str]:
        """(status, the file's text, or the error as JSON text)."""
        status, _, body = self.http("GET", f"/api/v1/sessions/{session['id']}/files/{path}",
                                    headers={"Authorization": f"Bearer {session['token']}"})
        return status, body

    def run(self, session: dict, *argv: str) -> tuple[int, dict]:
        return call_api(self.url, "POST", f"/api/v1/sessions/{session['id']}/commands", bearer=session["token"],
                        body={"bin": argv[0], "args": list(argv[1:]), "wait": True})

    def workspace(self, session: dict) -> Path:
        """The session's /workspace as the host sees it (the server's bubblewrap sandboxes)."""
        return self.data / "sandboxes" / "bubblewrap" / session["id"] / "workspace"

    def command_states(self, session: dict) -> list[str]:
        """The states of the session's commands, from the server's database, oldest first."""
        with contextlib.closing(sqlite3.connect(self.database)) as db:
            return [state for (state,) in db.execute(
                "SELECT state FROM agent_sessions_commandrun WHERE session_id = ? ORDER BY created_at",
                (uuid.UUID(session["id"]).hex,))]


def _cookie(headers: list[str], name: str):
    for header in headers:
        jar = SimpleCookie()
        jar.load(header)
        if name in jar:
            return jar[name]
    raise AssertionError(f"no {name} cookie among {headers}")


def _wait_until_listening(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start listening")


@pytest.fixture(scope="module")
def deployment():
    base = Path(tempfile.mkdtemp(prefix="airlock-configuration-"))
    base.chmod(0o711)  # sandboxes (uid 65534) traverse it to their workspace
    data, database = base / "data", base / "db" / "airlock.sqlite3"  # the data directory does not exist yet
    database.parent.mkdir()
    app = _git_repository(base / "repos" / "app", {"app.py": "APP = 'demo only'\n"})
    docs = _git_repository(base / "repos" / "docs", {"README.md": "shared with every tenant\n"})
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in TABLE and not k.startswith("AIRLOCK_")},
        "SECRET_KEY": "configuration-test-secret-key-" + "x" * 40,
        "AIRLOCK_DATA_DIR": str(data), "DATABASE_URL": f"sqlite:///{database}",
        "AIRLOCK_SANDBOX_DIR": str(data / "sandboxes"), "AIRLOCK_ROOTFS_DIR": str(django_settings.AIRLOCK_ROOTFS_DIR),
        "AIRLOCK_HOST": HOST, "AIRLOCK_PORT": str(port),
        "ALLOWED_HOSTS": f"{HOST},airlock.internal", "CSRF_TRUSTED_ORIGINS": "https://airlock.example.com",
        "AIRLOCK_SECURE_COOKIES": "false", "AIRLOCK_BEHIND_TLS_PROXY": "true", "AIRLOCK_SESSION_COOKIE_AGE_S": "120",
        "AIRLOCK_MAX_FILE_BYTES": "2048", "AIRLOCK_MAX_REQUEST_BYTES": "65536", "AIRLOCK_API_THREADS": "2",
        "AIRLOCK_API_WAITING_PER_TENANT": "2",  # one tenant may take both threads: the test below needs it
        "AIRLOCK_WORKSPACE_REPOS": f" demo:app={app} , docs={docs} ", "AIRLOCK_REDACT_VALUES": " , ".join(SECRETS),
        "AIRLOCK_SERVER_CPU": str(SERVER_CPU),
    }
    log = base / "server.log"
    server = None
    try:
        _manage(env, "migrate", "--no-input", "-v", "0")
        printed = _manage(env, "demo_setup")
        globex_key = _manage(env, "shell", "--no-imports", "-c", GLOBEX).strip().splitlines()[-1]
        with log.open("ab") as out:
            server = subprocess.Popen([sys.executable, "-m", "controlplane.serve", "-b", HOST, "-p", str(port),
                                       "controlplane.asgi:application"], cwd=ROOT, env=env, stdout=out,
                                      stderr=subprocess.STDOUT)
        _wait_until_listening(port, server, log)
        yield Deployment(port=port, base=base, data=data, database=database, log=log, printed=printed,
                         key=re.search(r"alk_\S+", printed).group(0), globex_key=globex_key,
                         password=re.search(r"password: (\S+)", printed).group(1), pid=server.pid)
    finally:
        if server is not None:
            stop_server(server)
        if log.exists():
            print(f"--- server.log\n{log.read_text(errors='replace')[-4000:]}")
        shutil.rmtree(base, ignore_errors=True)


# -- the server, as the environment configures it --------------------------------------------

def test_a_missing_data_directory_is_created_and_database_url_places_the_database(deployment):
    assert deployment.data.is_dir() and stat.S_IMODE(deployment.data.stat().st_mode) == 0o711
    assert not (deployment.data / "airlock.sqlite3").exists()  # DATABASE_URL's path instead
    with sqlite3.connect(deployment.database) as db:
        assert db.execute("SELECT slug FROM controlplane_tenant ORDER BY slug").fetchall() == [("demo",), ("globex",)]


def test_demo_setup_prints_the_address_airlock_host_and_port_serve(deployment):
    assert f"Dashboard  {deployment.url}/" in deployment.printed
    curl = re.search(r"curl -H 'Authorization: Bearer (\S+)' (\S+)/api/v1/whoami", deployment.printed)
    status, body = call_api(curl.group(2), "GET", "/api/v1/whoami", bearer=curl.group(1))
    assert status == 200 and body["tenant"]["slug"] == "demo"


def test_allowed_hosts_are_the_only_host_names_and_websocket_origins_served(deployment):
    assert deployment.http("GET", "/login/", host="airlock.internal")[0] == 200
    assert deployment.http("GET", "/login/", host="127.0.0.1")[0] == 400  # a default, replaced
    url = f"ws://{HOST}:{deployment.port}/ws/t/demo/sessions/"
    with connect(url, origin="http://airlock.internal", open_timeout=10):
        pass  # the handshake passed (the consumer then closes it: nobody is signed in)
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin="http://localhost", open_timeout=10)
    assert refused.value.response.status_code == 403


def test_airlock_secure_cookies_and_session_cookie_age_s_shape_the_login_cookies(deployment):
    status, cookies, _ = deployment.http("GET", "/login/")
    assert not _cookie(cookies, "csrftoken")["secure"]
    status, cookies = deployment.log_in(deployment.password)
    assert status == 302
    session = _cookie(cookies, "sessionid")
    assert session["max-age"] == "120" and not session["secure"]


def test_csrf_trusted_origins_lets_a_proxy_on_another_origin_post_forms(deployment):
    assert deployment.log_in("wrong", Origin="https://airlock.example.com")[0] == 200  # the form, not a 403
    assert deployment.log_in("wrong", Origin="https://elsewhere.example.com")[0] == 403


def test_airlock_behind_tls_proxy_trusts_x_forwarded_proto(deployment):
    origin = f"https://{HOST}:{deployment.port}"
    assert deployment.log_in("wrong", Origin=origin, **{"X-Forwarded-Proto": "https"})[0] == 200
    assert deployment.log_in("wrong", Origin=origin)[0] == 403  # plain HTTP from an https:// page: foreign


def test_without_airlock_static_root_the_server_serves_the_static_files_itself(deployment):
    status, _, body = deployment.http("GET", "/static/favicon.svg")
    assert status == 200 and body == (ROOT / "static" / "favicon.svg").read_text()


def test_airlock_max_request_bytes_refuses_a_longer_body_before_reading_it(deployment):
    status, _, body = deployment.http("POST", "/login/", body=b"x" * 65537)
    assert status == 413 and '"request_too_large"' in body and "65536 bytes" in body
    assert deployment.http("POST", "/login/", body=b"x" * 65536)[0] == 403  # read: CSRF refuses it


def test_a_refusal_written_before_django_carries_the_security_headers(deployment):
    """The 413 is written by the server's own layer, before Django's handler: it carries the
    API's headers all the same, and HSTS where the TLS proxy in front says the request was HTTPS."""
    for forwarded, hsts in (("https", True), (None, False)):
        connection = http.client.HTTPConnection(HOST, deployment.port, timeout=30)
        try:
            connection.request("POST", "/api/v1/sessions", body=b"x" * 65537,
                               headers={"Host": f"{HOST}:{deployment.port}",
                                        **({"X-Forwarded-Proto": forwarded} if forwarded else {})})
            response = connection.getresponse()
            response.read()
        finally:
            connection.close()
        assert response.status == 413
        assert response.getheader("Content-Security-Policy") == "default-src 'none'; frame-ancestors 'none'"
        assert response.getheader("X-Content-Type-Options") == "nosniff"
        assert (response.getheader("Strict-Transport-Security") is not None) is hsts, forwarded


def test_a_chunked_body_is_counted_as_it_arrives_and_refused_past_the_limit(deployment):
    connection = http.client.HTTPConnection(HOST, deployment.port, timeout=30)
    try:  # no Content-Length to refuse it by: it is counted as it arrives
        connection.request("POST", "/login/", body=iter([b"x" * 40_000, b"x" * 40_000]), encode_chunked=True,
                           headers={"Host": f"{HOST}:{deployment.port}", "Transfer-Encoding": "chunked"})
        response = connection.getresponse()
        assert response.status == 413 and b"65536 bytes" in response.read()
        assert response.getheader("Server") is None  # the server does not say what it is
    finally:
        connection.close()
    assert deployment.http("GET", "/healthz")[0] == 200  # and it serves on


def test_after_a_413_the_connection_closes_so_nothing_sent_next_is_taken_for_a_request(deployment):
    """A client that waits for `100 Continue` gets the 413 and sends no body: were the connection
    kept, its next request would be read as the refused body."""
    with socket.create_connection((HOST, deployment.port), timeout=10) as raw:
        raw.sendall(f"POST /login/ HTTP/1.1\r\nHost: {HOST}:{deployment.port}\r\nContent-Length: 100000000\r\n"
                    "Expect: 100-continue\r\n\r\n".encode())
        answer = b""
        while b"65536 bytes" not in answer:
            answer += raw.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed already: as good
            raw.sendall(f"GET /healthz HTTP/1.1\r\nHost: {HOST}:{deployment.port}\r\n\r\n".encode())
            assert raw.recv(65536) == b""  # closed: the GET was neither answered nor swallowed


def test_airlock_max_file_bytes_bounds_the_files_written_and_read(deployment, sandboxes):
    session = deployment.open()
    status, body = deployment.put(session, "big.bin", b"x" * 2049)
    assert status == 413 and body["error"] == "file_too_large"
    assert deployment.put(session, "fits.bin", b"x" * 2048)[0] == 204
    assert deployment.put(session, "grow.py", b"open('grown.txt', 'w').write('x' * 3000)\n")[0] == 204
    assert deployment.run(session, "python3", "grow.py")[1]["exit_code"] == 0
    status, body = deployment.get(session, "grown.txt")
    assert status == 413 and json.loads(body)["error"] == "file_too_large"


def test_airlock_api_threads_bounds_the_api_calls_that_wait_for_a_runner(deployment, sandboxes):
    first, second, third = sessions = [deployment.open() for _ in range(3)]
    for session in (first, second):
        assert deployment.put(session, "gated.py", GATED)[0] == 204
    assert deployment.put(third, "say.py", b"print('served')\n")[0] == 204
    answers = {}

    def call(session: dict, script: str) -> None:
        answers[session["id"]] = deployment.run(session, "python3", script)

    calls = {session["id"]: threading.Thread(target=call, args=(session, script))
             for session, script in ((first, "gated.py"), (second, "gated.py"), (third, "say.py"))}
    states = deployment.command_states
    try:
        for session in (first, second):
            calls[session["id"]].start()
        # Both calls now hold the server's two API threads: their commands wait at their gates.
        wait_until(lambda: states(first) == states(second) == ["running"], what="the two gated commands")
        calls[third["id"]].start()
        assert call_api(deployment.url, "GET", "/api/v1/whoami", bearer=deployment.key)[0] == 200
        assert states(first) == states(second) == ["running"]  # answered while both threads were busy
        calls[third["id"]].join(1)  # the chance to be served, had the server a third thread
        assert calls[third["id"]].is_alive() and states(third) == []  # the view has not even run
        (deployment.workspace(first) / "go").touch()
        for session in (first, third):
            calls[session["id"]].join(30)
        assert states(second) == ["running"]  # the third call had the thread the first one freed
    finally:
        for session in sessions:
            (deployment.workspace(session) / "go").touch()
        for thread in calls.values():
            if thread.ident is not None:
                thread.join(30)
    assert all(answers[s["id"]][0] == 200 and answers[s["id"]][1]["exit_code"] == 0 for s in sessions), answers
    first_end, second_end = (datetime.fromisoformat(answers[s["id"]][1]["ended_at"]) for s in (first, second))
    created = datetime.fromisoformat(answers[third["id"]][1]["created_at"])
    assert first_end <= created < second_end, (first_end, created, second_end)


def test_a_waiting_call_whose_client_left_before_a_thread_took_it_never_runs(deployment, sandboxes):
    """An agent whose HTTP client timed out retries: the call it abandoned, still queued for one
    of the server's two API threads, must not run its command a second time later."""
    first, second, third = sessions = [deployment.open() for _ in range(3)]
    for session in (first, second):
        assert deployment.put(session, "gated.py", GATED)[0] == 204
    assert deployment.put(third, "say.py", b"print('served')\n")[0] == 204
    holders = [threading.Thread(target=deployment.run, args=(session, "python3", "gated.py"))
               for session in (first, second)]
    states = deployment.command_states
    try:
        for thread in holders:
            thread.start()
        wait_until(lambda: states(first) == states(second) == ["running"], what="the two gated commands")
        connection = http.client.HTTPConnection(HOST, deployment.port, timeout=10)
        connection.request("POST", f"/api/v1/sessions/{third['id']}/commands",
                           body=json.dumps({"bin": "python3", "args": ["say.py"], "wait": True}),
                           headers={"Authorization": f"Bearer {third['token']}", "Content-Type": "application/json"})
        time.sleep(0.5)  # the request is whole at the server, queued for a thread
        connection.close()  # the client gives up
        time.sleep(0.5)
    finally:
        for session in sessions[:2]:
            (deployment.workspace(session) / "go").touch()
        for thread in holders:
            thread.join(30)
    assert states(first) == states(second) == ["exited"]
    assert deployment.run(third, "python3", "say.py")[0] == 200  # the threads are free again
    assert states(third) == ["exited"]  # ... and only the call its client waited for ran


def test_airlock_workspace_repos_gives_a_tenant_its_own_and_every_tenant_the_shared(deployment, sandboxes):
    own = deployment.open(workspace={"repo": "app"})
    assert deployment.get(own, "app.py") == (200, "APP = 'demo only'\n")
    shared = deployment.open(deployment.globex_key, workspace={"repo": "docs"})
    assert deployment.get(shared, "README.md") == (200, "shared with every tenant\n")
    status, refused = call_api(deployment.url, "POST", "/api/v1/sessions", bearer=deployment.globex_key,
                               body={"conversation_id": "c", "workspace": {"repo": "app"}})
    assert status == 400 and "not an allowlisted repository" in refused["detail"]


def test_airlock_redact_values_never_reach_command_output_or_the_access_log(deployment, sandboxes):
    session = deployment.open()
    assert deployment.put(session, "say.py", f"print('{SECRETS[0]} and {SECRETS[1]}')\n".encode())[0] == 204
    status, command = deployment.run(session, "python3", "say.py")
    assert status == 200 and command["output"].strip() == "[redacted] and [redacted]"
    deployment.get(session, SECRETS[1])  # a secret in a request's path
    wait_until(lambda: "/files/[redacted]" in deployment.log.read_text(), what="the access-log line")
    assert not any(secret in deployment.log.read_text() for secret in SECRETS)


def test_airlock_server_cpu_keeps_the_servers_threads_on_it_and_gives_sandboxes_every_cpu(deployment, sandboxes):
    every = _allowed_cpus("/proc/self/status")  # this test's process is kept to no CPU: the server started with these
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine gives the tests one CPU: the server and its sandboxes share it")
    session = deployment.open()
    assert deployment.put(session, "cpus.py", CPUS_PY)[0] == 204
    status, command = deployment.run(session, "python3", "cpus.py")
    assert status == 200 and command["output"].strip() == every, command
    # Every thread of the server, those it started for these calls included, is on the one CPU.
    threads = threads_cpus(deployment.pid)
    assert len(threads) > 5 and set(threads) == {str(SERVER_CPU)}, threads


# -- the runner, in-process --------------------------------------------------------------------

def test_runners_beat_every_heartbeat_s_and_one_silent_for_dead_after_s_is_declared_dead(transactional_db,
                                                                                           settings, monkeypatch):
    settings.AIRLOCK_RUNNER_HEARTBEAT_S, settings.AIRLOCK_RUNNER_DEAD_AFTER_S = 1, 10
    waits = []  # what the heartbeat task asks to wait before each beat
    real_sleep = asyncio.sleep

    async def sleep(delay, *args, **kwargs):
        task = asyncio.current_task()
        if task is not None and task.get_coro().__qualname__ == "beat_forever":
            waits.append(delay)
        return await real_sleep(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    with running_runner() as runner:
        beats = set()

        def beaten() -> bool:
            beats.add(Runner.objects.get(pk=runner.id).heartbeat_at)
            return len(beats) >= 4  # its registration, then three beats

        wait_until(beaten, timeout_s=30, what="three heartbeats")
    assert len(waits) >= 3 and set(waits) == {1}, waits  # the default would wait 2 s
    now = timezone.now()
    Runner.objects.create(id="silent", hostname="elsewhere", pid=1, heartbeat_at=now - timedelta(seconds=10 + 1))
    Runner.objects.create(id="quiet", hostname="elsewhere", pid=2, heartbeat_at=now - timedelta(seconds=10 - 5))
    assert records.runners_declare_dead(local_pids_gone=False, exclude=runner.id) == ["silent"]
    assert Runner.objects.get(pk="silent").stop_reason == "stopped answering (no heartbeat)"
    assert Runner.objects.get(pk="quiet").stopped_at is None  # silent, but not for dead-after yet


def test_airlock_runner_reap_interval_s_is_how_often_orphan_sandboxes_are_destroyed(agent, settings):
    settings.AIRLOCK_RUNNER_HEARTBEAT_S, settings.AIRLOCK_RUNNER_REAP_INTERVAL_S = 1, 1
    session = agent.open()
    assert agent.as_session(session).delete(f"/api/v1/sessions/{session['id']}").status_code == 200
    driver = get_driver("bubblewrap")
    # A sandbox of that ended session that nobody destroyed (a crash between the two).
    orphan = driver.create(SandboxSpec(tenant="acme", session_id=session["id"], limits=Limits(command_timeout_s=20)))
    try:
        assert session["id"] in driver.list_sandboxes()
        wait_until(lambda: session["id"] not in driver.list_sandboxes(), timeout_s=6, what="the orphan to be reaped")
    finally:
        if session["id"] in driver.list_sandboxes():
            driver.destroy(orphan)


def test_airlock_runner_threads_bounds_the_commands_that_run_at_once(transactional_db, sandboxes, acme, acme_policy,
                                                                      make_key, api, settings):
    settings.AIRLOCK_RUNNER_THREADS = 4  # read when the runner starts
    with running_runner():
        agent = Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)
        sessions = [agent.open() for _ in range(5)]
        workspaces = {s["id"]: get_driver("bubblewrap").sandbox_dir / s["id"] / "workspace" for s in sessions}
        for session in sessions:
            assert agent.put(session, "gated.py", GATED).status_code == 204
        commands = [(session, agent.run(session, "python3", "gated.py", wait=False).json()) for session in sessions]

        def marked(name: str) -> set[str]:
            return {session_id for session_id, workspace in workspaces.items() if (workspace / name).exists()}

        try:
            wait_until(lambda: len(marked("started")) >= 4, timeout_s=30, what="four commands to start")
            time.sleep(1)  # the chance to start, had the fifth a thread
            running = marked("started")
            assert len(running) == 4 and not marked("ended"), running  # four run at once, all at their gates
            (fifth,) = set(workspaces) - running
            released = sorted(running)[0]
            for session_id in (released, fifth):
                (workspaces[session_id] / "go").touch()
            wait_until(lambda: fifth in marked("started"), timeout_s=30, what="the fifth command to start")
            # It started once the released one had ended, while the three others still ran.
            assert marked("ended") - {fifth} == {released}
        finally:
            for workspace in workspaces.values():
                (workspace / "go").touch()

        def finished():
            found = [agent.as_session(s).get(f"/api/v1/sessions/{s['id']}/commands/{c['id']}").json()
                     for s, c in commands]
            return found if all(command["state"] == "exited" for command in found) else None

        done = wait_until(finished, timeout_s=30, what="the five commands")
    assert [command["exit_code"] for command in done] == [0] * 5


def test_airlock_rootfs_dir_is_where_sandboxes_find_their_root_filesystem(agent, settings, tmp_path):
    built, cache = rootfs.current(), rootfs.cache_dir()
    settings.AIRLOCK_ROOTFS_DIR = str(tmp_path)  # an empty cache
    refused = agent.client.post("/api/v1/sessions", {"conversation_id": "c"}, content_type="application/json")
    assert refused.status_code == 503 and "root filesystem is not built" in refused.json()["detail"]
    (tmp_path / built.recipe_hash).mkdir()  # the current recipe's entry, naming the tree built before
    shutil.copy(cache / built.recipe_hash / "rootfs.json", tmp_path / built.recipe_hash / "rootfs.json")
    assert agent.open()["state"] == "ready"
