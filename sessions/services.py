"""Writes of sessions and command runs. Each state change is a conditional UPDATE (the state
machine of models.SessionQuerySet.transition) and its live event leaves after commit."""

import functools
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.models import Tenant
from policies_app.document import DocumentError, Runtime, parse_yaml
from policies_app.models import DecisionRecord, PolicyVersion
from sessions.events import publish_on_commit, session_changed_on_commit
from sessions.models import (
    ACTIVE_STATES,
    CommandRun,
    CommandState,
    Runner,
    Session,
    SessionState,
    hash_token,
    new_token,
    session_group,
)

# How a command's exit reason maps to its state; the reason itself is kept beside it.
COMMAND_STATE_BY_REASON = {"exited": CommandState.EXITED, "timeout": CommandState.TIMEOUT,
                           "killed": CommandState.KILLED}


def driver_of(version: PolicyVersion) -> tuple[str, bool]:
    """The driver a session of this version runs on, and whether the policy named it (else it
    is the deployment's AIRLOCK_RUNTIME). Read from the source as its author wrote it: versions
    stored before `runtime.driver` became optional hold `bubblewrap` in their document either way."""
    runtime = _runtime_as_written(version.source) or Runtime.model_validate(version.document["runtime"])
    return runtime.driver_for(settings.AIRLOCK_RUNTIME), runtime.driver is not None or runtime.isolation == "gvisor"


@functools.lru_cache(maxsize=256)  # a version's source never changes: parse it once, not per session
def _runtime_as_written(source: str) -> Runtime | None:
    try:
        return parse_yaml(source).runtime
    except DocumentError:  # a source today's schema refuses: its stored document still says
        return None


@transaction.atomic
def session_create(*, tenant: Tenant, conversation_id: str, policy_version: PolicyVersion, runner: Runner,
                   created_by: str, workspace_source: str = "") -> tuple[Session, str]:
    """A session in state `creating`, placed on `runner`; returns it with its token (shown once)."""
    token = new_token()
    document = policy_version.document
    driver, _named = driver_of(policy_version)
    now = timezone.now()
    session = Session.objects.create(
        tenant=tenant, conversation_id=conversation_id, policy_version=policy_version,
        driver=driver, runner=runner, token_hash=hash_token(token),
        workspace_source=workspace_source, created_by=created_by[:100], created_at=now, last_activity_at=now,
        expires_at=now + timedelta(seconds=document["limits"]["session_ttl_s"]),
    )
    session_changed_on_commit(session)
    return session, token


@transaction.atomic
def session_ready(*, session_id, rootfs_digest: str, prepare_ms: int | None = None,
                  cache_hit: bool | None = None) -> bool:
    """`prepare_ms`: the runner's time to make the sandbox and its workspace; `cache_hit`: the
    root filesystem was already in the local cache."""
    Session.objects.filter(pk=session_id).update(rootfs_digest=rootfs_digest, prepare_ms=prepare_ms,
                                                 cache_hit=cache_hit)
    moved = Session.objects.transition(session_id, to=SessionState.READY, allowed_from=(SessionState.CREATING,))
    if moved:
        session_changed_on_commit(Session.objects.select_related("policy_version__policy").get(pk=session_id))
    return moved


@transaction.atomic
def session_finish(*, session_id, state: str, reason: str) -> bool:
    """End an active session in `state` (ended, killed, expired, failed). Its queued and running
    commands end with it. True when this call ended it; False when it had already ended."""
    moved = Session.objects.transition(session_id, to=state, reason=reason)
    if moved:
        commands_abandon(session_id=session_id, state=CommandState.KILLED if state == SessionState.KILLED
                         else CommandState.FAILED, reason=f"session {state}")
        session_changed_on_commit(Session.objects.select_related("policy_version__policy").get(pk=session_id))
    return moved


def session_kill(*, session: Session, actor, reason: str = "") -> bool:
    """Kill a session (its runner is told by the caller, after commit). Audited."""
    with transaction.atomic():
        moved = session_finish(session_id=session.pk, state=SessionState.KILLED, reason=reason or "killed")
        if moved:
            audit_record(tenant=session.tenant, actor=actor, action="session.killed", target=session,
                         data={"conversation_id": session.conversation_id, "reason": reason})
    return moved


def sessions_for_bulk_kill(*, tenant: Tenant, conversation_id: str | None) -> list[Session]:
    sessions = Session.objects.filter(tenant=tenant, state__in=ACTIVE_STATES)
    if conversation_id is not None:
        sessions = sessions.filter(conversation_id=conversation_id)
    return list(sessions.select_related("tenant"))


def session_touch(*, session_id) -> None:
    Session.objects.filter(pk=session_id).update(last_activity_at=timezone.now())


def session_record_stats(*, session_id, cpu_s, memory_bytes, disk_bytes) -> None:
    Session.objects.filter(pk=session_id).update(cpu_s=cpu_s, memory_bytes=memory_bytes, disk_bytes=disk_bytes)


@transaction.atomic
def command_queue(*, session: Session, argv: list[str], cwd: str, timeout_s: int,
                  decision: DecisionRecord) -> CommandRun:
    return CommandRun.objects.create(session=session, argv=argv, cwd=cwd, timeout_s=timeout_s, decision=decision)


def command_start(*, command_id):
    """Mark a queued command running; returns its start time, or None if it was no longer queued."""
    now = timezone.now()
    marked = CommandRun.objects.filter(pk=command_id, state=CommandState.QUEUED).update(
        state=CommandState.RUNNING, started_at=now)
    return now if marked else None


def command_finish(*, command_id, exit_code: int | None, reason: str, output: str, truncated: bool,
                   output_bytes: int, duration_ms: int) -> dict:
    """Record a command's end; returns the fields written (a waiting caller answers with them)."""
    fields = {"state": COMMAND_STATE_BY_REASON.get(reason, CommandState.FAILED), "exit_code": exit_code,
              "reason": reason, "output": output, "truncated": truncated, "output_bytes": output_bytes,
              "duration_ms": duration_ms, "ended_at": timezone.now()}
    CommandRun.objects.filter(pk=command_id).update(**fields, started_at=Coalesce("started_at", fields["ended_at"]))
    return fields


def command_fail_queued(*, command_id, reason: str) -> None:
    """A queued command that will never run (its runner is gone, its session ended)."""
    CommandRun.objects.filter(pk=command_id, state=CommandState.QUEUED).update(
        state=CommandState.FAILED, reason=reason[:20], ended_at=timezone.now())


def commands_abandon(*, session_id, state: str, reason: str) -> None:
    """Queued and running commands of a session that ended: they will never report an exit."""
    CommandRun.objects.filter(session_id=session_id, state__in=(CommandState.QUEUED, CommandState.RUNNING)).update(
        state=state, reason=reason, ended_at=timezone.now(),
    )


def decision_event_on_commit(*, session: Session, decision: dict, request: dict) -> None:
    publish_on_commit(session_group(session.pk), {"event": "decision", "session": str(session.pk),
                                                 "decision": decision, "request": request})
