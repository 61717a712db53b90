"""WebSockets: a session's live stream, and a tenant's live session list.

`/ws/sessions/<id>/` admits a signed-in member of the session's tenant (any role), or the
session's own token, sent as the subprotocol `airlock.token.<token>` beside `airlock.v1` or as a
first message `{"type": "auth", "token": …}` within AUTH_WAIT_S. Never in the URL, where logs
would keep it. Anyone else is closed with 4403.

A late subscriber first gets the session's state and recent commands, then the running
command's tail so far (a snapshot from the runner), then live events. Output events carry
sequence numbers: events the snapshot already covers are skipped, and a gap (the channel
layer dropped messages for a slow subscriber, or the runner's outbox was full) becomes one
`lagged` event instead of a silent hole."""

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import timezone

from controlplane.models import Membership
from sessions.models import Session, runner_channel, session_group, tenant_group
from sessions.selectors import session_by_token

SUBPROTOCOL = "airlock.v1"
TOKEN_PROTOCOL = "airlock.token."  # noqa: S105 - a prefix, not a token
AUTH_WAIT_S = 5
SNAPSHOT_WAIT_S = 2
RECENT_COMMANDS = 20
PENDING_LIMIT = 2000
FORBIDDEN = 4403


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
    session = session_by_token(token) if token.startswith("ast_") else None
    if session is None or str(session.pk) != str(session_id) or not session.is_active:
        return None
    if session.expires_at <= timezone.now():
        return None
    return session


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


class SessionConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        self.joined = False
        self.pending: list | None = None
        self.last_seq: int | None = None
        self.waiter: asyncio.Task | None = None
        offered = self.scope.get("subprotocols") or []
        await self.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        session = await _session_for_user(self.scope.get("user"), self.session_id)
        token = next((p[len(TOKEN_PROTOCOL):] for p in offered if p.startswith(TOKEN_PROTOCOL)), None)
        if session is None and token is not None:
            session = await _session_for_token(token, self.session_id)
            if session is None:
                await self.close(code=FORBIDDEN)
                return
        if session is None:  # perhaps a first-message token: wait for it, briefly
            self.waiter = asyncio.create_task(self._close_later(AUTH_WAIT_S))
            return
        await self._join()

    async def receive_json(self, content, **kwargs):
        if self.joined:
            return  # the stream is one-way: nothing a subscriber sends is acted on
        if not isinstance(content, dict) or content.get("type") != "auth" or not isinstance(content.get("token"), str):
            await self.close(code=FORBIDDEN)
            return
        if await _session_for_token(content["token"], self.session_id) is None:
            await self.close(code=FORBIDDEN)
            return
        self.waiter.cancel()
        await self._join()

    async def _close_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.close(code=FORBIDDEN)

    async def _join(self) -> None:
        self.joined = True
        await self.channel_layer.group_add(session_group(self.session_id), self.channel_name)
        opening = await _opening_state(self.session_id)
        await self.send_json(opening)
        if opening["runner"]:
            self.pending = []
            await self.channel_layer.send(runner_channel(opening["runner"]), {
                "type": "session.snapshot", "session": self.session_id, "reply_to": self.channel_name,
                "reply_type": "airlock.snapshot",
            })
            self.waiter = asyncio.create_task(self._snapshot_timeout())

    async def _snapshot_timeout(self) -> None:
        await asyncio.sleep(SNAPSHOT_WAIT_S)
        await self._flush_pending()

    async def disconnect(self, code):
        if self.waiter is not None:
            self.waiter.cancel()
        if self.joined:
            await self.channel_layer.group_discard(session_group(self.session_id), self.channel_name)

    async def airlock_snapshot(self, message):
        if self.pending is None:
            return
        if message.get("command"):
            await self.send_json({"event": "command.output", "session": self.session_id, "command": message["command"],
                                  "stream": "tail", "data": message["output"], "snapshot": True})
        self.last_seq = message.get("seq")
        await self._flush_pending()

    async def _flush_pending(self) -> None:
        pending, self.pending = self.pending, None
        for event in pending or []:
            await self._deliver(event)

    async def airlock_event(self, message):
        event = message["event"]
        if self.pending is not None and "seq" in event:
            if len(self.pending) < PENDING_LIMIT:
                self.pending.append(event)
            return  # past the limit the gap shows up as `lagged` once the snapshot arrives
        await self._deliver(event)

    async def _deliver(self, event: dict) -> None:
        seq = event.get("seq")
        if seq is not None:
            if self.last_seq is not None and seq <= self.last_seq:
                return  # the snapshot already held it
            first = event.get("seq_from", seq)
            if self.last_seq is not None and first > self.last_seq + 1:
                missed = first - self.last_seq - 1
                await self.send_json({"event": "lagged", "session": self.session_id, "missed": missed})
            self.last_seq = seq
        await self.send_json(event)


class TenantSessionsConsumer(AsyncJsonWebsocketConsumer):
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
