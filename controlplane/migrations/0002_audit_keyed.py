"""Audit events are chained with HMAC-SHA256 from now on (controlplane/audit.py): the events of
each tenant's chain are re-chained with the key, in order, as long as their plain SHA-256 chain
holds. A chain broken before this migration stays as it was from its first broken link on, so
that `audit_verify` still reports it there, rather than the migration vouching for it.

The canonical form and the key's derivation are written out here as they were when this ran."""

import hashlib
import hmac
import json

from django.conf import settings
from django.db import migrations

GENESIS = "0" * 64


def _canonical(event) -> str:
    body = {"tenant": event.tenant_id, "seq": event.seq, "created_at": event.created_at.isoformat(),
            "actor": event.actor, "action": event.action, "target_type": event.target_type,
            "target_id": event.target_id, "data": event.data}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def rekey(apps, schema_editor):
    key = (settings.AIRLOCK_AUDIT_KEY.encode() if settings.AIRLOCK_AUDIT_KEY else
           hmac.new(settings.SECRET_KEY.encode(), b"airlock audit chain v1", hashlib.sha256).digest())
    AuditEvent = apps.get_model("controlplane", "AuditEvent")
    for tenant_id in AuditEvent.objects.values_list("tenant_id", flat=True).distinct():
        old_prev, new_prev, seq = GENESIS, GENESIS, 1
        for event in AuditEvent.objects.filter(tenant_id=tenant_id).order_by("seq"):
            text = _canonical(event)
            if (event.seq != seq or event.prev_hash != old_prev
                    or hashlib.sha256((old_prev + text).encode()).hexdigest() != event.hash):
                break  # broken before: left for audit_verify to report
            new_hash = hmac.new(key, (new_prev + text).encode(), hashlib.sha256).hexdigest()
            AuditEvent.objects.filter(pk=event.pk).update(prev_hash=new_prev, hash=new_hash)
            old_prev, new_prev, seq = event.hash, new_hash, seq + 1


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0001_initial")]
    operations = [migrations.RunPython(rekey, migrations.RunPython.noop)]
