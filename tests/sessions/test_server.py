"""The server as `make run` starts it (controlplane.serve, its own runner, SQLite), stopped the
way an operator stops it."""

import contextlib
import os
import re
import shutil
import signal
import socket
import sqlite3
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sessions.runtimes.bubblewrap import BubblewrapDriver
from tests.http import call_api
from tests.live import _free_port, _wait_until_listening
from tests.sessions.test_cluster import SLEEPER, _manage, _start, wait_until


@contextlib.contextmanager
def serving():
    """A server as `make run` starts it, on a fresh data directory: (url, demo key, data dir, process)."""
    data = Path(tempfile.mkdtemp(prefix="airlock-server-"))
    data.chmod(0o711)  # sandboxes (uid 65534) traverse it to their workspace
    env = {**{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}},
           "AIRLOCK_DATA_DIR": str(data), "AIRLOCK_SANDBOX_DIR": str(data / "sandboxes"),
           "SECRET_KEY": "server-test-secret-key-" + "x" * 40}
    server = None
    try:
        _manage(env, "migrate", "--no-input", "-v", "0")
        key = re.search(r"alk_\S+", _manage(env, "demo_setup")).group(0)
        port = _free_port()
        server = _start(env, data / "server.log", sys.executable, "-m", "controlplane.serve", "-b", "127.0.0.1",
                        "-p", str(port), "controlplane.asgi:application")
        _wait_until_listening(port, server)
        yield f"http://127.0.0.1:{port}", key, data, server
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait(10)
        shutil.rmtree(data, ignore_errors=True)


def test_sigterm_fails_the_servers_sessions_and_destroys_their_sandboxes(sandboxes):
    with serving() as (url, key, data, server):
        status, session = call_api(url, "POST", "/api/v1/sessions", bearer=key, body={"conversation_id": "stop"})
        assert status == 201, session
        path = f"/api/v1/sessions/{session['id']}"
        assert call_api(url, "PUT", f"{path}/files/sleep.py", bearer=session["token"], raw=SLEEPER)[0] == 204
        status, command = call_api(url, "POST", f"{path}/commands", bearer=session["token"],
                                   body={"bin": "python3", "args": ["sleep.py"]})
        assert status == 202, command
        wait_until(lambda: call_api(url, "GET", f"{path}/commands/{command['id']}", bearer=key)[1]["state"]
                   == "running", what="the command to run")
        driver = BubblewrapDriver(sandbox_dir=data / "sandboxes")
        assert session["id"] in driver.list_sandboxes()
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        with sqlite3.connect(data / "airlock.sqlite3") as db:
            state, reason = db.execute("SELECT state, state_reason FROM agent_sessions_session WHERE id = ?",
                                       (session["id"].replace("-", ""),)).fetchone()
            stopped = db.execute("SELECT count(*) FROM agent_sessions_runner WHERE stopped_at IS NULL").fetchone()
        assert (state, reason) == ("failed", "the server stopped")
        assert stopped == (0,)  # the runner says it stopped: nobody has to declare it dead
        assert session["id"] not in driver.list_sandboxes()


def test_a_client_that_goes_away_mid_upload_leaves_the_old_file_as_it_was(sandboxes):
    with serving() as (url, key, data, _server):
        status, session = call_api(url, "POST", "/api/v1/sessions", bearer=key, body={"conversation_id": "upload"})
        assert status == 201, session
        path = f"/api/v1/sessions/{session['id']}/files/keep.py"
        assert call_api(url, "PUT", path, bearer=session["token"], raw=b"old = 1\n")[0] == 204
        port = int(url.rsplit(":", 1)[1])
        for sent in (0, 1, 200_000, 399_999):  # nothing, a byte, half, all but the last byte
            with socket.create_connection(("127.0.0.1", port), timeout=10) as upload:
                upload.sendall(f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {session['token']}"
                               f"\r\nContent-Type: application/octet-stream\r\nContent-Length: 400000\r\n\r\n"
                               .encode() + b"#" * sent)
                time.sleep(0.3)
            # the client is gone: whatever the server does with the rest, the old file stays whole
            time.sleep(0.5)
            request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {session['token']}"})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.read() == b"old = 1\n", f"after a client left {sent} bytes in"
        workspace = data / "sandboxes" / "bubblewrap" / session["id"] / "workspace"
        assert [p.name for p in workspace.iterdir()] == ["keep.py"]  # no partial or hidden file
