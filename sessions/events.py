"""Live events: sent to channel-layer groups only after the transaction that caused them commits.

Groups: `session.<id>` (that session's WebSocket subscribers) and `tenant.<id>.sessions` (the
operator dashboard's live list). With the in-memory layer every send must happen on the event
loop that serves the WebSockets; when this process embeds a runner, that is the runner's loop,
so sends from other threads are handed to it."""

import asyncio

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from sessions.models import Session, session_group, tenant_group

_loop: asyncio.AbstractEventLoop | None = None  # the loop of this process's runner, if it has one


def deliver_on(loop: asyncio.AbstractEventLoop | None) -> None:
    """Send events on `loop` from now on (sessions/runner/__init__.py says which, when this
    process gets or loses a runner): this module knows nothing of runners."""
    global _loop
    _loop = loop


def publish(group: str, event: dict) -> None:
    """Send one event to a group now, from synchronous code."""
    message = {"type": "airlock.event", "event": event}
    layer = get_channel_layer()
    loop = _loop
    if loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
        return
    async_to_sync(layer.group_send)(group, message)


def publish_on_commit(group: str, event: dict) -> None:
    transaction.on_commit(lambda: publish(group, event))


def session_summary(session: Session, *, running: str = "") -> dict:
    """One row of the operator dashboard's live list."""
    version = session.policy_version
    return {
        "id": str(session.id), "conversation_id": session.conversation_id, "state": session.state,
        "state_reason": session.state_reason, "created_at": session.created_at.isoformat(),
        "policy_version": f"{version.policy.name} v{version.number}", "driver": session.driver,
        "running": running, "cpu_s": session.cpu_s, "memory_bytes": session.memory_bytes,
    }


def session_changed_on_commit(session: Session, *, running: str = "") -> None:
    """The session's state (to its subscribers) and its row (to the tenant's live list)."""
    publish_on_commit(session_group(session.id), {
        "event": "session.state", "session": str(session.id), "state": session.state, "reason": session.state_reason,
    })
    publish_on_commit(tenant_group(session.tenant_id), {"event": "session.updated",
                                                        "session": session_summary(session, running=running)})
