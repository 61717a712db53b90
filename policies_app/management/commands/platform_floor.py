from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from policies_app import floor, services
from policies_app.document import DocumentError, parse_yaml


class Command(BaseCommand):
    help = ("The platform floor: the policy every tenant's policy may only narrow (docs/architecture.md, "
            "\"Platform floor\"). `show` it; `check FILE` lists the published tenant versions a new floor would "
            "refuse (exit 1 when there are some); `set FILE --note WHY` puts it in force, refused while it breaks "
            "published versions unless --accept-breaking.")

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["show", "check", "set"])
        parser.add_argument("file", nargs="?", help="the floor, a policy document in YAML (check, set)")
        parser.add_argument("--note", default="", help="why the floor changes (set: required; audited)")
        parser.add_argument("--accept-breaking", action="store_true",
                            help="set it even though published tenant versions widen it (their sessions cannot "
                                 "start until a narrower version is published)")

    def handle(self, *args, action, file, note, accept_breaking, **options):
        if action == "show":
            self._show()
            return
        if not file:
            raise CommandError(f"{action} needs the floor's file: platform_floor {action} FLOOR.yaml")
        source = self._read(file)
        if action == "check":
            broken = floor.preview(self._parse(file, source))
            self._list(broken)
            if broken:
                raise CommandError(f"{len(broken)} published version(s) widen this floor", returncode=1)
            self.stdout.write("every published tenant version is within this floor")
            return
        try:
            version = services.floor_set(source=source, actor=None, note=note, accept_breaking=accept_breaking)
        except DocumentError:
            self._parse(file, source)  # says where, and stops
        except services.FloorBreaks as exc:
            self._list(exc.broken)
            raise CommandError(f"not set: {len(exc.broken)} published version(s) widen it; narrow them first, or "
                               "set it with --accept-breaking (their sessions then cannot start)") from None
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(self.style.SUCCESS(f"platform floor v{version.number} is in force (sha256 "
                                             f"{version.sha256[:16]}…), recorded in every tenant's audit log"))

    def _show(self) -> None:
        in_force = floor.current()
        if in_force is None:
            self.stdout.write("no platform floor: tenants' policies are limited by the schema alone")
            return
        self.stdout.write(f"# platform floor v{in_force.number}, {in_force.created_at:%Y-%m-%d %H:%M} UTC: "
                          f"{in_force.note}\n{in_force.source}")

    def _read(self, file: str) -> str:
        try:
            return Path(file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from None

    def _parse(self, file: str, source: str):
        try:
            return parse_yaml(source)
        except DocumentError as exc:
            for error in exc.errors:
                where = f"{file}:{error['line']}" if error["line"] else file
                self.stderr.write(f"{where}: {error['path'] or 'document'}: {error['message']}")
            raise CommandError(f"{file} is not a valid policy document") from None

    def _list(self, broken) -> None:
        for item in broken:
            self.stdout.write(f"{item.policy.tenant.slug}/{item.policy.name} v{item.version.number} (published):")
            for widening in item.widenings:
                self.stdout.write(f"  {'.'.join(map(str, widening.location))}: {widening.message}")
