"""Thin wrappers over Linux calls the drivers need and Python does not expose."""

import ctypes
import ctypes.util
import os
from pathlib import Path

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2

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
