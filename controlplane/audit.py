"""The audit log's hash chain.

Each tenant has its own chain: event n stores `prev_hash` (event n-1's hash, or GENESIS) and
`hash = sha256(prev_hash + canonical_json(event))`. Changing, inserting or deleting a row
breaks the chain from that row on, which `audit_verify` reports."""

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from controlplane.models import AuditEvent, Tenant

GENESIS = "0" * 64


def canonical_json(event: AuditEvent) -> str:
    body = {
        "tenant": event.tenant_id,
        "seq": event.seq,
        "created_at": event.created_at.isoformat(),
        "actor": event.actor,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "data": event.data,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def chain_hash(prev_hash: str, event: AuditEvent) -> str:
    return hashlib.sha256((prev_hash + canonical_json(event)).encode()).hexdigest()


def actor_label(actor) -> str:
    """'user:alice', 'apikey:alk_ab12cd34', 'system', or a label given as a string
    ('session:<id>' for a session's own token)."""
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    if hasattr(actor, "prefix"):
        return f"apikey:{actor.PREFIX}{actor.prefix}"
    return f"user:{actor.get_username()}"


def user_of(actor):
    """The user behind an actor, or None for an API key or the system."""
    return actor if actor is not None and not isinstance(actor, str) and not hasattr(actor, "prefix") else None


@transaction.atomic
def audit_record(
    *, tenant: Tenant, actor, action: str, target=None, data: dict | None = None
) -> AuditEvent:
    """Append one event to the tenant's chain. The tenant row is locked so that concurrent
    writers take sequence numbers one at a time (SQLite serialises writers by itself)."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    last = AuditEvent.objects.filter(tenant=tenant).order_by("-seq").values("seq", "hash").first()
    event = AuditEvent(
        tenant=tenant,
        seq=(last["seq"] + 1) if last else 1,
        created_at=timezone.now(),
        actor_user=user_of(actor),
        actor=actor_label(actor),
        action=action,
        target_type=type(target).__name__.lower() if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        data=json.loads(json.dumps(data or {}, default=str)),
        prev_hash=last["hash"] if last else GENESIS,
    )
    event.hash = chain_hash(event.prev_hash, event)
    event.save()
    return event


@dataclass(frozen=True)
class BrokenLink:
    tenant: str
    seq: int
    problem: str


def audit_verify(tenant: Tenant) -> BrokenLink | None:
    """The first broken link of the tenant's chain, or None when it is whole."""
    prev_hash, expected_seq = GENESIS, 1
    for event in _events_in_order(tenant):
        if event.seq != expected_seq:
            return BrokenLink(tenant.slug, expected_seq, f"event #{expected_seq} is missing (found #{event.seq})")
        if event.prev_hash != prev_hash:
            return BrokenLink(tenant.slug, event.seq, "prev_hash does not match the previous event's hash")
        if chain_hash(prev_hash, event) != event.hash:
            return BrokenLink(tenant.slug, event.seq, "the event's content does not match its hash")
        prev_hash, expected_seq = event.hash, expected_seq + 1
    return None


def _events_in_order(tenant: Tenant) -> Iterator[AuditEvent]:
    return AuditEvent.objects.filter(tenant=tenant).order_by("seq").iterator(chunk_size=2000)
