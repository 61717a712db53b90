"""`airlock mcp` driven by the official MCP client (the `mcp` SDK), over stdio and streamable
HTTP, against a real server: one Airlock session per MCP session, ended when it closes."""

import os
import subprocess
import time

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from airlock import Airlock
from tests.clients.conftest import AIRLOCK
from tests.live import _free_port, _wait_until_listening

TEST = "def test_ok():\n    assert 2 + 2 == 4\n"


def env_for(demo_server) -> dict[str, str]:
    return {**os.environ, "AIRLOCK_URL": demo_server.url, "AIRLOCK_API_KEY": demo_server.api_key}


async def exercise(client: Client, session_id: str | None = None) -> str:
    """What an agent does: write a test, run pytest, look around, get denied. The session it used."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"run_command", "write_file", "read_file", "list_files"}
    assert tools["run_command"].input_schema["required"] == ["bin"] and tools["run_command"].description
    chosen = {"session_id": session_id} if session_id else {}
    wrote = await client.call_tool("write_file", {"path": "tests/test_math.py", "content": TEST, **chosen})
    assert not wrote.is_error, wrote
    chosen = {"session_id": wrote.structured_content["session_id"]}
    ran = await client.call_tool("run_command", {"bin": "pytest", "args": ["tests"], **chosen})
    assert not ran.is_error and ran.structured_content["exit_code"] == 0
    assert "1 passed" in ran.structured_content["output"]
    listed = await client.call_tool("list_files", chosen)
    assert {"path": "tests/test_math.py", "type": "file", "size": len(TEST)} in listed.structured_content["entries"]
    read = await client.call_tool("read_file", {"path": "tests/test_math.py", **chosen})
    assert read.structured_content["content"] == TEST
    denied = await client.call_tool("run_command", {"bin": "bash", "args": ["-c", "id"], **chosen})
    assert denied.is_error
    message = denied.content[0].text
    assert "bin_not_allowed" in message and "hint:" in message  # what the model needs to change course
    outside = await client.call_tool("read_file", {"path": "../../etc/passwd", **chosen})
    assert outside.is_error and "path_outside_workspace" in outside.content[0].text
    return chosen["session_id"]


def state_of(demo_server, session_id: str) -> str:
    with Airlock(demo_server.url, demo_server.api_key) as client:
        return client.sessions.get(session_id).state


def eventually_ended(demo_server, session_id: str) -> str:
    deadline = time.monotonic() + 20
    while (state := state_of(demo_server, session_id)) == "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    return state


async def test_over_stdio_a_session_runs_pytest_and_a_denial_is_a_tool_error_with_its_hint(demo_server):
    server = StdioServerParameters(command=AIRLOCK, args=["mcp", "--conversation", "mcp-stdio"],
                                   env=env_for(demo_server))
    async with Client(server) as client:
        session_id = await exercise(client)
        again = await client.call_tool("list_files", {})  # the MCP session's one Airlock session
        assert again.structured_content["session_id"] == session_id
        assert state_of(demo_server, session_id) == "ready"
    assert eventually_ended(demo_server, session_id) == "ended"  # closing the MCP session ended it


async def test_over_streamable_http_each_caller_has_its_own_session_ended_when_idle_or_at_stop(demo_server,
                                                                                              tmp_path):
    port, log = _free_port(), tmp_path / "mcp.log"
    process = subprocess.Popen([AIRLOCK, "mcp", "--transport", "http", "--port", str(port), "--idle-timeout", "4"],
                               env={**env_for(demo_server), "AIRLOCK_MCP_TOKEN": "mcp-test-token"},
                               stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def connect() -> Client:
        return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(
            headers={"Authorization": "Bearer mcp-test-token"}, timeout=60)))

    try:
        _wait_until_listening(port, process, log=log)
        url = f"http://127.0.0.1:{port}/mcp"
        # Whoever reaches the port without the token gets nothing: it would act with the server's API key.
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
            assert refused.status_code == 401
        async with connect() as first, connect() as second:
            mine = await exercise(first)
            other = await second.call_tool("run_command", {"bin": "pytest", "args": ["tests"]})
            assert other.structured_content["session_id"] != mine  # its own, empty workspace: no tests there
            assert other.structured_content["exit_code"] == 4
            kept = await first.call_tool("read_file", {"path": "tests/test_math.py", "session_id": mine})
            assert kept.structured_content["content"] == TEST
            forged = await second.call_tool("list_files", {"session_id": "00000000-0000-0000-0000-000000000000"})
            assert forged.is_error and "unknown_session" in forged.content[0].text
        assert eventually_ended(demo_server, other.structured_content["session_id"]) == "ended"  # idle for 4 s
        async with connect() as third:
            last = (await third.call_tool("list_files", {})).structured_content["session_id"]
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert state_of(demo_server, last) == "ended"  # the server stopped: its sessions went with it


def test_without_the_mcp_extra_the_command_says_how_to_install_it(demo_server, tmp_path):
    # A Python that cannot import `mcp`: the SDK alone on its path.
    sdk = os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python")
    blocker = tmp_path / "mcp"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('mcp is not installed')\n")
    result = subprocess.run([AIRLOCK, "mcp"], env={**env_for(demo_server), "PYTHONPATH": f"{tmp_path}:{sdk}"},
                            capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "pip install 'airlock-sdk[mcp]'" in result.stderr
