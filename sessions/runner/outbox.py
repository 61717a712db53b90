"""The runner's live events: one bounded outbox, one sender (docs/architecture.md, "Runner").

Every event of a session carries the next sequence number, so a subscriber that missed some
knows it. Events leave in order; consecutive output of one stream is merged into one event (up
to MERGE_CHARS), except across the point a snapshot stopped at. Output that does not fit
(OUTBOX_CHARS unsent) is dropped: its sequence numbers are skipped, and the command's stored
tail still has it."""

import asyncio
import collections
import logging
from collections.abc import Callable

from sessions.models import session_group, tenant_group
from sessions.runtimes.base import Stats

log = logging.getLogger("airlock.runner")
MERGE_CHARS = 64 * 1024
OUTBOX_CHARS = 8 * 2**20


class Outbox:
    def __init__(self, layer, live_of: Callable[[str], object]):
        self.layer = layer
        self._live_of = live_of  # a session id's LiveSession, if it is still on this runner
        self._queue: collections.deque = collections.deque()
        self._chars = 0
        self._ready = asyncio.Event()

    def output(self, live, command_id: str, stream: str, text: str) -> None:
        if live.output is not None:
            live.output.keep(text)  # the stored tail has it even when the stream drops it
        if self._chars + len(text) > OUTBOX_CHARS:
            live.seq += 1  # dropped: the gap in sequence numbers tells subscribers they lagged
            return
        self.emit(live, {"event": "command.output", "command": command_id, "stream": stream, "data": text})

    def emit(self, live, event: dict) -> None:
        live.seq += 1
        event = {**event, "session": live.id, "seq": live.seq, "seq_from": live.seq}
        self._queue.append((session_group(live.id), event))
        self._chars += len(event.get("data", ""))
        self._ready.set()

    def summary(self, live) -> None:
        """The session's row in the tenant's live list: what runs, CPU and memory."""
        stats = live.stats or Stats(cpu_s=None, memory_bytes=None, disk_bytes=None)
        self._queue.append((tenant_group(live.tenant_id), {
            "event": "session.activity", "session": live.id, "running": live.running_label,
            "running_since": live.running_since,
            "cpu_s": stats.cpu_s, "memory_bytes": stats.memory_bytes}))
        self._ready.set()

    async def send_forever(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                group, event = self._next()
                try:
                    await self.layer.group_send(group, {"type": "airlock.event", "event": event})
                except Exception:
                    log.exception("could not publish an event to %s", group)

    def _next(self) -> tuple[str, dict]:
        group, event = self._queue.popleft()
        self._chars -= len(event.get("data", ""))
        live = self._live_of(event.get("session", ""))
        while event["event"] == "command.output" and self._queue and len(event["data"]) < MERGE_CHARS:
            next_group, following = self._queue[0]
            if (next_group != group or following["event"] != "command.output"
                    or following["command"] != event["command"] or following["stream"] != event["stream"]
                    or following["seq"] != event["seq"] + 1
                    or (live is not None and event["seq"] in live.snapshot_seqs)):
                break
            self._queue.popleft()
            self._chars -= len(following["data"])
            event = {**event, "data": event["data"] + following["data"], "seq": following["seq"]}
        if live is not None and live.snapshot_seqs and "seq" in event:
            live.snapshot_seqs = {seq for seq in live.snapshot_seqs if seq > event["seq"]}
        return group, event
