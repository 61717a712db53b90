from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from policies_app.models import DecisionRecord, DecisionRollup
from policies_app.rollups import compact, day_of


class Command(BaseCommand):
    help = ("Delete decisions older than AIRLOCK_DECISION_RETENTION_DAYS (or --days), and merge the hourly "
            "rollups of days older than 3 days into daily rows. Run it daily.")

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, help="override the retention setting")

    def handle(self, *args, days=None, **options):
        if days is None:  # an explicit --days 0 is refused below, not taken for "unset"
            days = settings.AIRLOCK_DECISION_RETENTION_DAYS
        if days < 1:
            raise CommandError("--days must be at least 1")
        # Whole days: the decision log and its rollups (daily by then) keep the same period.
        cutoff = day_of(timezone.now() - timedelta(days=days))
        deleted, _ = DecisionRecord.objects.filter(created_at__lt=cutoff).delete()
        DecisionRollup.objects.filter(hour__lt=cutoff).delete()
        merged = compact()
        self.stdout.write(f"deleted {deleted} decision(s) older than {days} days; merged {merged} hourly rollup "
                          "row(s) into days")
