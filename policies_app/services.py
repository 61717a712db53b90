"""Writes of policies: versions, publish, rollback, retire. Each goes to the audit log."""

import logging

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max

from controlplane.audit import audit_record, user_of
from controlplane.models import AuditEvent, Tenant
from policies_app import floor, integrity, lint
from policies_app.document import DocumentError, PolicyDocument, lines_of, parse_yaml
from policies_app.engine import VersionRef
from policies_app.models import FloorVersion, Policy, PolicyPublication, PolicyVersion
from policies_app.testing import run_tests, shown

log = logging.getLogger("airlock.policies")


@transaction.atomic
def policy_create(*, tenant: Tenant, name: str, actor) -> Policy:
    policy = Policy(tenant=tenant, name=name)
    policy.full_clean()
    try:
        with transaction.atomic():
            policy.save()
    except IntegrityError:  # created at the same moment by someone else
        raise ValidationError({"name": f"a policy named {name!r} already exists"}) from None
    audit_record(tenant=tenant, actor=actor, action="policy.created", target=policy, data={"name": name})
    return policy


@transaction.atomic
def version_create(*, policy: Policy, source: str, actor, note: str = "",
                   parent: PolicyVersion | None = None) -> PolicyVersion:
    """Save a draft. Raises DocumentError (field paths and YAML lines) when it is not valid."""
    document = parse_yaml(source)
    # One number at a time. (A lock that leaves the key alone: a concurrent publication's foreign-key
    # check takes a key-share lock of this row, and waited for ours while we waited for its tenant.)
    Policy.objects.select_for_update(no_key=True).filter(pk=policy.pk).first()
    last = policy.versions.aggregate(last=Max("number"))["last"] or 0
    version = PolicyVersion.objects.create(
        policy=policy, number=last + 1, document=document.canonical(), source=source, sha256=document.sha256(),
        author=user_of(actor), note=note, parent=parent or policy.published_version(),
    )
    audit_record(tenant=policy.tenant, actor=actor, action="policy.version_created", target=version,
                 data={"policy": policy.name, "number": version.number, "sha256": version.sha256,
                       "source_sha256": integrity.source_digest(source)})
    return version


def version_ref(version: PolicyVersion) -> VersionRef:
    return VersionRef(version.policy.name, version.number, version.sha256)


def version_document(version: PolicyVersion) -> PolicyDocument:
    return PolicyDocument.model_validate(version.document)


@transaction.atomic
def version_publish(*, version: PolicyVersion, actor, note: str, action: str = PolicyPublication.PUBLISH,
                    eval_of: PolicyVersion | None = None) -> PolicyPublication:
    """Publish a version. Needs a note, the document's own tests passing, no widening of the
    platform floor and, where the deployment asks for it (AIRLOCK_REQUIRE_CONTAINMENT_EVAL), a
    passing containment eval on its driver (not for a rollback).

    `eval_of`: `version` is the containment eval's own policy, derived from `eval_of` and wider by
    design (it runs the probes, and names what the egress guards must refuse); no agent opens it.
    It needs no eval, and the floor is checked on `eval_of`, whose sessions it stands for."""
    if not note.strip():
        raise ValidationError({"note": "say why you publish this version"})
    document = version_document(version)
    failures = [outcome for outcome in run_tests(document, version_ref(version)) if not outcome.passed]
    if failures:
        raise ValidationError({"tests": [f"test {f.index + 1}: expected {shown(f.expected)}, got {shown(f.got)}"
                                         for f in failures]})
    if eval_of is None and action == PolicyPublication.PUBLISH and settings.AIRLOCK_REQUIRE_CONTAINMENT_EVAL:
        driver = document.runtime.driver_for(settings.AIRLOCK_RUNTIME)
        if not version.scores.filter(driver=driver, passed=True).exists():
            raise ValidationError({"containment": f"publishing needs a passing containment eval of v{version.number} "
                                                  f"on {driver} (AIRLOCK_REQUIRE_CONTAINMENT_EVAL): run it from "
                                                  "this page, or with manage.py containment_eval"})
    bounded = eval_of or version
    if widened := floor.check(version_document(bounded)):
        line_at = lines_of(bounded.source)
        raise ValidationError({"floor": [f"line {line_at(list(w.location))}: {w.message}" for w in widened]})
    if unreachable := lint.unreachable_entries(document):
        raise ValidationError({"network": [warning.message.removesuffix("; publishing refuses it")
                                           for warning in unreachable]})
    policy = version.policy
    _publications_in_chain_order(policy)
    previous = policy.published_version()
    publication = PolicyPublication.objects.create(policy=policy, version=version, action=action,
                                                   actor=user_of(actor), note=note)
    audit_record(tenant=policy.tenant, actor=actor, action=f"policy.{'published' if action == 'publish' else action}",
                 target=version, data={"policy": policy.name, "number": version.number, "sha256": version.sha256,
                                       "previous": previous.number if previous else None, "note": note})
    return publication


def _publications_in_chain_order(policy: Policy) -> None:
    """Take the tenant's audit lock before a publication's row: concurrent publishes then get
    their ids in the order of their audit events, which `audit_verify` compares
    (policies_app/integrity.py)."""
    Tenant.objects.select_for_update().filter(pk=policy.tenant_id).first()


@transaction.atomic
def version_rollback(*, policy: Policy, to: PolicyVersion, actor, note: str) -> PolicyVersion:
    """Publish an older document again, as a new version (history only grows)."""
    if to.policy_id != policy.pk:
        raise ValidationError({"version": "that version belongs to another policy"})
    try:
        version = version_create(policy=policy, source=to.source, actor=actor,
                                 note=f"rollback to v{to.number}: {note}", parent=policy.published_version())
    except DocumentError as exc:  # an old document that today's schema no longer accepts
        raise ValidationError({"version": f"v{to.number} is not valid any more: {exc}"}) from None
    version_publish(version=version, actor=actor, note=note, action=PolicyPublication.ROLLBACK)
    return version


@transaction.atomic
def policy_retire(*, policy: Policy, actor, note: str) -> None:
    """Unpublish: the policy then allows nothing (default deny)."""
    current = policy.published_version()
    if current is None:
        raise ValidationError({"policy": "nothing is published"})
    if not note.strip():
        raise ValidationError({"note": "say why you retire this policy"})
    _publications_in_chain_order(policy)
    PolicyPublication.objects.create(policy=policy, version=current, action=PolicyPublication.RETIRE,
                                     actor=user_of(actor), note=note)
    audit_record(tenant=policy.tenant, actor=actor, action="policy.retired", target=current,
                 data={"policy": policy.name, "number": current.number, "note": note})



@transaction.atomic
def policy_set_shadow(*, policy: Policy, version: PolicyVersion | None, actor) -> Policy:
    """Name the candidate evaluated beside the published version (None stops shadowing)."""
    if version is not None and version.policy_id != policy.pk:
        raise ValidationError({"version": "that version belongs to another policy"})
    policy.shadow_version = version
    policy.save(update_fields=["shadow_version"])
    audit_record(tenant=policy.tenant, actor=actor, action="policy.shadow_set", target=policy,
                 data={"policy": policy.name, "number": version.number if version else None})
    return policy


class FloorBreaks(Exception):
    """Saving this floor would refuse published tenant versions: `broken` (floor.Broken)."""

    def __init__(self, broken: list):
        super().__init__(f"{len(broken)} published version(s) would be refused")
        self.broken = broken


def floor_record_in_force(*, tenant: Tenant, actor, **_) -> None:
    """A new tenant's chain records the floor in force (controlplane.signals.tenant_created), as
    every chain records each floor set: so every floor version in force while a tenant exists is
    recorded somewhere, and `audit_verify` finds one inserted in the database. Only a floor some
    chain already vouches for is recorded (or the first tenant's, set while there was none): a
    new tenant must not vouch for a floor inserted in the database."""
    version = floor.current()
    if version is None:
        return
    vouched = AuditEvent.objects.filter(action__in=integrity.FLOOR_EVENTS, target_id=str(version.pk),
                                        data__sha256=version.sha256).exists()
    if vouched or not Tenant.objects.exclude(pk=tenant.pk).exists():
        audit_record(tenant=tenant, actor=actor, action="platform.floor_in_force", target=version,
                     data={"number": version.number, "sha256": version.sha256})
    else:
        log.error("platform floor v%d is in force but no tenant's audit chain records it: not recorded for the new "
                  "tenant %s (manage.py audit_verify)", version.number, tenant.slug)


@transaction.atomic
def floor_set(*, source: str, actor, note: str, accept_breaking: bool = False) -> FloorVersion:
    """A new platform floor, in force at once, recorded in every tenant's audit chain. Raises
    DocumentError for an invalid document and FloorBreaks when published tenant versions would
    be refused, unless `accept_breaking` (their sessions then cannot start until narrowed)."""
    if not note.strip():
        raise ValidationError({"note": "say why the floor changes"})
    document = parse_yaml(source)
    broken = floor.preview(document)
    if broken and not accept_breaking:
        raise FloorBreaks(broken)
    FloorVersion.objects.select_for_update().order_by("-number").first()  # one number at a time
    last = FloorVersion.objects.aggregate(last=Max("number"))["last"] or 0
    version = FloorVersion.objects.create(number=last + 1, document=document.canonical(), source=source,
                                          sha256=document.sha256(), author=user_of(actor), note=note)
    for tenant in Tenant.objects.order_by("pk"):
        audit_record(tenant=tenant, actor=actor, action="platform.floor_set", target=version,
                     data={"number": version.number, "sha256": version.sha256, "note": note,
                           "refuses": [f"{b.policy.name} v{b.version.number}" for b in broken
                                       if b.policy.tenant_id == tenant.pk]})
    return version
