"""A session's life, in one place (docs/architecture.md, "Sessions").

    creating ──ready──▶ ready ──end────▶ ended
       │                  ├────kill───▶ killed
       │                  ├────expire─▶ expired
       │                  └────fail───▶ failed
       └── end, kill, expire or fail, while its sandbox is still being made ──┘

A state only moves forward, each move is one conditional UPDATE (`_move`), so two actors racing
(a kill and the time to live, a runner and the API) cannot both win; every move publishes, once
its transaction commits, `session.state` to the session's subscribers and `session.updated` to
the tenant's live list. Who moves a session:

- **open** (`creating`): an API key with the `sessions` scope (`session_open`), which places it
  on the least busy live runner and asks that runner for the sandbox (and, with `resume`, checks
  the snapshot first; its runner checks the bytes: sessions/persistence/services.py);
- **ready**: its runner, once the sandbox and workspace exist (`session_ready`);
- **ended**: its token or its tenant's key (`DELETE`), through `session_stop`;
- **killed**: an operator or the API, one session or a conversation's (`session_stop`,
  `sessions_kill_bulk`); audited;
- **expired**: its runner's housekeeping, past the time to live or idle (`session_finish`);
- **failed**: its runner (the sandbox could not start, the runner stopped), the opener (the
  runner did not answer), another runner (its own runner stopped beating).

An ended session's queued and running commands end with it, and its runner is told to destroy
the sandbox; if that message is lost, the runner's housekeeping (or, for a dead runner, another
runner's reaper) destroys it. A session takes work (commands, files) only while `ready` and
within its time to live (`not_live`)."""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane import rows
from controlplane.audit import audit_record
from controlplane.models import Tenant
from controlplane.redaction import configured_secrets
from policies_app import floor
from policies_app.decisions import record_payload, refuse
from policies_app.document import PolicyDocument
from policies_app.models import Policy, PolicyVersion
from sessions import admission, services
from sessions.events import session_changed_on_commit
from sessions.models import ACTIVE_STATES, CommandState, Session, SessionState, hash_token, new_token
from sessions.persistence import services as persistence
from sessions.runner.client import NoCapacity, NoRunner, runner_call, runner_pick, runner_send
from sessions.workspace import allowed_repositories

CREATE_TIMEOUT_S = 120  # a gVisor sandbox with a large checkout can take seconds
RELEASE_TIMEOUT_S = 60
PAST_TTL = "past its time to live"
# What a session's moves change: every field but its relations (tenant, version, runner, the
# snapshot it resumed), which stay as they were made. A refresh of these keeps the relations
# already read (an answer names the tenant and the version: three queries less).
OWN_FIELDS = [field.attname for field in Session._meta.concrete_fields if not field.is_relation]
FROM = {SessionState.READY: (SessionState.CREATING,), SessionState.ENDED: ACTIVE_STATES,
        SessionState.KILLED: ACTIVE_STATES, SessionState.EXPIRED: ACTIVE_STATES, SessionState.FAILED: ACTIVE_STATES}


class LifecycleError(Exception):
    """Refused or failed, with an API error code, a message, and the HTTP status it maps to."""

    decision: dict | None = None

    def __init__(self, code: str, detail: str, status: int):
        super().__init__(detail)
        self.code, self.detail, self.status = code, detail, status


def not_live(state: str, expires_at, *, creating: bool = False) -> str | None:
    """None while a session takes work (`ready`, or also `creating` for its token, and within
    its time to live); otherwise why not: its state, or PAST_TTL."""
    if state != SessionState.READY and not (creating and state == SessionState.CREATING):
        return state
    if expires_at <= timezone.now():  # even before its runner has marked it expired
        return PAST_TTL
    return None


def _move(session_id, to: str, reason: str = "") -> bool:
    """Move one session to `to` from a state that may reach it; True when this call moved it."""
    now = timezone.now()
    changes = {"state": to, "state_reason": reason[:500], "ready_at" if to == SessionState.READY else "ended_at": now}
    return bool(Session.objects.filter(pk=session_id, state__in=FROM[to]).update(**changes))


def _published(session_id) -> None:
    session_changed_on_commit(Session.objects.select_related("policy_version__policy").get(pk=session_id))


# -- open ------------------------------------------------------------------------------------

@dataclass
class Opened:
    session: Session
    token: str  # shown once


# The containment eval's own policy (sessions/evals/suite.py): wider than the version it derives
# from (it runs the eval's probe scripts), so only the eval opens sessions of it.
EVAL_POLICY = "containment-eval"


def session_open(*, tenant: Tenant, conversation_id: str, policy_name: str, repository: str,
                 actor_label: str, persist: bool = False, resume: str = "",
                 eval_version: PolicyVersion | None = None) -> Opened:
    """A session of the policy's published version, on a live runner, with its sandbox ready.
    `persist`: snapshot its workspace when it ends; `resume`: start from a snapshot of this
    conversation ("latest" or its id), checked in full first (sessions/persistence/services.py).
    The containment eval's policy opens for the eval alone, at the version it names
    (`eval_version`: another eval may publish another one meanwhile)."""
    if (policy_name == EVAL_POLICY) != (eval_version is not None):
        raise LifecycleError("policy_reserved", f"policy {EVAL_POLICY!r} is the containment eval's own: only the "
                             "eval opens sessions of it", 403)
    policy = Policy.objects.filter(tenant=tenant, name=policy_name).first()
    if eval_version is not None and (policy is None or eval_version.policy_id != policy.pk):
        raise LifecycleError("policy_reserved", f"that version is not of this tenant's {EVAL_POLICY!r}", 403)
    if policy is None:
        raise LifecycleError("policy_not_found", f"this tenant has no policy named {policy_name!r} (a key with the "
                             "scope policies:read lists them: GET /api/v1/policies)", 404)
    version = eval_version or policy.published_version()
    if version is None:
        raise LifecycleError("policy_not_published", f"policy {policy_name!r} has no published version; a security "
                             "admin can publish one", 409)
    version.policy = policy  # the row just read: the session's answer names it
    if eval_version is None:  # the eval's policy is wider by design; the eval checks the version it derives from
        _within_floor(tenant=tenant, version=version, conversation_id=conversation_id)
    if repository and repository not in allowed_repositories(tenant.slug):
        raise LifecycleError("invalid_request", f"{repository!r} is not an allowlisted repository", 400)
    if repository and resume:  # a restore settles into an empty workspace (sessions/persistence/pack.py)
        raise LifecycleError("invalid_request", "a session starts from a snapshot or from a checkout, not both", 400)
    resumed = _resume_claim(tenant=tenant, version=version, conversation_id=conversation_id, persist=persist,
                            resume=resume) if persist or resume else None
    reserve = admission.reserved_mb(version.document["limits"])
    try:
        placed = runner_pick(reserve)
    except NoRunner as exc:
        raise LifecycleError("no_runner", str(exc), 503) from None
    except NoCapacity as exc:
        raise LifecycleError("no_capacity", str(exc), 503) from None
    try:
        session, token = _create(tenant=tenant, conversation_id=conversation_id, version=version,
                                 runner_id=placed.runner_id, created_by=actor_label, repository=repository,
                                 reserved_mb=reserve, runners_mb=placed.runners_mb, persist=persist, resumed=resumed)
    except _TenantLimit as exc:  # recorded like a denial, once nothing of the session was written
        evaluation = refuse(tenant=tenant, version=version, kind="session", reason_code="tenant_limit",
                            request={"policy": policy_name, "conversation_id": conversation_id},
                            message=str(exc), hint=admission.LIMIT_HINT, conversation_id=conversation_id,
                            secrets=configured_secrets())
        error = LifecycleError("too_many_sessions", evaluation.decision.message, 429)
        error.decision = record_payload(evaluation.record)
        raise error from None
    reply = runner_call(placed.runner_id, {"type": "session.create", "session": str(session.pk),
                                           "tenant": tenant.pk, "reserved_mb": reserve}, timeout_s=CREATE_TIMEOUT_S)
    if not reply.get("ok"):
        session_finish(session_id=session.pk, state=SessionState.FAILED, reason=reply.get("detail", ""))
        if reply.get("error") == "no_capacity":  # the runner's own count: placement raced another open
            raise LifecycleError("no_capacity", reply["detail"], 503)
        if reply.get("error") in ("provenance_invalid", "provenance_mismatch"):  # the bytes failed a check
            raise _resume_refused(tenant=tenant, version=version, conversation_id=conversation_id, resume=resume,
                                  session_id=session.pk, error=persistence.ProvenanceError(
                                      reply["error"], reply.get("rule_id", "").removeprefix("persistence."),
                                      reply.get("detail", ""), reply.get("hint", "")))
        chosen_by = (f"policy `{policy.name}` v{version.number} names it in runtime" if services.driver_of(version)[1]
                     else "the deployment's default, AIRLOCK_RUNTIME")
        raise LifecycleError("sandbox_unavailable", f"the sandbox could not start on the {session.driver} driver "
                             f"({chosen_by}): {reply.get('detail')}", 503)
    session.refresh_from_db(fields=OWN_FIELDS)  # what its runner wrote
    return Opened(session=session, token=token)


class _TenantLimit(Exception):
    pass


def _resume_claim(*, tenant: Tenant, version: PolicyVersion, conversation_id: str, persist: bool, resume: str):
    """The snapshot to resume, checked from the database, or a refusal recorded like a denial."""
    allowed = persistence.persistence_of(version.document)
    if not allowed.enabled:
        asked = "persist: true" if persist else "resume"
        evaluation = refuse(tenant=tenant, version=version, kind="session", rule_id="persistence.enabled",
                            request={"policy": version.policy.name, "conversation_id": conversation_id,
                                     "persist": persist, "resume": resume},
                            reason_code="default_deny", message=f"{asked} needs a policy whose persistence is "
                            f"enabled, and policy `{version.policy.name}` v{version.number} keeps nothing",
                            hint="a security admin can add `persistence: {enabled: true, retention_days: 7, "
                            "max_mb: 256}` to the policy; sessions are ephemeral without it",
                            conversation_id=conversation_id, secrets=configured_secrets())
        error = LifecycleError("persistence_denied", evaluation.decision.message, 403)
        error.decision = record_payload(evaluation.record)
        raise error
    if not resume:
        return None
    try:
        return persistence.claim(tenant=tenant, conversation_id=conversation_id, resume=resume,
                                 policy_name=version.policy.name, policy=allowed)
    except persistence.ProvenanceError as exc:
        raise _resume_refused(tenant=tenant, version=version, conversation_id=conversation_id, resume=resume,
                              session_id=None, error=exc) from None


def _within_floor(*, tenant: Tenant, version: PolicyVersion, conversation_id: str) -> None:
    """A session runs with its tenant's version checked against the platform floor in force: a
    version the floor has since narrowed below opens nothing (recorded like a denial)."""
    in_force = floor.current()
    widened = floor.check(PolicyDocument.model_validate(version.document), in_force) if in_force else []
    if not widened:
        return
    evaluation = refuse(tenant=tenant, version=version, kind="session", rule_id="platform.floor",
                        request={"policy": version.policy.name, "conversation_id": conversation_id},
                        reason_code="limit_exceeded",
                        message=f"policy `{version.policy.name}` v{version.number} widens the platform floor "
                                f"v{in_force.number}: {widened[0].message}"
                                + (f" (and {len(widened) - 1} more)" if len(widened) > 1 else ""),
                        hint="a security admin can publish a version within the platform floor (the editor marks "
                             "each widening at its line)", conversation_id=conversation_id,
                        secrets=configured_secrets())
    refused = LifecycleError("policy_outside_floor", evaluation.decision.message, 403)
    refused.decision = record_payload(evaluation.record)
    raise refused


def _resume_refused(*, tenant, version, conversation_id: str, resume: str, session_id,
                    error: "persistence.ProvenanceError") -> LifecycleError:
    evaluation = refuse(tenant=tenant, version=version, kind="resume", rule_id=error.rule_id,
                        request={"resume": resume, "conversation_id": conversation_id},
                        reason_code=error.reason_code, message=error.message, hint=error.hint,
                        session_id=session_id, conversation_id=conversation_id, secrets=configured_secrets())
    refused = LifecycleError("resume_denied", evaluation.decision.message, 403)
    refused.decision = record_payload(evaluation.record)
    return refused


@transaction.atomic
def _create(*, tenant: Tenant, conversation_id: str, version: PolicyVersion, runner_id: str, created_by: str,
            repository: str, reserved_mb: int, runners_mb: int, persist: bool = False,
            resumed=None) -> tuple[Session, str]:
    admission.lock_tenant(tenant)
    why = admission.sessions_refusal(tenant, reserved_mb, runners_mb)
    if why is not None:
        raise _TenantLimit(why)
    token = new_token()
    now = timezone.now()
    session = Session(
        tenant=tenant, conversation_id=conversation_id, policy_version=version, driver=services.driver_of(version)[0],
        runner_id=runner_id, token_hash=hash_token(token), workspace_source=repository, created_by=created_by[:100],
        created_at=now, last_activity_at=now, reserved_mb=reserved_mb, persist=persist, resumed_from=resumed,
        expires_at=now + timedelta(seconds=version.document["limits"]["session_ttl_s"]),
    )
    rows.insert([session])
    session_changed_on_commit(session)
    return session, token


# -- the runner's moves ----------------------------------------------------------------------

@transaction.atomic
def session_ready(*, session_id, rootfs_digest: str, prepare_ms: int | None = None,
                  cache_hit: bool | None = None, warm: bool | None = None) -> bool:
    """`prepare_ms`: the runner's time to make the sandbox and its workspace; `cache_hit`: the
    root filesystem was already in the local cache; `warm`: the sandbox came from a warm pool."""
    Session.objects.filter(pk=session_id).update(rootfs_digest=rootfs_digest, prepare_ms=prepare_ms,
                                                 cache_hit=cache_hit, warm=warm)
    moved = _move(session_id, SessionState.READY)
    if moved:
        _published(session_id)
    return moved


@transaction.atomic(savepoint=False)  # inside _end's transaction: no savepoint, nothing there catches
def session_finish(*, session_id, state: str, reason: str) -> bool:
    """End an active session in `state` (ended, killed, expired, failed), with its queued and
    running commands. True when this call ended it; False when it had already ended. The caller
    tells the runner (session_stop does)."""
    moved = _move(session_id, state, reason)
    if moved:
        services.commands_abandon(session_id=session_id, state=CommandState.KILLED if state == SessionState.KILLED
                                  else CommandState.FAILED, reason=f"session {state}")
        _published(session_id)
    return moved


# -- end and kill ----------------------------------------------------------------------------

def session_stop(*, session: Session, state: str, actor, reason: str, wait: bool = True) -> Session:
    """End (`ended`) or kill (`killed`, audited) a session and have its runner destroy the
    sandbox; `wait` for it (the API), or only tell it (the dashboard's one request thread)."""
    if not _end(session, state, actor, reason):
        session.refresh_from_db(fields=OWN_FIELDS)
        raise LifecycleError("session_not_active", f"the session is already {session.state}", 409)
    if session.runner_id:
        release = {"type": "session.release", "session": str(session.pk)}
        if wait:  # if it does not answer, its housekeeping (or a live runner's reaper) destroys the sandbox
            runner_call(session.runner_id, release, timeout_s=RELEASE_TIMEOUT_S)
        else:
            runner_send(session.runner_id, release)
    session.refresh_from_db(fields=OWN_FIELDS)
    return session


def sessions_kill_bulk(*, tenant: Tenant, conversation_id: str | None, actor, reason: str) -> int:
    """Kill every active session of the tenant (or of one conversation); their runners are told."""
    sessions = Session.objects.filter(tenant=tenant, state__in=ACTIVE_STATES)
    if conversation_id is not None:
        sessions = sessions.filter(conversation_id=conversation_id)
    killed = 0
    for session in sessions.select_related("tenant"):
        if _end(session, SessionState.KILLED, actor, reason):
            killed += 1
            if session.runner_id:
                runner_send(session.runner_id, {"type": "session.release", "session": str(session.pk)})
    return killed


@transaction.atomic
def _end(session: Session, state: str, actor, reason: str) -> bool:
    moved = session_finish(session_id=session.pk, state=state, reason=reason or state)
    if moved and state == SessionState.KILLED:
        audit_record(tenant=session.tenant, actor=actor, action="session.killed", target=session,
                     data={"conversation_id": session.conversation_id, "reason": reason})
    return moved
