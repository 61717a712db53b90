import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from controlplane import services
from controlplane.models import ApiKey, ApiKeyScope, Membership, Tenant
from controlplane.roles import Role
from policies_app import services as policy_services

DEMO_TENANT, DEMO_USER, DEMO_KEY = "demo", "admin", "demo-agent"
DEMO_POLICY = """# The demo tenant's policy. Default deny: only these commands run, with these arguments.
mode: enforce
limits: {cpus: 1, memory_mb: 512, pids: 128, disk_mb: 256, command_timeout_s: 15, output_tail_chars: 8000}
commands:
  - id: pytest
    bin: pytest
    prepend_args: ["-q"]
    deny_args: ["^-c", "^-p", "^--rootdir", "^--confcutdir"]
  - id: python3
    bin: python3
    deny_args: ["^-"]  # no interpreter options at all: -c, -m, -i and their spellings stay closed
filesystem: {workspace: /workspace, arg_paths: workspace_only}
# One way out, through the session's egress proxy: PyPI over TLS, for `pip install`. Every other
# connection is refused (a 403 to the program, a denial on the Denials page).
network:
  egress: allowlist
  allow: ["pypi.org:443", "files.pythonhosted.org:443"]
# Checkpoints: a session opened with `persist: true` leaves its workspace as a sealed snapshot when
# it ends; the next session of its conversation may resume it (every file's digest checked first).
persistence: {enabled: true, retention_days: 7, max_mb: 256}
tests:
  - request: {bin: pytest, args: ["tests/"]}
    expect: {allowed: true, rule_id: pytest}
  - request: {bin: pytest, args: ["-c", "x"]}
    expect: {allowed: false, reason_code: arg_denied}
  - request: {bin: python3, args: ["-c", "import os"]}
    expect: {allowed: false, reason_code: arg_denied}
  - request: {bin: bash, args: ["-c", "id"]}
    expect: {allowed: false, reason_code: bin_not_allowed}
"""


class Command(BaseCommand):
    help = (
        "Create the demo tenant with an admin user and an API key, printing both once. "
        "Re-running keeps everything and prints no secret unless --reset-credentials is given."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--reset-credentials", action="store_true",
            help="set a new admin password and replace the demo API key (the old one is revoked)",
        )

    def handle(self, *args, reset_credentials=False, **options):
        tenant = Tenant.objects.filter(slug=DEMO_TENANT).first()
        if tenant is not None and not reset_credentials:
            self.stdout.write(
                f"Demo tenant '{DEMO_TENANT}' already exists; its credentials were printed when it was created.\n"
                "To mint new ones: .venv/bin/python manage.py demo_setup --reset-credentials"
            )
            return
        with transaction.atomic():
            password, key = self._set_up(tenant)
        self.stdout.write(self.style.SUCCESS("\nAirlock demo tenant ready. These secrets are shown once:\n"))
        # Where `make run` serves (scripts/run.sh reads the same variables).
        base = f"http://{os.environ.get('AIRLOCK_HOST') or '127.0.0.1'}:{os.environ.get('AIRLOCK_PORT') or '8000'}"
        self.stdout.write(f"  Dashboard  {base}/   user: {DEMO_USER}   password: {password}")
        self.stdout.write(f"  API key    {key}")
        self.stdout.write(f"  Try it     curl -H 'Authorization: Bearer {key}' {base}/api/v1/whoami")
        self.stdout.write(f"  Metrics    curl -H 'Authorization: Bearer {key}' {base}/metrics\n")

    def _set_up(self, tenant):
        User = get_user_model()
        if tenant is None:
            tenant = services.tenant_create(slug=DEMO_TENANT, name="Demo")
        user = User.objects.filter(username=DEMO_USER).first()
        if user is None:
            new_user = services.user_create(username=DEMO_USER)
            user, password = new_user.user, new_user.password
        else:
            password = services.user_reset_password(user=user)
        if not Membership.objects.filter(tenant=tenant, user=user).exists():
            services.membership_add(tenant=tenant, user=user, role=Role.TENANT_ADMIN)
        for old in ApiKey.objects.filter(tenant=tenant, name=DEMO_KEY, revoked_at__isnull=True):
            services.api_key_revoke(api_key=old, actor=None)
        new_key = services.api_key_create(
            tenant=tenant, name=DEMO_KEY, actor=None,
            scopes=[ApiKeyScope.SESSIONS, ApiKeyScope.POLICIES_READ, ApiKeyScope.METRICS],
        )
        if not tenant.policies.filter(name="default").exists():
            policy = policy_services.policy_create(tenant=tenant, name="default", actor=None)
            version = policy_services.version_create(policy=policy, source=DEMO_POLICY, actor=None,
                                                     note="demo policy")
            policy_services.version_publish(version=version, actor=None, note="demo policy")
        return password, new_key.key
