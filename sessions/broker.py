"""The command broker: a validated intent → a policy decision (recorded) → a refusal with that
decision, or a queued CommandRun handed to the session's runner; and workspace files, gated the
same way. A session's own moves (open, end, kill) are in sessions/lifecycle.py.

The decision is taken with the version the session pinned when it started: publishing a new
version changes what new sessions may do, never what a running one may."""

import time
from datetime import datetime

from django.db import transaction

from controlplane import rows
from controlplane.redaction import configured_secrets, redact_data
from policies_app.decisions import Evaluation, allow_file, decide, record_payload, refuse
from sessions import admission, services
from sessions.lifecycle import LifecycleError, not_live
from sessions.models import Artifact, CommandRun, Session
from sessions.persistence.pack import HELPER_TIMEOUT_S
from sessions.persistence.services import persistence_of
from sessions.runner.client import runner_call, runner_send
from sessions.workspace import WRITE_DEADLINE_S, normalize_path


class BrokerError(LifecycleError):
    """Refused or failed, as a LifecycleError is, with the decision when one was taken."""

    def __init__(self, code: str, detail: str, status: int, decision: dict | None = None):
        super().__init__(code, detail, status)
        self.decision = decision


def _not_active(session: Session, why: str, kind: str, request: dict) -> Evaluation:
    return refuse(tenant=session.tenant, version=session.policy_version, kind=kind, request=request,
                  reason_code="session_not_active", message=f"the session is {why}",
                  hint="open a new session; an ended, killed, expired or failed session runs nothing",
                  session_id=session.pk, conversation_id=session.conversation_id, secrets=configured_secrets())


def command_propose(*, session: Session, request: dict, wait: bool) -> CommandRun:
    """Decide, queue, hand to the runner. Raises BrokerError(command_denied) with the decision."""
    secrets = configured_secrets()
    with transaction.atomic():
        [(state, expires_at)] = rows.select(Session, ("state", "expires_at"), {"pk": session.pk}, for_update=True)
        why = not_live(state, expires_at)
        over = None
        if why is None:
            admission.lock_tenant(session.tenant)
            over = admission.commands_refusal(session.tenant)
        if why is not None:
            evaluation = _not_active(session, why, "exec", request)
        elif over is not None:
            evaluation = refuse(tenant=session.tenant, version=session.policy_version, kind="exec", request=request,
                                reason_code="tenant_limit", message=over, hint=admission.LIMIT_HINT,
                                session_id=session.pk, conversation_id=session.conversation_id, secrets=secrets)
        else:
            evaluation = decide(tenant=session.tenant, policy=session.policy_version.policy, request=request,
                                session_id=session.pk, conversation_id=session.conversation_id,
                                version=session.policy_version, secrets=secrets)
        payload = _payload(evaluation)
        services.decision_event_on_commit(session=session, decision=payload,
                                          request=redact_data(request, secrets))
        if over is not None:
            denied = BrokerError("too_many_commands", evaluation.decision.message, 429, payload)
        elif not evaluation.decision.allowed:
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


def file_operation(*, session: Session, op: str, path: str, data: bytes | None = None) -> bytes | dict | None:
    """Read (`get`), write (`put`) or list (`list`: a directory, `.` the whole workspace) workspace
    files through the runner, gated like a command (kind `file`)."""
    request = {"op": op, "path": path, "bytes": len(data) if data is not None else None}
    secrets = configured_secrets()
    try:
        relative = "." if op == "list" and path in {"", "."} else normalize_path(path)
    except ValueError as exc:
        evaluation = refuse(tenant=session.tenant, version=session.policy_version, kind="file", request=request,
                            reason_code="path_outside_workspace", message=f"`{path}`: {exc}",
                            hint="use a path relative to /workspace without `..`", session_id=session.pk,
                            conversation_id=session.conversation_id, secrets=secrets)
        raise BrokerError("file_denied", evaluation.decision.message, 403, _payload(evaluation)) from None
    why = not_live(session.state, session.expires_at)
    if why is not None:
        evaluation = _not_active(session, why, "file", request)
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
                  "runner_timeout": 504, "runner_unreachable": 503, "session_busy": 429}.get(reply.get("error"), 400)
        raise BrokerError(reply.get("error", "workspace_error"), reply.get("detail", ""), status)
    return reply.get("data")


def artifact_pack(*, session: Session, name: str, paths: list[str], actor: str) -> Artifact:
    """Pack workspace paths into an artifact through the runner, gated like files (kind
    `artifact`): paths inside the workspace, a policy that keeps things (persistence enabled)."""
    request = {"name": name, "paths": paths}
    secrets = configured_secrets()

    def refused(reason_code: str, message: str, hint: str, rule_id: str | None = None) -> BrokerError:
        evaluation = refuse(tenant=session.tenant, version=session.policy_version, kind="artifact", request=request,
                            reason_code=reason_code, message=message, hint=hint, session_id=session.pk,
                            conversation_id=session.conversation_id, secrets=secrets, rule_id=rule_id)
        return BrokerError("artifact_denied", evaluation.decision.message, 403, _payload(evaluation))

    roots = []
    for path in paths:
        try:
            roots.append(normalize_path(path))
        except ValueError as exc:
            raise refused("path_outside_workspace", f"`{path}`: {exc}", "use paths relative to /workspace without "
                          "`..`") from None
    why = not_live(session.state, session.expires_at)
    if why is not None:
        evaluation = _not_active(session, why, "artifact", request)
        raise BrokerError("artifact_denied", evaluation.decision.message, 403, _payload(evaluation))
    version = session.policy_version
    if not persistence_of(version.document).enabled:
        raise refused("default_deny", f"policy `{version.policy.name}` v{version.number} keeps nothing: artifacts "
                      "need persistence enabled", "a security admin can add `persistence: {enabled: true, "
                      "retention_days: 7, max_mb: 256}` to the policy", rule_id="persistence.enabled")
    reply = runner_call(session.runner_id, {"type": "artifact.pack", "session": str(session.pk), "name": name,
                                            "paths": list(dict.fromkeys(roots)), "actor": actor},
                        timeout_s=HELPER_TIMEOUT_S + 30)
    if not reply.get("ok"):
        status = {"not_found": 404, "too_large": 413, "session_not_active": 409, "runner_timeout": 504,
                  "runner_unreachable": 503, "session_busy": 429}.get(reply.get("error"), 400)
        raise BrokerError(reply.get("error", "workspace_error"), reply.get("detail", ""), status)
    return Artifact.objects.get(pk=reply["artifact"], tenant=session.tenant)
