"""Live output over WebSockets, from real bubblewrap sandboxes through the real channel layer."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane.asgi import application
from controlplane.roles import Role
from sessions import consumers
from sessions.models import CommandRun
from sessions.runner import outbox

ORIGIN = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
COUNT = b"import sys, time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.05)\n" \
        b"print('oops', file=sys.stderr, flush=True)\n"

pytestmark = pytest.mark.django_db(transaction=True)


def communicator(session: dict, *, token: str | None = None, cookie: str | None = None) -> WebsocketCommunicator:
    protocols = ["airlock.v1"] + ([f"airlock.token.{token}"] if token else [])
    headers = ORIGIN + ([(b"cookie", f"sessionid={cookie}".encode())] if cookie else [])
    return WebsocketCommunicator(application, f"/ws/sessions/{session['id']}/", subprotocols=protocols,
                                 headers=headers)


async def events_until(socket: WebsocketCommunicator, last: str, timeout: float = 20) -> list[dict]:
    """Events up to the first `last`. `decision` events are left out: the server publishes them,
    not the runner, so over Redis they are not ordered with the runner's events."""
    events = []
    while True:
        event = await socket.receive_json_from(timeout=timeout)
        if event["event"] != "decision":
            events.append(event)
        if event["event"] == last:
            return events


def login_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def test_a_command_streams_in_order_from_a_real_sandbox(async_agent):
    session = await sync_to_async(async_agent.open)()
    await sync_to_async(async_agent.put)(session, "count.py", COUNT)
    socket = communicator(session, token=session["token"])
    connected, subprotocol = await socket.connect()
    assert connected and subprotocol == "airlock.v1"
    opening = await socket.receive_json_from()
    assert opening["event"] == "session.state" and opening["state"] == "ready"
    response = await sync_to_async(async_agent.run)(session, "python3", "count.py", wait=False)
    assert response.status_code == 202
    started = await events_until(socket, "command.started")
    first_output = (await events_until(socket, "command.output", timeout=10))[-1]
    assert first_output["event"] == "command.output" and first_output["data"].startswith("0")
    # The first chunk arrived while the command still runs: output streams, it is not batched.
    assert await sync_to_async(lambda: CommandRun.objects.get(pk=response.json()["id"]).state)() == "running"
    rest = await events_until(socket, "command.exited")
    outputs = [first_output] + [e for e in rest if e["event"] == "command.output"]
    stdout = "".join(e["data"] for e in outputs if e["stream"] == "stdout")
    assert stdout == "0\n1\n2\n3\n4\n"
    assert [e["data"] for e in outputs if e["stream"] == "stderr"] == ["oops\n"]
    assert started[-1]["argv"] == ["python3", "count.py"]
    assert rest[-1]["exit_code"] == 0 and rest[-1]["reason"] == "exited"
    seqs = [e["seq"] for e in [started[-1], *outputs, rest[-1]]]
    assert seqs == sorted(seqs)
    await socket.disconnect()


async def test_a_late_subscriber_gets_the_tail_first_then_live_output(async_agent, loop_runner):
    session = await sync_to_async(async_agent.open)()
    script = b"import time\nprint('early', flush=True)\ntime.sleep(1.5)\nprint('late', flush=True)\n"
    await sync_to_async(async_agent.put)(session, "slow.py", script)
    await sync_to_async(async_agent.run)(session, "python3", "slow.py", wait=False)
    for _ in range(100):  # until the runner has seen the early output
        live = loop_runner.live[session["id"]]
        if live.output is not None and "early" in live.output.tail.text:
            break
        await asyncio.sleep(0.05)
    socket = communicator(session, token=session["token"])
    assert (await socket.connect())[0]
    assert (await socket.receive_json_from())["event"] == "session.state"
    snapshot = await socket.receive_json_from(timeout=5)
    assert snapshot["snapshot"] is True and snapshot["data"] == "early\n"
    rest = await events_until(socket, "command.exited")
    assert "".join(e.get("data", "") for e in rest if e["event"] == "command.output") == "late\n"
    await socket.disconnect()


async def test_a_first_message_token_is_accepted(async_agent):
    session = await sync_to_async(async_agent.open)()
    socket = communicator(session)
    assert (await socket.connect())[0]
    await socket.send_json_to({"type": "auth", "token": session["token"]})
    assert (await socket.receive_json_from(timeout=5))["event"] == "session.state"
    await socket.disconnect()


@pytest.mark.parametrize("frame", [{"text_data": "{not json"}, {"bytes_data": b"\x00\xff"}])
async def test_a_frame_that_is_not_json_closes_an_outsider_with_4403_and_is_ignored_after(async_agent, frame):
    session = await sync_to_async(async_agent.open)()
    outsider = communicator(session)
    assert (await outsider.connect())[0]
    await outsider.send_to(**frame)
    assert (await outsider.receive_output(timeout=5))["code"] == 4403
    member = communicator(session, token=session["token"])
    assert (await member.connect())[0]
    assert (await member.receive_json_from(timeout=5))["event"] == "session.state"
    await member.send_to(**frame)  # a subscriber's frames are ignored, whatever they hold
    await sync_to_async(async_agent.run)(session, "printf", "still here", wait=False)
    events = await events_until(member, "command.exited")
    assert any(event.get("data") == "still here" for event in events)
    await member.disconnect()


async def test_an_outsider_is_closed_once(async_agent, monkeypatch):
    """A second close (a second bad message, or the token wait running out after the first) was an
    error in a real server's log: 'Unexpected ASGI message websocket.close'."""
    monkeypatch.setattr(consumers, "AUTH_WAIT_S", 0.3)
    session = await sync_to_async(async_agent.open)()
    outsider = communicator(session)
    assert (await outsider.connect())[0]
    await outsider.send_json_to({"type": "hello"})
    assert (await outsider.receive_output(timeout=5))["code"] == 4403
    await outsider.send_json_to({"type": "hello again"})  # sent before the close handshake ends
    assert await outsider.receive_nothing(timeout=1)  # past the token wait too
    await outsider.disconnect()


async def test_outsiders_are_closed_with_4403(async_agent, globex, make_member, acme, bob):
    session = await sync_to_async(async_agent.open)()
    other = await sync_to_async(async_agent.open)()
    for socket in (communicator(session, token=other["token"]), communicator(session, token="ast_forged")):
        assert (await socket.connect())[0]
        assert (await socket.receive_output(timeout=5))["code"] == 4403
    socket = communicator(session)
    assert (await socket.connect())[0]
    await socket.send_json_to({"type": "auth", "token": other["token"]})
    assert (await socket.receive_output(timeout=5))["code"] == 4403
    charlie = await sync_to_async(make_member)(globex, "charlie", Role.TENANT_ADMIN)
    socket = communicator(session, cookie=await sync_to_async(login_cookie)(charlie))
    assert (await socket.connect())[0]
    await socket.send_json_to({"type": "hello"})
    assert (await socket.receive_output(timeout=5))["code"] == 4403
    # Any role of the tenant may watch: bob is a viewer.
    socket = communicator(session, cookie=await sync_to_async(login_cookie)(bob))
    assert (await socket.connect())[0]
    assert (await socket.receive_json_from(timeout=5))["event"] == "session.state"
    await socket.disconnect()


async def test_an_api_key_of_the_tenant_with_the_sessions_scope_may_watch(async_agent, acme, globex, make_key):
    from controlplane.models import ApiKeyScope

    session = await sync_to_async(async_agent.open)()
    socket = communicator(session, token=async_agent.key)
    assert (await socket.connect())[0]
    assert (await socket.receive_json_from(timeout=5))["event"] == "session.state"
    await socket.disconnect()
    read_only = await sync_to_async(make_key)(acme, scopes=[ApiKeyScope.POLICIES_READ], name="reader")
    foreign = await sync_to_async(make_key)(globex, scopes=[ApiKeyScope.SESSIONS], name="globex")
    for key in (read_only.key, foreign.key, async_agent.key[:-2] + "xx"):
        socket = communicator(session, token=key)
        assert (await socket.connect())[0]
        assert (await socket.receive_output(timeout=5))["code"] == 4403, key


async def test_output_that_cannot_be_delivered_becomes_a_lagged_marker(async_agent, monkeypatch):
    monkeypatch.setattr(outbox, "OUTBOX_CHARS", 1)  # every piece of output overflows the outbox
    session = await sync_to_async(async_agent.open)()
    socket = communicator(session, token=session["token"])
    assert (await socket.connect())[0]
    await socket.receive_json_from()
    await asyncio.sleep(0.2)  # the snapshot reply has arrived
    response = await sync_to_async(async_agent.run)(session, "printf", "a lot of output", wait=False)
    events = await events_until(socket, "command.exited")
    assert [e["event"] for e in events] == ["command.started", "lagged", "command.exited"]
    assert events[1]["missed"] >= 1
    stored = await sync_to_async(lambda: CommandRun.objects.get(pk=response.json()["id"]).output)()
    assert stored == "a lot of output"  # the tail keeps what the stream dropped
    await socket.disconnect()


async def test_the_tenant_list_hears_a_session_start(async_agent, alice):
    cookie = await sync_to_async(login_cookie)(alice)
    socket = WebsocketCommunicator(application, "/ws/t/acme/sessions/",
                                   headers=[*ORIGIN, (b"cookie", f"sessionid={cookie}".encode())])
    assert (await socket.connect())[0]
    session = await sync_to_async(async_agent.open)(conversation_id="conv-live")
    seen = []
    while not any(e["session"]["state"] == "ready" for e in seen):
        event = await socket.receive_json_from(timeout=10)
        if event["event"] == "session.updated" and event["session"]["id"] == session["id"]:
            seen.append(event)
    assert seen[0]["session"]["conversation_id"] == "conv-live"
    await socket.disconnect()


async def test_an_agent_without_origin_streams_with_its_token_but_a_foreign_page_cannot(async_agent):
    session = await sync_to_async(async_agent.open)()
    socket = WebsocketCommunicator(application, f"/ws/sessions/{session['id']}/",
                                   subprotocols=["airlock.v1", f"airlock.token.{session['token']}"],
                                   headers=[(b"host", b"127.0.0.1")])
    assert (await socket.connect())[0]
    assert (await socket.receive_json_from(timeout=5))["event"] == "session.state"
    await socket.disconnect()
    foreign = WebsocketCommunicator(application, f"/ws/sessions/{session['id']}/",
                                    subprotocols=["airlock.v1", f"airlock.token.{session['token']}"],
                                    headers=[(b"origin", b"https://evil.example"), (b"host", b"127.0.0.1")])
    assert not (await foreign.connect())[0]
