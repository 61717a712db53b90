"""The Docker driver (runc, or gVisor with `isolation: gvisor`), through the docker SDK.

One container per session, one `exec` per command. The container has no network, a read-only
root (the imported debootstrap tree), uid 65534, no capabilities, no-new-privileges, pids /
memory / CPU limits, an init (docker-init) and size-limited tmpfs mounts for /workspace and
/tmp, the only writable places: no /dev/shm (IPC mode `none`) and a read-only /dev/mqueue.
Its main process is `sleep infinity`, the keep-alive; after each command every other process
of the container is killed, so nothing a command started outlives it.

Killing: under runc the container's processes are visible to the runner (root on the same
host), so they are killed from the host through the container's cgroup. Under gVisor they
live inside the sandbox kernel, so a fixed reaper program (REAPER, passed as argv: no shell)
runs inside the container and kills every process but the init and the keep-alive. It runs as
the sandbox kernel's root with CAP_KILL (a privileged exec; gVisor's root is not the host's),
because the command may have used up uid 65534's process limit; it runs with `python3 -I`
from `/`, so nothing the command wrote into /workspace can be imported into it."""

import contextlib
import hashlib
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Ulimit
from requests.exceptions import RequestException

from sessions.runtimes import deadlines, rootfs, seccomp
from sessions.runtimes.base import (
    EGRESS_MOUNT,
    WORKSPACE,
    Chunk,
    Driver,
    ExitStatus,
    RuntimeUnavailable,
    Sandbox,
    SandboxError,
    SandboxSpec,
    Stats,
    check_argv,
    egress_argv,
    sandbox_env,
    workspace_cwd,
)

NOBODY = "65534:65534"
# The init and keep-alive run as another unprivileged uid, so a command (65534) cannot signal them.
KEEPER = "65533:65533"
LABEL_SESSION = "airlock.session"
LABEL_DRIVER = "airlock.driver"
STREAMS = {1: "stdout", 2: "stderr"}
GVISOR_RUNTIME = "runsc"
RUNSC_FIX = (
    "register gVisor with Docker: apt-get install -y runsc, put "
    '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]}}} '
    "in /etc/docker/daemon.json, then reload dockerd (kill -HUP $(pidof dockerd))"
)

# Runs inside a gVisor container: kills every process except pid 1 (the init), the
# keep-alive whose pid is argv[1], and itself; repeats until none is left.
REAPER = """
import os, signal, sys, time
keep = {1, os.getpid(), int(sys.argv[1])}
for _ in range(500):
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep]
    if not pids:
        break
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    time.sleep(0.01)
"""
KEEPALIVE_PID = "import os; print(min(int(p) for p in os.listdir('/proc') if p.isdigit() and p != '1' " \
                "and open(f'/proc/{p}/cmdline','rb').read() == b'sleep\\0infinity\\0'))"


@dataclass
class _Running:
    reason: str | None = None  # set by whoever stops the command: timeout, killed, output_limit


class DockerDriver(Driver):
    def __init__(self, *, isolation: str = "standard", base_url: str | None = None,
                 gvisor_runtime: str = GVISOR_RUNTIME):
        self.isolation = isolation
        self.gvisor_runtime = gvisor_runtime
        self.name = "gvisor" if isolation == "gvisor" else "docker"
        self.base_url = base_url
        self._client: docker.DockerClient | None = None
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._checked = False
        self._host_uds = False  # gVisor lets a sandbox connect to a host Unix socket mounted into it
        self._image_imported = False

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = (docker.DockerClient(base_url=self.base_url, timeout=60) if self.base_url
                                else docker.from_env(timeout=60))
            except DockerException as exc:
                raise RuntimeUnavailable(_daemon_fix(exc)) from None
        return self._client

    # -- host checks -----------------------------------------------------------------------
    def check(self) -> None:
        if self._checked:
            return
        try:
            self.client.ping()
            runtimes = self.client.info().get("Runtimes", {})
        except (DockerException, RequestException) as exc:
            raise RuntimeUnavailable(_daemon_fix(exc)) from None
        if self.isolation == "gvisor" and self.gvisor_runtime not in runtimes:
            raise RuntimeUnavailable(f"Docker has no runtime {self.gvisor_runtime!r}; {RUNSC_FIX}")
        args = runtimes.get(self.gvisor_runtime, {}).get("runtimeArgs") or []
        self._host_uds = self.isolation != "gvisor" or any(arg in {"--host-uds=open", "--host-uds=all"} for arg in args)
        self.image_digest, self._image_imported = ensure_image(self.client)
        self._checked = True

    def _security_options(self) -> list[str]:
        """runc applies Airlock's seccomp rules (seccomp.py); runsc keeps its own filter, on the
        gVisor kernel that takes every call of the sandbox."""
        if self.isolation == "gvisor":
            return ["no-new-privileges"]
        return ["no-new-privileges", f"seccomp={seccomp.docker_profile()}"]

    # -- lifecycle -------------------------------------------------------------------------
    def create(self, spec: SandboxSpec) -> Sandbox:
        self.check()
        if spec.egress_dir and not self._host_uds:
            raise SandboxError("gVisor may not connect to the session's egress socket (runsc lacks --host-uds=open); "
                               + RUNSC_FIX)
        limits = spec.limits
        tmpfs_options = "uid=65534,gid=65534,nosuid,nodev,exec"
        pids_options = {"pids_limit": limits.pids}
        if self.isolation == "gvisor":
            # The host's pids cgroup counts the gVisor kernel's own threads (measured here: ~7
            # per guest process under the ptrace platform), and the sandbox dies when it cannot
            # make one, so it only guards the host; the guest's limit is its RLIMIT_NPROC, which
            # gVisor enforces per sandbox.
            pids_options = {"pids_limit": limits.pids * 16 + 256,
                            "ulimits": [Ulimit(name="nproc", soft=limits.pids, hard=limits.pids)]}
        try:
            container = self.client.containers.run(
                rootfs.IMAGE, ["sleep", "infinity"], detach=True, init=True,
                name=f"airlock-{spec.session_id}", hostname="sandbox", network_mode="none",
                read_only=True, user=KEEPER, cap_drop=["ALL"], security_opt=self._security_options(),
                ipc_mode="none",
                **pids_options, mem_limit=limits.memory_mb * 2**20, memswap_limit=limits.memory_mb * 2**20,
                nano_cpus=int(limits.cpus * 1e9), working_dir=WORKSPACE, environment={},
                tmpfs={WORKSPACE: f"size={limits.disk_mb}m,mode=0700,{tmpfs_options}",
                       "/tmp": f"size={limits.tmp_mb}m,mode=0700,{tmpfs_options}",  # noqa: S108
                       "/dev/mqueue": "ro,size=4k,mode=0555"},
                labels={LABEL_SESSION: spec.session_id, LABEL_DRIVER: self.name, "airlock.tenant": spec.tenant,
                        rootfs.DIGEST_LABEL: self.image_digest},
                runtime=self.gvisor_runtime if self.isolation == "gvisor" else None,
                log_config={"type": "none"},
                # The session's egress socket and forwarder, when its policy allows egress.
                volumes={spec.egress_dir: {"bind": EGRESS_MOUNT, "mode": "ro"}} if spec.egress_dir else None,
            )
        except APIError as exc:
            if exc.status_code == 409:
                raise SandboxError(f"sandbox {spec.session_id} already exists") from None
            raise SandboxError(f"docker could not create the sandbox: {exc.explanation}") from None
        except (DockerException, RequestException) as exc:  # the daemon went away after check()
            raise RuntimeUnavailable(_daemon_fix(exc)) from None
        sandbox = Sandbox(id=spec.session_id, driver=self.name, spec=spec, rootfs_digest=self.image_digest,
                          handle={"container": container.id}, cache_hit=not self._image_imported)
        self._image_imported = False  # the next sandbox finds the image in the cache
        try:
            self._record_processes(sandbox, container)
        except BaseException:
            self.destroy(sandbox)
            raise
        return sandbox

    def _record_processes(self, sandbox: Sandbox, container) -> None:
        if self.isolation == "gvisor":
            sandbox.handle["keepalive_pid"] = int(self._helper(sandbox, KEEPALIVE_PID))
            return
        container.reload()
        init_pid = container.attrs["State"]["Pid"]
        children: list[str] = []
        deadline = time.monotonic() + 5
        while not children and time.monotonic() < deadline:  # docker-init forks the keep-alive
            children = Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()
            if not children:
                time.sleep(0.005)
        if not children:
            raise SandboxError("the sandbox's keep-alive process did not start")
        sandbox.handle.update(keep_host_pids=[init_pid, *map(int, children)],
                              cgroup_procs=str(_cgroup_dir(init_pid, "pids") / "cgroup.procs"),
                              memory_cgroup=str(_cgroup_dir(init_pid, "memory")))

    def destroy(self, sandbox: Sandbox) -> None:
        self.destroy_by_id(sandbox.id)

    def destroy_by_id(self, sandbox_id: str) -> None:
        for container in self._containers(sandbox_id):
            with contextlib.suppress(NotFound):
                container.remove(force=True, v=True)

    def list_sandboxes(self) -> list[str]:
        return sorted({c.labels.get(LABEL_SESSION, "") for c in self._containers()} - {""})

    def _containers(self, sandbox_id: str | None = None) -> list:
        filters = [f"{LABEL_DRIVER}={self.name}"]
        if sandbox_id:
            filters.append(f"{LABEL_SESSION}={sandbox_id}")
        try:
            return self.client.containers.list(all=True, filters={"label": filters})
        except (DockerException, RequestException) as exc:
            raise RuntimeUnavailable(_daemon_fix(exc)) from None

    # -- commands --------------------------------------------------------------------------
    def exec(
        self, sandbox: Sandbox, argv: Sequence[str], *, cwd: str = WORKSPACE,
        env: Mapping[str, str] | None = None, timeout_s: float | None = None, stdin: bytes | None = None,
        egress: bool = True,
    ) -> Iterator[Chunk | ExitStatus]:
        check_argv(argv)
        argv = egress_argv(sandbox.spec, argv) if egress else list(argv)
        cwd = workspace_cwd(cwd)
        limits = sandbox.spec.limits
        timeout_s = min(timeout_s or limits.command_timeout_s, limits.command_timeout_s)
        api = self.client.api
        started = time.monotonic()
        oom_before = self._oom_kills(sandbox)
        running = _Running()
        with self._lock:
            if sandbox.id in self._running:
                raise SandboxError("a command is already running in this sandbox")
            self._running[sandbox.id] = running
        try:
            exec_id = api.exec_create(
                sandbox.handle["container"], argv, stdout=True, stderr=True, user=NOBODY,
                workdir=cwd,
                environment=sandbox_env(sandbox.spec, env), stdin=stdin is not None,
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except BaseException as exc:
            with self._lock:
                self._running.pop(sandbox.id, None)
            if isinstance(exc, APIError) and not self._container_running(sandbox):
                raise SandboxError("the sandbox is not running (under gVisor an out-of-memory kill ends it)") from None
            if isinstance(exc, (DockerException, RequestException)) and not isinstance(exc, APIError):
                raise RuntimeUnavailable(_daemon_fix(exc)) from None
            raise
        raw = getattr(sock, "_sock", sock)
        if stdin is not None:
            threading.Thread(target=_feed, args=(raw, stdin), daemon=True).start()
        # The one deadline mechanism: it holds even when nobody reads the output.
        watchdog = deadlines.after(timeout_s, lambda: self._stop(sandbox, running, "timeout"))
        output_bytes = 0

        def on_idle() -> bool:
            """True when the stream will not end by itself: the container died (under gVisor an
            OOM ends the whole sandbox), or the command exited while a process it left behind
            holds its output open (reaped here, which ends the stream)."""
            if not self._container_running(sandbox):
                return True
            if not _exec_running(api, exec_id):
                self._reap(sandbox)
            return False

        try:
            for chunk in _frames(raw, on_idle=on_idle):
                if running.reason is None:
                    if output_bytes + len(chunk.data) > limits.max_output_bytes:
                        self._stop(sandbox, running, "output_limit")
                        continue
                    output_bytes += len(chunk.data)
                    yield chunk
                # After a stop the stream is drained and dropped until it ends: under gVisor a
                # process blocked writing to a full pipe only dies once the pipe is read.
        finally:
            watchdog.cancel()
            sock.close()
            self._reap(sandbox)  # whatever the command left behind dies with it
            with self._lock:
                self._running.pop(sandbox.id, None)
        exit_code, reason = self._outcome(sandbox, api, exec_id, running.reason, oom_before)
        yield ExitStatus(exit_code=exit_code, reason=reason, duration_ms=round((time.monotonic() - started) * 1000),
                         output_bytes=output_bytes)

    def _outcome(self, sandbox: Sandbox, api, exec_id: str, reason: str | None, oom_before: int):
        if reason is None and self.isolation != "gvisor":
            # runc, the common case: the exec's own exit code, one call to the daemon. A command
            # that ended normally left its container running (an OOM kill shows in the cgroup).
            exit_code = api.exec_inspect(exec_id).get("ExitCode")
            if exit_code is not None and 0 <= exit_code < 128:  # not killed by a signal
                return exit_code, "oom" if self._oom_kills(sandbox) > oom_before else "exited"
        state = self._container_state(sandbox)
        if not state.get("Running"):
            return None, "oom" if state.get("OOMKilled") else (reason or "killed")
        if reason is not None:
            return None, reason
        exit_code = api.exec_inspect(exec_id).get("ExitCode")
        return exit_code, "oom" if self._oom_kills(sandbox) > oom_before else "exited"

    def _container_state(self, sandbox: Sandbox) -> dict:
        try:
            return self.client.api.inspect_container(sandbox.handle["container"])["State"]
        except NotFound:
            return {}

    def _container_running(self, sandbox: Sandbox) -> bool:
        return bool(self._container_state(sandbox).get("Running"))

    def _stop(self, sandbox: Sandbox, running: _Running, reason: str) -> None:
        """Mark the command stopped and reap in the background, while exec() keeps draining."""
        if running.reason is None:
            running.reason = reason
        threading.Thread(target=self._reap, args=(sandbox,), name=f"reap-{sandbox.id}", daemon=True).start()

    def kill(self, sandbox: Sandbox) -> None:
        with self._lock:
            running = self._running.get(sandbox.id)
        if running is not None:
            self._stop(sandbox, running, "killed")
        else:
            self._reap(sandbox)

    def _reap(self, sandbox: Sandbox) -> None:
        """Kill every process of the container except its init and keep-alive."""
        if self.isolation == "gvisor":
            with contextlib.suppress(APIError, NotFound, SandboxError):
                self._helper(sandbox, REAPER, str(sandbox.handle["keepalive_pid"]), as_root=True)
            return
        keep = set(sandbox.handle["keep_host_pids"])
        procs = Path(sandbox.handle["cgroup_procs"])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pids = {int(pid) for pid in procs.read_text().split()} - keep
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def _oom_kills(self, sandbox: Sandbox) -> int:
        """OOM kills in the container's memory cgroup (runc; gVisor's kernel is opaque here)."""
        if self.isolation == "gvisor":
            return 0
        memory = Path(sandbox.handle["memory_cgroup"])
        for name in ("memory.oom_control", "memory.events"):  # cgroup v1, v2
            with contextlib.suppress(OSError):
                for line in (memory / name).read_text().splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        return 0

    def _helper(self, sandbox: Sandbox, code: str, *args: str, as_root: bool = False, timeout_s: float = 15) -> bytes:
        """Run one of Airlock's own fixed Python programs in the container and return its stdout.
        `-I` and cwd `/`: nothing the command wrote into /workspace can be imported into it.
        Bounded in time: an exec into a gVisor sandbox that dies meanwhile never ends by itself."""
        api = self.client.api
        exec_id = api.exec_create(
            sandbox.handle["container"], ["python3", "-I", "-c", code, *args], workdir="/",
            user="0:0" if as_root else NOBODY, privileged=as_root,
        )["Id"]
        sock = api.exec_start(exec_id, socket=True)
        try:
            chunks = []
            deadline = time.monotonic() + timeout_s

            def give_up() -> bool:
                if time.monotonic() > deadline:
                    raise SandboxError("a helper program did not finish in time")
                return not self._container_running(sandbox)

            for chunk in _frames(getattr(sock, "_sock", sock), on_idle=give_up):
                if chunk.stream == "stdout":
                    chunks.append(chunk.data)
            return b"".join(chunks).strip()
        finally:
            sock.close()

    def stats(self, sandbox: Sandbox) -> Stats:
        try:
            raw = self.client.api.stats(sandbox.handle["container"], stream=False)
        except (APIError, NotFound):
            return Stats(cpu_s=None, memory_bytes=None, disk_bytes=None)
        cpu_ns = raw.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage")
        memory = raw.get("memory_stats", {}).get("max_usage") or raw.get("memory_stats", {}).get("usage")
        try:
            disk = int(self._helper(sandbox, "import shutil; print(shutil.disk_usage('/workspace').used)"))
        except (APIError, NotFound, SandboxError, ValueError):
            disk = None
        return Stats(cpu_s=cpu_ns / 1e9 if cpu_ns else None, memory_bytes=memory, disk_bytes=disk)


IDLE_CHECK_S = 0.25


def _feed(raw, data: bytes) -> None:
    """Send a command's whole standard input, then end it (half-close), from its own thread."""
    with contextlib.suppress(OSError):
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)


def _exec_running(api, exec_id: str) -> bool:
    try:
        return bool(api.exec_inspect(exec_id).get("Running"))
    except NotFound:
        return False


def _frames(sock, *, on_idle: Callable[[], bool]) -> Iterator[Chunk]:
    """Docker's multiplexed exec stream: 8-byte headers (stream, 0, 0, 0, big-endian size).
    After each quiet IDLE_CHECK_S, asks on_idle whether to give up on the stream."""
    buffer = b""
    while True:
        ready, _, _ = select.select([sock], [], [], IDLE_CHECK_S)
        if not ready:
            if on_idle():
                return
            continue
        data = sock.recv(65536)
        if not data:
            return
        buffer += data
        while len(buffer) >= 8:
            stream, size = buffer[0], struct.unpack(">I", buffer[4:8])[0]
            if len(buffer) < 8 + size:
                break
            payload, buffer = buffer[8:8 + size], buffer[8 + size:]
            if stream in STREAMS and payload:
                yield Chunk(stream=STREAMS[stream], data=payload)


def _cgroup_dir(pid: int, controller: str) -> Path:
    """The host cgroup directory of process `pid` for a v1 controller (or the v2 group)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            return Path("/sys/fs/cgroup") / path.lstrip("/")
        if controller in controllers.split(","):
            return Path("/sys/fs/cgroup") / controller / path.lstrip("/")
    raise SandboxError(f"cannot find the {controller} cgroup of container process {pid}")


def _daemon_fix(exc: Exception) -> str:
    if "Permission denied" in str(exc) or "PermissionError" in repr(exc):
        return ("the Docker daemon's socket refused this user (permission denied); run Airlock as root, or add "
                "its user to the docker group: usermod -aG docker $USER")
    return (f"the Docker daemon is not reachable ({type(exc).__name__}); install and start it: "
            "apt-get install -y docker.io && dockerd &")


class _HashingReader:
    """A file-like tar stream for the Docker API that hashes what it hands over."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks, self.sha = chunks, hashlib.sha256()

    def __iter__(self):
        for chunk in self.chunks:
            self.sha.update(chunk)
            yield chunk


def ensure_image(client: docker.DockerClient, *,
                 progress: Callable[[str], None] | None = None) -> tuple[str, bool]:
    """The digest of the current root filesystem's image, and whether it had to be imported
    (nothing is pulled) because the local cache lacked it."""
    built = rootfs.require()
    try:
        image = client.images.get(rootfs.IMAGE)
        if image.labels.get(rootfs.DIGEST_LABEL) == built.digest:
            return built.digest, False
    except ImageNotFound:
        pass
    import_image(built, client=client, progress=progress)
    return built.digest, True


def import_image(built: rootfs.RootFS, *, client: docker.DockerClient | None = None,
                 progress: Callable[[str], None] | None = None) -> str:
    client = client or docker.from_env(timeout=600)
    (progress or (lambda message: None))(f"docker import of {built.path} as {rootfs.IMAGE}")
    reader = _HashingReader(rootfs.tar_stream(built.path))
    repository, tag = rootfs.IMAGE.split(":")
    client.api.import_image_from_stream(
        reader, repository=repository, tag=tag,
        changes=[f"LABEL {rootfs.DIGEST_LABEL}={built.digest}", "USER 65534:65534", f"WORKDIR {WORKSPACE}",
                 "ENV PATH=/usr/local/bin:/usr/bin:/bin"],
    )
    streamed = f"sha256:{reader.sha.hexdigest()}"
    if streamed != built.digest:
        raise RuntimeUnavailable(f"the root filesystem changed since it was built ({streamed} != {built.digest}); "
                                 "rebuild it: manage.py build_rootfs --force --docker")
    layers = client.images.get(rootfs.IMAGE).attrs["RootFS"]["Layers"]
    if layers != [built.digest]:
        raise RuntimeUnavailable(f"docker stored the layer as {layers}, not {built.digest}")
    return client.images.get(rootfs.IMAGE).id
