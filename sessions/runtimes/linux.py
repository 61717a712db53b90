"""Thin wrappers over Linux calls the drivers need and Python does not expose."""

import ctypes
import ctypes.util
import os
import select
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
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


def mount_overlay_ro(target: Path, layers: list[Path]) -> None:
    """A read-only overlay of `layers` (two at least) on `target`. The layers are given as this
    process's descriptors, so the mount's options name no host path."""
    descriptors = []
    try:
        for layer in layers:
            descriptors.append(os.open(layer, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        options = ("lowerdir=" + ":".join(f"/proc/self/fd/{fd}" for fd in descriptors)).encode()
        if _libc.mount(b"airlock", str(target).encode(), b"overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, options) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"mount overlay on {target}: {os.strerror(error)}")
    finally:
        for fd in descriptors:
            os.close(fd)


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


def adopt_orphans() -> bool:
    """Processes orphaned below this one become its children (PR_SET_CHILD_SUBREAPER), not the
    host init's, so that this process can reap them (`reap`): an init that reaps nothing (a
    container's or a microVM's) would keep each as a zombie for good. False if the kernel refused."""
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def pidfd(pid: int) -> int | None:
    """A descriptor that names this one process for as long as it is open (its pid may be reused
    once it is reaped; the descriptor never refers to another), or None if it is gone."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def reap(descriptor: int, *, timeout_s: float = 1.0) -> bool:
    """Reap the process `descriptor` names (and close the descriptor) once it has exited, if it is
    this process's child by then (an orphan adopted through `adopt_orphans`); a process another
    one reaped, or one still running after timeout_s, is left alone. True when it was reaped here."""
    try:
        poller = select.poll()  # not select(): a descriptor past 1023 is fine
        poller.register(descriptor, select.POLLIN)
        if not poller.poll(timeout_s * 1000):
            return False
        try:
            return os.waitid(os.P_PIDFD, descriptor, os.WEXITED | os.WNOHANG) is not None
        except ChildProcessError:  # not ours: its parent reaped it
            return False
    finally:
        os.close(descriptor)


def children(pid: int) -> list[int]:
    """The pids of a (single-threaded) process's children, as the kernel lists them."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as listed:
            return [int(child) for child in listed.read().split()]
    except (OSError, ValueError):
        return []
