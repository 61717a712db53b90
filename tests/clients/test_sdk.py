"""The Python SDK, sync and async, against a real server and real sandboxes."""

import asyncio
import http.server
import socket
import threading
import uuid

import pytest

from airlock import (
    Airlock,
    AsyncAirlock,
    BadRequest,
    CommandDenied,
    FileDenied,
    NotFound,
    Output,
    Retry,
    Timeout,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from airlock._wire import Call

COUNT = ("import sys, time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.1)\n"
         "print('oops', file=sys.stderr, flush=True)\ntime.sleep(0.1)\nprint('end', flush=True)\nsys.exit(3)\n")
SLOW = "import time\nprint('ready', flush=True)\ntime.sleep(4)\nprint('done', flush=True)\n"
FOREVER = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"


def test_output_streams_to_the_callback_in_order_and_the_result_carries_the_end(client):
    pieces: list[Output] = []
    with client.sessions.create(conversation_id="sdk-order") as session:
        session.files.write("count.py", COUNT)
        result = session.run("python3", ["count.py"], on_output=pieces.append)
        stored = session.command(result.id)
        # More than the policy keeps (output_tail_chars: 8000): the result is the stored tail, cut.
        session.files.write("many.py", "for i in range(3000):\n    print(f'line {i:05}')\n")
        many = session.run("python3", ["many.py"], on_output=lambda piece: None)
    assert (result.output, result.exit_code, result.reason) == (stored.output, stored.exit_code, stored.reason)
    assert many.truncated and many.output == session.command(many.id).output and "line 02999" in many.output
    assert [(piece.stream, piece.data) for piece in pieces] == [
        ("stdout", "0\n"), ("stdout", "1\n"), ("stdout", "2\n"), ("stderr", "oops\n"), ("stdout", "end\n")]
    assert (result.exit_code, result.reason, result.truncated) == (3, "exited", False)
    assert "oops" in result.output and result.decision.allowed and result.decision.rule_id == "python3"
    assert client.sessions.get(session.id).state == "ended"  # the `with` block ended it


def test_a_run_without_callback_waits_in_one_call(client):
    with client.sessions.create(conversation_id="sdk-plain") as session:
        session.files.write("tests/test_ok.py", "def test_ok():\n    assert True\n")
        result = session.run("pytest", ["tests"])
    assert result.exit_code == 0 and "1 passed" in result.output


def test_a_denial_raises_with_the_policys_decision(client):
    with client.sessions.create(conversation_id="sdk-denied") as session:
        with pytest.raises(CommandDenied) as denied:
            session.run("echo", ["hello"])
        with pytest.raises(CommandDenied) as flag:
            session.run("python3", ["-c", "print(1)"], on_output=print)
    error = denied.value
    assert (error.code, error.status, error.reason_code) == ("command_denied", 403, "bin_not_allowed")
    assert error.decision.allowed is False and error.hint and error.decision.id
    assert "bin_not_allowed" in str(error) and error.hint in str(error)
    assert (flag.value.reason_code, flag.value.rule) == ("arg_denied", "python3")


def test_a_wait_runs_out_while_the_command_goes_on_and_output_already_arrived(client):
    pieces: list[str] = []
    with client.sessions.create(conversation_id="sdk-wait") as session:
        session.files.write("slow.py", SLOW)
        handle = session.start("python3", ["slow.py"], on_output=lambda piece: pieces.append(piece.data))
        with pytest.raises(WaitTimeout) as timed_out:
            handle.wait(timeout=2)
        assert pieces == ["ready\n"] and timed_out.value.code == "wait_timeout"
        result = handle.wait(timeout=30)
    assert pieces == ["ready\n", "done\n"] and result.exit_code == 0


def test_kill_stops_a_running_command_and_ends_its_session(client):
    with client.sessions.create(conversation_id="sdk-kill") as session:
        session.files.write("forever.py", FOREVER)
        seen: list[str] = []
        handle = session.start("python3", ["forever.py"], on_output=lambda piece: seen.append(piece.data))
        with pytest.raises(WaitTimeout):
            handle.wait(timeout=1.5)
        assert seen == ["up\n"]
        handle.kill()
        result = handle.wait(timeout=20)
    assert result.reason == "killed" and result.exit_code is None
    assert client.sessions.get(session.id).state == "killed"


def test_files_are_written_read_and_listed_and_refusals_are_typed(client):
    blob = bytes(range(256)) * 4
    with client.sessions.create(conversation_id="sdk-files") as session:
        session.files.write("data/blob.bin", blob)
        session.files.write("notes.txt", "héllo\n")
        assert session.files.read("data/blob.bin") == blob
        assert session.files.read("/workspace/notes.txt") == "héllo\n".encode()
        listed = {entry.path: entry for entry in session.files.list()}
        assert set(listed) == {"data", "data/blob.bin", "notes.txt"}
        assert (listed["data/blob.bin"].type, listed["data/blob.bin"].size) == ("file", 1024)
        assert [entry.path for entry in session.files.list("data")] == ["data/blob.bin"]
        with pytest.raises(NotFound) as missing:
            session.files.read("nothing.txt")
        with pytest.raises(FileDenied) as outside:
            session.files.write("../escape.txt", "x")
    assert missing.value.code == "not_found"
    assert outside.value.reason_code == "path_outside_workspace" and outside.value.hint


def test_the_servers_error_codes_become_typed_exceptions(demo_server, client):
    with pytest.raises(Unauthorized) as unauthorized, Airlock(demo_server.url, "alk_nothing_nothing") as stranger:
        stranger.sessions.list()
    assert unauthorized.value.code == "invalid_key"
    with pytest.raises(NotFound):
        client.sessions.get(str(uuid.uuid4()))
    with client.sessions.create(conversation_id="sdk-errors") as session, pytest.raises(BadRequest) as bad:
        session.run("pytest", timeout_s=0)
    assert bad.value.code == "invalid_request" and "timeout_s" in bad.value.fields
    with pytest.raises(NotFound) as no_policy:
        client.sessions.create(conversation_id="sdk-errors", policy="no-such-policy")
    assert (no_policy.value.status, no_policy.value.code) == (404, "policy_not_found")


def test_a_session_created_elsewhere_is_driven_with_the_key(client):
    created = client.sessions.create(conversation_id="sdk-attach")
    pieces: list[str] = []
    with client.sessions.attach(created.id) as session:
        assert session.token is None
        session.files.write("hi.py", "print('hi')\n")
        assert session.run("python3", ["hi.py"], on_output=lambda piece: pieces.append(piece.data)).exit_code == 0
        assert [info.id for info in client.sessions.list(conversation_id="sdk-attach")] == [created.id]
    assert pieces == ["hi\n"]
    # Its token was revoked when it ended: what is left to read, the client reads with the key.
    assert created.refresh().state == "ended" and created.token is None


async def test_the_async_client_does_the_same(demo_server):
    pieces: list[Output] = []

    async def collect(piece: Output) -> None:
        pieces.append(piece)

    async with AsyncAirlock(demo_server.url, demo_server.api_key) as client:
        async with client.sessions.create(conversation_id="sdk-async") as session:
            await session.files.write("count.py", COUNT)
            result = await session.run("python3", ["count.py"], on_output=collect)
            assert [entry.path for entry in await session.files.list()] == ["count.py"]
            with pytest.raises(CommandDenied) as denied:
                await session.run("echo", ["x"])
            handle = await session.start("python3", ["count.py"])
            with pytest.raises(WaitTimeout):
                await handle.wait(timeout=0.05)
            assert (await handle.wait(timeout=30)).exit_code == 3
            # two sessions at once, each with its own stream
            async with client.sessions.create(conversation_id="sdk-async-2") as other:
                await other.files.write("hi.py", "print('hi')\n")
                both = await asyncio.gather(other.run("python3", ["hi.py"]), session.run("python3", ["count.py"]))
        assert (await client.sessions.get(session.id)).state == "ended"
    assert "".join(piece.data for piece in pieces if piece.stream == "stdout") == "0\n1\n2\nend\n"
    assert result.exit_code == 3 and denied.value.reason_code == "bin_not_allowed"
    assert [run.exit_code for run in both] == [0, 3]


class Flaky(http.server.BaseHTTPRequestHandler):
    """A loopback stand-in for a server that is starting: 503 (Retry-After: 0) twice, then an answer."""

    answers: list[int] = []

    def do_GET(self):
        self.answers.append(503 if len(self.answers) < 2 else 200)
        body = b'{"error": "runner_unreachable", "detail": "no runner yet"}' if self.answers[-1] == 503 else b"[]"
        self.send_response(self.answers[-1])
        if self.answers[-1] == 503:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.answers.append(429)
        body = (b'{"error": "too_many_commands", "detail": "at the limit", "decision": {"allowed": false, '
                b'"reason_code": "tenant_limit", "message": "at the limit", "hint": "wait"}}')
        self.send_response(429)
        self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_503_is_retried_with_backoff_and_a_silent_server_times_out():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with Airlock(url, "alk_x_y") as client:
            assert client.sessions.list() == []
        assert Flaky.answers == [503, 503, 200]
        Flaky.answers.clear()
        with Airlock(url, "alk_x_y", retry=Retry(attempts=2, backoff_s=0)) as client, \
                pytest.raises(Unavailable) as gave_up:
            client.sessions.list()
        assert gave_up.value.code == "runner_unreachable" and Flaky.answers == [503, 503]
        Flaky.answers.clear()
        with Airlock(url, "alk_x_y") as client, pytest.raises(CommandDenied) as limited:
            client.request(Call("POST", "/api/v1/sessions/x/commands", json={}))
        assert limited.value.reason_code == "tenant_limit" and Flaky.answers == [429]
    finally:
        server.shutdown()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts the connection, never answers
    try:
        with Airlock(f"http://127.0.0.1:{silent.getsockname()[1]}", "alk_x_y", read_timeout=0.5) as client, \
                pytest.raises(Timeout) as timed_out:
            client.sessions.list()
        assert timed_out.value.code == "timeout"
    finally:
        silent.close()
