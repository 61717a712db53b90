"""A policy's tenant and name never change, and a policy is never deleted (its versions and
publications are PROTECTed, and the application deletes none): the database refuses both, so
plain DML cannot move a policy, with its history, to another tenant or swap two policies'
names (whose versions sessions run). Only its shadow changes. On PostgreSQL the refusal fires
ALWAYS, like the history's (0016). See also sessions/0007."""

from django.db import migrations

from controlplane import triggers

TABLE = "policies_app_policy"
REFUSAL = "the tenant and name of a policy never change, and a policy is never deleted"


def statements(vendor: str, *, drop: bool) -> list[str]:
    if vendor == "sqlite":
        if drop:
            return [f"DROP TRIGGER IF EXISTS {name}" for name in ("policy_identity", "policy_no_delete",
                                                                   "policy_no_replace")]
        return [
            f"CREATE TRIGGER policy_identity BEFORE UPDATE OF tenant_id, name ON {TABLE} "
            "WHEN NEW.tenant_id IS NOT OLD.tenant_id OR NEW.name IS NOT OLD.name "
            f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END",
            f"CREATE TRIGGER policy_no_delete BEFORE DELETE ON {TABLE} BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END",
            triggers.no_replace(TABLE, "policy_no_replace",
                                "id = NEW.id OR (tenant_id = NEW.tenant_id AND name = NEW.name)", REFUSAL),
        ]
    if vendor == "postgresql":
        if drop:
            return [f"DROP TRIGGER IF EXISTS {name} ON {TABLE}" for name in ("policy_identity", "policy_no_delete",
                                                                             "policy_no_truncate")]
        return [
            "CREATE OR REPLACE FUNCTION airlock_policy_identity() RETURNS trigger AS $$ BEGIN "
            "IF TG_OP = 'UPDATE' AND NEW.tenant_id = OLD.tenant_id AND NEW.name = OLD.name THEN RETURN NEW; END IF; "
            f"RAISE EXCEPTION '{REFUSAL}'; END; $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER policy_identity BEFORE UPDATE ON {TABLE} FOR EACH ROW "
            "EXECUTE FUNCTION airlock_policy_identity()",
            f"CREATE TRIGGER policy_no_delete BEFORE DELETE ON {TABLE} FOR EACH ROW "
            "EXECUTE FUNCTION airlock_policy_identity()",
            f"CREATE TRIGGER policy_no_truncate BEFORE TRUNCATE ON {TABLE} FOR EACH STATEMENT "
            "EXECUTE FUNCTION airlock_policy_identity()",
            *(f"ALTER TABLE {TABLE} ENABLE ALWAYS TRIGGER {name}"
              for name in ("policy_identity", "policy_no_delete", "policy_no_truncate")),
        ]
    return []


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0016_history_always")]
    operations = [triggers.operation(
        statements, afterwards={"postgresql": ["DROP FUNCTION IF EXISTS airlock_policy_identity()"]})]
