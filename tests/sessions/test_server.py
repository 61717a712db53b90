"""The server as `make run` starts it (controlplane.serve, its own runner, SQLite), stopped the
way an operator stops it."""

import contextlib
import http.client
import os
import re
import shutil
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from sessions.runtimes.bubblewrap import BubblewrapDriver
from tests.http import call_api
from tests.live import _free_port, _wait_until_listening, stop_server
from tests.sessions.test_cluster import SLEEPER, _manage, _start, wait_until


@contextlib.contextmanager
def serving(**extra_env: str):
    """A server as `make run` starts it, on a fresh data directory: (url, demo key, data dir, process)."""
    data = Path(tempfile.mkdtemp(prefix="airlock-server-"))
    data.chmod(0o711)  # sandboxes (uid 65534) traverse it to their workspace
    env = {**{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}},
           "AIRLOCK_DATA_DIR": str(data), "AIRLOCK_SANDBOX_DIR": str(data / "sandboxes"),
           "SECRET_KEY": "server-test-secret-key-" + "x" * 40, **extra_env}
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
        if server is not None:
            stop_server(server)  # its sandboxes go with it: rmtree cannot remove their mount points
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


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the server from `source`, one of loopback's addresses."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def _closed_by_server(connection: socket.socket, within_s: float) -> bool:
    """Whether the server closes `connection` within `within_s` (what it sent before is skipped)."""
    connection.settimeout(within_s)
    try:
        while connection.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _health(connection: socket.socket) -> int:
    """GET /healthz on an open connection, which stays open (keep-alive): its status."""
    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    response = http.client.HTTPResponse(connection)
    response.begin()
    response.read()
    return response.status


def _healthy(port: int, source: str = "127.0.0.1") -> int:
    with _connect(port, source) as connection:
        return _health(connection)


def test_a_client_that_sends_its_request_too_slowly_holds_no_connection():
    """uvicorn alone kept each of these open for ever: a thousand of them took every descriptor of
    a server with the common limit of 1024, and nobody else got in (slowloris)."""
    with serving(AIRLOCK_CLIENT_TIMEOUT_S="1") as (url, _key, _data, _server):
        port = int(url.rsplit(":", 1)[1])
        silent = _connect(port)  # never sends a byte
        partial = _connect(port)
        partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the headers never end
        trickle = _connect(port)
        stalled_body = _connect(port)
        stalled_body.sendall(b"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                             b"Content-Type: application/json\r\n\r\n{")  # then nothing
        trickled_body = _connect(port)  # a byte of its body every 0.2 s: under MIN_BODY_RATE
        trickled_body.sendall(b"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n"
                              b"Content-Type: application/json\r\n\r\n")
        pipelined = _connect(port)  # a whole request, then a second one's headers that never end
        pipelined.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /healthz HTTP/1.1\r\n")
        kept_alive = _connect(port)
        assert _health(kept_alive) == 200
        started = time.monotonic()
        for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n":  # a header byte every 0.2 s: never idle
            if time.monotonic() - started > 3:
                break
            with contextlib.suppress(OSError):
                trickle.send(bytes([byte]))
                trickled_body.send(b"{")
            time.sleep(0.2)
        assert _closed_by_server(trickle, 2), "a request whose header bytes trickle in is closed at the timeout"
        for name, connection in (("silent", silent), ("partial headers", partial), ("stalled body", stalled_body),
                                 ("trickled body", trickled_body), ("pipelined partial", pipelined)):
            assert _closed_by_server(connection, 2), f"the {name} connection is closed at the timeout"
        # An idle keep-alive connection between two requests is not a slow request: it stays (75 s).
        assert _health(kept_alive) == 200
        for connection in (silent, partial, trickle, stalled_body, trickled_body, pipelined, kept_alive):
            connection.close()


def _handshake(port: int, path: str, source: str = "127.0.0.1") -> tuple[socket.socket, bytes]:
    """A WebSocket handshake on `path`: the connection and the server's answer."""
    connection = _connect(port, source)
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                       "Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1\r\n\r\n".encode())
    return connection, connection.recv(65536)


def _websocket(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A session's stream, open (accepted; it waits for a first-message token)."""
    connection, answer = _handshake(port, f"/ws/sessions/{uuid.uuid4()}/", source)
    assert answer.startswith(b"HTTP/1.1 101 ")
    return connection


API_HEADER_LINES = (b"\r\ncontent-security-policy: default-src 'none'; frame-ancestors 'none'\r\n",
                    b"\r\nx-content-type-options: nosniff\r\n", b"\r\nx-frame-options: deny\r\n")


def test_a_websocket_to_no_stream_and_a_forged_host_are_refused_and_log_no_traceback():
    """...and every refusal written before Django (by uvicorn or websockets) carries the API's
    headers: they carried no CSP, nosniff or framing."""
    with serving() as (url, _key, data, _server):
        port = int(url.rsplit(":", 1)[1])
        for path in ("/ws/nowhere/", "/ws/sessions/not-a-uuid/", "/static/app.js"):
            connection, answer = _handshake(port, path)
            connection.close()
            assert answer.startswith(b"HTTP/1.1 403 "), path
            assert all(line in answer.lower() for line in API_HEADER_LINES), answer
        for request, status in [
            (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n", b"400"),  # uvicorn's own
            (b"GET /ws/nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Version: 13\r\n\r\n", b"400"),  # websockets': no key
        ]:
            with _connect(port) as connection:
                connection.sendall(request)
                answer = connection.recv(65536)
            assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer
            assert all(line in answer.lower() for line in API_HEADER_LINES), answer
        with _connect(port) as connection:  # a Host this deployment does not serve: 400, one line logged
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: forged.example\r\n\r\n")
            assert connection.recv(65536).startswith(b"HTTP/1.1 400 ")
        assert _healthy(port) == 200
        log = (data / "server.log").read_text()
        assert "Traceback" not in log and "No route found" not in log, log[-2000:]
        assert "Invalid HTTP_HOST header: 'forged.example'" in log


def test_one_client_address_cannot_take_every_connection():
    with serving(AIRLOCK_MAX_CONNECTIONS_PER_CLIENT="6") as (url, _key, _data, _server):
        port = int(url.rsplit(":", 1)[1])
        held = [_connect(port, "127.0.0.2") for _ in range(4)] + [_websocket(port, "127.0.0.2") for _ in range(2)]
        with _connect(port, "127.0.0.2") as refused:
            answer = refused.recv(65536)
        assert answer.startswith(b"HTTP/1.1 429 ") and b"AIRLOCK_MAX_CONNECTIONS_PER_CLIENT" in answer
        assert _healthy(port, "127.0.0.1") == 200  # another address is served as before
        held.pop().close()  # a WebSocket ends: its count is given back
        deadline = time.monotonic() + 5
        while _healthy(port, "127.0.0.2") != 200:
            assert time.monotonic() < deadline, "a closed WebSocket still counts against its address"
            time.sleep(0.05)
        held.pop(0).close()  # and so is a plain connection's
        time.sleep(0.2)
        again = _connect(port, "127.0.0.2")
        assert _health(again) == 200
        for connection in [*held, again]:
            connection.close()


def test_a_websocket_client_cannot_flood_the_server_with_pings():
    """Empty pings as fast as the sockets take them, on 10 streams of one address, the pongs read:
    uvicorn alone parsed and answered every one (500,000 on one stream in 3 s here) and the event
    loop served nothing else meanwhile (a health check waited 6.8 s). A stream's client sends a
    token and keep-alive pongs, no more; the allowance is the address's, not each stream's."""
    with serving() as (url, _key, _data, _server):
        port = int(url.rsplit(":", 1)[1])
        streams = [_websocket(port, "127.0.0.3") for _ in range(10)]  # their token wait (5 s) outlasts the flood
        pong_bytes, stopping = [0] * len(streams), threading.Event()

        def read_pongs(index: int) -> None:
            streams[index].settimeout(0.2)
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    pong_bytes[index] += len(streams[index].recv(65536))

        def send_pings(index: int) -> None:
            burst = (b"\x89\x80" + b"\x00" * 4) * 10_000  # masked pings with no payload: 6 bytes each
            with contextlib.suppress(OSError):
                while not stopping.is_set():
                    streams[index].sendall(burst)

        threads = [threading.Thread(target=read_pongs, args=(index,)) for index in range(len(streams))]
        threads += [threading.Thread(target=send_pings, args=(index,), daemon=True) for index in range(len(streams))]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)
            assert _healthy(port) == 200  # answered meanwhile (within the 10 s of the probe's socket)
            time.sleep(2.5)
        finally:
            stopping.set()
            for thread in threads[:len(streams)]:
                thread.join()
            for stream in streams:
                stream.close()
        pongs = sum(pong_bytes) // 2  # 2 bytes each
        # 8 KiB at once, then 1 KiB a second for the address: ~1,900 pings in 3 s, plus the read
        # (32 KiB at most) that overdrew it. Counted per stream, it was 54,610 here.
        assert pongs < 20_000, f"the server answered {pongs} pings in 3 s"
