"""SQLite's `INSERT OR REPLACE` removes the row it conflicts with without firing an UPDATE
trigger, so it could rewrite a policy version under 0002's refusal. This refuses any insert
that would meet an existing version: its id, or its policy's version number (see
controlplane/migrations/0006_audit_no_replace.py). PostgreSQL's upsert fires the UPDATE trigger."""

from django.db import migrations

from controlplane import triggers

TABLE = "policies_app_policyversion"
TRIGGER = "policyversion_no_replace"
statements = triggers.sqlite_only(
    triggers.no_replace(TABLE, TRIGGER, "id = NEW.id OR (policy_id = NEW.policy_id AND number = NEW.number)",
                        "policy versions are immutable"),
    dropped=[TRIGGER])


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0012_containment_scores")]
    operations = [triggers.operation(statements)]
