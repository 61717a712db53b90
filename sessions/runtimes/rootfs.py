"""The sandbox root filesystem: a debootstrap of Debian bookworm, built once per recipe.

The tree is cached under a directory named by the recipe's hash, so a changed recipe builds a
new tree and an unchanged one is reused. Its digest is the SHA-256 of a deterministic tar of
the tree: the same bytes `docker import` receives, so the digest bubblewrap reports equals the
Docker image's layer id (`docker image inspect -f '{{.RootFS.Layers}}'`).

A build reports its progress as a phase and a fraction of the whole: debootstrap runs in its
machine-readable mode (`--debian-installer`: P:/I:/E: records on descriptor 3), and each of its
phases is weighted by the share of the build it took here (docs/architecture.md, "Root filesystem")."""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

from sessions.runtimes.base import RuntimeUnavailable
from sessions.runtimes.linux import unmount

IMAGE = "airlock/sandbox:bookworm"
# Docker and gVisor sandboxes' pid 1 (supervisor.c), built static with the host's C compiler.
SUPERVISOR_SOURCE = Path(__file__).with_name("supervisor.c")
SUPERVISOR = "/usr/local/lib/airlock/supervisor"  # in the tree, and in the image
DIGEST_LABEL = "airlock.rootfs.digest"
SUPERVISOR_FIX = "install gcc (apt-get install -y gcc), then run: manage.py build_rootfs --force"

RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "mirror": "http://deb.debian.org/debian",
    # What an agent reaches for: git, curl, Python with pip and venv (through the egress proxy).
    "packages": ["ca-certificates", "curl", "git", "python3", "python3-pip", "python3-pytest", "python3-venv"],
    # Paths emptied after the build: package caches and lists only bloat the image.
    "prune": ["var/cache/apt/archives", "var/lib/apt/lists", "var/cache/debconf", "var/log"],
    # Files removed: the root is read-only, so pip installs for the user (into /workspace) and
    # Debian's "externally managed" marker only stands in the way of that.
    "remove": ["usr/lib/python3*/EXTERNALLY-MANAGED"],
    # Mount points: the workspace, and /run/airlock where a session's egress socket appears.
    "dirs": ["workspace", "run/airlock"],
    # debootstrap copies these from the building host: its name and its resolvers stay out.
    "host_files": {"etc/hostname": "sandbox\n",
                   "etc/resolv.conf": "# No resolver: a sandbox has no network (docs/architecture.md).\n"},
    "supervisor": hashlib.sha256(SUPERVISOR_SOURCE.read_bytes()).hexdigest(),
    "version": 4,
}


# debootstrap's phases in the order they run, each with its share of a whole build (measured:
# 44 s of debootstrap, then ~2 s for the digest). A phase not listed keeps the bar where it is.
PHASES = {
    "DOWNREL": 1, "DOWNRELSIG": 1, "DOWNMAINPKGS": 0, "DOWNPKGS": 14, "SIZEDEBS": 1, "DOWNDEBS": 16,
    "EXTRACTPKGS": 8, "INSTCORE": 4, "UNPACKREQ": 12, "CONFREQ": 21, "UNPACKBASE": 8, "CONFBASE": 8,
}
# The rest of 100 (6) is pruning the tree and computing its digest. Where each phase starts:
PHASE_STARTS = {name: sum(list(PHASES.values())[:index]) for index, name in enumerate(PHASES)}

# meter(fraction of the whole build in [0, 1], the phase in words)
Meter = Callable[[float, str], None]


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
            "the sandbox root filesystem is not built; run: .venv/bin/python manage.py build_rootfs (as root, ~50 s; "
            "`make run` does it)"
        )
    return rootfs


def build(*, progress: Callable[[str], None] = print, force: bool = False, meter: Meter | None = None) -> RootFS:
    """Build (or reuse) the tree for the current recipe. Concurrent callers wait for one build;
    reusing a tree needs neither debootstrap nor root. `progress` gets lines of text (what
    started, warnings, the result); `meter`, when given, the build's progress as it goes."""
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
        return _build_locked(base, progress, meter or (lambda fraction, phase: None))


def _reuse(progress: Callable[[str], None]) -> RootFS | None:
    existing = current()
    if existing is not None:
        progress(f"root filesystem {existing.digest[:19]}… already built at {existing.path}")
    return existing


def _build_locked(base: Path, progress: Callable[[str], None], meter: Meter) -> RootFS:
    partial = base.with_name(base.name + ".partial")
    _remove_partial(partial)
    tree = partial / "tree"
    tree.mkdir(parents=True)
    log_path = partial / "debootstrap.log"
    started = time.monotonic()
    progress(f"debootstrap {RECIPE['variant']} {RECIPE['suite']} with {', '.join(RECIPE['packages'])} (~50 s)")
    command = [
        "debootstrap", "--debian-installer", f"--variant={RECIPE['variant']}",
        f"--include={','.join(RECIPE['packages'])}", RECIPE["suite"], str(tree), RECIPE["mirror"],
    ]
    records = DebootstrapRecords(meter)
    returncode = _spawn_with_records(command, log_path, records.feed)
    for warning in records.warnings:
        progress(f"  debootstrap: {warning}")
    if returncode != 0:
        said = records.error or (records.warnings[-1] if records.warnings else "no error line")
        raise RuntimeUnavailable(f"debootstrap failed with exit code {returncode} ({said}); its full log is "
                                 f"{log_path}; check the mirror {RECIPE['mirror']} is reachable, then run "
                                 "build_rootfs again")
    meter(records.fraction, "Pruning caches and computing the digest of the tree")
    _finish_tree(tree)
    _build_supervisor(tree, progress)
    digest, size = _digest(tree)
    meter(1.0, "Done")
    shutil.rmtree(base, ignore_errors=True)
    partial.rename(base)
    rootfs = RootFS(path=base / "tree", digest=digest, recipe_hash=base.name, size_bytes=size,
                    built_at=time.time())
    (base / "rootfs.json").write_text(json.dumps({**asdict(rootfs), "path": str(rootfs.path)}, indent=2))
    progress(f"root filesystem built in {time.monotonic() - started:.0f} s ({size / 2**20:.0f} MiB)")
    return rootfs


class DebootstrapRecords:
    """Reads debootstrap's machine-readable records (`P: now end [PHASE]`, `PF: text`; `I:`,
    `W:`, `E:` with their `*A:` arguments and `*F:` printf format) into the build's progress,
    its warnings and its error, worded as debootstrap words them."""

    def __init__(self, meter: Meter):
        self.meter = meter
        self.fraction, self.phase, self.text = 0.0, "", "Starting debootstrap"
        self.warnings: list[str] = []
        self.error = ""
        self._args: list[str] = []
        self._step = (0, 1)

    def feed(self, line: str) -> None:
        tag, _, value = line.rstrip("\n").partition(": ")
        if tag == "P":
            fields = value.split()
            if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
                return  # a record this reader does not know: the bar stays where it is
            self._step = (int(fields[0]), max(int(fields[1]), 1))
            if len(fields) > 2:  # a new phase: its words follow in `PF:`
                self.phase = fields[2]
            else:
                self._advance()
        elif tag in {"I", "W", "E"}:  # a message starts: its arguments follow
            self._args = []
        elif tag in {"IA", "WA", "EA", "PA"}:
            self._args.append(value)
        elif tag == "PF":
            self.text = value
            self._advance()
        elif tag in {"WF", "EF"}:
            message = _printf(value, self._args)
            if tag == "WF":
                self.warnings.append(message)
            else:
                self.error = message

    def _advance(self) -> None:
        if self.phase in PHASES:
            now, end = self._step
            fraction = (PHASE_STARTS[self.phase] + PHASES[self.phase] * min(now, end) / end) / 100
            self.fraction = max(self.fraction, fraction)  # a phase repeats its last record: never go back
        self.meter(self.fraction, self.text)


def _remove_partial(partial: Path) -> None:
    """What an interrupted build left: debootstrap mounts /proc and /sys in its tree and only
    unmounts them on a clean exit, so those go first (deepest first), then the files."""
    if not partial.exists():
        return
    with open("/proc/self/mounts") as mounts:
        inside = [Path(line.split()[1].replace("\\040", " ")) for line in mounts]
    for mount in sorted((m for m in inside if m.is_relative_to(partial)), key=lambda m: len(m.parts), reverse=True):
        unmount(mount)
    try:
        shutil.rmtree(partial)
    except OSError as exc:
        raise RuntimeUnavailable(f"an earlier, interrupted build left {partial}, which cannot be removed ({exc}); "
                                 "remove it, then run build_rootfs again") from None


def _printf(fmt: str, args: Iterable[str]) -> str:
    """debootstrap's printf formats hold only %s."""
    parts = fmt.split("%s")
    values = list(args) + [""] * len(parts)
    return "".join(part + (values[index] if index < len(parts) - 1 else "") for index, part in enumerate(parts))


def _spawn_with_records(command: list[str], log_path: Path, on_record: Callable[[str], None]) -> int:
    """Run `command` with its full output in `log_path` and descriptor 3 (where debootstrap's
    --debian-installer mode writes its records) on a pipe read line by line; its exit code.
    posix_spawn places the pipe at 3 without a shell or a pre-exec hook."""
    read_end, write_end = os.pipe()
    with open(log_path, "wb") as log, open(os.devnull, "rb") as null:
        try:
            pid = os.posix_spawnp(command[0], command, dict(os.environ, LC_ALL="C"), file_actions=[
                (os.POSIX_SPAWN_DUP2, null.fileno(), 0), (os.POSIX_SPAWN_DUP2, log.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, log.fileno(), 2), (os.POSIX_SPAWN_DUP2, write_end, 3)])
        finally:
            os.close(write_end)
    try:
        with os.fdopen(read_end, encoding="utf-8", errors="replace") as records:
            for line in records:
                on_record(line)
    except BaseException:  # Ctrl-C, say: debootstrap does not outlive its build
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _finish_tree(tree: Path) -> None:
    for relative in RECIPE["prune"]:
        target = tree / relative
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    for relative, text in RECIPE["host_files"].items():
        (tree / relative).unlink(missing_ok=True)  # a symlink is replaced, not followed
        (tree / relative).write_text(text)
    for pattern in RECIPE["remove"]:
        for found in tree.glob(pattern):
            found.unlink()
    for relative in RECIPE["dirs"]:
        (tree / relative).mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(tree.parent, 0o755)  # noqa: S103 - sandboxes (uid 65534) must reach the tree


def _build_supervisor(tree: Path, progress: Callable[[str], None]) -> None:
    """supervisor.c into the tree, static: it loads no library, so it starts in a few system
    calls (under gVisor each costs ~70 us). Without a compiler, or where it fails, the tree is
    whole all the same for bubblewrap; the Docker drivers refuse it, naming the fix."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        progress(f"  no C compiler (cc): Docker and gVisor sandboxes need the supervisor; {SUPERVISOR_FIX}")
        return
    target = tree / SUPERVISOR.lstrip("/")
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    built = subprocess.run([compiler, "-O2", "-static", "-Wall", "-o", str(target), str(SUPERVISOR_SOURCE)],
                           capture_output=True, text=True, check=False)
    if built.returncode != 0:
        target.unlink(missing_ok=True)
        said = built.stderr.strip().splitlines()
        progress(f"  {compiler} could not build {SUPERVISOR_SOURCE.name} ({said[-1] if said else 'no message'}): "
                 f"Docker and gVisor sandboxes need it; {SUPERVISOR_FIX}")
        return
    target.chmod(0o755)


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
