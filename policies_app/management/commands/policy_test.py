from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from policies_app.document import DocumentError, parse_yaml
from policies_app.engine import VersionRef
from policies_app.lint import lint
from policies_app.testing import run_tests, shown


class Command(BaseCommand):
    help = "Run a policy file's own tests offline (like `opa test`); exit non-zero when one fails."

    def add_arguments(self, parser):
        parser.add_argument("file", help="a policy document in YAML")

    def handle(self, *args, file, **options):
        path = Path(file)
        try:
            source = path.read_text()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from None
        try:
            document = parse_yaml(source)
        except DocumentError as exc:
            for error in exc.errors:
                where = f"{file}:{error['line']}" if error["line"] else file
                self.stderr.write(f"{where}: {error['path'] or 'document'}: {error['message']}")
            raise CommandError(f"{file} is not a valid policy") from None
        for warning in lint(document):
            self.stdout.write(self.style.WARNING(f"warning: {warning.message}"))
        outcomes = run_tests(document, VersionRef(path.stem, 0, document.sha256()))
        for outcome in outcomes:
            label = f"test {outcome.index} {outcome.request['bin']} {' '.join(outcome.request['args'])}".rstrip()
            if outcome.passed:
                self.stdout.write(f"PASS  {label}")
            else:
                self.stdout.write(f"FAIL  {label}: expected {shown(outcome.expected)}, got {shown(outcome.got)}")
        failed = sum(not outcome.passed for outcome in outcomes)
        self.stdout.write(f"{len(outcomes) - failed} passed, {failed} failed")
        if failed:
            raise CommandError(f"{failed} policy test(s) failed", returncode=1)
