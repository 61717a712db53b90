"""Two more of the policy history's refusals (0015):

- SQLite's `INSERT OR REPLACE` of a publication removes the row it meets without firing 0015's
  DELETE trigger, so it could move a publication to another version: an insert that meets an
  existing publication's id is refused (as 0013 does for versions);
- on PostgreSQL, a session with `session_replication_role = replica` skips ordinary triggers:
  the history's refusals (0002, 0011, 0015) fire in every session instead (ENABLE ALWAYS), as
  the audit log's do (controlplane/0007)."""

from django.db import migrations

from controlplane import triggers

PUBLICATIONS = "policies_app_policypublication"
NO_REPLACE = "policypublication_no_replace"
ALWAYS = {
    "policies_app_policyversion": ("policyversion_immutable", "policies_app_policyversion_append_only",
                                   "policies_app_policyversion_no_truncate"),
    "policies_app_floorversion": ("floorversion_immutable", "policies_app_floorversion_append_only",
                                  "policies_app_floorversion_no_truncate"),
    PUBLICATIONS: ("policies_app_policypublication_append_only", "policies_app_policypublication_no_truncate"),
}


def statements(vendor: str, *, drop: bool) -> list[str]:
    if vendor == "sqlite":
        if drop:
            return [f"DROP TRIGGER IF EXISTS {NO_REPLACE}"]
        return [triggers.no_replace(PUBLICATIONS, NO_REPLACE, "id = NEW.id", "policy history is append-only")]
    if vendor == "postgresql" and not drop:
        return [f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}" for table, names in ALWAYS.items() for name in names]
    return []


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0015_history_append_only")]
    operations = [triggers.operation(statements, afterwards={"postgresql": [
        f"ALTER TABLE {table} ENABLE TRIGGER {name}" for table, names in ALWAYS.items() for name in names]})]
