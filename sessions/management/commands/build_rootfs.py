import sys
import time

from django.core.management.base import BaseCommand, CommandError

from sessions.runtimes import rootfs
from sessions.runtimes.base import RuntimeUnavailable


class Bar:
    """The build's progress for a person: on a terminal one line redrawn in place (a bar, the
    percentage, the phase, the time so far); elsewhere (a CI log, a pipe) one line per phase."""

    WIDTH = 30

    def __init__(self, stream, *, terminal: bool):
        self.stream, self.terminal = stream, terminal
        self.started = time.monotonic()
        self.phase, self.drawn, self.shown = "", False, None

    def __call__(self, fraction: float, phase: str) -> None:
        percent = int(fraction * 100)
        elapsed = f"{time.monotonic() - self.started:.0f} s"
        shown = (percent, phase, elapsed)
        if shown == self.shown:  # debootstrap sends thousands of records: redraw only what changed
            return
        self.shown = shown
        if self.terminal:
            filled = int(fraction * self.WIDTH)
            self.stream.write(f"\r\033[K  [{'#' * filled}{'.' * (self.WIDTH - filled)}] {percent:3d}%  {phase}"
                              f"  ({elapsed})")
            self.stream.flush()
            self.drawn = True
        elif phase != self.phase:
            self.stream.write(f"  {percent:3d}%  {phase}  ({elapsed})\n")
            self.stream.flush()
        self.phase = phase

    def end(self) -> None:
        """End the bar's line, so what follows starts on a line of its own."""
        if self.drawn:
            self.stream.write("\n")
            self.drawn = False

    def say(self, line: str) -> None:
        self.end()
        self.stream.write(line + "\n")
        self.stream.flush()


class Command(BaseCommand):
    help = "Build the sandbox root filesystem (debootstrap, cached by recipe) and, with --docker, its image."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="rebuild even when the cache has this recipe")
        parser.add_argument("--docker", action="store_true", help=f"also import it into Docker as {rootfs.IMAGE}")

    def handle(self, *args, force=False, docker=False, **options):
        bar = Bar(sys.stdout, terminal=sys.stdout.isatty())
        try:
            built = rootfs.build(progress=bar.say, force=force, meter=bar)
            if docker:
                from sessions.runtimes.docker_driver import import_image

                image_id = import_image(built, progress=bar.say)
                bar.say(f"image {rootfs.IMAGE} = {image_id}")
        except RuntimeUnavailable as exc:
            bar.end()
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            bar.end()
            self.stderr.write("build_rootfs: interrupted; the next build starts over")
            sys.exit(130)
        bar.say(self.style.SUCCESS(f"root filesystem {built.digest} at {built.path}"))
