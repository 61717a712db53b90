"""The database refuses to delete a policy's history: a version, a floor version or a publication
(and, on PostgreSQL, to TRUNCATE their tables); a publication cannot be updated either. 0002 and
0011 refuse UPDATE of versions, 0013 and 0014 SQLite's REPLACE; without this, a version could
be deleted and inserted again with other content. The application never deletes any of them
(the models are PROTECTed). Only DDL takes the refusal away: the test suite drops it for Django's
flush, as for the audit log (tests/conftest.py), and `audit_verify` still compares every version
with the digest the keyed audit chain recorded for it (policies_app/integrity.py).

(On SQLite, a later migration that rebuilds one of these tables drops its triggers with it: such
a migration must create them again.)"""

from django.db import migrations

from controlplane import triggers

REFUSAL = "policy history is append-only"
# table: what is refused besides DELETE
TABLES = {
    "policies_app_policyversion": (),
    "policies_app_floorversion": (),
    "policies_app_policypublication": ("UPDATE",),
}


def _sqlite(table: str, op: str) -> str:
    return f"{table}_no_{op.lower()}"


def _postgres(table: str) -> tuple[str, str]:
    return f"{table}_append_only", f"{table}_no_truncate"


def statements(vendor: str, *, drop: bool) -> list[str]:
    if vendor == "sqlite":
        refused = [(table, op) for table, more in TABLES.items() for op in ("DELETE", *more)]
        if drop:
            return [f"DROP TRIGGER IF EXISTS {_sqlite(table, op)}" for table, op in refused]
        return [f"CREATE TRIGGER {_sqlite(table, op)} BEFORE {op} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END" for table, op in refused]
    if vendor == "postgresql":
        if drop:
            return [f"DROP TRIGGER IF EXISTS {name} ON {table}" for table in TABLES for name in _postgres(table)]
        created = ["CREATE OR REPLACE FUNCTION airlock_history_append_only() RETURNS trigger AS $$ BEGIN "
                   f"RAISE EXCEPTION '{REFUSAL}'; END; $$ LANGUAGE plpgsql"]
        for table, more in TABLES.items():
            rows, statement = _postgres(table)
            created += [f"CREATE TRIGGER {rows} BEFORE {' OR '.join(('DELETE', *more))} ON {table} "
                        "FOR EACH ROW EXECUTE FUNCTION airlock_history_append_only()",
                        f"CREATE TRIGGER {statement} BEFORE TRUNCATE ON {table} "
                        "FOR EACH STATEMENT EXECUTE FUNCTION airlock_history_append_only()"]
        return created
    return []


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0014_floor_no_replace")]
    operations = [triggers.operation(
        statements, afterwards={"postgresql": ["DROP FUNCTION IF EXISTS airlock_history_append_only()"]})]
