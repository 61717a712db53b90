from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit import audit_verify, checkpoints
from controlplane.models import AuditEvent, Tenant


class Command(BaseCommand):
    help = ("Verify every tenant's audit chain (its keyed hashes, and every head checkpointed outside the "
            "database) and what the apps record beside it (policy versions, publications, exceptions and the "
            "platform floor against the chain); report each problem and what caused it, and exit non-zero.")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="verify only this tenant (slug)")

    def handle(self, *args, tenant=None, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant!r}")
        broken = 0
        found, forged, cut, restarted = {}, [], [], []
        events = AuditEvent.objects.filter(tenant__in=tenants).exists()
        try:
            file = checkpoints()
            found, forged, cut, restarted = file.found, file.forged, file.cut, file.restarted
            if events and not (found or forged):
                broken += 1
                self.stdout.write(f"BROKEN  checkpoints: the checkpoint file {settings.AIRLOCK_AUDIT_CHECKPOINTS} is "
                                  "empty, though audit events exist that it recorded: it was emptied")
        except FileNotFoundError:
            if events:
                broken += 1
                self.stdout.write(f"BROKEN  checkpoints: the checkpoint file {settings.AIRLOCK_AUDIT_CHECKPOINTS} is "
                                  "missing, though audit events exist that it recorded: it was deleted or moved "
                                  "(AIRLOCK_AUDIT_CHECKPOINTS)")
        except OSError as exc:
            broken += 1
            self.stdout.write(f"BROKEN  checkpoints: the checkpoint file cannot be read: {exc}")
        for number in forged:
            broken += 1
            self.stdout.write(f"BROKEN  checkpoints: line {number} of the checkpoint file is not signed by this "
                              "deployment's audit key: it was written or altered by someone else (or cut short "
                              "by a crash while it was written)")
        for number, held in restarted:
            broken += 1
            self.stdout.write(f"BROKEN  checkpoints: line {number} begins the checkpoint file again, though the "
                              f"database held {held} audit events it does not checkpoint: the file was deleted or "
                              "emptied (or checkpoints could not be written: see the log)")
        for number in cut:
            broken += 1
            self.stdout.write(f"BROKEN  checkpoints: line {number} of the checkpoint file does not follow the line "
                              "before it: lines between them were cut out of the file (or the line before was "
                              "altered)")
        checks = [config for config in apps.get_app_configs() if hasattr(config, "audit_problems")]
        for each in tenants:
            link = audit_verify(each, found.pop(each.pk, []))
            count = AuditEvent.objects.filter(tenant=each).count()
            if link is None:
                self.stdout.write(f"ok      {each.slug}: {count} events, chain intact")
            else:
                broken += 1
                self.stdout.write(f"BROKEN  {link.tenant}: event #{link.seq}: {link.problem}")
            for problem in _problems(checks, "audit_problems", each):
                broken += 1
                self.stdout.write(f"BROKEN  {each.slug}: {problem}")
        for problem in _problems(checks, "platform_audit_problems"):
            broken += 1
            self.stdout.write(f"BROKEN  platform: {problem}")
        names = {each.slug for each in tenants}
        # Checkpointed, and gone from the database (not merely left out by --tenant).
        still_here = set(Tenant.objects.filter(pk__in=found).values_list("pk", flat=True))
        for points in sorted(found.values(), key=lambda points: points[-1].tenant):
            point = max(points, key=lambda point: point.count)
            if point.tenant_id not in still_here and (not tenant or point.tenant in names):
                broken += 1
                self.stdout.write(f"BROKEN  {point.tenant}: the tenant and its whole chain are gone from the "
                                  f"database (the checkpoint of {point.at} recorded {point.count} events"
                                  + (", and a tenant of that name was made again)" if point.tenant in names else ")"))
        if broken:
            raise CommandError(f"{broken} problem(s) with the audit log", returncode=3)


def _problems(checks, name: str, *args) -> list[str]:
    """What each app's check finds; a check that fails on what it reads is a problem too (rows
    no honest write makes), not the end of the report."""
    problems = []
    for config in checks:
        try:
            problems += getattr(config, name)(*args)
        except Exception as exc:
            problems.append(f"{config.label}: could not be checked ({type(exc).__name__}: {exc}): a row was written "
                            "that no honest write makes")
    return problems
