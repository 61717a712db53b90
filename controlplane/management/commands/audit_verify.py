from django.core.management.base import BaseCommand, CommandError

from controlplane.audit import audit_verify
from controlplane.models import AuditEvent, Tenant


class Command(BaseCommand):
    help = "Verify every tenant's audit hash chain; report the first broken link and exit non-zero."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="verify only this tenant (slug)")

    def handle(self, *args, tenant=None, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant!r}")
        broken = 0
        for each in tenants:
            link = audit_verify(each)
            count = AuditEvent.objects.filter(tenant=each).count()
            if link is None:
                self.stdout.write(f"ok      {each.slug}: {count} events, chain intact")
            else:
                broken += 1
                self.stdout.write(f"BROKEN  {link.tenant}: event #{link.seq}: {link.problem}")
        if broken:
            raise CommandError(f"{broken} tenant chain(s) broken", returncode=3)
