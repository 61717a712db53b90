import json

from django.core.management.base import BaseCommand, CommandError

from controlplane.models import Tenant
from policies_app.models import Policy
from sessions.evals.suite import refusal, run_suite
from sessions.runner import local_runner
from sessions.runner.thread import runner_in_thread

DRIVERS = ("bubblewrap", "docker", "gvisor")


class Command(BaseCommand):
    help = ("Run the containment eval (docs/architecture.md, \"Containment evals\"): hostile probes through the "
            "real broker and runner, in real sandboxes, against a tenant's published policy on each driver asked "
            "for. Exits 1 when a probe fails.")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo", help="the tenant's slug (default demo)")
        parser.add_argument("--policy", default="default", help="the policy whose published version is judged")
        parser.add_argument("--driver", action="append", choices=DRIVERS,
                            help="a driver to run on (repeat for several; default bubblewrap)")
        parser.add_argument("--probe", action="append", help="run only this probe (repeat for several)")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the scorecards as JSON")

    def handle(self, *args, tenant, policy, driver, probe, as_json: bool, **options):
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"no tenant {tenant!r}")
        chosen = Policy.objects.filter(tenant=found, name=policy).first()
        version = chosen.published_version() if chosen else None
        if version is None:
            raise CommandError(f"tenant {tenant!r} has no published policy {policy!r}")
        drivers = driver or ["bubblewrap"]
        for name in drivers:
            if why := refusal(version, name):
                raise CommandError(why)
        if local_runner() is not None:
            cards = [run_suite(tenant=found, version=version, driver=name, only=probe) for name in drivers]
        else:
            with runner_in_thread("containment-eval"):
                cards = [run_suite(tenant=found, version=version, driver=name, only=probe) for name in drivers]
        self._print(cards, as_json=as_json)
        if not all(card.passed for card in cards):
            raise CommandError("a probe failed", returncode=1)

    def _print(self, cards, *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps([card.as_json() for card in cards], indent=2))
            return
        for card in cards:
            self.stdout.write(f"{card.policy} v{card.version} on {card.driver} (under {card.policy}'s eval policy "
                              f"containment-eval v{card.eval_version}), {card.seconds} s:")
            for result in card.results:
                mark = self.style.SUCCESS("pass") if result.passed else self.style.ERROR("FAIL")
                self.stdout.write(f"  {mark}  {result.probe:20} {result.evidence}")

