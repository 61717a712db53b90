"""Thin wrappers over Linux calls the drivers need and Python does not expose."""

import contextlib
import ctypes
import ctypes.util
import os
import select
from pathlib import Path

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def mount_tmpfs(target: Path, *, size_bytes: int, uid: int, gid: int, mode: int = 0o700,
                inodes: int | None = None) -> None:
    options = (f"size={size_bytes},mode={mode:o},uid={uid},gid={gid}"
               + (f",nr_inodes={inodes}" if inodes else "")).encode()
    if _libc.mount(b"airlock", str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount tmpfs on {target}: {os.strerror(error)}")


def unmount(target: Path) -> None:
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        error = ctypes.get_errno()
        if error not in (22, 2):  # EINVAL: not a mount point; ENOENT: already gone
            raise OSError(error, f"umount {target}: {os.strerror(error)}")


def is_mount_point(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def adopt_orphans() -> None:
    """Processes orphaned below this one become its children (PR_SET_CHILD_SUBREAPER), not the
    host init's, so that this process can reap them (`reap_orphan`): an init that reaps nothing
    (a container's or a microVM's) would keep each as a zombie for good."""
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(error)}")


def reap_orphan(pid: int, *, timeout_s: float = 1.0) -> bool:
    """Reap `pid` if it is an orphan adopted by this process: its parent is this process (a
    child of this process's own is reaped by whoever started it, and is never passed here).
    Waits at most timeout_s for it to exit. True when it was reaped."""
    if _parent_of(pid) != os.getpid():
        return False
    try:
        descriptor = os.pidfd_open(pid)  # readable once it has exited
    except OSError:
        return False
    try:
        if not select.select([descriptor], [], [], timeout_s)[0]:
            return False
        with contextlib.suppress(ChildProcessError):
            return os.waitpid(pid, os.WNOHANG)[0] == pid
        return False
    finally:
        os.close(descriptor)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
