"""The Redis channel layer as Airlock uses it: channels_redis's, with receives that hold up
nobody (docs/architecture.md, "Runner", "The channel layer").

A process gets the messages of all its process-local channels (names with a `!`: each
WebSocket consumer's, each runner call's reply) from Redis through one receive at a time, which
pops them for everyone and hands each to its channel's waiter. channels_redis 4.3.0 gets two
things wrong there, both measured against a real Redis in tests/sessions/test_channel_layer.py:

- That receive pops only the Redis key of its own channel's prefix (the part before the `!`),
  and keeps its turn until a message for itself arrives. A runner's reply on `airlock.reply.…!…`
  waited behind an idle WebSocket's `specific.…!…` until that WebSocket got an event: a session
  create hung for its 120 s (django/channels_redis#165, open, rewrites that receive). Here every
  process-local channel has the one prefix, so one key (settings.py gives it room for live
  events and replies together); the name a caller asks for follows the `!`.
- Cancelling the receive whose turn it is (a WebSocket's client left, a call timed out) can
  lose a message Redis had already popped for another channel (django/channels_redis#366 is
  about the same race). Here a cancelled receive goes on in the background, popping for
  everyone, until a message of its own ends it; what was or is buffered for its caller until
  then is dropped. A channel whose receive was cancelled is therefore over: receiving on it
  again is an error, as is a second receive on one channel at once (the end's message could
  reach it). What arrives for it later stays in channels_redis's buffer, as upstream keeps
  what comes for any channel nobody receives on."""

import asyncio
import logging
import uuid

from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as UpstreamRedisChannelLayer

log = logging.getLogger(__name__)
ENDED = "airlock.receive.ended"
END_TRIES = 30  # ChannelFull: one a second (the process's channels are backed up)


class RedisChannelLayer(UpstreamRedisChannelLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._receiving: set[str] = set()  # process-local channels with a receive under way
        self._ended: set[str] = set()  # channels whose receive was cancelled and is being ended
        self._enders: set[asyncio.Task] = set()

    async def new_channel(self, prefix: str = "specific") -> str:
        local, _, unique = (await super().new_channel()).partition("!")
        return f"{local}!{prefix.rstrip('.')}.{unique}"

    async def receive(self, channel: str) -> dict:
        if "!" not in channel:  # a key of its own (a runner's channel): a cancel can lose only its own message
            return await super().receive(channel)
        if channel in self._ended or channel in self._receiving:
            raise RuntimeError(f"{channel} is over, or already has a receive: one receive at a time, none after "
                               "one was cancelled")
        self._receiving.add(channel)
        receiving = asyncio.ensure_future(super().receive(channel))
        try:
            return await asyncio.shield(receiving)
        except asyncio.CancelledError:
            # Still receiving, or done with a message its caller will not take while more may be
            # buffered for it: ended either way. (Failed: channels_redis dropped its buffer.)
            if not receiving.done() or not (receiving.cancelled() or receiving.exception()):
                self._ended.add(channel)
                ender = asyncio.ensure_future(self._end(channel, receiving))
                self._enders.add(ender)
                ender.add_done_callback(self._enders.discard)
            raise
        finally:
            self._receiving.discard(channel)

    async def _end(self, channel: str, receiving: asyncio.Future) -> None:
        """Send the channel a message of its own and receive until it comes: the receive its
        caller gave up ends without being cancelled, and nothing is left buffered for it."""
        marker = {"type": ENDED, "id": uuid.uuid4().hex}
        try:
            for attempt in range(END_TRIES):
                try:
                    await self.send(channel, marker)
                    break
                except ChannelFull:
                    if attempt == END_TRIES - 1:
                        raise
                    await asyncio.sleep(1)
            while await receiving != marker:  # for the caller that left: dropped
                receiving = asyncio.ensure_future(super().receive(channel))
        except asyncio.CancelledError:  # the loop closes, and every receive on it with it
            self._ended.discard(channel)
            raise
        except Exception as exc:  # Redis failed, or stayed full: that receive ends with the next message for it
            log.warning("a cancelled receive on %s could not be ended (%s: %s)", channel, type(exc).__name__, exc)
            return
        self._ended.discard(channel)
