"""The command broker: a validated intent → a policy decision (recorded) → a refusal with that
decision, or a queued CommandRun handed to the session's runner. Session lifecycle operations
that need the runner (create, end, kill, files) live here too, so views stay short.

The decision is taken with the version the session pinned when it started: publishing a new
version changes what new sessions may do, never what a running one may."""

import time
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from controlplane.models import Tenant
from controlplane.redaction import configured_secrets, redact_data
from policies_app.decisions import Evaluation, allow_file, decide, record_payload, refuse
from policies_app.models import Policy
from sessions import services
from sessions.models import CommandRun, Session, SessionState
from sessions.runner.client import NoRunner, runner_call, runner_pick, runner_send
from sessions.workspace import WRITE_DEADLINE_S, allowed_repositories, normalize_path

CREATE_TIMEOUT_S = 120  # a gVisor sandbox with a large checkout can take seconds
RELEASE_TIMEOUT_S = 60


class BrokerError(Exception):
    """Refused or failed, with an API error code, a message, and the HTTP status it maps to."""

    def __init__(self, code: str, detail: str, status: int, decision: dict | None = None):
        super().__init__(detail)
        self.code, self.detail, self.status, self.decision = code, detail, status, decision


@dataclass
class Created:
    session: Session
    token: str


def session_open(*, tenant: Tenant, conversation_id: str, policy_name: str, repository: str,
                 actor_label: str) -> Created:
    policy = Policy.objects.filter(tenant=tenant, name=policy_name).first()
    version = policy.published_version() if policy else None
    if version is None:
        raise BrokerError("policy_not_published", f"policy {policy_name!r} has no published version; a security "
                          "admin can publish one", 409)
    if repository and repository not in allowed_repositories(tenant.slug):
        raise BrokerError("invalid_request", f"{repository!r} is not an allowlisted repository", 400)
    try:
        runner = runner_pick()
    except NoRunner as exc:
        raise BrokerError("no_runner", str(exc), 503) from None
    session, token = services.session_create(tenant=tenant, conversation_id=conversation_id, policy_version=version,
                                             runner=runner, created_by=actor_label, workspace_source=repository)
    reply = runner_call(runner.pk, {"type": "session.create", "session": str(session.pk), "tenant": tenant.pk},
                        timeout_s=CREATE_TIMEOUT_S)
    if not reply.get("ok"):
        services.session_finish(session_id=session.pk, state=SessionState.FAILED, reason=reply.get("detail", ""))
        chosen_by = (f"policy `{policy.name}` v{version.number} names it in runtime" if services.driver_of(version)[1]
                     else "the deployment's default, AIRLOCK_RUNTIME")
        raise BrokerError("sandbox_unavailable", f"the sandbox could not start on the {session.driver} driver "
                          f"({chosen_by}): {reply.get('detail')}", 503)
    session.refresh_from_db()
    return Created(session=session, token=token)


def _not_active(session: Session, kind: str, request: dict) -> Evaluation:
    state = session.state if session.state != SessionState.READY else "past its time to live"
    return refuse(tenant=session.tenant, version=session.policy_version, kind=kind, request=request,
                  reason_code="session_not_active", message=f"the session is {state}",
                  hint="open a new session; an ended, killed, expired or failed session runs nothing",
                  session_id=session.pk, conversation_id=session.conversation_id, secrets=configured_secrets())


def command_propose(*, session: Session, request: dict, wait: bool) -> CommandRun:
    """Decide, queue, hand to the runner. Raises BrokerError(command_denied) with the decision."""
    secrets = configured_secrets()
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        if locked.state != SessionState.READY or locked.expires_at <= timezone.now():
            evaluation = _not_active(locked, "exec", request)
        else:
            evaluation = decide(tenant=session.tenant, policy=session.policy_version.policy, request=request,
                                session_id=session.pk, conversation_id=session.conversation_id,
                                version=session.policy_version, secrets=secrets)
        payload = _payload(evaluation)
        services.decision_event_on_commit(session=session, decision=payload,
                                          request=redact_data(request, secrets))
        if not evaluation.decision.allowed:
            denied = BrokerError("command_denied", evaluation.decision.message, 403, payload)
        else:
            denied = None
            limits = session.policy_version.document["limits"]
            command = services.command_queue(
                session=session, argv=redact_data(list(evaluation.decision.argv), secrets),
                cwd=redact_data(request["cwd"], secrets),
                timeout_s=request.get("timeout_s") or limits["command_timeout_s"], decision=evaluation.record)
    if denied:
        raise denied
    message = {"type": "command.run", "session": str(session.pk), "command": str(command.pk),
               "argv": list(evaluation.decision.argv), "stored_argv": command.argv, "cwd": request["cwd"],
               "timeout_s": command.timeout_s, "tail_chars": limits["output_tail_chars"]}
    if wait:
        reply = runner_call(session.runner_id, {**message, "wait": True}, timeout_s=command.timeout_s + 30)
        for field, value in (reply.get("command") or {}).items():  # as written: no need to read it back
            setattr(command, field, datetime.fromisoformat(value) if field.endswith("_at") else value)
        reached = reply.get("error") != "runner_unreachable"
    else:
        reached = runner_send(session.runner_id, message)
    if not reached:  # it will never run: say so rather than leave it queued
        services.command_fail_queued(command_id=command.pk, reason="runner unreachable")
        command.refresh_from_db()
    return command


def _payload(evaluation: Evaluation) -> dict:
    return record_payload(evaluation.record)


def session_stop(*, session: Session, state: str, actor, reason: str, wait: bool = True) -> Session:
    """End (`ended`) or kill (`killed`) a session and have its runner destroy the sandbox;
    `wait` for it (the API), or only tell it (the dashboard's one request thread)."""
    if state == SessionState.KILLED:
        moved = services.session_kill(session=session, actor=actor, reason=reason)
    else:
        moved = services.session_finish(session_id=session.pk, state=state, reason=reason)
    if not moved:
        session.refresh_from_db()
        raise BrokerError("session_not_active", f"the session is already {session.state}", 409)
    if wait:
        release(session)
    elif session.runner_id:
        runner_send(session.runner_id, {"type": "session.release", "session": str(session.pk)})
    session.refresh_from_db()
    return session


def release(session: Session) -> None:
    """Tell the owning runner to tear the sandbox down. If it does not answer, its housekeeping
    (or, if it is dead, the reaper of a live runner) destroys the sandbox of the ended session."""
    if session.runner_id:
        runner_call(session.runner_id, {"type": "session.release", "session": str(session.pk)},
                    timeout_s=RELEASE_TIMEOUT_S)


def sessions_kill_bulk(*, tenant: Tenant, conversation_id: str | None, actor, reason: str) -> int:
    killed = 0
    for session in services.sessions_for_bulk_kill(tenant=tenant, conversation_id=conversation_id):
        if services.session_kill(session=session, actor=actor, reason=reason):
            killed += 1
            if session.runner_id:
                runner_send(session.runner_id, {"type": "session.release", "session": str(session.pk)})
    return killed


def file_operation(*, session: Session, op: str, path: str, data: bytes | None = None) -> bytes | None:
    """Read or write one workspace file through the runner, gated like a command (kind `file`)."""
    request = {"op": op, "path": path, "bytes": len(data) if data is not None else None}
    secrets = configured_secrets()
    try:
        relative = normalize_path(path)
    except ValueError as exc:
        evaluation = refuse(tenant=session.tenant, version=session.policy_version, kind="file", request=request,
                            reason_code="path_outside_workspace", message=f"`{path}`: {exc}",
                            hint="use a path relative to /workspace without `..`", session_id=session.pk,
                            conversation_id=session.conversation_id, secrets=secrets)
        raise BrokerError("file_denied", evaluation.decision.message, 403, _payload(evaluation)) from None
    if session.state != SessionState.READY or session.expires_at <= timezone.now():
        evaluation = _not_active(session, "file", request)
        raise BrokerError("file_denied", evaluation.decision.message, 403, _payload(evaluation))
    allow_file(tenant=session.tenant, version=session.policy_version, request=request, session_id=session.pk,
               conversation_id=session.conversation_id, secrets=secrets)
    message = {"type": f"file.{op}", "session": str(session.pk), "path": relative}
    if data is not None:
        message.update(data=data, deadline=time.time() + WRITE_DEADLINE_S)
    # Longer than the write's deadline: a 504 from here means it did not land and never will.
    reply = runner_call(session.runner_id, message, timeout_s=WRITE_DEADLINE_S + 30)
    if not reply.get("ok"):
        status = {"not_found": 404, "quota_exceeded": 507, "file_too_large": 413, "session_not_active": 409,
                  "runner_timeout": 504}.get(reply.get("error"), 400)
        raise BrokerError(reply.get("error", "workspace_error"), reply.get("detail", ""), status)
    return reply.get("data")
