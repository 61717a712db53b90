"""The bubblewrap driver's helper that puts a command in its sandbox's cgroups (enter.c).

Built with the host's C compiler the first time a root runner needs it, into a directory only
root may write, under a name that carries its source's hash: a changed source builds anew, and
processes that share the directory share the build. Root runs it before every command, so the
directory and each one above it must be root's and writable by nobody else (a sticky one, such
as /tmp, lets others add names but not move root's): whoever could replace it would run as root.
Without a compiler, where the build or its trial run fails, or where the directory is not
private, there is none: the driver then moves each command's processes into the cgroups itself,
as it did before, and says so once."""

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
TOOLS = "/usr/bin:/bin"  # where the compiler is looked for, not the runner's PATH

_built: dict[Path, str | None] = {}
_lock = threading.Lock()


def helper(directory: Path) -> str | None:
    """The built helper's path in `directory`, built now if missing; None when it cannot be."""
    with _lock:
        if directory not in _built:
            _built[directory] = _build(directory)
        return _built[directory]


def forget(directory: Path) -> None:
    """The helper of `directory` failed to run: the next driver to ask builds it anew."""
    with _lock:
        _built.pop(directory, None)


def _build(directory: Path) -> str | None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory = directory.resolve()  # the real directories are checked, and the helper run from them
        target = directory / f"airlock-enter-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}"
        _check_private(directory)
        for place in directory.parents:
            _check_private(place, sticky=True)
        for _ in range(2):  # a file under that name that does not run (cut short, damaged) is built again
            if not target.exists():
                _compile(directory, target)
            _check_private(target)
            if _runs(target):
                return str(target)
            target.unlink()
        raise OSError(f"{target.name} does not run")
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("bubblewrap: no cgroup helper (%s); the runner moves each command into its cgroups itself, "
                    "and on cgroup v1 a command that follows a pause may wait for the kernel (an RCU grace period, "
                    "~11 ms here)", exc)
        return None


def _runs(target: Path) -> bool:
    try:
        return subprocess.run([str(target), "--", "/bin/true"], capture_output=True, timeout=10, env={}).returncode == 0
    except OSError:  # not a program at all
        return False


def _compile(directory: Path, target: Path) -> None:
    compiler = shutil.which("cc", path=TOOLS) or shutil.which("gcc", path=TOOLS)
    if compiler is None:
        raise OSError("no C compiler (cc); install gcc")
    with tempfile.TemporaryDirectory(dir=directory) as building:
        built = Path(building) / target.name
        compiled = subprocess.run([compiler, "-O2", "-Wall", "-o", str(built), str(SOURCE)], capture_output=True,
                                  text=True, check=False, timeout=120, env={"PATH": TOOLS})
        if compiled.returncode != 0:
            said = compiled.stderr.strip().splitlines()
            raise OSError(f"{compiler} could not build {SOURCE.name}: {said[-1] if said else 'no message'}")
        built.chmod(0o700)
        with open(built, "rb") as written:
            os.fsync(written.fileno())
        os.replace(built, target)  # whole or absent, whoever else builds it meanwhile


def _check_private(path: Path, *, sticky: bool = False) -> None:
    """Root's, not a link, and writable by nobody else (with `sticky`: or a sticky directory,
    where others may add names but not move root's)."""
    status = os.stat(path, follow_symlinks=False)
    others_write = status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    sticky_dir = sticky and stat.S_ISDIR(status.st_mode) and status.st_mode & stat.S_ISVTX
    if status.st_uid != 0 or stat.S_ISLNK(status.st_mode) or (others_write and not sticky_dir):
        raise OSError(f"{path} must belong to root and be writable by root only")
