"""Per-sandbox cgroups for memory, pids and CPU, on cgroup v1 or v2.

Sandbox cgroups live under `<the runner's own cgroup>/<group>/<tenant>/<sandbox id>`, so that
they are nested inside whatever limits the runner itself has; the group names one sandbox
directory, so deployments that share a host never see each other's sandboxes. The tenant level
holds no limit but its CPU weight, the same for every tenant: when the CPU is contended, each
tenant with work gets an equal share, however many sessions it runs (a sandbox's own `cpus` caps
it within that). When the host offers no
writable cgroup hierarchy, `CgroupManager.available` is false (and a warning says why) and the
drivers fall back to rlimits.

Each group records which sandbox directory it serves (in OWNERS, under /run: cleared at boot, as
cgroups are). A manager that starts removes the groups beside its own that nobody serves any
more: their directory is gone (a test's, a deployment moved or removed), or, unrecorded (made
before records were kept), they hold no process."""

import contextlib
import hashlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sessions.runtimes.base import SandboxError

log = logging.getLogger(__name__)

V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
GROUP = "airlock"
OWNERS = Path("/run/airlock/cgroups")
TENANT_LEVEL = "tenant-"


@dataclass(frozen=True)
class Usage:
    cpu_s: float | None
    memory_bytes: int | None
    oom_kills: int


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _write(path: Path | str, value: str) -> None:
    """One write(2), as the kernel's cgroup files want; without pathlib's text layer, which cost
    more than the write on every command (attach runs once per process and controller)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(descriptor, value.encode())
    finally:
        os.close(descriptor)


class CgroupManager:
    def __init__(self, root: Path = Path("/sys/fs/cgroup"), *, group: str = GROUP, owner: Path | None = None,
                 owners: Path = OWNERS):
        self.group = group
        self.version = 2 if (root / "cgroup.controllers").exists() else 1
        self.bases: dict[str, Path] = self._find_bases(root)
        self.owners = owners
        self._levels: dict[str, str] = {}  # sandbox id -> its tenant level
        self._paths: dict[str, dict[str, Path]] = {}  # sandbox id -> its groups (read on every command)
        self._level_lock = threading.Lock()
        self.available = self._prepare()
        if self.available and owner is not None:
            self._record_owner(owner)
            self.sweep_stale()

    # -- discovery -------------------------------------------------------------------------
    def _find_bases(self, root: Path) -> dict[str, Path]:
        own = {}
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                for controller in controllers.split(","):
                    own[controller] = path.lstrip("/")
        if self.version == 2:
            return {"unified": root / own.get("", "") / self.group}
        bases = {}
        for controller in V1_CONTROLLERS:
            mount = root / controller
            if mount.is_dir():
                bases[controller] = mount / own.get(controller, "") / self.group
        return bases

    def _prepare(self) -> bool:
        if os.geteuid() != 0 or not self.bases:
            return False
        try:
            for base in self.bases.values():
                base.mkdir(exist_ok=True)
            if self.version == 2:
                # Controllers must be enabled for the children of airlock/ (and airlock/ itself
                # has no processes, which the v2 "no internal processes" rule requires).
                _write(self.bases["unified"] / "cgroup.subtree_control", "+memory +pids +cpu")
        except OSError as exc:
            log.warning("sandbox cgroups are unavailable (%s); sandboxes get rlimits instead. On cgroup v2 "
                        "the runner needs a delegated cgroup of its own (systemd: Delegate=yes)", exc)
            return False
        return self.version == 2 or {"memory", "pids"} <= set(self.bases)

    # -- groups of other sandbox directories ----------------------------------------------
    def _record_owner(self, owner: Path) -> None:
        with contextlib.suppress(OSError):
            self.owners.mkdir(parents=True, exist_ok=True, mode=0o700)
            (self.owners / self.group).write_text(str(owner.resolve()))

    def sweep_stale(self) -> list[str]:
        """Remove the `airlock-*` groups beside this one that nobody serves; returns their names."""
        names = {child.name for base in self.bases.values() if base.parent.is_dir()
                 for child in base.parent.iterdir()
                 if child.name.startswith(GROUP + "-") and child.name != self.group and child.is_dir()}
        removed = []
        for name in sorted(names):
            groups = [base.parent / name for base in self.bases.values() if (base.parent / name).is_dir()]
            record = self.owners / name
            try:
                owner = record.read_text().strip()
            except OSError:
                owner = None
            stale = not Path(owner).exists() if owner else not any(_populated(group) for group in groups)
            if not stale:
                continue
            try:
                for group in groups:
                    _remove_group(group)
            except OSError as exc:
                log.warning("could not remove the stale sandbox cgroup %s: %s", name, exc)
                continue
            record.unlink(missing_ok=True)
            removed.append(name)
            log.info("removed the sandbox cgroup %s (%s)", name,
                     f"its directory {owner} is gone" if owner else "no process, no record of its directory")
        return removed

    def attach_waits_for_rcu(self) -> bool:
        """Moving a process into a cgroup takes a global lock whose writer first waits out an RCU
        grace period when none has passed lately (~11 ms measured here, on every command that
        follows a pause), unless the kernel expedites grace periods (/sys/kernel/rcu_expedited)
        or a v2 hierarchy is mounted with favordynmods."""
        if not self.available:
            return False
        with contextlib.suppress(OSError):
            if Path("/sys/kernel/rcu_expedited").read_text().strip() == "1":
                return False
        if self.version == 2:
            with contextlib.suppress(OSError):
                return "favordynmods" not in Path("/proc/self/mounts").read_text()
        return True

    # -- one sandbox -----------------------------------------------------------------------
    def paths(self, sandbox_id: str) -> dict[str, Path]:
        paths = self._paths.get(sandbox_id)
        if paths is None:
            level = self._level_of(sandbox_id)
            paths = self._paths[sandbox_id] = {controller: base / level / sandbox_id
                                               for controller, base in self.bases.items()}
        return paths

    def _level_of(self, sandbox_id: str) -> str:
        """The tenant level a sandbox's cgroup sits in ("" for one made before there were any)."""
        level = self._levels.get(sandbox_id)
        if level is None:
            base = next(iter(self.bases.values()))
            found = [path.parent.name for path in base.glob(f"{TENANT_LEVEL}*/{sandbox_id}")]
            level = self._levels[sandbox_id] = found[0] if found else ""
        return level

    def create(self, sandbox_id: str, *, memory_mb: int, pids: int, cpus: float, tenant: str = "") -> None:
        memory = str(memory_mb * 2**20)
        period = 100_000
        quota = str(max(1000, int(cpus * period)))
        level = TENANT_LEVEL + hashlib.sha256(tenant.encode()).hexdigest()[:12]
        self._levels[sandbox_id] = level
        self._paths.pop(sandbox_id, None)
        paths = self.paths(sandbox_id)
        with self._level_lock:  # a tenant's level is not removed (its last sandbox gone) while one is added
            for base in self.bases.values():
                (base / level).mkdir(parents=True, exist_ok=True)  # (parents: another deployment's sweep raced ours)
            if self.version == 2:  # each level hands its controllers down (none holds a process itself)
                _write(self.bases["unified"] / "cgroup.subtree_control", "+memory +pids +cpu")
                _write(self.bases["unified"] / level / "cgroup.subtree_control", "+memory +pids +cpu")
            for path in paths.values():
                path.mkdir(exist_ok=True)
        if self.version == 2:
            group = paths["unified"]
            _write(group / "memory.max", memory)
            with contextlib.suppress(OSError):
                _write(group / "memory.swap.max", "0")
            _write(group / "pids.max", str(pids))
            _write(group / "cpu.max", f"{quota} {period}")
            return
        _write(paths["memory"] / "memory.limit_in_bytes", memory)
        with contextlib.suppress(OSError):  # absent without swap accounting
            _write(paths["memory"] / "memory.memsw.limit_in_bytes", memory)
        _write(paths["pids"] / "pids.max", str(pids))
        if "cpu" in paths:
            _write(paths["cpu"] / "cpu.cfs_period_us", str(period))
            _write(paths["cpu"] / "cpu.cfs_quota_us", quota)

    def attach(self, sandbox_id: str, pid: int) -> None:
        level = self._level_of(sandbox_id)
        for base in self.bases.values():
            _write(f"{base}/{level}/{sandbox_id}/cgroup.procs", str(pid))

    def entry_files(self, sandbox_id: str) -> list[str]:
        """The files a process writes "0" to, in attach's order, to move itself into the
        sandbox's groups (enter.c): each controller's `tasks` on v1, which moves the writing
        thread alone, without the global lock that moving a whole process takes; `cgroup.procs`
        on v2, whose `cgroup.threads` serves threaded groups only."""
        name = "tasks" if self.version == 1 else "cgroup.procs"
        return [f"{path}/{name}" for path in self.paths(sandbox_id).values()]

    def pids(self, sandbox_id: str, *, every: bool = False) -> set[int]:
        """The sandbox's processes, read from the group `attach` and the helper (enter.c) join
        first (on v1, one group per controller): a process joins it before any other, and what it
        forks starts in all of its parent's groups, so no process Airlock placed is missing from
        it. Reading every controller's list cost four more reads after each command; `every`
        reads them all, for a removal, in case something else on the host moved a process
        between one hierarchy's groups and not another's."""
        groups = list(self.paths(sandbox_id).values())
        return set().union(*(_procs(f"{group}/cgroup.procs") for group in (groups if every else groups[:1])))

    def usage(self, sandbox_id: str) -> Usage:
        paths = self.paths(sandbox_id)
        if self.version == 2:
            group = paths["unified"]
            cpu_usec = _stat_field(group / "cpu.stat", "usage_usec")
            return Usage(
                cpu_s=cpu_usec / 1e6 if cpu_usec is not None else None,
                memory_bytes=_read_int(group / "memory.peak") or _read_int(group / "memory.current"),
                oom_kills=self.oom_kills(sandbox_id),
            )
        cpu_ns = _read_int(paths["cpuacct"] / "cpuacct.usage") if "cpuacct" in paths else None
        return Usage(
            cpu_s=cpu_ns / 1e9 if cpu_ns is not None else None,
            memory_bytes=_read_int(paths["memory"] / "memory.max_usage_in_bytes"),
            oom_kills=self.oom_kills(sandbox_id),
        )

    def oom_kills(self, sandbox_id: str) -> int:
        """How many of the sandbox's processes the kernel killed for its memory limit so far
        (read before and after each command: the rest of `usage` is not needed there)."""
        if self.version == 2:
            return _stat_field(self.paths(sandbox_id)["unified"] / "memory.events", "oom_kill") or 0
        return _stat_field(self.paths(sandbox_id)["memory"] / "memory.oom_control", "oom_kill") or 0

    def kill_all(self, sandbox_id: str, *, timeout_s: float = 5.0, every: bool = False) -> bool:
        """SIGKILL every process of the sandbox; True when none is left. The group is frozen
        before its members are read, so nothing forks in between; the signals land on thaw.
        `every`: read every controller's group (pids)."""
        if not self.pids(sandbox_id, every=every):
            return True
        paths = self.paths(sandbox_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            frozen = self._freeze(paths, True)
            try:
                pids = self.pids(sandbox_id, every=every)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            finally:
                if frozen:
                    self._freeze(paths, False)
            if not pids:
                return True
            time.sleep(0.002)
        return not self.pids(sandbox_id, every=every)

    def _freeze(self, paths: dict[str, Path], frozen: bool) -> bool:
        try:
            if self.version == 2:
                _write(paths["unified"] / "cgroup.freeze", "1" if frozen else "0")
            elif "freezer" in paths:
                _write(paths["freezer"] / "freezer.state", "FROZEN" if frozen else "THAWED")
            else:
                return False
        except OSError:
            return False
        return True

    def remove(self, sandbox_id: str) -> None:
        self.kill_all(sandbox_id, every=True)
        for path in self.paths(sandbox_id).values():
            deadline = time.monotonic() + 5
            while True:  # rmdir fails with EBUSY until the last task is gone
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise SandboxError(f"cgroup {path} could not be removed: {exc.strerror}") from None
                    time.sleep(0.005)
            if path.parent.name.startswith(TENANT_LEVEL):
                with self._level_lock, contextlib.suppress(OSError):  # the tenant's last sandbox: its level goes too
                    path.parent.rmdir()
        self._levels.pop(sandbox_id, None)
        self._paths.pop(sandbox_id, None)

    def list_ids(self) -> set[str]:
        ids: set[str] = set()
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                for child in base.iterdir():
                    if child.name.startswith(TENANT_LEVEL) and child.is_dir():
                        ids.update(grandchild.name for grandchild in child.iterdir() if grandchild.is_dir())
                    elif child.is_dir():
                        ids.add(child.name)
        return ids


def _populated(group: Path) -> bool:
    """Whether any process is in the group or below it."""
    events = _stat_field(group / "cgroup.events", "populated")  # v2
    if events is not None:
        return bool(events)
    return bool((group / "cgroup.procs").read_text().strip()) or any(
        _populated(child) for child in group.iterdir() if child.is_dir())


def _remove_group(group: Path) -> None:
    """Kill what is left in a group and below it, then remove it, deepest first."""
    for child in [path for path in group.iterdir() if path.is_dir()]:
        _remove_group(child)
    for _ in range(100):
        pids = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    group.rmdir()


def _procs(listing: str) -> set[int]:
    """The pids a group's `cgroup.procs` lists (none when it is gone)."""
    try:
        with open(listing) as listed:
            return {int(pid) for pid in listed.read().split()}
    except OSError:
        return set()


def _stat_field(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None
