"""SQLite's `INSERT OR REPLACE` (and `REPLACE`, and an upsert's conflict resolution) removes the
row it conflicts with without firing DELETE triggers (unless a connection turns
`recursive_triggers` on, which whoever tampers would not), so it could rewrite an audit row
under 0003's refusal. This refuses any insert that would meet an existing row: its id, or its
tenant's sequence number. PostgreSQL's upsert fires the UPDATE trigger, which refuses it."""

from django.db import migrations

TABLE = "controlplane_auditevent"
TRIGGER = "auditevent_no_replace"
CREATE = (f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {TABLE} "
          f"WHEN EXISTS (SELECT 1 FROM {TABLE} WHERE id = NEW.id OR (tenant_id = NEW.tenant_id AND seq = NEW.seq)) "
          "BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END")


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0005_data_keys")]
    operations = [migrations.RunPython(create, drop)]
