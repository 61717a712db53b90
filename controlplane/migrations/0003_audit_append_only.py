"""The database refuses UPDATE, DELETE (and, on PostgreSQL, TRUNCATE) of audit events, whoever
sends them, unless `controlplane_audit_unlock` holds a row. In a deployment it holds none; the
test suite puts one in its own database, because Django's test flush empties every table.

(On SQLite, a later migration that rebuilds the audit table would drop these triggers with it:
such a migration must create them again.)"""

from django.db import migrations

TABLE = "controlplane_auditevent"
UNLOCK = "controlplane_audit_unlock"
REFUSAL = "audit events are append-only"

SQLITE = [
    f"CREATE TABLE {UNLOCK} (reason TEXT NOT NULL)",
    *(f"CREATE TRIGGER auditevent_no_{op.lower()} BEFORE {op} ON {TABLE} "
      f"WHEN NOT EXISTS (SELECT 1 FROM {UNLOCK}) BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
      for op in ("UPDATE", "DELETE")),
]
POSTGRES = [
    f"CREATE TABLE {UNLOCK} (reason text NOT NULL)",
    "CREATE OR REPLACE FUNCTION airlock_audit_append_only() RETURNS trigger AS $$ BEGIN "
    f"IF EXISTS (SELECT 1 FROM {UNLOCK}) THEN "
    "IF TG_OP = 'DELETE' THEN RETURN OLD; ELSIF TG_OP = 'UPDATE' THEN RETURN NEW; ELSE RETURN NULL; END IF; "
    f"END IF; RAISE EXCEPTION '{REFUSAL}'; END; $$ LANGUAGE plpgsql",
    f"CREATE TRIGGER auditevent_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
    "FOR EACH ROW EXECUTE FUNCTION airlock_audit_append_only()",
    f"CREATE TRIGGER auditevent_no_truncate BEFORE TRUNCATE ON {TABLE} "
    "FOR EACH STATEMENT EXECUTE FUNCTION airlock_audit_append_only()",
]


def create(apps, schema_editor):
    for statement in {"sqlite": SQLITE, "postgresql": POSTGRES}.get(schema_editor.connection.vendor, []):
        schema_editor.execute(statement)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for trigger in ("auditevent_append_only", "auditevent_no_truncate"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {TABLE}")
        schema_editor.execute("DROP FUNCTION IF EXISTS airlock_audit_append_only()")
    else:
        for trigger in ("auditevent_no_update", "auditevent_no_delete"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    schema_editor.execute(f"DROP TABLE IF EXISTS {UNLOCK}")


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0002_audit_keyed")]
    operations = [migrations.RunPython(create, drop)]
