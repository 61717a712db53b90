"""SQLite's `INSERT OR REPLACE` (and `REPLACE`, and an upsert's conflict resolution) removes the
row it conflicts with without firing DELETE triggers (unless a connection turns
`recursive_triggers` on, which whoever tampers would not), so it could rewrite an audit row
under 0003's refusal. This refuses any insert that would meet an existing row: its id, or its
tenant's sequence number. PostgreSQL's upsert fires the UPDATE trigger, which refuses it."""

from django.db import migrations

from controlplane import triggers

TABLE = "controlplane_auditevent"
TRIGGER = "auditevent_no_replace"
statements = triggers.sqlite_only(
    triggers.no_replace(TABLE, TRIGGER, "id = NEW.id OR (tenant_id = NEW.tenant_id AND seq = NEW.seq)",
                        "audit events are append-only"),
    dropped=[TRIGGER])


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0005_data_keys")]
    operations = [triggers.operation(statements)]
