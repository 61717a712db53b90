"""From a denial to the narrowest fix: a draft version that allows exactly the denied request.

For a command, the rule names the exact program and the exact arguments that were sent, in
their order (`exact_args`), optionally until an expiry, and carries a test proving it. For an
egress connection, the draft adds exactly its `host:port` to `network.allow` (turning
`egress: none` into an allowlist of that one entry). It is a draft:
a security admin reads its replay and publishes it, or not. Hard refusals (a path out of the
workspace, a limit, a malformed request, an inactive session) are not the rules' to waive, and a
request stored with a redacted secret cannot be allowed exactly: neither is offered. Nor is a
shell (lint flags a rule for one, even for one exact script), nor a request that the drafted
rule would still leave refused (a path out of the workspace hidden behind `bin_not_allowed`)."""

import hashlib
import re
from datetime import UTC, datetime

import yaml
from pydantic import ValidationError

from policies_app import egress, lint, services, yamledit
from policies_app.document import BARE_NAME, DocumentError, PolicyDocument, parse_yaml
from policies_app.engine import VersionRef, compile_policy, evaluate, evaluate_egress
from policies_app.models import DecisionRecord, PolicyVersion

NARROWABLE = {"bin_not_allowed", "arg_denied", "default_deny"}


class NotNarrowable(Exception):
    pass


class DraftExists(Exception):
    """The draft asked for is already there, unpublished: `version`."""

    def __init__(self, version: PolicyVersion):
        super().__init__(f"v{version.number} is already this draft")
        self.version = version


def newer_verdicts(record: DecisionRecord) -> list[tuple[PolicyVersion, str, bool]]:
    """How the versions of the policy made after the one that decided judge the same request
    now: (version, its state, allowed), for the published version and the newest draft, when
    they are newer. A session keeps the version it was opened with, so a denial may come from a
    version older than what is published (docs/architecture.md, "Policy document")."""
    judge = {"exec": evaluate, "egress": evaluate_egress}.get(record.kind)
    if judge is None or record.policy_version_id is None or not isinstance(record.request, dict):
        return []
    policy = record.policy_version.policy
    published = policy.published_version()
    newest = policy.versions.order_by("-number").first()
    verdicts = []
    for version in dict.fromkeys(v for v in (published, newest) if v and v.number > record.policy_version.number):
        compiled = compile_policy(PolicyDocument.model_validate(version.document),
                                  VersionRef(policy.name, version.number, version.sha256))
        verdicts.append((version, version.state(published), judge(compiled, record.request).effect == "allow"))
    return verdicts


def why_not(record: DecisionRecord) -> str | None:
    """Why this denial cannot become a rule (or an exception), or None when it can."""
    for version, state, allowed in newer_verdicts(record):
        if state == "published" and allowed:
            return (f"v{version.number}, published since, already allows it: sessions opened from now on may run "
                    f"it (this one kept v{record.policy_version.number}, the version it was opened with)")
    if record.kind == "egress":
        return _why_not_egress(record)
    if reason := _not_a_rules_request(record):
        return reason
    if lint.program(record.request["bin"]) in lint.SHELLS:
        return (f"a rule for the shell `{record.request['bin']}` runs arbitrary code even for one exact script (lint "
                "flags it); allow the command the script runs instead")
    document, rule, request, base = _drafted(record)
    if [r.get("id") for r in document["commands"]].count(rule["id"]) > 1:
        return f"rule `{rule['id']}` of v{base.number} already allows exactly this request"
    ref = VersionRef(base.policy.name, base.number + 1, "draft")
    try:
        compiled = compile_policy(PolicyDocument.model_validate(document), ref)
    except ValidationError as exc:  # a base that no longer validates: say so, never a 500
        return f"v{base.number} with the rule added would not be a valid policy ({exc.errors()[0]['msg']})"
    verdict = evaluate(compiled, {**request, "cwd": record.request.get("cwd") or "/workspace"})
    if not verdict.allowed:
        return f"even a rule for exactly this request leaves it refused ({verdict.message.removeprefix('denied: ')})"
    return None


def egress_entry(record: DecisionRecord) -> str:
    """The allowlist entry for exactly the host and port of an egress decision."""
    host, port = str(record.request.get("host", "")), record.request.get("port")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why_not_egress(record: DecisionRecord) -> str | None:
    request = record.request if isinstance(record.request, dict) else {}
    if record.reason_code not in egress.RULE_REASONS:
        return (f"a `{record.reason_code}` refusal holds whatever the policy says (docs/architecture.md, "
                "\"Egress\")")
    if record.policy_version_id is None:
        return "no policy version decided it"
    if "[redacted]" in str(request.get("host", "")):
        return "the host held a secret and was stored redacted, so it is unknown"
    entry = egress_entry(record)
    try:
        egress.parse_entry(entry)
    except egress.InvalidEntry as exc:
        return str(exc)
    if reason := egress.unreachable_entry(entry):
        return reason
    base = record.policy_version.policy.published_version() or record.policy_version
    network = base.document.get("network") or {}
    if network.get("egress") == "allowlist" and entry in network.get("allow", []):
        return f"v{base.number} already allows exactly {entry}"
    return None


def _draft_egress(record: DecisionRecord, actor) -> PolicyVersion:
    entry = egress_entry(record)
    base = record.policy_version.policy.published_version() or record.policy_version
    document = dict(base.document)
    network = dict(document.get("network") or {})
    was, listed = network.get("egress", "none"), network.get("allow", [])
    network["allow"] = [*(listed if was == "allowlist" else []), entry]
    network["egress"] = "allowlist"
    document["network"] = network
    what = (f"network.allow gains exactly {entry}"
            + (" (egress was none: now an allowlist of that one entry)" if was != "allowlist" else ""))
    comment = f"Allow this: denial {record.id} ({record.reason_code}) on v{base.number}: {what}"

    def edit(source: str) -> str:
        if was != "allowlist":
            if listed:  # entries that egress: none ignored; the draft drops them, as its document says
                raise yamledit.Unsupported("network.allow lists entries while egress is none")
            source = yamledit.set_scalar(source, ("network", "egress"), "allowlist")
        return yamledit.append_item(source, ("network", "allow"), entry, comment=comment)

    return _save_draft(base, _edited(base, document, edit, record, what), actor,
                       note=f"Allow this: egress to {entry} (denial {record.id})")


def _not_a_rules_request(record: DecisionRecord) -> str | None:
    request = record.request if isinstance(record.request, dict) else {}
    if record.kind != "exec" or record.reason_code not in NARROWABLE:
        return f"a `{record.reason_code or record.kind}` refusal is not decided by a command rule"
    if not isinstance(request.get("bin"), str) or not re.fullmatch(BARE_NAME, request["bin"]):
        return "the program was given as a path or is not a valid name; only bare names can be allowed"
    args = request.get("args") or []
    if not all(isinstance(arg, str) for arg in args):
        return "the recorded arguments are not strings"
    if any("[redacted]" in arg for arg in args):
        return "the request held a secret and was stored redacted, so its exact arguments are unknown"
    if record.policy_version_id is None:
        return "no policy version decided it"
    return None


TESTABLE = {"bin_not_allowed", "arg_denied", "path_outside_workspace", "default_deny"}


def with_denial_test(source: str, record: DecisionRecord) -> str:
    """`source` with a test that this denied request stays refused for the same reason ("Add as a
    test"): only for refusals the document's rules decide, and only for an exec request."""
    if record.kind != "exec" or record.effect == "allow" or record.reason_code not in TESTABLE:
        raise NotNarrowable(f"a `{record.reason_code or record.kind}` refusal is not one a policy's tests can hold")
    request = record.request if isinstance(record.request, dict) else {}
    if not isinstance(request.get("bin"), str) or not all(isinstance(a, str) for a in request.get("args") or []):
        raise NotNarrowable("the recorded request is not a program and its arguments")
    test_request = {"bin": request["bin"], "args": list(request.get("args") or [])}
    if request.get("cwd") and request["cwd"] != "/workspace":
        test_request["cwd"] = request["cwd"]
    test = {"request": test_request, "expect": {"allowed": False, "reason_code": record.reason_code}}
    try:
        document = parse_yaml(source).canonical()
        edited = yamledit.append_item(source, ("tests",), test, comment=f"From denial {record.id}: keep it refused.")
        meant = PolicyDocument.model_validate({**document, "tests": [*document["tests"], test]})
        if parse_yaml(edited).sha256() == meant.sha256():
            return edited
    except (yamledit.Unsupported, DocumentError, ValidationError):
        pass
    raise NotNarrowable("the document's `tests:` is written in a way this cannot add to without rewriting it; "
                        "add the test by hand")


def narrow_rule(record: DecisionRecord, expires: datetime | None = None) -> dict:
    if reason := _not_a_rules_request(record):
        raise NotNarrowable(reason)
    bin_name, args = record.request["bin"], list(record.request.get("args") or [])
    digest = hashlib.sha256(repr((bin_name, args)).encode()).hexdigest()[:8]
    rule_id = f"allow-{re.sub(r'[^a-z0-9._-]', '-', bin_name.lower())[:40]}-{digest}"
    rule = {"id": rule_id, "bin": bin_name, "exact_args": args}
    if expires is not None:
        rule["expires"] = expires.astimezone(UTC).isoformat(timespec="seconds")
    return rule


def draft_allowing(*, record: DecisionRecord, actor, expires: datetime | None = None) -> PolicyVersion:
    """A new draft of the policy's current version (the published one, else the one that
    decided) with the narrow rule (allowing nothing after `expires`, when given) and a test."""
    if reason := why_not(record):
        raise NotNarrowable(reason)
    if record.kind == "egress":
        if expires is not None:
            raise NotNarrowable("an allowlist entry has no expiry; grant a temporary exception instead")
        return _draft_egress(record, actor)
    document, rule, request, base = _drafted(record, expires)
    until = f" until {rule['expires']}" if expires else ""
    command = " ".join([rule["bin"], *request["args"]])
    what = f"rule {rule['id']} allows exactly `{command}`{until}"
    comment = f"Allow this: denial {record.id} ({record.reason_code}) on v{base.number}: {what}"

    def edit(source: str) -> str:
        source = yamledit.append_item(source, ("commands",), rule, comment=comment)
        return yamledit.append_item(source, ("tests",), document["tests"][-1])

    return _save_draft(base, _edited(base, document, edit, record, what), actor,
                       note=f"Allow this: `{command}` (denial {record.id})")


def _edited(base: PolicyVersion, document: dict, edit, record: DecisionRecord, what: str) -> str:
    """The draft's source: the base's own source with only the change added (comments, order and
    layout kept), checked to parse to exactly `document`; else, where the edit cannot be made so
    (policies_app/yamledit.py), the whole document written anew under a comment that says so."""
    expected = PolicyDocument.model_validate(document).sha256()
    try:
        source = edit(base.source)
        if parse_yaml(source).sha256() == expected:
            return source
    except (yamledit.Unsupported, DocumentError):
        pass
    header = (f"# Drafted by \"Allow this\" from denial {record.id} ({record.reason_code}) on v{base.number}:\n"
              f"# {what}. v{base.number}'s layout could not be kept, so the document is written anew.\n")
    written = PolicyDocument.model_validate(document).model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return header + yaml.safe_dump(written, sort_keys=False, allow_unicode=True)


def _save_draft(base: PolicyVersion, source: str, actor, *, note: str) -> PolicyVersion:
    """A new draft on `base`, unless a draft made since `base` already holds exactly this document."""
    sha256 = parse_yaml(source).sha256()
    existing = base.policy.versions.filter(sha256=sha256, number__gt=base.number).order_by("number").first()
    if existing is not None and existing.state(base.policy.published_version()) == "draft":
        raise DraftExists(existing)
    return services.version_create(policy=base.policy, source=source, actor=actor, note=note, parent=base)


def _drafted(record: DecisionRecord, expires: datetime | None = None) -> tuple[dict, dict, dict, PolicyVersion]:
    """The document of the draft (the policy's published version, else the one that decided,
    with the narrow rule and its test), the rule, the request it allows, and the base version."""
    rule = narrow_rule(record, expires)
    policy = record.policy_version.policy
    base = policy.published_version() or record.policy_version
    document = dict(base.document)
    request = {"bin": rule["bin"], "args": list(record.request.get("args") or [])}
    # Run it as the rule that denied it would have: a narrow rule never reframes the command.
    denying = next((r for r in document.get("commands", []) if record.rule_id and r.get("id") == record.rule_id), None)
    if denying and denying.get("prepend_args"):
        rule = {**rule, "prepend_args": list(denying["prepend_args"])}
    document["commands"] = [*document.get("commands", []), rule]
    document["tests"] = [*document.get("tests", []),
                         {"request": request, "expect": {"allowed": True, "rule_id": rule["id"]}}]
    return document, rule, request, base
