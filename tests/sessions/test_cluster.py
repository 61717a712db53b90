"""Separate runners over Redis, as in production: a server without a runner of its own
and two `manage.py runner` processes, sharing a database, each owning its sandboxes.

Needs Redis (127.0.0.1:6379, always there on these machines; required in CI)."""

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from websockets.sync.client import connect

from sessions.lifecycle import RELEASE_TIMEOUT_S
from sessions.runtimes.bubblewrap import BubblewrapDriver
from tests.http import call_api
from tests.live import _free_port, _wait_until_listening

ROOT = Path(__file__).resolve().parents[2]
REDIS = ("127.0.0.1", 6379)
SLEEPER = b"import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"


def _redis_up() -> bool:
    try:
        with socket.create_connection(REDIS, timeout=1):
            return True
    except OSError:
        return False


def wait_until(check, timeout_s: float = 20, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Cluster:
    url: str
    key: str
    data: Path
    env: dict
    server: subprocess.Popen
    runners: dict = field(default_factory=dict)  # pid -> Popen

    def call(self, method: str, path: str, body=None, token: str | None = None, raw: bytes | None = None,
             timeout: float = 60):
        return call_api(self.url, method, path, bearer=token or self.key, body=body, raw=raw, timeout=timeout)

    def start_sleeper(self) -> tuple[dict, dict]:
        status, session = self.call("POST", "/api/v1/sessions", {"conversation_id": "cluster"})
        assert status == 201, session
        path = f"/api/v1/sessions/{session['id']}"
        assert self.call("PUT", f"{path}/files/sleep.py", raw=SLEEPER, token=session["token"])[0] == 204
        status, command = self.call("POST", f"{path}/commands", {"bin": "python3", "args": ["sleep.py"]},
                                    token=session["token"])
        assert status == 202, command
        wait_until(lambda: self.command(session, command)["state"] == "running", what="the command to run")
        return session, command

    def command(self, session: dict, command: dict) -> dict:
        return self.call("GET", f"/api/v1/sessions/{session['id']}/commands/{command['id']}")[1]

    def owner(self, session: dict) -> tuple[str, int]:
        with sqlite3.connect(self.data / "airlock.sqlite3") as db:
            return db.execute("SELECT r.id, r.pid FROM agent_sessions_session s JOIN agent_sessions_runner r "
                              "ON r.id = s.runner_id WHERE s.id = ?", (session["id"].replace("-", ""),)).fetchone()

    def sandbox_left(self, session: dict) -> bool:
        driver = BubblewrapDriver(sandbox_dir=self.data / "sandboxes")
        return session["id"] in driver.list_sandboxes()


def _allowed_cpus(status_file: str) -> str:
    with open(status_file) as status:
        return re.search(r"^Cpus_allowed_list:\s*(\S+)", status.read(), re.MULTILINE).group(1)


def threads_cpus(pid: int) -> list[str]:
    """The CPUs each thread of the process may run on (a thread that ended meanwhile is skipped)."""
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            found.append(_allowed_cpus(f"/proc/{pid}/task/{tid}/status"))
    return found


CPUS_PY = b"print(open('/proc/self/status').read().split('Cpus_allowed_list:')[1].split()[0])\n"


def _manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _start(env: dict, log: Path, *command: str) -> subprocess.Popen:
    with log.open("ab") as out:  # read back when a test fails (printed at teardown)
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def cluster(sandboxes):
    if not _redis_up():
        if os.environ.get("CI") == "true":
            pytest.fail("Redis is required in CI at 127.0.0.1:6379")
        pytest.skip("Redis is not running at 127.0.0.1:6379")
    data = Path(tempfile.mkdtemp(prefix="airlock-cluster-"))
    data.chmod(0o711)  # sandboxes (uid 65534) traverse it to their workspace
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DEBUG"}},
        "AIRLOCK_DATA_DIR": str(data), "AIRLOCK_SANDBOX_DIR": str(data / "sandboxes"),
        "SECRET_KEY": "cluster-test-secret-key-" + "x" * 40, "REDIS_URL": "redis://{}:{}/0".format(*REDIS),
        "AIRLOCK_CHANNEL_PREFIX": f"airlock-test-{uuid.uuid4().hex[:8]}", "AIRLOCK_EMBEDDED_RUNNER": "0",
        "AIRLOCK_RUNNER_HEARTBEAT_S": "1", "AIRLOCK_RUNNER_DEAD_AFTER_S": "3",
        "AIRLOCK_OUTPUT_BYTES_PER_S": str(2**30),  # unpaced: the floods below test the WebSocket's backpressure
    }
    _manage(env, "migrate", "--no-input", "-v", "0")
    key = re.search(r"alk_\S+", _manage(env, "demo_setup")).group(0)
    port = _free_port()
    processes = [_start(env, data / f"runner-{n}.log", sys.executable, "manage.py", "runner") for n in range(2)]
    server = _start(env, data / "server.log", sys.executable, "-m", "controlplane.serve", "-b", "127.0.0.1",
                    "-p", str(port), "controlplane.asgi:application")
    processes.append(server)
    try:
        _wait_until_listening(port, server)
        with sqlite3.connect(data / "airlock.sqlite3") as db:
            wait_until(lambda: db.execute("SELECT count(*) FROM agent_sessions_runner WHERE stopped_at IS NULL")
                       .fetchone()[0] == 2, what="two runners")
        yield Cluster(url=f"http://127.0.0.1:{port}", key=key, data=data, env=env, server=server,
                      runners={p.pid: p for p in processes[:2]})
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in sorted(data.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}")
        shutil.rmtree(data, ignore_errors=True)


def test_a_kill_sent_by_the_server_reaches_the_runner_process_that_owns_the_session(cluster):
    session, command = cluster.start_sleeper()
    _, owner_pid = cluster.owner(session)
    assert owner_pid in cluster.runners  # not the server: it has no runner of its own
    asked = time.monotonic()
    status, body = cluster.call("POST", f"/api/v1/sessions/{session['id']}/kill")
    assert status == 200 and body["state"] == "killed"
    # The owner answered: a kill that never reached it would wait out the release timeout.
    assert time.monotonic() - asked < RELEASE_TIMEOUT_S / 2
    wait_until(lambda: cluster.command(session, command)["state"] == "killed", what="the command to die")
    assert not cluster.sandbox_left(session)
    assert cluster.runners[owner_pid].poll() is None  # the runner lives on


def test_a_runner_killed_mid_command_leaves_its_session_failed_and_no_sandbox(cluster):
    session, command = cluster.start_sleeper()
    _, owner_pid = cluster.owner(session)
    victim = cluster.runners.pop(owner_pid)
    victim.kill()  # SIGKILL: no chance to clean up
    victim.wait(10)
    state = wait_until(lambda: cluster.call("GET", f"/api/v1/sessions/{session['id']}")[1]["state"] == "failed",
                       what="the session to fail")
    assert state
    body = cluster.call("GET", f"/api/v1/sessions/{session['id']}")[1]
    assert "stopped answering" in body["state_reason"]
    assert cluster.command(session, command)["state"] == "failed", cluster.command(session, command)
    wait_until(lambda: not cluster.sandbox_left(session), what="the sandbox to be reaped")
    # The surviving runner takes the next session.
    status, fresh = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "after"})
    assert status == 201 and cluster.owner(fresh)[1] in cluster.runners


SPEW = b"import sys\nline = 'x' * 999 + '\\n'\nfor _ in range(15_000):\n    sys.stdout.write(line)\n"  # 15 MB


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) / 1024


def test_a_subscriber_that_stops_reading_is_told_it_lagged_and_the_server_does_not_grow(cluster):
    status, session = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "slow-reader"})
    assert status == 201, session
    path = f"/api/v1/sessions/{session['id']}"
    assert cluster.call("PUT", f"{path}/files/spew.py", raw=SPEW, token=session["token"])[0] == 204
    url = cluster.url.replace("http", "ws") + f"/ws/sessions/{session['id']}/"
    # max_queue: the client stops taking frames off the socket once two wait unread.
    with connect(url, subprotocols=["airlock.v1", f"airlock.token.{session['token']}"], max_queue=2,
                 max_size=None) as ws:
        time.sleep(1)
        before = _rss_mb(cluster.server.pid)
        for _ in range(6):  # 90 MB of output (each command within the 16 MiB cap) while the subscriber reads nothing
            status, run = cluster.call("POST", f"{path}/commands", {"bin": "python3", "args": ["spew.py"],
                                                                     "wait": True}, token=session["token"])
            assert status == 200 and run["exit_code"] == 0 and run["output_bytes"] == 15_000_000, run
        grown = _rss_mb(cluster.server.pid) - before
        events = []
        while sum(event["event"] == "command.exited" for event in events) < 6:
            events.append(json.loads(ws.recv(timeout=20)))
    assert grown < 48, f"the server grew by {grown:.0f} MB for a subscriber that read nothing"
    lagged = [event["missed"] for event in events if event["event"] == "lagged"]
    assert lagged and sum(lagged) > 100  # output was dropped for it, and it was told
    received = sum(len(event["data"]) for event in events if event["event"] == "command.output")
    # What it got: the kernel's socket buffers, the outbox and the layer's queue, not the 90 MB.
    assert received < 45_000_000


def test_the_server_hears_its_runners_while_a_websocket_waits_and_after_one_leaves(cluster):
    """The server's WebSocket consumers and its calls to runners receive through one channel
    layer (controlplane/channel_layer.py): an idle subscriber kept channels_redis from reading
    a runner's reply, and a session create waited out its 120 s."""
    status, watched = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "watched"})
    assert status == 201, watched
    url = cluster.url.replace("http", "ws") + f"/ws/sessions/{watched['id']}/"
    with connect(url, subprotocols=["airlock.v1", f"airlock.token.{watched['token']}"]) as ws:
        assert json.loads(ws.recv(timeout=20))["event"] == "session.state"  # joined; nothing more comes
        for _ in range(3):
            status, session = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "while-watched"}, timeout=20)
            assert status == 201, session
    for _ in range(3):  # and once it left (its consumer's receive was cancelled)
        status, session = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "after-watched"}, timeout=20)
        assert status == 201, session


def test_a_request_body_past_the_limit_gets_413_before_it_is_read(cluster):
    host, port = cluster.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    # Declared too long, and not even signed in: refused from the headers, while the client is
    # still sending its body (which is read and dropped, so it gets the answer, not a reset).
    connection.putrequest("PUT", "/api/v1/sessions/00000000-0000-0000-0000-000000000000/files/big.bin")
    connection.putheader("Content-Length", str(64 * 2**20))
    connection.endheaders()
    connection.send(b"x" * 2**20)
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"] == "request_too_large"
    connection.close()
    # A file over AIRLOCK_MAX_FILE_BYTES but within the request bound: the API's own 413.
    status, session = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "big"})
    status, body = cluster.call("PUT", f"/api/v1/sessions/{session['id']}/files/big.bin", raw=b"x" * (4 * 2**20 + 1),
                                token=session["token"])
    assert status == 413 and body["error"] == "file_too_large"


def test_the_access_log_never_holds_a_secret(cluster):
    secret = cluster.env["SECRET_KEY"]
    _, session = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "log"})
    cluster.call("GET", f"/api/v1/sessions/{session['id']}/files/{secret}", token=session["token"])
    encoded = f"%{ord(secret[0]):02x}{secret[1:]}"  # the same secret, its first letter percent-encoded
    cluster.call("GET", f"/api/v1/sessions/{session['id']}/files/{encoded}", token=session["token"])
    # A WebSocket handshake's line (the server logs its path and query as it accepts or refuses)
    ws_url = cluster.url.replace("http://", "ws://") + f"/ws/sessions/{session['id']}/?x={encoded}"
    with contextlib.suppress(Exception), connect(ws_url, open_timeout=10) as ws:
        ws.recv(timeout=10)
    log = cluster.data / "server.log"
    wait_until(lambda: "/files/[redacted]" in log.read_text() and "held a secret" in log.read_text(),
               what="the access-log lines")
    assert secret[1:] not in log.read_text()


def test_a_runner_process_keeps_its_threads_to_one_cpu_and_gives_its_sandboxes_every_cpu(cluster):
    every = sorted(os.sched_getaffinity(0))
    if len(every) < 2:
        pytest.skip("this machine gives the tests one CPU: a runner and its sandboxes share it")
    status, session = cluster.call("POST", "/api/v1/sessions", {"conversation_id": "cpus"})
    assert status == 201, session
    path = f"/api/v1/sessions/{session['id']}"
    assert cluster.call("PUT", f"{path}/files/cpus.py", raw=CPUS_PY, token=session["token"])[0] == 204
    status, command = cluster.call("POST", f"{path}/commands", {"bin": "python3", "args": ["cpus.py"], "wait": True},
                                   token=session["token"])
    assert status == 200 and command["output"].strip() == _allowed_cpus("/proc/self/status"), command
    _, owner_pid = cluster.owner(session)
    assert set(threads_cpus(owner_pid)) == {str(every[owner_pid % len(every)])}  # AIRLOCK_SERVER_CPU=auto
    cluster.call("DELETE", path, token=session["token"])
