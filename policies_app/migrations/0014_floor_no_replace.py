"""The platform floor's versions get 0013's guard too: on SQLite, `INSERT OR REPLACE` removes
the version it meets without firing 0011's UPDATE trigger, and could rewrite a floor in force."""

from django.db import migrations

from controlplane import triggers

TABLE = "policies_app_floorversion"
TRIGGER = "floorversion_no_replace"
statements = triggers.sqlite_only(
    triggers.no_replace(TABLE, TRIGGER, "id = NEW.id OR number = NEW.number", "floor versions are immutable"),
    dropped=[TRIGGER])


class Migration(migrations.Migration):
    dependencies = [("policies_app", "0013_versions_no_replace")]
    operations = [triggers.operation(statements)]
