"""A session's tenant, pinned policy version and driver are set when it opens and never change
(docs/architecture.md, "Audit"): the database refuses to change them, so plain DML cannot
give a live session another version (another tenant's, or a wider one) to decide its commands.
SQLite's `INSERT OR REPLACE` of an existing session is refused too. On PostgreSQL the refusal
fires ALWAYS."""

from django.db import migrations

from controlplane import triggers

TABLE = "agent_sessions_session"
REFUSAL = "the tenant, policy version and driver of a session never change"
COLUMNS = ("tenant_id", "policy_version_id", "driver")


def statements(vendor: str, *, drop: bool) -> list[str]:
    changed = " OR ".join(f"NEW.{column} IS NOT OLD.{column}" for column in COLUMNS)
    if vendor == "sqlite":
        if drop:
            return ["DROP TRIGGER IF EXISTS session_identity", "DROP TRIGGER IF EXISTS session_no_replace"]
        return [
            f"CREATE TRIGGER session_identity BEFORE UPDATE OF {', '.join(COLUMNS)} ON {TABLE} WHEN {changed} "
            f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END",
            triggers.no_replace(TABLE, "session_no_replace", "id = NEW.id", REFUSAL),
        ]
    if vendor == "postgresql":
        if drop:
            return [f"DROP TRIGGER IF EXISTS session_identity ON {TABLE}"]
        return [
            "CREATE OR REPLACE FUNCTION airlock_session_identity() RETURNS trigger AS $$ BEGIN "
            f"IF {changed.replace(' IS NOT ', ' IS DISTINCT FROM ')} THEN RAISE EXCEPTION '{REFUSAL}'; END IF; "
            "RETURN NEW; END; $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER session_identity BEFORE UPDATE ON {TABLE} FOR EACH ROW "
            "EXECUTE FUNCTION airlock_session_identity()",
            f"ALTER TABLE {TABLE} ENABLE ALWAYS TRIGGER session_identity",
        ]
    return []


class Migration(migrations.Migration):
    dependencies = [("agent_sessions", "0006_persistence"), ("policies_app", "0017_policy_identity")]
    operations = [triggers.operation(
        statements, afterwards={"postgresql": ["DROP FUNCTION IF EXISTS airlock_session_identity()"]})]
