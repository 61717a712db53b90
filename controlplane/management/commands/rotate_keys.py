from django.core.management.base import BaseCommand, CommandError

from controlplane.keys import KeyUnavailable, master_id, master_key, rotate


class Command(BaseCommand):
    help = ("Re-wrap every tenant's data keys under the current master key (AIRLOCK_MASTER_KEY); keys wrapped by "
            "an older one must still open with AIRLOCK_MASTER_KEYS_PREVIOUS. All or nothing: one key that does not "
            "open leaves every key as it was. With --new-data-keys, also give each tenant a new data key, which "
            "new snapshots and artifacts use.")

    def add_arguments(self, parser):
        parser.add_argument("--new-data-keys", action="store_true", help="also start a new data key per tenant")

    def handle(self, *args, new_data_keys=False, **options):
        try:
            report = rotate(new_data_keys=new_data_keys)
        except KeyUnavailable as exc:
            raise CommandError(f"{exc}; nothing was changed") from None
        self.stdout.write(f"master key {master_id(master_key())}: {report.rewrapped} data keys re-wrapped, "
                          f"{report.already_current} already under it, {report.new_versions} new data keys")
