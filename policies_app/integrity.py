"""A tenant's policy history against its audit chain (docs/architecture.md, "Audit").

The database refuses to change or delete a version, a floor version or a publication (migrations
0002, 0011, 0013-0016), but whoever may run DDL can drop those refusals. What they cannot do is
write the keyed audit chain (controlplane/audit.py), which recorded each version's digests when
it was saved, each publish, rollback and retire in order, each exception granted and revoked,
and each platform floor. `audit_verify` therefore also compares:

- each version's document with its own sha256, and its sha256 (and its source's, recorded since
  the source is read too: `sessions.services.driver_of`) with those the chain recorded for it
  when it was saved: a version deleted and inserted again with other content, or edited;
- the versions the chain says were saved with the versions that are here (one deleted, or one
  inserted without the chain's record);
- the publications, in order, with the chain's publish, rollback and retire events: the action,
  the version and the policy (one deleted, which would put an older version back in force, one
  inserted, or one moved to another policy);
- each exception with the grant the chain recorded (what it allows, where, until when) and its
  revocation;
- each platform floor version with the digest the tenants' chains recorded for it (`floor_set`,
  and the floor in force when a tenant was created, `platform.floor_in_force`).

Each problem is a line of text; the chain itself is checked by controlplane/audit.py."""

import collections
import hashlib
import json
from datetime import datetime

from pydantic import ValidationError as PydanticError

from controlplane.models import AuditEvent, Tenant
from policies_app import floor
from policies_app.document import DocumentError, Runtime, parse_yaml
from policies_app.models import FloorVersion, PolicyException, PolicyPublication, PolicyVersion

PUBLICATION_EVENTS = {"policy.published": PolicyPublication.PUBLISH, "policy.rollback": PolicyPublication.ROLLBACK,
                      "policy.retired": PolicyPublication.RETIRE}
FLOOR_EVENTS = ("platform.floor_set", "platform.floor_in_force")


def digest(document) -> str:
    """The sha256 of a stored canonical document (PolicyDocument.sha256 of the document it was).
    Text that was never valid (a lone surrogate) digests to something, never to an error."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def runtime_agrees(source: str, document) -> bool:
    """Whether the runtime a version's source names (which decides its sessions' driver:
    sessions.services.driver_of) is its document's. Documents stored before `runtime.driver`
    became optional say `bubblewrap` where the source names none. A source today's schema
    refuses is not compared (its document decides)."""
    try:
        written = parse_yaml(source).runtime
        stored = Runtime.model_validate(document["runtime"])
    except (DocumentError, PydanticError, KeyError, TypeError):
        return True
    if written.driver is None and written.isolation == "standard":
        return stored.driver in (None, "bubblewrap") and stored.isolation == "standard"
    return (written.driver, written.isolation) == (stored.driver, stored.isolation)


def tenant_problems(tenant: Tenant) -> list[str]:
    return _version_problems(tenant) + _publication_problems(tenant) + _exception_problems(tenant)


def _recorded(tenant: Tenant, *actions: str):
    """(seq, action, target id, data) of the tenant's events of these actions, in order."""
    for seq, action, target, data in AuditEvent.objects.filter(tenant=tenant, action__in=actions).order_by(
            "seq").values_list("seq", "action", "target_id", "data"):
        yield seq, action, target, data if isinstance(data, dict) else {}


def _version_problems(tenant: Tenant) -> list[str]:
    recorded = {target: (seq, data) for seq, _, target, data in _recorded(tenant, "policy.version_created")}
    problems = []
    versions = PolicyVersion.objects.filter(policy__tenant=tenant).select_related("policy")
    for version in versions.order_by("policy__name", "number"):
        name = f"policy {version.policy.name} v{version.number}"
        if digest(version.document) != version.sha256:
            problems.append(f"{name}: its document does not match its own sha256 (it was changed in the database)")
        seq, data = recorded.pop(str(version.pk), (None, None))
        if seq is None:
            problems.append(f"{name}: the audit chain has no record of it being saved (it was inserted in the "
                            "database)")
        elif (data.get("sha256"), data.get("number"), data.get("policy")) != (
                version.sha256, version.number, version.policy.name):
            problems.append(f"{name}: not the version that audit event #{seq} recorded (policy "
                            f"{data.get('policy')} v{data.get('number')}, sha256 {data.get('sha256')}): it was "
                            "deleted and inserted again with other content")
        elif "source_sha256" in data and data["source_sha256"] != source_digest(version.source):
            problems.append(f"{name}: its source is not the one audit event #{seq} recorded (it was changed in the "
                            "database)")
        elif not runtime_agrees(version.source, version.document):
            problems.append(f"{name}: the runtime its source names is not its document's (the source was changed in "
                            "the database)")
    for seq, data in sorted(recorded.values(), key=lambda entry: entry[0]):
        problems.append(f"policy {data.get('policy')} v{data.get('number')}: saved at audit event #{seq}, and gone "
                        "from the database (deleted)")
    return problems


def _publication_problems(tenant: Tenant) -> list[str]:
    events = list(_recorded(tenant, *PUBLICATION_EVENTS))
    rows = list(PolicyPublication.objects.filter(policy__tenant=tenant).order_by("id").values_list(
        "action", "version_id", "policy__name", "version__policy__name", "version__number"))
    for index in range(max(len(events), len(rows))):
        event = events[index] if index < len(events) else None
        row = rows[index] if index < len(rows) else None
        if event is not None and row is not None:
            _, action, target, data = event
            if (PUBLICATION_EVENTS[action], target, data.get("policy"), data.get("policy")) == (
                    row[0], str(row[1]), row[2], row[3]):
                continue
        said = (f"audit event #{event[0]} records {event[1]} of policy {event[3].get('policy')} "
                f"v{event[3].get('number')}" if event is not None else "the audit chain records nothing more")
        found = "the database has no more publications" if row is None else (
            f"the database's next publication is a {row[0]} of policy {row[2]} v{row[4]}"
            + (f", a version of policy {row[3]}" if row[3] != row[2] else ""))
        return [f"publications: {said}, but {found} (a publication was deleted, inserted or changed in the "
                "database, which changes the version in force)"]
    return []


def _exception_problems(tenant: Tenant) -> list[str]:
    granted, revoked = {}, {}
    for seq, action, target, data in _recorded(tenant, "policy.exception_granted", "policy.exception_revoked"):
        (granted if action == "policy.exception_granted" else revoked)[target] = (seq, data)
    problems = []
    for grant in PolicyException.objects.filter(tenant=tenant).select_related("policy").order_by("created_at"):
        name = f"exception {grant.pk} ({grant.command!r})"
        seq, data = granted.pop(str(grant.pk), (None, None))
        if seq is None:
            problems.append(f"{name}: the audit chain has no record of it being granted (it was inserted in the "
                            "database)")
            continue
        compared = _exact if isinstance(data.get("grant"), dict) else _legacy  # (exact fields recorded since)
        if compared(data) != compared({"policy": grant.policy.name, "grant": grant_fields(grant)}):
            problems.append(f"{name}: not what audit event #{seq} granted (it was changed in the database)")
        if str(grant.pk) in revoked and grant.revoked_at is None:
            problems.append(f"{name}: revoked at audit event #{revoked[str(grant.pk)][0]}, and in force again (it "
                            "was changed in the database)")
    for seq, data in sorted(granted.values(), key=lambda entry: entry[0]):
        allowed = data.get("command", data.get("egress"))
        problems.append(f"exception for {allowed!r}: granted at audit event #{seq}, and gone from the database "
                        "(deleted)")
    return problems


def grant_fields(grant: PolicyException) -> dict:
    """What an exception allows, where and until when, as its grant event records it."""
    return {"kind": grant.kind, "bin": grant.bin, "args": list(grant.args), "cwd": grant.cwd, "host": grant.host,
            "port": grant.port, "expires_at": grant.expires_at.isoformat()}


def _exact(data: dict) -> tuple:
    grant = data["grant"]
    return data.get("policy"), sorted({**grant, "expires_at": _instant(grant.get("expires_at"))}.items())


def _legacy(data: dict) -> tuple:
    """What grant events recorded before `grant`: the one-line command (an exec grant's
    `command` and `cwd`, an egress grant's `egress`) and the expiry."""
    grant = data.get("grant")
    if grant is None:
        return (data.get("policy"), data.get("command", data.get("egress")), data.get("cwd"),
                _instant(data.get("expires_at")))
    egress = grant["kind"] == "egress"
    command = f"{grant['host']}:{grant['port']}" if egress else " ".join([grant["bin"], *grant["args"]])
    return data.get("policy"), command, None if egress else grant["cwd"], _instant(grant["expires_at"])


def _instant(text):
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return text


def floor_problems() -> list[str]:
    """The platform floor's versions against the digests recorded in the tenants' chains. Every
    floor set is recorded in each tenant's chain, and each new tenant's chain records the floor
    in force; so once any tenant exists, every floor version from the first one recorded on
    must be recorded (those before were set and replaced while there was no tenant)."""
    recorded: dict[str, list[tuple[str, int, dict]]] = {}
    for slug, seq, target, data in AuditEvent.objects.filter(action__in=FLOOR_EVENTS).order_by("seq").values_list(
            "tenant__slug", "seq", "target_id", "data"):
        recorded.setdefault(target, []).append((slug, seq, data if isinstance(data, dict) else {}))
    versions = list(FloorVersion.objects.order_by("number", "id"))
    first = min((version.number for version in versions if str(version.pk) in recorded), default=None)
    in_force = floor.current()
    problems = []
    numbers = collections.Counter(version.number for version in versions)
    for version in versions:
        name = f"platform floor v{version.number}"
        if numbers[version.number] > 1:
            problems.append(f"{name}: {numbers[version.number]} floor versions have this number (one was inserted "
                            "in the database)")
        if digest(version.document) != version.sha256:
            problems.append(f"{name}: its document does not match its own sha256 (it was changed in the database)")
        entries = recorded.pop(str(version.pk), [])
        for slug, seq, data in entries:
            if (data.get("sha256"), data.get("number")) != (version.sha256, version.number):
                problems.append(f"{name}: not the floor that {slug}'s audit event #{seq} recorded "
                                f"(v{data.get('number')}, sha256 {data.get('sha256')}): it was deleted and inserted "
                                "again with other content")
                break
        if not entries and ((first is not None and version.number >= first)
                            or (in_force is not None and version.pk == in_force.pk and Tenant.objects.exists())):
            problems.append(f"{name}: no tenant's audit chain records it (it was inserted in the database; or it was "
                            "set while there was no tenant, and the tenants were made by an Airlock from before "
                            "floors were recorded in new tenants' chains: set it again to record it)")
    for entries in recorded.values():
        slug, seq, data = entries[0]
        problems.append(f"platform floor v{data.get('number')}: recorded at {slug}'s audit event #{seq}, and gone from "
                        "the database (deleted)")
    return problems
