"""Airlock's Redis channel layer (controlplane/channel_layer.py) against a real Redis: a process's
receives hold up nobody, and cancelling one loses no other channel's message.

Needs Redis (127.0.0.1:6379, always there on these machines; required in CI)."""

import asyncio
import os
import socket
import threading
import time
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from controlplane.channel_layer import RedisChannelLayer

REDIS = ("127.0.0.1", 6379)


@pytest.fixture
def prefix():
    try:
        socket.create_connection(REDIS, timeout=1).close()
    except OSError:
        if os.environ.get("CI") == "true":
            pytest.fail("Redis is required in CI at 127.0.0.1:6379")
        pytest.skip("Redis is not running at 127.0.0.1:6379")
    return f"airlock-test-{uuid.uuid4().hex[:8]}"


def layer_for(prefix: str) -> RedisChannelLayer:
    """A process's layer (each instance has its own process-local channels), as settings.py makes it."""
    return RedisChannelLayer(hosts=[{"address": "redis://{}:{}/0".format(*REDIS), "socket_timeout": 15}],
                             prefix=prefix, channel_capacity=settings.CHANNEL_CAPACITY)


async def settled(baseline: int) -> int:
    """How many more tasks than `baseline` still run after a moment (a cancelled receive ends in
    the background; asyncio.run would wait for it)."""
    deadline = time.monotonic() + 5
    while len(asyncio.all_tasks()) > baseline and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(asyncio.all_tasks()) - baseline


def test_a_reply_reaches_its_caller_while_a_websocket_of_the_same_process_waits(prefix):
    """channels_redis let the waiting receive of a consumer's channel (`specific.…!`) keep the
    turn, popping only its own prefix's key: the reply on `airlock.reply.…!` waited for it."""
    async def scenario():
        server, runner = layer_for(prefix), layer_for(prefix)
        websocket = await server.new_channel()
        waiting = asyncio.ensure_future(server.receive(websocket))  # as a consumer does
        await asyncio.sleep(0.3)
        reply_to = await server.new_channel("airlock.reply.")
        await runner.send(reply_to, {"type": "runner.reply", "ok": True})
        try:
            return await asyncio.wait_for(server.receive(reply_to), 3)
        finally:
            await runner.send(websocket, {"type": "airlock.event"})
            await asyncio.wait_for(waiting, 3)

    assert asyncio.run(scenario()) == {"type": "runner.reply", "ok": True}


def test_cancelling_the_receive_that_pops_for_everyone_loses_no_other_channels_message(prefix):
    """The consumer of a WebSocket whose client leaves holds the turn, blocked in Redis; a reply
    for another channel is popped for it just as it is cancelled. channels_redis dropped it."""
    async def scenario():
        server, baseline = layer_for(prefix), len(asyncio.all_tasks())
        websocket, reply_to = await server.new_channel(), await server.new_channel()  # (one key, as consumers share)
        holder = asyncio.ensure_future(server.receive(websocket))
        await asyncio.sleep(0.3)  # it has the turn, and waits in Redis
        # Sent from another process while this loop is held up: Redis pops the reply for the
        # waiting receive, and it sits unread in the socket when the receive is cancelled.
        sender = threading.Thread(target=async_to_sync(layer_for(prefix).send),
                                  args=(reply_to, {"type": "runner.reply", "ok": True}))
        sender.start()
        sender.join()
        time.sleep(0.1)
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        try:
            return await asyncio.wait_for(server.receive(reply_to), 3)
        finally:
            await settled(baseline)

    assert asyncio.run(scenario()) == {"type": "runner.reply", "ok": True}


def test_a_cancelled_receive_ends_in_the_background_and_its_channel_is_over(prefix):
    async def scenario():
        server = layer_for(prefix)
        baseline = len(asyncio.all_tasks())
        channel = await server.new_channel()
        given_up = asyncio.ensure_future(server.receive(channel))
        await asyncio.sleep(0.3)
        given_up.cancel()
        await asyncio.gather(given_up, return_exceptions=True)
        with pytest.raises(RuntimeError, match="is over"):
            await asyncio.wait_for(server.receive(channel), 1)
        left = await settled(baseline)
        # Still served: a receive on a new channel of the process.
        fresh = await server.new_channel("airlock.reply.")
        await layer_for(prefix).send(fresh, {"type": "runner.reply"})
        return left, await asyncio.wait_for(server.receive(fresh), 3)

    left, message = asyncio.run(scenario())
    assert left == 0, f"{left} tasks of the cancelled receive still run"
    assert message == {"type": "runner.reply"}


def test_a_reply_gets_through_while_the_process_has_a_full_backlog_of_live_events(prefix):
    """Replies share the process's one key with its WebSockets' events: 100 events waiting
    (the most a consumer's channel takes) must not refuse a runner's reply."""
    async def scenario():
        server, runner = layer_for(prefix), layer_for(prefix)
        websocket, reply_to = await server.new_channel(), await server.new_channel("airlock.reply.")
        for n in range(100):
            await runner.send(websocket, {"type": "airlock.event", "n": n})
        await runner.send(reply_to, {"type": "runner.reply", "ok": True})
        return await asyncio.wait_for(server.receive(reply_to), 3)

    assert asyncio.run(scenario()) == {"type": "runner.reply", "ok": True}


def test_nothing_stays_buffered_for_a_channel_whose_receive_was_cancelled_after_it_took_a_message(prefix):
    """A consumer whose client leaves just as its receive took one of its waiting events: the
    rest must not stay in the process's memory for good."""
    async def scenario():
        server, runner = layer_for(prefix), layer_for(prefix)
        baseline = len(asyncio.all_tasks())
        websocket, other = await server.new_channel(), await server.new_channel()
        holder = asyncio.ensure_future(server.receive(other))  # another WebSocket's: it pops for everyone
        await asyncio.sleep(0.2)
        for n in range(20):
            await runner.send(websocket, {"type": "airlock.event", "n": n})
        await asyncio.sleep(0.5)  # all buffered for `websocket`
        leaving = asyncio.ensure_future(server.receive(websocket))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # it has taken one
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        await runner.send(other, {"type": "airlock.event"})
        await holder
        await settled(baseline)
        return server.receive_buffer.get(websocket)

    left = asyncio.run(scenario())
    assert left is None or left.empty(), f"{left.qsize()} events stayed buffered for a channel nobody reads"


def test_a_channel_takes_one_receive_at_a_time(prefix):
    """A second receive could be handed the message that ends a cancelled one."""
    async def scenario():
        server = layer_for(prefix)
        channel = await server.new_channel()
        first = asyncio.ensure_future(server.receive(channel))
        await asyncio.sleep(0.1)
        try:
            with pytest.raises(RuntimeError, match="already has a receive"):
                await asyncio.wait_for(server.receive(channel), 1)
        finally:
            await layer_for(prefix).send(channel, {"type": "airlock.event"})
            await asyncio.wait_for(first, 3)

    asyncio.run(scenario())
