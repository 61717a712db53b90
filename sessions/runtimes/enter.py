"""The bubblewrap driver's helper that puts a command in its sandbox's cgroups (enter.c).

Built with the host's C compiler the first time a root runner needs it, into a directory only
root may write (it runs as root, before bwrap drops to uid 65534), under a name that carries its
source's hash: a changed source builds anew, and processes that share the directory share the
build. Without a compiler, or where the build fails, there is none: the driver then moves each
command's processes into the cgroups itself, as it did before, and says so once."""

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("enter.c")

_built: dict[Path, str | None] = {}
_lock = threading.Lock()


def helper(directory: Path) -> str | None:
    """The built helper's path in `directory`, built now if missing; None when it cannot be."""
    with _lock:
        if directory not in _built:
            _built[directory] = _build(directory)
        return _built[directory]


def _build(directory: Path) -> str | None:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = directory / f"airlock-enter-{digest}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(directory)
        if not target.exists():
            compiler = shutil.which("cc") or shutil.which("gcc")
            if compiler is None:
                raise OSError("no C compiler (cc); install gcc")
            with tempfile.TemporaryDirectory(dir=directory) as building:
                built = Path(building) / target.name
                compiled = subprocess.run([compiler, "-O2", "-Wall", "-o", str(built), str(SOURCE)],
                                          capture_output=True, text=True, check=False)
                if compiled.returncode != 0:
                    said = compiled.stderr.strip().splitlines()
                    raise OSError(f"{compiler} could not build {SOURCE.name}: {said[-1] if said else 'no message'}")
                built.chmod(0o700)
                os.replace(built, target)  # whole or absent, whoever else builds it meanwhile
        _check_private(target)
        ran = subprocess.run([str(target), "--", "/bin/true"], capture_output=True, text=True, timeout=10, env={})
        if ran.returncode != 0:
            raise OSError(f"{target} does not run: {ran.stderr.strip()}")
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("bubblewrap: no cgroup helper (%s); the runner moves each command into its cgroups itself, "
                    "and a command that follows a pause waits ~11 ms for the kernel", exc)
        return None
    return str(target)


def _check_private(path: Path) -> None:
    """Root's, and writable by nobody else: root runs what is there."""
    status = os.stat(path, follow_symlinks=False)
    if status.st_uid != 0 or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or stat.S_ISLNK(status.st_mode):
        raise OSError(f"{path} must belong to root and be writable by root only")
