import asyncio
import signal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from controlplane import cpus


class Command(BaseCommand):
    help = ("Run a runner: it owns sandboxes and runs the commands of the sessions placed on it. Needs REDIS_URL "
            "(the server reaches it through the channel layer). Stops cleanly on SIGTERM or Ctrl-C: its sessions "
            "fail and its sandboxes are destroyed.")

    def handle(self, *args, **options):
        if not settings.REDIS_URL:
            raise CommandError("a separate runner needs REDIS_URL (the server reaches runners through Redis); "
                               "without it the server runs its own runner")
        try:
            cpus.pin(settings.AIRLOCK_SERVER_CPU)  # before any thread: each one it starts inherits the CPU
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        asyncio.run(self._run())

    async def _run(self) -> None:
        from sessions.runner import set_local_runner
        from sessions.runner.core import RunnerService

        runner = RunnerService(embedded=False)
        await runner.start()
        set_local_runner(runner)
        self.stdout.write(f"runner {runner.id} started; drivers: {', '.join(sorted(runner.drivers))}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        await runner.stop("runner stopped")
        self.stdout.write(f"runner {runner.id} stopped")
