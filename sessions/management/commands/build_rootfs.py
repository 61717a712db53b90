from django.core.management.base import BaseCommand, CommandError

from sessions.runtimes import rootfs
from sessions.runtimes.base import RuntimeUnavailable


class Command(BaseCommand):
    help = "Build the sandbox root filesystem (debootstrap, cached by recipe) and, with --docker, its image."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="rebuild even when the cache has this recipe")
        parser.add_argument("--docker", action="store_true", help=f"also import it into Docker as {rootfs.IMAGE}")

    def handle(self, *args, force=False, docker=False, **options):
        try:
            built = rootfs.build(progress=self.stdout.write, force=force)
            if docker:
                from sessions.runtimes.docker_driver import import_image

                image_id = import_image(built, progress=self.stdout.write)
                self.stdout.write(f"image {rootfs.IMAGE} = {image_id}")
        except RuntimeUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(self.style.SUCCESS(f"root filesystem {built.digest} at {built.path}"))
