"""The platform floor's versions get 0013's guard too: on SQLite, `INSERT OR REPLACE` removes
the version it meets without firing 0011's UPDATE trigger, and could rewrite a floor in force."""

from django.db import migrations

TABLE = "policies_app_floorversion"
TRIGGER = "floorversion_no_replace"
CREATE = (f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {TABLE} "
          f"WHEN EXISTS (SELECT 1 FROM {TABLE} WHERE id = NEW.id OR number = NEW.number) "
          "BEGIN SELECT RAISE(ABORT, 'floor versions are immutable'); END")


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0013_versions_no_replace")]
    operations = [migrations.RunPython(create, drop)]
