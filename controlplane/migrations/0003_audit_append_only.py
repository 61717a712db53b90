"""The database refuses UPDATE, DELETE (and, on PostgreSQL, TRUNCATE) of audit events, whoever
sends them. Only DDL takes that away (dropping the triggers): the test suite does, in its own
database, because Django's test flush empties every table (tests/conftest.py); its tests of the
refusal put the triggers back.

(On SQLite, a later migration that rebuilds the audit table would drop these triggers with it:
such a migration must create them again.)"""

from django.db import migrations

from controlplane import triggers

TABLE = "controlplane_auditevent"
REFUSAL = "audit events are append-only"

SQLITE = [
    f"CREATE TRIGGER auditevent_no_{op.lower()} BEFORE {op} ON {TABLE} BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
    for op in ("UPDATE", "DELETE")
]
POSTGRES = [
    "CREATE OR REPLACE FUNCTION airlock_audit_append_only() RETURNS trigger AS $$ BEGIN "
    f"RAISE EXCEPTION '{REFUSAL}'; END; $$ LANGUAGE plpgsql",
    f"CREATE TRIGGER auditevent_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
    "FOR EACH ROW EXECUTE FUNCTION airlock_audit_append_only()",
    f"CREATE TRIGGER auditevent_no_truncate BEFORE TRUNCATE ON {TABLE} "
    "FOR EACH STATEMENT EXECUTE FUNCTION airlock_audit_append_only()",
]
DROP_SQLITE = [f"DROP TRIGGER IF EXISTS auditevent_no_{op}" for op in ("update", "delete")]
DROP_POSTGRES = [f"DROP TRIGGER IF EXISTS {trigger} ON {TABLE}"
                 for trigger in ("auditevent_append_only", "auditevent_no_truncate")]


def statements(vendor: str, *, drop: bool) -> list[str]:
    if drop:
        return {"sqlite": DROP_SQLITE, "postgresql": DROP_POSTGRES}.get(vendor, [])
    return {"sqlite": SQLITE, "postgresql": POSTGRES}.get(vendor, [])


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0002_audit_keyed")]
    operations = [triggers.operation(
        statements, afterwards={"postgresql": ["DROP FUNCTION IF EXISTS airlock_audit_append_only()"]})]
