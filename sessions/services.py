"""Writes of command runs and of a session's figures. A session's state moves in
sessions/lifecycle.py; each live event leaves after commit."""

import functools

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane import rows
from policies_app.document import DocumentError, Runtime, parse_yaml
from policies_app.models import DecisionRecord, PolicyVersion
from sessions.events import publish_on_commit
from sessions.models import (
    CommandRun,
    CommandState,
    Session,
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


def session_touch(*, session_id) -> None:
    rows.update(Session, {"pk": session_id}, {"last_activity_at": timezone.now()})


def session_record_stats(*, session_id, cpu_s, memory_bytes, disk_bytes) -> None:
    Session.objects.filter(pk=session_id).update(cpu_s=cpu_s, memory_bytes=memory_bytes, disk_bytes=disk_bytes)


def command_queue(*, session: Session, argv: list[str], cwd: str, timeout_s: int,
                  decision: DecisionRecord) -> CommandRun:
    command = CommandRun(session=session, argv=argv, cwd=cwd, timeout_s=timeout_s, decision=decision)
    rows.insert([command])
    return command


def command_start(*, command_id):
    """Mark a queued command running; returns its start time, or None if it was no longer queued."""
    now = timezone.now()
    marked = rows.update(CommandRun, {"pk": command_id, "state": CommandState.QUEUED},
                         {"state": CommandState.RUNNING, "started_at": now})
    return now if marked else None


@transaction.atomic
def command_finish(*, session_id, command_id, started_at, exit_code: int | None, reason: str, output: str,
                   truncated: bool, output_bytes: int, duration_ms: int) -> dict:
    """Record the end of a command that started at `started_at` (command_start), and its
    session's activity, in one transaction; returns the fields written (a waiting caller answers
    with them)."""
    if started_at is None:
        raise ValueError("command_finish records a command that started: command_start gives its start time")
    fields = {"state": COMMAND_STATE_BY_REASON.get(reason, CommandState.FAILED), "exit_code": exit_code,
              "reason": reason, "output": output, "truncated": truncated, "output_bytes": output_bytes,
              "duration_ms": duration_ms, "started_at": started_at, "ended_at": timezone.now()}
    rows.update(CommandRun, {"pk": command_id}, fields)
    rows.update(Session, {"pk": session_id}, {"last_activity_at": fields["ended_at"]})
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
