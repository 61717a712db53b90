"""SQLite's `INSERT OR REPLACE` removes the row it conflicts with without firing an UPDATE
trigger, so it could rewrite a policy version under 0002's refusal. This refuses any insert
that would meet an existing version: its id, or its policy's version number (see
controlplane/migrations/0006_audit_no_replace.py). PostgreSQL's upsert fires the UPDATE trigger."""

from django.db import migrations

TABLE = "policies_app_policyversion"
TRIGGER = "policyversion_no_replace"
CREATE = (f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {TABLE} "
          f"WHEN EXISTS (SELECT 1 FROM {TABLE} WHERE id = NEW.id OR (policy_id = NEW.policy_id AND number = NEW.number)) "
          "BEGIN SELECT RAISE(ABORT, 'policy versions are immutable'); END")


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0012_containment_scores")]
    operations = [migrations.RunPython(create, drop)]
