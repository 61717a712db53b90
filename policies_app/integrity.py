"""A tenant's policy history against its audit chain (docs/architecture.md, "Audit").

The database refuses to change or delete a version, a floor version or a publication (migrations
0002, 0011, 0013-0015), but whoever may run DDL can drop those refusals. What they cannot do is
write the keyed audit chain (controlplane/audit.py), which recorded each version's digest when it
was saved and each publish, rollback and retire in order. `audit_verify` therefore also compares:

- each version's document with its own sha256, and that sha256 with the one the chain recorded
  for the version when it was saved (a version deleted and inserted again with other content);
- the versions the chain says were saved with the versions that are here (one deleted, or one
  inserted without the chain's record);
- the publications, in order, with the chain's publish, rollback and retire events (one deleted,
  which would put an older version back in force, or one inserted);
- each platform floor version with the digest any tenant's chain recorded for it.

Each problem is a line of text; the chain itself is checked by controlplane/audit.py."""

import hashlib
import json

from controlplane.models import AuditEvent, Tenant
from policies_app.models import FloorVersion, PolicyPublication, PolicyVersion

PUBLICATION_EVENTS = {"policy.published": PolicyPublication.PUBLISH, "policy.rollback": PolicyPublication.ROLLBACK,
                      "policy.retired": PolicyPublication.RETIRE}


def digest(document: dict) -> str:
    """The sha256 of a stored canonical document (PolicyDocument.sha256 of the document it was)."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def tenant_problems(tenant: Tenant) -> list[str]:
    return _version_problems(tenant) + _publication_problems(tenant)


def _version_problems(tenant: Tenant) -> list[str]:
    recorded = {target: (seq, data) for seq, target, data in AuditEvent.objects.filter(
        tenant=tenant, action="policy.version_created").values_list("seq", "target_id", "data")}
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
    for seq, data in sorted(recorded.values(), key=lambda entry: entry[0]):
        problems.append(f"policy {data.get('policy')} v{data.get('number')}: saved at audit event #{seq}, and gone "
                        "from the database (deleted)")
    return problems


def _publication_problems(tenant: Tenant) -> list[str]:
    events = list(AuditEvent.objects.filter(tenant=tenant, action__in=PUBLICATION_EVENTS).order_by("seq")
                  .values_list("seq", "action", "target_id", "data"))
    rows = list(PolicyPublication.objects.filter(policy__tenant=tenant).order_by("id")
                .values_list("id", "action", "version_id", "policy__name", "version__number"))
    for index in range(max(len(events), len(rows))):
        event = events[index] if index < len(events) else None
        row = rows[index] if index < len(rows) else None
        if event is not None and row is not None and (PUBLICATION_EVENTS[event[1]], event[2]) == (row[1], str(row[2])):
            continue
        said = (f"audit event #{event[0]} records {event[1]} of policy {event[3].get('policy')} "
                f"v{event[3].get('number')}" if event is not None else "the audit chain records nothing more")
        found = (f"the database's next publication is a {row[1]} of policy {row[3]} v{row[4]}" if row is not None
                 else "the database has no more publications")
        return [f"publications: {said}, but {found} (a publication was deleted or inserted in the database, "
                "which changes the version in force)"]
    return []


def floor_problems() -> list[str]:
    """The platform floor's versions against the digests recorded in the tenants' chains (every
    tenant's chain records each floor set while it exists)."""
    recorded: dict[str, list[tuple[str, int, dict]]] = {}
    for slug, seq, target, data in AuditEvent.objects.filter(action="platform.floor_set").values_list(
            "tenant__slug", "seq", "target_id", "data"):
        recorded.setdefault(target, []).append((slug, seq, data))
    problems = []
    for version in FloorVersion.objects.order_by("number"):
        name = f"platform floor v{version.number}"
        if digest(version.document) != version.sha256:
            problems.append(f"{name}: its document does not match its own sha256 (it was changed in the database)")
        for slug, seq, data in recorded.pop(str(version.pk), []):
            if (data.get("sha256"), data.get("number")) != (version.sha256, version.number):
                problems.append(f"{name}: not the floor that {slug}'s audit event #{seq} recorded "
                                f"(v{data.get('number')}, sha256 {data.get('sha256')}): it was deleted and inserted "
                                "again with other content")
                break
    for entries in recorded.values():
        slug, seq, data = entries[0]
        problems.append(f"platform floor v{data.get('number')}: set at {slug}'s audit event #{seq}, and gone from the "
                        "database (deleted)")
    return problems
