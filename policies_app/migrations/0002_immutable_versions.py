"""A database trigger refuses any UPDATE of a policy version, whoever sends it."""

from django.db import migrations

TABLE = "policies_app_policyversion"

SQLITE = [
    f"CREATE TRIGGER policyversion_immutable BEFORE UPDATE ON {TABLE} "
    "BEGIN SELECT RAISE(ABORT, 'policy versions are immutable'); END;",
]
POSTGRES = [
    "CREATE OR REPLACE FUNCTION airlock_refuse_update() RETURNS trigger AS $$ "
    "BEGIN RAISE EXCEPTION 'policy versions are immutable'; END; $$ LANGUAGE plpgsql;",
    f"CREATE TRIGGER policyversion_immutable BEFORE UPDATE ON {TABLE} "
    "FOR EACH ROW EXECUTE FUNCTION airlock_refuse_update();",
]


def create_trigger(apps, schema_editor):
    statements = {"sqlite": SQLITE, "postgresql": POSTGRES}.get(schema_editor.connection.vendor, [])
    for statement in statements:
        schema_editor.execute(statement)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS policyversion_immutable ON {TABLE};")
    else:
        schema_editor.execute("DROP TRIGGER IF EXISTS policyversion_immutable;")


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0001_initial")]
    operations = [migrations.RunPython(create_trigger, drop_trigger)]
