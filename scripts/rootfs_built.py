"""Exit 0 when the sandbox root filesystem of the current recipe is built (and say where);
3 when not, printing the command that builds it. No Django start: `make run` asks this every
time, so a cached tree costs it ~0.1 s."""

import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from sessions.runtimes import rootfs  # noqa: E402 - after the settings module is named

if __name__ == "__main__":
    built = rootfs.current()
    if built is None:
        from django.conf import settings

        words = ["env", f"AIRLOCK_DATA_DIR={settings.DATA_DIR}", f"AIRLOCK_ROOTFS_DIR={rootfs.cache_dir()}",
                 sys.executable, str(ROOT / "manage.py"), "build_rootfs"]
        print(shlex.join(words))
        sys.exit(3)
    print(f"root filesystem {built.digest[:19]}… cached at {built.path}")
