"""WebSockets: a session's live stream, and a tenant's live session list.

`/ws/sessions/<id>/` admits a signed-in member of the session's tenant (any role), the
session's own token, or an API key of its tenant with the scope `sessions`, sent as the
subprotocol `airlock.token.<token>` beside `airlock.v1` or as a first message
`{"type": "auth", "token": …}` within AUTH_WAIT_S. Never in the URL, where logs would keep it.
Anyone else is closed with 4403.

A late subscriber first gets the session's state and recent commands, then the running
command's tail so far (a snapshot from the runner), then live events. Output events carry
sequence numbers: events the snapshot already covers are skipped, and a gap (the channel
layer dropped messages for a slow subscriber, or the runner's outbox was full) becomes one
`lagged` event instead of a silent hole.

A subscriber that reads slowly never slows the runner nor grows the server's memory: the
server's send waits for its connection to drain (controlplane/serve.py) while the consumer keeps
taking events off the channel layer into a bounded outbox. Output that does not fit is dropped
and counted, and the next event it lets through is preceded by `lagged`; state and command
events are kept. What the channel layer itself dropped (a full queue, under load) may include a
command's end or a state change: once anything went missing, the consumer reconciles with the
database every RECONCILE_S until no command it knows of is running, and sends the ends and the
state it finds there (marked `reconciled`), so a subscriber always learns how each command ended; a
command's end only once its output has stopped arriving (RECONCILE_S without any), so the end is
never shown above output still on its way."""

import asyncio
import collections
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db.models import Q
from django.utils import timezone

from controlplane.api.auth import ApiKeyFailed, api_key_for
from controlplane.models import ApiKey, Membership
from sessions.lifecycle import not_live
from sessions.models import CommandState, Session, runner_channel, session_group, tenant_group
from sessions.selectors import session_by_token

SUBPROTOCOL = "airlock.v1"
TOKEN_PROTOCOL = "airlock.token."  # noqa: S105 - a prefix, not a token
AUTH_WAIT_S = 5
SNAPSHOT_WAIT_S = 2
RECENT_COMMANDS = 20
PENDING_LIMIT = 2000
OUTBOX_CHARS = 2**20  # what waits for one slow subscriber; past it (or OUTBOX_EVENTS), events are dropped
OUTBOX_EVENTS = 10_000
ALWAYS_SENT = {"command.exited", "session.state", "lagged"}  # small, one per command at most: never dropped
RECONCILE_S = 1.0
FORBIDDEN = 4403


class OneWayJsonConsumer(AsyncJsonWebsocketConsumer):
    """A stream whose subscribers send nothing but, perhaps, a first JSON message: a frame that
    is not JSON (text or binary) is handed on as None, never a crash of the consumer."""

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            content = json.loads(text_data) if text_data is not None else None
        except (ValueError, RecursionError):  # RecursionError: nested past the json module's limit
            content = None
        await self.receive_json(content)


@database_sync_to_async
def _session_for_user(user, session_id) -> Session | None:
    if user is None or not user.is_authenticated:
        return None
    session = Session.objects.filter(pk=session_id).select_related("tenant").first()
    if session is None or not Membership.objects.filter(user=user, tenant_id=session.tenant_id).exists():
        return None
    return session


@database_sync_to_async
def _session_for_token(token: str, session_id) -> Session | None:
    """A session token's own live session, or a session of an API key's tenant when the key has
    the scope `sessions` (what the CLI holds: it reaches those sessions through the API too)."""
    if token.startswith(ApiKey.PREFIX):
        try:
            api_key = api_key_for(token)
        except ApiKeyFailed:
            return None
        if "sessions" not in api_key.scopes:
            return None
        return Session.objects.filter(pk=session_id, tenant_id=api_key.tenant_id).select_related("tenant").first()
    session = session_by_token(token) if token.startswith("ast_") else None
    if session is None or str(session.pk) != str(session_id):
        return None
    return session if not_live(session.state, session.expires_at, creating=True) is None else None


@database_sync_to_async
def _opening_state(session_id) -> dict:
    session = Session.objects.select_related("policy_version__policy").get(pk=session_id)
    commands = list(session.commands.order_by("-created_at")[:RECENT_COMMANDS])
    return {
        "event": "session.state", "session": str(session.pk), "state": session.state,
        "reason": session.state_reason, "conversation_id": session.conversation_id,
        "runner": session.runner_id if session.is_active else None,
        "commands": [{"command": str(c.pk), "argv": c.argv, "state": c.state, "exit_code": c.exit_code,
                      "reason": c.reason, "output": c.output if c.finished else "", "truncated": c.truncated}
                     for c in reversed(commands)],
    }


@database_sync_to_async
def _session_now(session_id, command_ids: set[str], since) -> tuple[dict, list[dict], bool]:
    """The session's state event, the end events of its commands created since `since` (or named)
    that have ended, and whether any command of the session is still queued or running."""
    session = Session.objects.get(pk=session_id)
    state = {"event": "session.state", "session": str(session.pk), "state": session.state,
             "reason": session.state_reason}
    ended = [{"event": "command.exited", "session": str(session.pk), "command": str(c.pk), "exit_code": c.exit_code,
              "reason": c.reason, "duration_ms": c.duration_ms, "truncated": c.truncated, "reconciled": True}
             for c in session.commands.filter(Q(pk__in=command_ids) | Q(created_at__gte=since)).order_by("created_at")
             if c.finished]
    return state, ended, session.commands.filter(state__in=(CommandState.QUEUED, CommandState.RUNNING)).exists()


class SessionConsumer(OneWayJsonConsumer):
    async def connect(self):
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        self.joined = self.refused = False
        self.pending: list | None = None
        self.last_seq: int | None = None
        self.waiter: asyncio.Task | None = None
        self.sender: asyncio.Task | None = None
        self.outbox: collections.deque = collections.deque()
        self.outbox_chars = 0
        self.missed = 0
        self.has_mail = asyncio.Event()
        self.state: str | None = None  # the session state last sent
        self.unended: set[str] = set()  # commands seen starting whose end has not been sent
        self.ended: set[str] = set()
        self.reconciler: asyncio.Task | None = None
        self.output_at: dict[str, float] = {}  # a command's last output delivered (loop time)
        offered = self.scope.get("subprotocols") or []
        await self.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        session = await _session_for_user(self.scope.get("user"), self.session_id)
        token = next((p[len(TOKEN_PROTOCOL):] for p in offered if p.startswith(TOKEN_PROTOCOL)), None)
        if session is None and token is not None:
            session = await _session_for_token(token, self.session_id)
            if session is None:
                await self._refuse()
                return
        if session is None:  # perhaps a first-message token: wait for it, briefly
            self.waiter = asyncio.create_task(self._close_later(AUTH_WAIT_S))
            return
        await self._join()

    async def receive_json(self, content, **kwargs):
        if self.joined or self.refused:
            return  # the stream is one-way: nothing a subscriber sends is acted on
        if not isinstance(content, dict) or content.get("type") != "auth" or not isinstance(content.get("token"), str):
            await self._refuse()
            return
        if await _session_for_token(content["token"], self.session_id) is None:
            await self._refuse()
            return
        self.waiter.cancel()
        await self._join()

    async def _close_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.waiter = None  # (this task: not cancelled by the refusal it makes)
        await self._refuse()

    async def _refuse(self) -> None:
        """Close with 4403, once: a second close is an error to the server."""
        if self.refused:
            return
        self.refused = True
        if self.waiter is not None:
            self.waiter.cancel()
        await self.close(code=FORBIDDEN)

    async def _join(self) -> None:
        self.joined, self.joined_at = True, timezone.now()
        self.sender = asyncio.create_task(self._send_outbox())
        await self.channel_layer.group_add(session_group(self.session_id), self.channel_name)
        opening = await _opening_state(self.session_id)
        self.unended.update(c["command"] for c in opening["commands"] if c["state"] in {"queued", "running"})
        self._post(opening)
        if opening["runner"]:
            self.pending = []
            await self.channel_layer.send(runner_channel(opening["runner"]), {
                "type": "session.snapshot", "session": self.session_id, "reply_to": self.channel_name,
                "reply_type": "airlock.snapshot",
            })
            self.waiter = asyncio.create_task(self._snapshot_timeout())

    async def _snapshot_timeout(self) -> None:
        await asyncio.sleep(SNAPSHOT_WAIT_S)
        self._flush_pending()

    async def disconnect(self, code):
        for task in (self.waiter, self.sender, self.reconciler):
            if task is not None:
                task.cancel()
        if self.joined:
            await self.channel_layer.group_discard(session_group(self.session_id), self.channel_name)

    def _post(self, event: dict) -> None:
        """Queue an event for the subscriber. Past the outbox's bounds an event is dropped and
        counted (the count goes out as `lagged` before the next event let through), except the
        ends of commands and states, which reconciliation relies on to reach the subscriber."""
        size = _size(event)
        kind = event.get("event")
        if kind not in ALWAYS_SENT and (len(self.outbox) >= OUTBOX_EVENTS or self.outbox_chars + size > OUTBOX_CHARS):
            self.missed += 1
            if kind != "command.output":
                self._reconcile_soon()
            return
        if self.missed:
            self.outbox.append({"event": "lagged", "session": self.session_id, "missed": self.missed})
            self.missed = 0
        if kind == "session.state":
            self.state = event["state"]
        elif kind == "command.started":
            self.unended.add(event["command"])
        elif kind == "command.exited":
            self.unended.discard(event["command"])
            self.ended.add(event["command"])
        self.outbox.append(event)
        self.outbox_chars += size
        self.has_mail.set()

    async def _send_outbox(self) -> None:
        while True:
            await self.has_mail.wait()
            while self.outbox:
                event = self.outbox.popleft()
                self.outbox_chars -= _size(event)
                try:
                    await self.send_json(event)  # waits while the connection drains
                except OSError:  # the client is gone (the server says so); the disconnect follows
                    return
            self.has_mail.clear()

    async def airlock_snapshot(self, message):
        if self.pending is None:
            return
        if message.get("command"):
            self._post({"event": "command.output", "session": self.session_id, "command": message["command"],
                        "stream": "tail", "data": message["output"], "snapshot": True})
        self.last_seq = message.get("seq")
        self._flush_pending()

    def _flush_pending(self) -> None:
        pending, self.pending = self.pending, None
        for event in pending or []:
            self._deliver(event)

    async def airlock_event(self, message):
        event = message["event"]
        if self.pending is not None and "seq" in event:
            if len(self.pending) < PENDING_LIMIT:
                self.pending.append(event)
            return  # past the limit the gap shows up as `lagged` once the snapshot arrives
        self._deliver(event)

    def _deliver(self, event: dict) -> None:
        seq = event.get("seq")
        if seq is not None:
            if self.last_seq is not None and seq <= self.last_seq:
                return  # the snapshot already held it
            first = event.get("seq_from", seq)
            if self.last_seq is not None and first > self.last_seq + 1:
                self.missed += first - self.last_seq - 1  # dropped before it reached this consumer
                self._reconcile_soon()
            self.last_seq = seq
        if event.get("event") == "command.exited" and event["command"] in self.ended:
            return  # reconciliation already sent it
        if event.get("event") == "command.output":
            self.output_at[event["command"]] = asyncio.get_running_loop().time()
        elif event.get("event") == "command.exited":
            self.output_at.pop(event["command"], None)
        self._post(event)

    def _reconcile_soon(self) -> None:
        if self.reconciler is None or self.reconciler.done():
            self.reconciler = asyncio.create_task(self._reconcile())

    async def _reconcile(self) -> None:
        """While something may have been lost: now and then (from RECONCILE_S, slowing to 10 s),
        send what the database says ended and the session's state, until no command of the
        session is queued or running."""
        busy, pause = True, RECONCILE_S
        while busy:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 10.0)
            state, ended, busy = await _session_now(self.session_id, set(self.unended), self.joined_at)
            now = asyncio.get_running_loop().time()
            for event in ended:
                if event["command"] in self.ended:
                    continue
                if now - self.output_at.get(event["command"], -RECONCILE_S) < RECONCILE_S:
                    busy = True  # its output still arrives: its end goes after it, on a later pass
                    continue
                self._post(event)
            if state["state"] != self.state:
                self._post(state)


def _size(event: dict) -> int:
    """What an event weighs in the outbox: its output, or the argv it carries."""
    return len(event.get("data") or "") + sum(len(arg) for arg in event.get("argv") or ())


class TenantSessionsConsumer(OneWayJsonConsumer):
    """The operator dashboard's live list: every session change of one tenant."""

    async def connect(self):
        await self.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in (self.scope.get("subprotocols") or []) else None)
        self.group = None
        tenant_id = await self._tenant_id(self.scope.get("user"), self.scope["url_route"]["kwargs"]["tenant_slug"])
        if tenant_id is None:
            await self.close(code=FORBIDDEN)
            return
        self.group = tenant_group(tenant_id)
        await self.channel_layer.group_add(self.group, self.channel_name)

    @database_sync_to_async
    def _tenant_id(self, user, slug: str) -> int | None:
        if user is None or not user.is_authenticated:
            return None
        return Membership.objects.filter(user=user, tenant__slug=slug).values_list("tenant_id", flat=True).first()

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def airlock_event(self, message):
        await self.send_json(message["event"])
