"""The sandbox root filesystem: a debootstrap of Debian bookworm, built once per recipe.

The tree is cached under a directory named by the recipe's hash, so a changed recipe builds a
new tree and an unchanged one is reused. Its digest is the SHA-256 of a deterministic tar of
the tree: the same bytes `docker import` receives, so the digest bubblewrap reports equals the
Docker image's layer id (`docker image inspect -f '{{.RootFS.Layers}}'`)."""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

from sessions.runtimes.base import RuntimeUnavailable

IMAGE = "airlock/sandbox:bookworm"
DIGEST_LABEL = "airlock.rootfs.digest"

RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "mirror": "http://deb.debian.org/debian",
    "packages": ["ca-certificates", "git", "python3", "python3-pytest"],
    # Paths emptied after the build: package caches and lists only bloat the image.
    "prune": ["var/cache/apt/archives", "var/lib/apt/lists", "var/cache/debconf", "var/log"],
    "version": 1,
}


@dataclass(frozen=True)
class RootFS:
    path: Path  # the tree, mounted read-only as / in every sandbox
    digest: str  # sha256:<hex> of the deterministic tar of the tree
    recipe_hash: str
    size_bytes: int
    built_at: float


def recipe_hash(recipe: dict = RECIPE) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(settings.AIRLOCK_ROOTFS_DIR)


def current() -> RootFS | None:
    """The built root filesystem for the current recipe, or None."""
    meta = cache_dir() / recipe_hash() / "rootfs.json"
    if not meta.exists():
        return None
    data = json.loads(meta.read_text())
    return RootFS(path=Path(data["path"]), digest=data["digest"], recipe_hash=data["recipe_hash"],
                  size_bytes=data["size_bytes"], built_at=data["built_at"])


def require() -> RootFS:
    rootfs = current()
    if rootfs is None:
        raise RuntimeUnavailable(
            "the sandbox root filesystem is not built; run: .venv/bin/python manage.py build_rootfs (as root, ~30 s)"
        )
    return rootfs


def build(*, progress: Callable[[str], None] = print, force: bool = False) -> RootFS:
    """Build (or reuse) the tree for the current recipe. Concurrent callers wait for one build;
    reusing a tree needs neither debootstrap nor root."""
    if not force and (existing := _reuse(progress)):
        return existing
    if shutil.which("debootstrap") is None:
        raise RuntimeUnavailable("debootstrap is not installed; install it with: apt-get install -y debootstrap")
    if os.geteuid() != 0:
        raise RuntimeUnavailable("building the root filesystem needs root (debootstrap); run build_rootfs as root")
    base = cache_dir() / recipe_hash()
    base.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(base.parent, 0o755)  # noqa: S103 - sandboxes (uid 65534) must reach the tree
    with open(base.parent / f"{recipe_hash()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and (existing := _reuse(progress)):  # another caller built it meanwhile
            return existing
        return _build_locked(base, progress)


def _reuse(progress: Callable[[str], None]) -> RootFS | None:
    existing = current()
    if existing is not None:
        progress(f"root filesystem {existing.digest[:19]}… already built at {existing.path}")
    return existing


def _build_locked(base: Path, progress: Callable[[str], None]) -> RootFS:
    partial = base.with_name(base.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tree = partial / "tree"
    started = time.monotonic()
    progress(f"debootstrap {RECIPE['variant']} {RECIPE['suite']} with {', '.join(RECIPE['packages'])} (~30 s)")
    command = [
        "debootstrap", f"--variant={RECIPE['variant']}", f"--include={','.join(RECIPE['packages'])}",
        RECIPE["suite"], str(tree), RECIPE["mirror"],
    ]
    said = "no error line"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            if line.startswith(("I: Retrieving", "I: Configuring", "I: Extracting", "I: Base system")):
                progress("  " + line.strip()[3:])
            elif line.startswith(("E:", "W:")):  # debootstrap's errors and warnings, as it words them
                progress("  " + line.strip())
                said = line.strip()
    if process.returncode != 0:
        raise RuntimeUnavailable(f"debootstrap failed with exit code {process.returncode} ({said}); its full log "
                                 f"is {tree / 'debootstrap' / 'debootstrap.log'}; check the mirror {RECIPE['mirror']} "
                                 "is reachable, then run build_rootfs again")
    _finish_tree(tree)
    progress("computing the digest of the tree")
    digest, size = _digest(tree)
    shutil.rmtree(base, ignore_errors=True)
    partial.rename(base)
    rootfs = RootFS(path=base / "tree", digest=digest, recipe_hash=base.name, size_bytes=size,
                    built_at=time.time())
    (base / "rootfs.json").write_text(json.dumps({**asdict(rootfs), "path": str(rootfs.path)}, indent=2))
    progress(f"root filesystem {digest} ({size / 2**20:.0f} MiB) built in {time.monotonic() - started:.0f} s")
    return rootfs


def _finish_tree(tree: Path) -> None:
    for relative in RECIPE["prune"]:
        target = tree / relative
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    (tree / "workspace").mkdir(mode=0o755, exist_ok=True)  # mount point of the workspace
    os.chmod(tree.parent, 0o755)  # noqa: S103 - sandboxes (uid 65534) must reach the tree


def tar_command(tree: Path) -> list[str]:
    """A deterministic tar of the tree: sorted names, numeric owners, no access/change times."""
    return ["tar", "--sort=name", "--numeric-owner", "--format=gnu", "-C", str(tree), "-cf", "-", "."]


def tar_stream(tree: Path) -> Iterator[bytes]:
    with subprocess.Popen(tar_command(tree), stdout=subprocess.PIPE) as process:
        while chunk := process.stdout.read(1 << 20):
            yield chunk
    if process.returncode != 0:
        raise RuntimeUnavailable(f"tar of the root filesystem failed with exit code {process.returncode}")


def _digest(tree: Path) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    for chunk in tar_stream(tree):
        sha.update(chunk)
        size += len(chunk)
    return f"sha256:{sha.hexdigest()}", size
