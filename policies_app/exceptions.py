"""Exceptions: narrow, temporary grants beside a policy's rules, for what cannot wait for a
new version (an incident, a one-off migration).

An exception allows exactly one program with exactly these arguments in this cwd, or exactly one
host and port to connect to, for this tenant's policy, until it expires, for a stated reason or
ticket. It is consulted only when the rules deny for a reason a rule decides (`bin_not_allowed`,
`arg_denied`, `default_deny`; for egress `egress_denied`, `egress_ip_literal`); a hard refusal
(a path out of the workspace, a limit, a malformed request, an inactive session, an address in
egress's deny set, fronting) is never waived. Each use is counted; once expired or revoked it is never
honoured again, and the denial says so in its hint."""

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone
from pydantic import ValidationError as PydanticError

from controlplane import rows
from controlplane.audit import actor_label, audit_record
from controlplane.models import Tenant
from policies_app import egress, narrowing
from policies_app.document import BARE_NAME, EgressRequest
from policies_app.engine import WORKSPACE, CompiledPolicy, Decision, path_candidates, path_escape
from policies_app.integrity import grant_fields
from policies_app.models import DecisionRecord, Policy, PolicyException

GRANTABLE = {"exec": {"bin_not_allowed", "arg_denied", "default_deny"},
             "egress": egress.RULE_REASONS}
MAX_LIFETIME = timedelta(days=90)
RULE_PREFIX = "exception:"


def exception_list(tenant: Tenant) -> QuerySet[PolicyException]:
    return PolicyException.objects.filter(tenant=tenant).select_related("policy")


def _check(*, bin_name, args, cwd: str, expires_at: datetime, reason: str, now: datetime) -> dict:
    errors = {}
    if not isinstance(bin_name, str) or not re.fullmatch(BARE_NAME, bin_name):
        errors["bin"] = "a bare program name such as 'pytest', never a path"
    if not isinstance(args, list) or not all(isinstance(arg, str) and "\0" not in arg for arg in args):
        errors["args"] = "a list of strings"
    elif len(args) > 1000:
        errors["args"] = "at most 1000 arguments"
    elif any("[redacted]" in arg for arg in args):
        errors["args"] = "holds a redacted secret, so the exact arguments are unknown"
    elif isinstance(cwd, str) and path_escape(cwd, WORKSPACE) is None:
        outside = [arg for arg in args for piece in path_candidates(arg) if path_escape(piece, cwd) is not None]
        if outside:
            errors["args"] = f"`{outside[0]}` points outside {WORKSPACE}; an exception never waives that"
    if not isinstance(cwd, str) or path_escape(cwd, WORKSPACE) is not None:
        errors["cwd"] = f"a directory inside {WORKSPACE}"
    return {**errors, **_check_lifetime(expires_at=expires_at, reason=reason, now=now)}


def _check_lifetime(*, expires_at: datetime, reason: str, now: datetime) -> dict:
    errors = {}
    if expires_at <= now:
        errors["expires_at"] = "must be in the future"
    elif expires_at > now + MAX_LIFETIME:
        errors["expires_at"] = f"at most {MAX_LIFETIME.days} days ahead; a lasting grant belongs in a policy version"
    if len(reason.strip()) < 3:
        errors["reason"] = "say why (or name the ticket) in a few words"
    return errors


@transaction.atomic
def exception_grant(*, policy: Policy, bin_name: str, args: list, cwd: str = WORKSPACE, expires_at: datetime,
                    reason: str, ticket: str = "", actor, from_decision=None) -> PolicyException:
    """Grant one exception. Raises ValidationError with field errors when it is not narrow or
    not temporary enough."""
    now = timezone.now()
    errors = _check(bin_name=bin_name, args=args, cwd=cwd, expires_at=expires_at, reason=reason, now=now)
    if errors:
        raise ValidationError(errors)
    grant = PolicyException.objects.create(
        tenant=policy.tenant, policy=policy, kind="exec", bin=bin_name, args=list(args), cwd=cwd.rstrip("/") or "/",
        reason=reason.strip(), ticket=ticket.strip()[:100], expires_at=expires_at, created_by=actor_label(actor),
        from_decision=from_decision)
    audit_record(tenant=policy.tenant, actor=actor, action="policy.exception_granted", target=grant,
                 data={"policy": policy.name, "command": grant.command, "cwd": grant.cwd, "reason": grant.reason,
                       "ticket": grant.ticket, "expires_at": expires_at.isoformat(), "grant": grant_fields(grant)})
    return grant


@transaction.atomic
def exception_grant_egress(*, policy: Policy, host: str, port: int, expires_at: datetime, reason: str,
                           ticket: str = "", actor, from_decision=None) -> PolicyException:
    """Grant one egress exception: exactly `host:port`, never a wildcard, never an address in
    the deny set. Raises ValidationError with field errors."""
    now = timezone.now()
    errors = _check_lifetime(expires_at=expires_at, reason=reason, now=now)
    try:
        request = EgressRequest(host=host, port=port)
    except PydanticError:
        errors["host"] = "a host name or IP address, and a port 1-65535"
    else:
        entry = f"[{request.host}]:{request.port}" if ":" in request.host else f"{request.host}:{request.port}"
        try:
            egress.parse_entry(entry)
            if why := egress.unreachable_entry(entry):
                errors["host"] = why
        except egress.InvalidEntry as exc:
            errors["host"] = str(exc)
    if errors:
        raise ValidationError(errors)
    grant = PolicyException.objects.create(
        tenant=policy.tenant, policy=policy, kind="egress", host=request.host.lower(), port=request.port,
        reason=reason.strip(), ticket=ticket.strip()[:100], expires_at=expires_at, created_by=actor_label(actor),
        from_decision=from_decision)
    audit_record(tenant=policy.tenant, actor=actor, action="policy.exception_granted", target=grant,
                 data={"policy": policy.name, "egress": grant.command, "reason": grant.reason,
                       "ticket": grant.ticket, "expires_at": expires_at.isoformat(), "grant": grant_fields(grant)})
    return grant


def exception_from_denial(*, record: DecisionRecord, expires_at: datetime, reason: str, ticket: str,
                          actor) -> PolicyException:
    """The narrowest exception for one recorded denial: its program, arguments and cwd, or its
    host and port."""
    why_not = narrowing.why_not(record)
    if why_not:
        raise ValidationError({"decision": f"no exception can be granted for this denial: {why_not}"})
    request = record.request
    if record.kind == "egress":
        return exception_grant_egress(policy=record.policy_version.policy, host=request["host"],
                                      port=request["port"], expires_at=expires_at, reason=reason, ticket=ticket,
                                      actor=actor, from_decision=record.pk)
    return exception_grant(policy=record.policy_version.policy, bin_name=request["bin"],
                           args=list(request.get("args") or []), cwd=request.get("cwd") or WORKSPACE,
                           expires_at=expires_at, reason=reason, ticket=ticket, actor=actor, from_decision=record.pk)


@transaction.atomic
def exception_revoke(*, grant: PolicyException, actor) -> PolicyException:
    if grant.revoked_at is None:
        grant.revoked_at, grant.revoked_by = timezone.now(), actor_label(actor)
        grant.save(update_fields=["revoked_at", "revoked_by"])
        audit_record(tenant=grant.tenant, actor=actor, action="policy.exception_revoked", target=grant,
                     data={"policy": grant.policy.name, "command": grant.command, "uses": grant.use_count})
    return grant


def apply(*, tenant: Tenant, policy: Policy | None, compiled: CompiledPolicy, request: dict, decision: Decision,
          at: datetime, count: bool, kind: str = "exec") -> Decision:
    """The decision of `compiled` once exceptions are consulted: a rule's denial of exactly what
    a live exception names becomes an allow (counted when `count`); an expired or revoked one
    only explains itself in the hint. What runs is what the rule that denied would have run
    (with its prepend_args), so a grant never reframes the command."""
    if policy is None or decision.effect == "allow" or decision.reason_code not in GRANTABLE[kind]:
        return decision
    grant, last = _matching(tenant=tenant, policy=policy, request=request, at=at, kind=kind)
    what = "connection" if kind == "egress" else "command"
    bin_name, args = request.get("bin"), request.get("args") or []
    if grant is None:
        if last is None:
            return decision
        ended = (f"was revoked at {_utc(last.revoked_at)}" if last.revoked_at
                 else f"expired at {_utc(last.expires_at)}")
        return replace(decision, hint=f"{decision.hint}; exception {last.short_id} for exactly this {what} {ended} "
                                      "and is not honoured; a security admin can grant a new one")
    if count:
        PolicyException.objects.filter(pk=grant.pk).update(use_count=F("use_count") + 1, last_used_at=at)
    why = f"{grant.ticket}: {grant.reason}" if grant.ticket else grant.reason
    message = (f"allowed by exception {grant.short_id} ({why[:120]}) until {_utc(grant.expires_at)}; the rules "
               f"alone: {decision.message}")
    if kind == "egress":
        return Decision(True, "allow", None, f"{RULE_PREFIX}{grant.id}", message, "", decision.mode,
                        decision.policy_version)
    denying = next((r.rule for r in compiled.rules_by_bin.get(bin_name, ()) if r.rule.id == decision.rule_id), None)
    prepend_args = tuple(denying.prepend_args) if denying else ()
    return Decision(True, "allow", None, f"{RULE_PREFIX}{grant.id}", message, "", decision.mode,
                    decision.policy_version, (bin_name, *prepend_args, *args))


def _matching(*, tenant: Tenant, policy: Policy, request: dict, at: datetime,
              kind: str) -> tuple[PolicyException | None, PolicyException | None]:
    """The live exception for exactly this request (the one that lasts longest), or else the
    newest ended one, which says why it no longer allows. Every denial asks, and most policies
    have no exception: one statement prepared once (controlplane/rows.py) finds the candidates,
    compared here, and only a match is read whole."""
    if kind == "egress":
        if request.get("port") is None:
            return None, None  # every egress exception names its port
        where = {"tenant": tenant.pk, "policy": policy.pk, "kind": "egress",
                 "host": str(request.get("host", "")).lower(), "port": request.get("port")}
        args = None
    else:
        where = {"tenant": tenant.pk, "policy": policy.pk, "kind": "exec", "bin": request.get("bin"),
                 "cwd": (request.get("cwd") or WORKSPACE).rstrip("/") or "/"}
        args = list(request.get("args") or [])
    same = [row for row in rows.select(PolicyException, ("pk", "args", "revoked_at", "expires_at", "created_at"), where)
            if args is None or row[1] == args]
    live = [row for row in same if row[2] is None and row[3] > at]
    if live:  # (a row deleted since it was read is no exception)
        return PolicyException.objects.filter(pk=max(live, key=lambda row: row[3])[0]).first(), None
    if same:
        return None, PolicyException.objects.filter(pk=max(same, key=lambda row: row[4])[0]).first()
    return None, None


def _utc(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
