"""Live events: sent to channel-layer groups only after the transaction that caused them commits.

Groups: `session.<id>` (that session's WebSocket subscribers) and `tenant.<id>.sessions` (the
operator dashboard's live list). Sends go through sessions/layer.py, which knows on which loop
the in-memory layer lives. This module imports nothing of the runner."""

from channels.layers import get_channel_layer
from django.db import transaction

from sessions import layer
from sessions.models import Session, session_group, tenant_group


def publish(group: str, event: dict) -> None:
    """Send one event to a group now, from synchronous code."""
    message = {"type": "airlock.event", "event": event}
    layer.start(lambda: get_channel_layer().group_send(group, message))


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
