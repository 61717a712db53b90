from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from controlplane import services
from controlplane.roles import Role


class Command(BaseCommand):
    help = "Create a tenant and make a user its tenant_admin (a new user's password is printed once)."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="short name used in URLs, e.g. acme")
        parser.add_argument("--name", help="display name (default: the slug)")
        parser.add_argument("--admin", required=True, help="username of the first tenant_admin")

    def handle(self, *args, slug, name=None, admin, **options):
        user = get_user_model().objects.filter(username=admin).first()
        password = None
        try:
            with transaction.atomic():
                tenant = services.tenant_create(slug=slug, name=name or slug)
                if user is None:
                    new_user = services.user_create(username=admin)
                    user, password = new_user.user, new_user.password
                services.membership_add(tenant=tenant, user=user, role=Role.TENANT_ADMIN)
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None
        self.stdout.write(self.style.SUCCESS(f"Tenant {slug} created; {admin} is its tenant_admin."))
        if password:
            self.stdout.write(f"New user {admin}, password (shown once): {password}")
