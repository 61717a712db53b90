"""Deciding and recording: the published version (and the shadow candidate, if any) judge a
request; the decision is stored with its request redacted. Replay re-judges recorded traffic
with a draft to show what it would change before it is published."""

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from controlplane import rows
from controlplane.models import Tenant
from controlplane.redaction import redact, redact_data
from policies_app import egress, exceptions
from policies_app.document import PolicyDocument
from policies_app.engine import CompiledPolicy, Decision, VersionRef, compile_policy, evaluate, evaluate_egress
from policies_app.models import DecisionRecord, Policy, PolicyVersion
from policies_app.rollups import count_decision, count_decisions
from policies_app.services import version_ref

COMPILED_CACHE_SIZE = 256
EVALUATORS = {"exec": evaluate, "egress": evaluate_egress}  # the kinds a policy's rules judge
REPLAY_DEFAULT = 10_000
_compiled: OrderedDict[tuple, CompiledPolicy] = OrderedDict()
_compiled_lock = threading.Lock()


def compiled_version(version: PolicyVersion) -> CompiledPolicy:
    """A version compiled once; its sha256 names its content, so an entry never goes stale."""
    key = (version.policy.name, version.number, version.sha256)
    with _compiled_lock:
        if key in _compiled:
            _compiled.move_to_end(key)
            return _compiled[key]
    compiled = compile_policy(PolicyDocument.model_validate(version.document), VersionRef(*key))
    with _compiled_lock:
        _compiled[key] = compiled
        if len(_compiled) > COMPILED_CACHE_SIZE:
            _compiled.popitem(last=False)
    return compiled


def _nothing_published(policy: Policy | None) -> Decision:
    name = policy.name if policy else "default"
    return Decision(False, "deny", "default_deny", None, f"denied: policy `{name}` has no published version",
                    f"a security admin can publish a version of policy `{name}`", "enforce")


@dataclass
class Evaluation:
    decision: Decision
    record: DecisionRecord | None
    shadow: Decision | None = None
    shadow_version: PolicyVersion | None = None
    eval_us: int = 0


def decide(*, tenant: Tenant, policy: Policy | None, request: dict, session_id=None, conversation_id: str = "",
           version: PolicyVersion | None = None, secrets: Iterable[str] = (), record: bool = True,
           kind: str = "exec", at: datetime | None = None, count: bool | None = None) -> Evaluation:
    """Judge one request of `kind` (exec: a command; egress: an outbound connection) with
    `version` (default: the policy's published one), then the policy's exceptions. A use of an
    exception is counted when the decision is recorded here, or when `count` says it will be
    (store_taken, later)."""
    count = record if count is None else count
    judge = EVALUATORS[kind]
    pinned = version is not None and session_id is not None  # a session's: it keeps its version
    version = version or (policy.published_version() if policy is not None else None)
    at = at or timezone.now()
    started = time.perf_counter_ns()
    decision = judge(compiled_version(version), request, at) if version else _nothing_published(policy)
    eval_us = (time.perf_counter_ns() - started) // 1000
    if version is not None:
        decision = _with_exceptions(kind, tenant, policy, version, request, decision, at, count=count)
        if pinned and not decision.allowed and policy is not None:
            decision = _newer_allows(policy, version, judge, request, decision, at)
    shadow_version = policy.shadow_version if policy is not None and policy.shadow_version_id else None
    shadow = None
    if shadow_version is not None:  # the policy's exceptions hold under the candidate too
        shadow = _with_exceptions(kind, tenant, policy, shadow_version, request,
                                  judge(compiled_version(shadow_version), request, at), at, count=False)
    stored = None
    if record:
        stored = _store(tenant, version, kind, request, decision, eval_us, session_id, conversation_id,
                        tuple(secrets), created_at=at, shadow_version=shadow_version,
                        shadow_allowed=shadow.allowed if shadow else None,
                        shadow_effect=shadow.effect if shadow else "",
                        shadow_reason_code=(shadow.reason_code or "") if shadow else "",
                        shadow_rule_id=(shadow.rule_id or "") if shadow else "")
    return Evaluation(decision=decision, record=stored, shadow=shadow, shadow_version=shadow_version, eval_us=eval_us)


def _newer_allows(policy: Policy, version: PolicyVersion, judge, request: dict, decision: Decision,
                  at: datetime) -> Decision:
    """A denial by the version a session keeps, when the version published since allows the same
    request: its hint says so, instead of asking an admin for what is already granted."""
    published = policy.published_version()
    if published is None or published.number <= version.number:
        return decision
    if judge(compiled_version(published), request, at).effect != "allow":
        return decision
    return replace(decision, hint=(
        f"v{published.number} of policy `{policy.name}`, published since this session opened, allows it; this "
        f"session keeps v{version.number}, the version it was opened with: a new session runs under "
        f"v{published.number}"))


def _with_exceptions(kind: str, tenant: Tenant, policy: Policy | None, version: PolicyVersion, request: dict,
                     decision: Decision, at: datetime, *, count: bool) -> Decision:
    if kind not in exceptions.GRANTABLE:
        return decision
    return exceptions.apply(tenant=tenant, policy=policy, compiled=compiled_version(version), request=request,
                            decision=decision, at=at, count=count, kind=kind)


def refuse(*, tenant: Tenant, version: PolicyVersion | None, kind: str, request: dict, reason_code: str,
           message: str, hint: str, session_id=None, conversation_id: str = "",
           secrets: Iterable[str] = (), rule_id: str | None = None) -> Evaluation:
    """Record a refusal that no rule of the document decides (the session is not active, a file
    path leaves the workspace, a snapshot fails a check: `rule_id` names which): a hard deny,
    whatever the policy's mode."""
    ref = version_ref(version) if version else None
    decision = Decision(False, "deny", reason_code, rule_id, f"denied: {message}", hint,
                        version.document.get("mode", "enforce") if version else "enforce", ref)
    return Evaluation(decision=decision, record=_store(tenant, version, kind, request, decision, 0, session_id,
                                                       conversation_id, tuple(secrets)))


def allow_file(*, tenant: Tenant, version: PolicyVersion, request: dict, session_id, conversation_id: str,
               secrets: Iterable[str] = ()) -> Evaluation:
    """A workspace file operation whose path stays inside the workspace (checked by the caller)."""
    decision = Decision(True, "allow", None, "filesystem.workspace", "allowed: a path inside /workspace", "",
                        version.document.get("mode", "enforce"), version_ref(version))
    return Evaluation(decision=decision, record=_store(tenant, version, "file", request, decision, 0, session_id,
                                                       conversation_id, tuple(secrets)))


@dataclass
class Taken:
    """A decision taken at once and recorded a moment later with others (an egress proxy's:
    one per connection, too many for a write each). Its id is known before it is stored, so
    the answer that carries it can leave first."""

    id: uuid.UUID
    tenant: Tenant
    version: PolicyVersion
    kind: str
    request: dict
    decision: Decision
    created_at: datetime
    session_id: object = None
    conversation_id: str = ""
    command_id: object = None
    eval_us: int = 0
    shadow_version: PolicyVersion | None = None
    shadow: Decision | None = None


def store_taken(taken: Iterable[Taken], secrets: Iterable[str] = ()) -> None:
    """Record decisions already answered: one INSERT for all, one upsert per rollup row."""
    secrets = tuple(secrets)
    records = []
    for item in taken:
        decision, shadow = item.decision, item.shadow
        records.append(DecisionRecord(
            id=item.id, tenant=item.tenant, session_id=item.session_id, command_id=item.command_id,
            conversation_id=item.conversation_id, policy_version=item.version, mode=decision.mode, kind=item.kind,
            request=redact_data(item.request, secrets), allowed=decision.allowed,
            subject=redact(subject_of(item.kind, item.request), secrets)[:255], effect=decision.effect,
            reason_code=decision.reason_code or "", rule_id=decision.rule_id or "",
            message=redact(decision.message, secrets), hint=redact(decision.hint, secrets), eval_us=item.eval_us,
            created_at=item.created_at, shadow_version=item.shadow_version if shadow else None,
            shadow_allowed=shadow.allowed if shadow else None, shadow_effect=shadow.effect if shadow else "",
            shadow_reason_code=(shadow.reason_code or "") if shadow else "",
            shadow_rule_id=(shadow.rule_id or "") if shadow else ""))
    with transaction.atomic(savepoint=False):  # inside a caller's transaction: no savepoint (see _store)
        rows.insert(records)
        count_decisions(records)


def _store(tenant, version, kind, request, decision: Decision, eval_us: int, session_id, conversation_id,
           secrets: tuple, **extra) -> DecisionRecord:
    """Record a decision, and count it in the hourly rollups when it is a denial."""
    record = DecisionRecord(
        tenant=tenant, session_id=session_id, conversation_id=conversation_id, policy_version=version,
        mode=decision.mode, kind=kind, request=redact_data(request, secrets), allowed=decision.allowed,
        subject=redact(subject_of(kind, request), secrets)[:255],
        effect=decision.effect, reason_code=decision.reason_code or "", rule_id=decision.rule_id or "",
        message=redact(decision.message, secrets), hint=redact(decision.hint, secrets), eval_us=eval_us, **extra,
    )
    # Inside a caller's transaction (a command's proposal holds SQLite's one writer meanwhile), no
    # savepoint: its two statements would cost as much as the record's own two.
    with transaction.atomic(savepoint=False):
        rows.insert([record])
        count_decision(record)
    return record


def subject_of(kind: str, request: dict) -> str:
    """The one value a decision is grouped by: program, path, or host:port."""
    if not isinstance(request, dict):
        return ""
    if kind == "egress":
        return f"{request.get('host', '')}:{request.get('port', '')}"
    if kind == "resume":
        value = request.get("resume", "")
        return value if isinstance(value, str) else ""
    value = request.get("path" if kind == "file" else "bin", "")
    return value if isinstance(value, str) else ""


def record_payload(record: DecisionRecord) -> dict:
    """A stored decision as the API shows it."""
    version = record.policy_version
    return {
        "id": str(record.id), "allowed": record.allowed, "effect": record.effect,
        "reason_code": record.reason_code or None, "rule_id": record.rule_id or None, "message": record.message,
        "hint": record.hint, "mode": record.mode,
        "policy_version": {"policy": version.policy.name, "number": version.number, "sha256": version.sha256}
        if version else None,
    }


def decision_payload(decision: Decision, record: DecisionRecord | None = None) -> dict:
    """A decision as the API shows it (docs/architecture.md, "API")."""
    ref = decision.policy_version
    return {
        "id": str(record.id) if record else None, "allowed": decision.allowed, "effect": decision.effect,
        "reason_code": decision.reason_code, "rule_id": decision.rule_id, "message": decision.message,
        "hint": decision.hint, "mode": decision.mode,
        "policy_version": {"policy": ref.policy, "number": ref.number, "sha256": ref.sha256} if ref else None,
    }


# -- replay --------------------------------------------------------------------------------

@dataclass
class FlipGroup:
    direction: str  # widening (deny -> allow) or breakage (allow -> deny)
    rule_id: str
    reason_code: str
    count: int = 0
    examples: list[dict] = field(default_factory=list)


@dataclass
class ReplayResult:
    replayed: int
    widenings: int
    breakages: int
    groups: list[FlipGroup]


def replay(*, policy: Policy, compiled: CompiledPolicy, limit: int = REPLAY_DEFAULT, examples: int = 3) -> ReplayResult:
    """Re-judge the last `limit` requests recorded under this policy; report where the verdict
    flips against the version published now (what publishing the candidate would change), or
    against the verdict recorded at the time when nothing is published. A verdict is the rules'
    (effect `allow` or not), so audit mode does not hide a flip. Requests are stored redacted, so
    a flip that hinges on a redacted value is not seen; what an exception allowed, and what
    egress's guards refused, is not the rules' verdict and is left out."""
    published = policy.published_version()
    current = compiled_version(published) if published is not None else None
    records = (DecisionRecord.objects.filter(tenant=policy.tenant, kind__in=EVALUATORS, policy_version__policy=policy)
               .exclude(rule_id__startswith=exceptions.RULE_PREFIX)
               .exclude(kind="egress", reason_code__in=egress.GUARD_REASONS).order_by("-created_at")
               .values_list("request", "effect", "kind")[:limit])
    groups: dict[tuple, FlipGroup] = {}
    replayed = widenings = breakages = 0
    for request, effect, kind in records.iterator(chunk_size=2000):
        replayed += 1
        was_allowed = EVALUATORS[kind](current, request).effect == "allow" if current else effect == "allow"
        now = EVALUATORS[kind](compiled, request)
        if (now.effect == "allow") == was_allowed:
            continue
        direction = "breakage" if was_allowed else "widening"
        widenings += direction == "widening"
        breakages += direction == "breakage"
        key = (direction, now.rule_id or "", now.reason_code or "")
        group = groups.setdefault(key, FlipGroup(direction, key[1], key[2]))
        group.count += 1
        if len(group.examples) < examples:
            group.examples.append(request)
    ordered = sorted(groups.values(), key=lambda g: (g.direction != "widening", -g.count))
    return ReplayResult(replayed=replayed, widenings=widenings, breakages=breakages, groups=ordered)
