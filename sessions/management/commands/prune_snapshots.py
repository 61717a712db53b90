from django.core.management.base import BaseCommand

from sessions.persistence import services


class Command(BaseCommand):
    help = ("Delete snapshots and artifacts past their retention (the policy's persistence.retention_days; each "
            "delete audited), and stored blobs that have had no record for an hour. Runners also do it every "
            "AIRLOCK_PRUNE_INTERVAL_S.")

    def handle(self, *args, **options):
        pruned = services.prune()
        self.stdout.write(f"pruned {pruned.snapshots} snapshots, {pruned.artifacts} artifacts and {pruned.blobs} "
                          "blobs without a record")
