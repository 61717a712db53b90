from django.core.management.base import BaseCommand, CommandError

from sessions.runtimes import DRIVERS, get_driver, rootfs
from sessions.runtimes.base import RuntimeUnavailable


class Command(BaseCommand):
    help = "Tell which sandbox drivers work on this host, and for those that do not, the fix."

    def add_arguments(self, parser):
        parser.add_argument("drivers", nargs="*", help=f"any of {', '.join(DRIVERS)} (default: all)")

    def handle(self, *args, drivers=(), **options):
        built = rootfs.current()
        self.stdout.write(f"root filesystem  {built.digest} ({built.path})" if built else
                          "root filesystem  not built: run manage.py build_rootfs")
        failed = 0
        for name in drivers or DRIVERS:
            try:
                get_driver(name).check()
            except RuntimeUnavailable as exc:
                failed += 1
                self.stdout.write(f"{name:<16} unavailable: {exc}")
            else:
                driver = get_driver(name)
                weaker, slower = driver.weaker_here(), driver.slower_here()
                self.stdout.write(f"{name:<16} ok" + (f", but weaker here: {'; '.join(weaker)}; run as root for "
                                                      "the full sandbox" if weaker else ""))
                for note in slower:
                    self.stdout.write(f"{'':<16} slower here: {note}")
        if failed:
            raise CommandError(f"{failed} driver(s) unavailable", returncode=2)
