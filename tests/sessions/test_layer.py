"""The channel layer from synchronous code (sessions/layer.py), and replies nobody waits for."""

import asyncio
import threading
import time

import pytest
from channels.layers import InMemoryChannelLayer, get_channel_layer

from sessions import layer
from sessions.models import runner_channel
from sessions.runner import client
from sessions.runner.core import RunnerService


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    layer.serve_on(loop)
    yield loop
    layer.serve_on(None)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def received(loop, channel_layer, channel: str, timeout_s: float = 0.3):
    async def receive():
        try:
            return await asyncio.wait_for(channel_layer.receive(channel), timeout_s)
        except TimeoutError:
            return None

    return asyncio.run_coroutine_threadsafe(receive(), loop).result(5)


def test_an_operation_the_loop_could_not_take_in_time_is_cancelled_and_never_happens_later(loop):
    """A send reported as failed (the broker then marks the command failed) must not reach the
    runner a moment later and run anyway."""
    channel_layer = InMemoryChannelLayer()
    loop.call_soon_threadsafe(time.sleep, 1.0)  # the loop is busy for a second
    with pytest.raises(TimeoutError):
        layer.run(lambda: channel_layer.send("airlock.runner.x", {"type": "command.run"}), 0.2)
    time.sleep(1.0)
    assert received(loop, channel_layer, "airlock.runner.x") is None
    layer.run(lambda: channel_layer.send("airlock.runner.x", {"type": "command.run"}), 2)  # free again
    assert received(loop, channel_layer, "airlock.runner.x") == {"type": "command.run"}


def test_run_refuses_to_block_the_loop_it_would_wait_for(loop):
    channel_layer = InMemoryChannelLayer()

    async def from_the_loop():
        with pytest.raises(RuntimeError, match="block the loop"):
            layer.run(lambda: channel_layer.send("x.y", {"type": "t"}), 1)

    asyncio.run_coroutine_threadsafe(from_the_loop(), loop).result(5)


def test_a_runner_drops_a_reply_whose_caller_stopped_waiting(loop):
    runner = RunnerService(embedded=True)
    try:
        channel_layer = runner.layer  # the deployment's: in-memory, or Redis
        for reply_by, expected in ((time.time() - 5, None), (time.time() + 30, "unknown_message")):
            reply_to = asyncio.run_coroutine_threadsafe(channel_layer.new_channel("airlock.reply."), loop).result(5)
            message = {"type": "no.such.message", "reply_to": reply_to, "reply_by": reply_by}
            asyncio.run_coroutine_threadsafe(runner._dispatch(message), loop).result(5)
            reply = received(loop, channel_layer, reply_to)
            assert (reply or {}).get("error") == expected
    finally:
        for executor in (runner.executor, runner.db_executor, runner.stats_executor):
            executor.shutdown(wait=False)


def test_a_call_the_loop_could_not_take_is_reported_unreachable_and_never_delivered(loop, monkeypatch):
    """The broker fails a command whose message was reported unreachable: it must not run later."""
    monkeypatch.setattr(client, "HAND_OVER_S", 0.2)
    loop.call_soon_threadsafe(time.sleep, 1.0)
    reply = client.runner_call("stalled", {"type": "command.run"}, timeout_s=0.1)
    assert reply["ok"] is False and reply["error"] == "runner_unreachable", reply
    time.sleep(1.0)
    assert received(loop, get_channel_layer(), runner_channel("stalled")) is None
