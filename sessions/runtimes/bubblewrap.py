"""The bubblewrap driver: the local default, no daemon, ~5 ms per command.

Each command is one `bwrap` process tree: new user, PID, IPC, UTS, cgroup and network
namespaces (loopback only), uid/gid 65534, no capabilities, no_new_privs, a new session, and
death with its parent. The root filesystem is the read-only debootstrap tree; /workspace is a
size-limited tmpfs that lives as long as the sandbox; /tmp is a small tmpfs private to the
command; /dev, /dev/shm included (no POSIX shared memory), is read-only. When the runner is
root, bwrap itself runs as the host's uid 65534, so even a mount mistake would expose nothing
that `nobody` cannot read.

Start-up order matters. Where the runner is root with cgroups, each command's first program is
a small helper (enter.c) that moves itself into the sandbox's cgroups and only then runs bwrap,
so bwrap and everything it starts are inside them from the first instruction. Otherwise bwrap
is started with --block-fd: its namespace init (pid 1 inside) waits until the runner has placed
both bwrap processes in the cgroups (or set their rlimits); only then does the command start,
and everything it forks inherits the limits."""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import resource
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from controlplane import cpus
from sessions.runtimes import deadlines, enter, rootfs, seccomp
from sessions.runtimes.base import (
    EGRESS_MOUNT,
    INODES_PER_MB,
    WORKSPACE,
    Chunk,
    Driver,
    ExitStatus,
    RuntimeUnavailable,
    Sandbox,
    SandboxError,
    SandboxSpec,
    Stats,
    Stdin,
    check_argv,
    egress_argv,
    is_uuid,
    sandbox_env,
    workspace_cwd,
)
from sessions.runtimes.cgroups import CgroupManager
from sessions.runtimes.linux import (
    adopt_orphans,
    children,
    is_mount_point,
    mount_overlay_ro,
    mount_tmpfs,
    pidfd,
    reap,
    unmount,
)

log = logging.getLogger(__name__)
NOBODY = 65534
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin")  # util-linux, essential on Debian
READ_SIZE = 65536
BULK_PIPE_BYTES = 1 << 20  # pipe-max-size's default: what any user may ask for


@dataclass
class _Running:
    process: subprocess.Popen
    inner_pid: int | None = None
    reason: str | None = None  # set by whoever kills it: timeout, killed, output_limit
    # pidfds of bwrap's namespace init (and, when it was killed before the init was known, of
    # whatever the outer bwrap had started): reaped once the command is over (see __init__).
    pidfds: list[int] = field(default_factory=list)


def cgroup_group(sandbox_dir: Path) -> str:
    """The cgroup group of one sandbox directory: deployments sharing a host stay apart."""
    return "airlock-" + hashlib.sha256(str(sandbox_dir.resolve()).encode()).hexdigest()[:12]


class BubblewrapDriver(Driver):
    name = "bubblewrap"

    def __init__(self, *, sandbox_dir: Path | None = None, cgroups: CgroupManager | None = None):
        self.sandbox_dir = Path(sandbox_dir or settings.AIRLOCK_SANDBOX_DIR) / "bubblewrap"
        self.cgroups = cgroups or CgroupManager(group=cgroup_group(self.sandbox_dir), owner=self.sandbox_dir)
        self.as_root = os.geteuid() == 0
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        # Per sandbox: a kill meant for one command never reaches the next (see _stop).
        self._guards: dict[str, threading.RLock] = {}
        self._bwrap: str | None = None  # its path, once check() has found it
        self._enter: str | None = None  # the cgroup helper's path (enter.py), where check() could build it
        self._helper_dir = self.sandbox_dir.parent / "bin"
        self._said_no_overlay = False
        # bwrap's namespace init (pid 1 inside) outlives its parent, the outer bwrap, by a moment:
        # the parent exits on the init's report of the command's exit. Orphaned, the init is
        # reaped by this process (exec) instead of the host's init, which may reap nothing (a
        # container's, a microVM's): kept as a zombie it stays charged to the sandbox's pids
        # limit, and after `pids` commands no command could start. (Should the kernel refuse,
        # they are the host init's to reap, as before.)
        adopt_orphans()

    # -- host checks -----------------------------------------------------------------------
    def check(self) -> None:
        if self._bwrap:
            return
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RuntimeUnavailable("bubblewrap is not installed; install it with: apt-get install -y bubblewrap")
        tree = rootfs.require().path
        try:
            filter_read = seccomp.program_fd()
        except seccomp.SeccompUnavailable as exc:
            raise RuntimeUnavailable(str(exc)) from None
        try:
            probe = subprocess.run(  # every option a command's bwrap uses, bar the two descriptors
                self._as_nobody([
                    bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
                    "--as-pid-1",  # no namespace init to outlive bwrap (see __init__): nothing to reap
                    "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox", "--cap-drop", "ALL",
                    "--ro-bind", str(tree), "/", "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
                    "--size", str(2**20), "--tmpfs", "/tmp", "--chdir", "/", "--clearenv",  # noqa: S108
                    "--seccomp", str(filter_read), "--", "/bin/true"]),
                capture_output=True, text=True, timeout=10, env={}, pass_fds=(filter_read,), **self._identity(),
            )
        finally:
            os.close(filter_read)
        if "nknown option" in probe.stderr:
            raise RuntimeUnavailable(f"this bubblewrap is too old ({probe.stderr.strip()}); Airlock needs "
                                     "bubblewrap 0.5 or newer: apt-get install -y bubblewrap")
        if probe.returncode != 0:
            raise RuntimeUnavailable(
                f"bubblewrap cannot create its namespaces here ({probe.stderr.strip()}); enable unprivileged "
                "user namespaces: sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1"
            )
        if self.as_root and SETPRIV and self.cgroups.available:
            self._enter = enter.helper(self._helper_dir)
        self._bwrap = bwrap

    def weaker_here(self) -> list[str]:
        weaker = []
        if not self.as_root:
            weaker.append("no /workspace size quota (mounting its tmpfs needs root)")
        if not self.cgroups.available:
            weaker.append("rlimits instead of cgroups: memory over the limit ends a command `exited` with "
                          "MemoryError, not `oom`, and CPU time is not capped")
        return weaker

    def slower_here(self) -> list[str]:
        moves_itself = self._enter is not None and self.cgroups.version == 1  # no global lock (enter.c)
        if not moves_itself and self.cgroups.attach_waits_for_rcu():
            return ["a command that follows a pause waits ~11 ms for an RCU grace period before it may join "
                    "its cgroup; echo 1 > /sys/kernel/rcu_expedited makes that ~1.5 ms"]
        return []

    def _as_nobody(self, argv: list[str]) -> list[str]:
        """Run bwrap as the host's nobody when we can (we are root), else as ourselves.
        `setpriv` drops the identity: Popen's own user= would make Python fork the whole runner
        process instead of vfork-ing it, ~17 ms instead of ~2 ms for a server-sized process."""
        if self.as_root and SETPRIV:
            return [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]
        return argv

    def _identity(self) -> dict:
        if self.as_root and not SETPRIV:
            return {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        return {}

    # -- lifecycle -------------------------------------------------------------------------
    def create(self, spec: SandboxSpec) -> Sandbox:
        self.check()
        tree = rootfs.require()
        root = self.sandbox_dir / spec.session_id
        workspace = root / "workspace"
        self.sandbox_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        os.chmod(self.sandbox_dir, 0o711)  # noqa: S103 - sandboxes (uid 65534) traverse it to their workspace
        try:
            root.mkdir(mode=0o711)
        except FileExistsError:
            raise SandboxError(f"sandbox {spec.session_id} already exists") from None
        try:
            workspace.mkdir(mode=0o700)
            quota, view = self.as_root, tree.path
            if quota:
                mount_tmpfs(workspace, size_bytes=spec.limits.disk_mb * 2**20, uid=NOBODY, gid=NOBODY,
                            inodes=spec.limits.disk_mb * INODES_PER_MB)
                view = self._view(root, tree.path)
            if self.cgroups.available:
                self.cgroups.create(spec.session_id, tenant=spec.tenant, memory_mb=spec.limits.memory_mb,
                                    pids=spec.limits.pids, cpus=spec.limits.cpus)
        except BaseException:
            self.destroy_by_id(spec.session_id)
            raise
        return Sandbox(
            id=spec.session_id, driver=self.name, spec=spec, rootfs_digest=tree.digest,
            handle={"root": str(root), "workspace": str(workspace), "rootfs": str(view),
                    "disk_quota": quota},
        )

    def _view(self, root: Path, tree: Path) -> Path:
        """The tree as the sandbox's / (as root). A bind mount of a directory shows the
        directory's host path in the sandbox's /proc/self/mountinfo: a read-only overlay of it,
        mounted in the sandbox's directory (`rootfs`, gone with it), has a root of its own, and
        its layers show as descriptors (`lowerdir=/proc/self/fd/N:...`), not as paths. Where
        the kernel has no overlayfs: the tree itself, said once."""
        view, empty = root / "rootfs", root / "empty"  # (overlay takes two layers at least)
        view.mkdir(mode=0o755)
        empty.mkdir(mode=0o755)
        try:
            mount_overlay_ro(view, [tree, empty])
        except OSError as exc:
            if not self._said_no_overlay:
                self._said_no_overlay = True
                log.warning("bubblewrap: sandboxes see their root filesystem's host path in /proc/self/mountinfo (%s)",
                            exc.strerror)
            return tree
        return view

    def destroy(self, sandbox: Sandbox) -> None:
        self.kill(sandbox)
        self.destroy_by_id(sandbox.id)

    def destroy_by_id(self, sandbox_id: str) -> None:
        if not is_uuid(sandbox_id):  # an id becomes a path below: nothing but a UUID may get there
            raise SandboxError(f"{sandbox_id!r} is not a sandbox id")
        with self._guard(sandbox_id):
            self._kill_processes(sandbox_id)
        with self._lock:
            self._guards.pop(sandbox_id, None)
        if self.cgroups.available:
            self.cgroups.remove(sandbox_id)
        root = self.sandbox_dir / sandbox_id
        for mounted in (root / "workspace", root / "rootfs"):
            if is_mount_point(mounted):
                unmount(mounted)
        shutil.rmtree(root, onerror=lambda function, path, _: _make_writable_and_retry(root, function, path))
        if root.exists():
            raise SandboxError(f"sandbox directory {root} could not be removed")

    def list_sandboxes(self) -> list[str]:
        ids = set(self.cgroups.list_ids()) if self.cgroups.available else set()
        if self.sandbox_dir.is_dir():
            ids.update(child.name for child in self.sandbox_dir.iterdir())
        return sorted(sandbox_id for sandbox_id in ids if is_uuid(sandbox_id))

    # -- commands --------------------------------------------------------------------------
    def exec(
        self, sandbox: Sandbox, argv: Sequence[str], *, cwd: str = WORKSPACE,
        env: Mapping[str, str] | None = None, timeout_s: float | None = None, stdin: Stdin | None = None,
        egress: bool = True, bulk: bool = False,
    ) -> Iterator[Chunk | ExitStatus]:
        check_argv(argv)
        cwd = workspace_cwd(cwd)
        limits = sandbox.spec.limits
        timeout_s = min(timeout_s or limits.command_timeout_s, limits.command_timeout_s)
        started = time.monotonic()
        oom_before = self.cgroups.oom_kills(sandbox.id) if self.cgroups.available else 0
        argv = egress_argv(sandbox.spec, argv) if egress else list(argv)
        running = self._start(sandbox, argv, cwd, sandbox_env(sandbox.spec, env), stdin, bulk)
        # The one deadline mechanism: it holds even when nobody reads the output.
        watchdog = deadlines.after(timeout_s, lambda: self._stop(sandbox.id, running, "timeout"))
        output_bytes = 0
        try:
            for chunk in _stream(running.process):
                output_bytes += len(chunk.data)
                if output_bytes > limits.max_output_bytes:
                    self._stop(sandbox.id, running, "output_limit")
                    break
                yield chunk
            returncode = running.process.wait()
        finally:
            watchdog.cancel()
            if running.process.poll() is None:  # the consumer stopped iterating: nothing survives it
                self._stop(sandbox.id, running, running.reason or "killed")
                running.process.wait()
            _close_pipes(running.process)
            with self._guard(sandbox.id):
                if self.cgroups.available:
                    self.cgroups.kill_all(sandbox.id)
                with self._lock:
                    self._running.pop(sandbox.id, None)
            _reap(running)
        reason = running.reason
        if reason is None and self.cgroups.available and self.cgroups.oom_kills(sandbox.id) > oom_before:
            reason = "oom"
        yield ExitStatus(
            exit_code=None if reason in {"timeout", "killed", "output_limit"} else _exit_code(returncode),
            reason=reason or "exited",
            duration_ms=round((time.monotonic() - started) * 1000),
            output_bytes=output_bytes,
        )

    def _start(self, sandbox: Sandbox, argv: Sequence[str], cwd: str, env: dict[str, str],
               stdin: Stdin | None, bulk: bool) -> _Running:
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        filter_read = seccomp.program_fd()
        blank_read, blank_write = os.pipe()
        os.close(blank_write)
        limits = sandbox.spec.limits
        entering = [self._enter, *self.cgroups.entry_files(sandbox.id), "--"] if self._enter else []
        options = [
            "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox", "--cap-drop", "ALL",
            "--ro-bind", sandbox.handle["rootfs"], "/",
            "--proc", "/proc", "--dev", "/dev",
            "--remount-ro", "/dev",
            # The host's boot options are not the sandbox's business: /proc/cmdline reads empty
            # (a file bwrap makes from an empty pipe, whose path tells nothing of the host).
            "--ro-bind-data", str(blank_read), "/proc/cmdline",
            "--bind", sandbox.handle["workspace"], WORKSPACE,
            # The session's egress socket and forwarder, when its policy allows egress.
            *(("--ro-bind", sandbox.spec.egress_dir, EGRESS_MOUNT) if sandbox.spec.egress_dir else ()),
            "--size", str(limits.tmp_mb * 2**20), "--tmpfs", "/tmp",  # noqa: S108 - the sandbox's own
            "--chdir", cwd,
            "--info-fd", str(info_write), "--block-fd", str(block_read),
            "--seccomp", str(filter_read),  # loaded into the command right before its exec (seccomp.py)
            # bwrap itself runs with an empty environment (nothing may steer how it loads); the
            # command gets exactly the policy's environment.
            "--clearenv", *[part for name, value in env.items() for part in ("--setenv", name, value)],
        ]
        # The options name host paths (the sandbox's directory, its egress socket's) and the
        # environment: bwrap reads them from a descriptor, so the argv that its namespace init,
        # the sandbox's pid 1, shows in /proc/1/cmdline is `bwrap --args N -- <command>`.
        args_fd = os.memfd_create("bwrap-args")
        os.write(args_fd, b"".join(option.encode() + b"\0" for option in options))
        os.lseek(args_fd, 0, os.SEEK_SET)
        command = [*entering, *self._as_nobody([self._bwrap, "--args", str(args_fd), "--", *argv])]
        fed = isinstance(stdin, bytes)  # written through a pipe; a file is the command's own stdin
        with self._guard(sandbox.id), self._lock:
            try:
                if sandbox.id in self._running:
                    raise SandboxError("a command is already running in this sandbox")
                with cpus.spawning():  # the command may use every CPU, not the server's one
                    process = subprocess.Popen(
                        command, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE if fed else stdin,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={},
                        pass_fds=(info_write, block_read, filter_read, blank_read, args_fd), start_new_session=True,
                        **self._identity(),
                    )
            except BaseException as exc:
                os.close(info_read)
                os.close(block_write)
                if isinstance(exc, OSError) and entering and exc.filename == entering[0]:
                    raise self._without_helper(exc) from None
                raise
            finally:  # bwrap's ends are its own now (or nobody's)
                for descriptor in (info_write, block_read, filter_read, blank_read, args_fd):
                    os.close(descriptor)
            if bulk:  # the rest stays 64 KiB: this counts against the user's pipe pages (pipe(7))
                with contextlib.suppress(OSError):
                    fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, BULK_PIPE_BYTES)
            running = _Running(process=process)
            self._running[sandbox.id] = running
        try:
            # With the helper every process is in its cgroups already. Without it, in cgroups,
            # the outer bwrap joins at once: the kernel's wait before a move (an RCU grace period,
            # ~11 ms after a pause) then overlaps bwrap's own set-up. Rlimits wait for the user
            # namespace: set before it, RLIMIT_NPROC would bound the namespace.
            early = [process.pid] if self.cgroups.available and not entering else []
            self._confine(sandbox, early)
            try:
                running.inner_pid = _read_child_pid(info_read)
                if (descriptor := pidfd(running.inner_pid)) is not None:
                    running.pidfds.append(descriptor)
            except SandboxError as exc:
                raise SandboxError(f"{exc}: {_startup_error(process)}") from None
            if not entering:
                self._confine(sandbox, [pid for pid in (process.pid, running.inner_pid) if pid not in early])
            os.write(block_write, b"1")  # the command may start now
            if fed:
                threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True).start()
        except (OSError, SandboxError):
            if running.reason is None:  # it could not start
                self._abandon(sandbox.id, running)
                raise
            # Killed while starting (its pipes broke): exec() reports it as such.
            self._stop(sandbox.id, running, running.reason)
        except BaseException:
            self._abandon(sandbox.id, running)
            raise
        finally:
            os.close(info_read)
            os.close(block_write)
        return running

    def _without_helper(self, exc: OSError) -> SandboxError:
        """The cgroup helper would not run (removed, replaced): this command fails, the next ones
        are moved into their cgroups by the runner, and the next driver builds it anew."""
        log.error("bubblewrap: the cgroup helper %s could not run (%s); the runner moves commands into their "
                  "cgroups itself from now on", self._enter, exc.strerror)
        self._enter = None
        enter.forget(self._helper_dir)
        return SandboxError("the sandbox's cgroup helper could not run; try again")

    def _abandon(self, sandbox_id: str, running: _Running) -> None:
        self._stop(sandbox_id, running, "killed")
        running.process.wait()
        _close_pipes(running.process)
        with self._guard(sandbox_id), self._lock:
            self._running.pop(sandbox_id, None)
        _reap(running)

    def _guard(self, sandbox_id: str) -> threading.RLock:
        with self._lock:
            return self._guards.setdefault(sandbox_id, threading.RLock())

    def _confine(self, sandbox: Sandbox, pids: list[int]) -> None:
        limits = sandbox.spec.limits
        if self.cgroups.available:
            for pid in pids:
                self.cgroups.attach(sandbox.id, pid)
            return
        # No cgroups: per-process rlimits, inherited by everything the command forks.
        memory = limits.memory_mb * 2**20
        cpu_s = int(limits.command_timeout_s * max(limits.cpus, 1)) + 1
        for pid in pids:
            resource.prlimit(pid, resource.RLIMIT_AS, (memory, memory))
            resource.prlimit(pid, resource.RLIMIT_NPROC, (limits.pids, limits.pids))
            resource.prlimit(pid, resource.RLIMIT_CPU, (cpu_s, cpu_s))

    def _stop(self, sandbox_id: str, running: _Running, reason: str) -> None:
        if running.reason is None:
            running.reason = reason
        # Killing bwrap's outer process kills its namespace init (die-with-parent), and with
        # the init the kernel kills every process of the PID namespace. Popen.kill() signals
        # only while the process is not yet reaped, so a recycled pid is never hit; the inner
        # pid is signalled only while the outer one, its parent, still runs. Before the init is
        # known (still starting), it may not have set die-with-parent yet: the outer's whole
        # process group goes (the init stays in it; only the command starts a session of its
        # own), and what the outer had started is reaped with the rest.
        if running.process.poll() is None:
            if running.inner_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(running.inner_pid, signal.SIGKILL)
            else:
                # Stopped first, it forks nothing between the reading of its children and the kill
                # (an init forked in between was left a zombie, reparented here, 1 kill in ~300).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(running.process.pid, signal.SIGSTOP)
                with contextlib.suppress(ChildProcessError):  # stopped, or already gone; nothing collected
                    os.waitid(os.P_PID, running.process.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
                running.pidfds += [fd for fd in map(pidfd, children(running.process.pid)) if fd is not None]
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(running.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                running.process.kill()
        # Whatever the command left in the sandbox, only while it is still the sandbox's command:
        # a late timer or kill must not reach the next command, which may already be starting.
        with self._guard(sandbox_id):
            with self._lock:
                current = self._running.get(sandbox_id) is running
            if current and self.cgroups.available:
                self.cgroups.kill_all(sandbox_id)

    def kill(self, sandbox: Sandbox) -> None:
        with self._guard(sandbox.id):
            with self._lock:
                running = self._running.get(sandbox.id)
            if running is not None:
                self._stop(sandbox.id, running, "killed")
            else:
                self._kill_processes(sandbox.id)

    def _kill_processes(self, sandbox_id: str) -> None:
        if self.cgroups.available:
            self.cgroups.kill_all(sandbox_id)
            return
        marker = str(self.sandbox_dir / sandbox_id / "workspace").encode()
        for pid in _pids_with_argument(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stats(self, sandbox: Sandbox) -> Stats:
        usage = self.cgroups.usage(sandbox.id) if self.cgroups.available else None
        try:
            fs = os.statvfs(sandbox.handle["workspace"])
            disk = (fs.f_blocks - fs.f_bfree) * fs.f_frsize if sandbox.handle["disk_quota"] else None
        except OSError:
            disk = None
        return Stats(
            cpu_s=usage.cpu_s if usage else None, memory_bytes=usage.memory_bytes if usage else None, disk_bytes=disk
        )


def _make_writable_and_retry(root: Path, function, path: str) -> None:
    """rmtree's error handler: a command may leave a directory without write or search bits.
    Only paths below the sandbox's root are touched, never the root's parent."""
    parent = Path(path).parent
    if parent != root and root not in parent.parents:
        return
    with contextlib.suppress(OSError):
        os.chmod(parent, 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
        function(path)


def _read_child_pid(fd: int) -> int:
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
        try:
            return int(json.loads(data)["child-pid"])
        except ValueError:
            continue
    raise SandboxError(f"bubblewrap did not start ({data.decode(errors='replace')!r})")


def _startup_error(process: subprocess.Popen) -> str:
    """What bwrap said on stderr when it gave up before starting the command. Never waits on
    the pipe: a process bwrap started may hold it open."""
    with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
        process.wait(timeout=5)
        os.set_blocking(process.stderr.fileno(), False)
        return os.read(process.stderr.fileno(), 4096).decode(errors="replace").strip()
    return "no message"


def _reap(running: _Running) -> None:
    for descriptor in running.pidfds:
        reap(descriptor)
    running.pidfds.clear()


def _stream(process: subprocess.Popen) -> Iterator[Chunk]:
    """Chunks from stdout and stderr as they come, until both close (the watchdog in exec()
    kills the command at its deadline, which closes them)."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ, "stdout")
    selector.register(process.stderr, selectors.EVENT_READ, "stderr")
    try:
        while selector.get_map():
            for key, _ in selector.select():
                data = os.read(key.fileobj.fileno(), READ_SIZE)
                if data:
                    yield Chunk(stream=key.data, data=data)
                else:
                    selector.unregister(key.fileobj)
    finally:
        selector.close()


def _feed(pipe, data: bytes) -> None:
    """Write a command's standard input from its own thread: the command may fill its output
    pipes before it reads everything, and exec() must keep draining them meanwhile."""
    with contextlib.suppress(OSError, ValueError), pipe:
        pipe.write(data)


def _close_pipes(process: subprocess.Popen) -> None:
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pids_with_argument(marker: bytes) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
