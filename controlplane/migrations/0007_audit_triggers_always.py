"""On PostgreSQL, a session with `session_replication_role = replica` (a superuser's, or a role
granted that setting) skips ordinary triggers: 0003's refusals fire in every session instead
(ENABLE ALWAYS). Only DDL takes that away. (SQLite has no such setting.)"""

from django.db import migrations

from controlplane import triggers

TABLE = "controlplane_auditevent"
TRIGGERS = ("auditevent_append_only", "auditevent_no_truncate")


def statements(vendor: str, *, drop: bool) -> list[str]:
    if vendor != "postgresql" or drop:
        return []
    return [f"ALTER TABLE {TABLE} ENABLE ALWAYS TRIGGER {trigger}" for trigger in TRIGGERS]


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0006_audit_no_replace")]
    operations = [triggers.operation(
        statements, afterwards={"postgresql": [f"ALTER TABLE {TABLE} ENABLE TRIGGER {name}" for name in TRIGGERS]})]
