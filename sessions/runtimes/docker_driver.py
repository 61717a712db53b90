"""The Docker driver (runc, or gVisor with `isolation: gvisor`), through the docker SDK.

One container per session. The container has no network, a read-only root (the imported
debootstrap tree), no-new-privileges, pids / memory / CPU limits, and
size-limited tmpfs mounts for /workspace and /tmp, the only writable places: no /dev/shm (IPC
mode `none`) and a read-only /dev/mqueue.

Its main process, pid 1, is Airlock's supervisor (supervisor.c), which runs every command and
collects every orphan (no docker-init: under gVisor one more process costs ~25 ms): the runner
sends it requests and reads its frames over the container's attach stream (channel.py), so a
command costs no `docker exec`. The supervisor runs as the container's root with three
capabilities only (SETUID and SETGID to drop a command to uid 65534, KILL to end whatever the
command left); each command runs as 65534 without any.
It kills the command's whole tree on timeout, kill and output limit, and everything a command
left behind after it ends, so nothing a command started outlives it."""

import contextlib
import hashlib
import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import LogConfig, Ulimit
from requests.exceptions import RequestException

from sessions.runtimes import deadlines, rootfs, seccomp
from sessions.runtimes.base import (
    EGRESS_MOUNT,
    INODES_PER_MB,
    WORKSPACE,
    Chunk,
    Driver,
    ExitStatus,
    Limits,
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
from sessions.runtimes.channel import (
    CLOSED,
    DISK_REQUEST,
    ChannelClosed,
    SupervisorChannel,
    exec_request,
    kill_request,
)

log = logging.getLogger("airlock.runtimes")
LABEL_SESSION = "airlock.session"
LABEL_DRIVER = "airlock.driver"
LABEL_POOL = "airlock.pool"
POOL_PREFIX = "airlock-pool-"
GVISOR_RUNTIME = "runsc"
RUNSC_FIX = (
    "register gVisor with Docker: apt-get install -y runsc, put "
    '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]}}} '
    "in /etc/docker/daemon.json, then reload dockerd (kill -HUP $(pidof dockerd))"
)
SUPERVISOR_CAPS = ["SETUID", "SETGID", "KILL"]
READY_S = 30  # for the supervisor's first frame (gVisor's start on a loaded host is slow)
UNRESPONSIVE_S = 5  # past a command's deadline, a supervisor that has not ended it is given up on
DRAIN_S = 10  # for a command whose consumer stopped reading to be killed and drained
STATS_S = 2
STATE_S = 2  # for the daemon to record the end of a container whose stream has ended


@dataclass
class _Running:
    id: int
    reason: str | None = None  # set here only when the supervisor stopped answering
    gave_up_at: float = 0.0


MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                "/sys/devices/virtual/powercap", "/proc/cmdline"]


class DockerDriver(Driver):
    supports_pool = True

    def __init__(self, *, isolation: str = "standard", base_url: str | None = None,
                 gvisor_runtime: str = GVISOR_RUNTIME):
        self.isolation = isolation
        self.gvisor_runtime = gvisor_runtime
        self.name = "gvisor" if isolation == "gvisor" else "docker"
        self.base_url = base_url
        self._client: docker.DockerClient | None = None
        self._running: dict[str, _Running] = {}
        self._channels: dict[str, SupervisorChannel] = {}
        self._ids = itertools.count(1)
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
        if not (rootfs.require().path / rootfs.SUPERVISOR.lstrip("/")).exists():
            raise RuntimeUnavailable(f"the root filesystem has no supervisor, its sandboxes' pid 1 (it was built "
                                     f"without a C compiler); {rootfs.SUPERVISOR_FIX}")
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
        return self._make(spec, name=f"airlock-{spec.session_id}",
                          labels={LABEL_SESSION: spec.session_id, "airlock.tenant": spec.tenant})

    def prepare(self, limits: Limits, *, pool_id: str, egress_dir: str | None = None) -> Sandbox:
        """A started sandbox for the warm pool (pool.py): nobody's yet, named airlock-pool-<id>.
        Its egress directory is mounted empty only where the session's proxy can be reached."""
        self.check()
        egress_dir = egress_dir if self._host_uds else None
        sandbox = self._make(SandboxSpec(tenant="", session_id=pool_id, limits=limits, egress_dir=egress_dir),
                             name=f"{POOL_PREFIX}{pool_id}", labels={LABEL_SESSION: pool_id, LABEL_POOL: "1"},
                             warm=True)
        if egress_dir is not None:
            sandbox.handle["egress_dir"] = egress_dir
        return sandbox

    def bind(self, sandbox: Sandbox, spec: SandboxSpec) -> Sandbox:
        """Make a pooled sandbox the session's: it takes the session's name (so it is listed,
        reaped and destroyed as the session's), tenant and spec; its workspace and processes
        are as the pool made them, untouched. The environment is bound per command. (Its labels
        stay the pool's: Docker cannot change them; names are what lists and reaps go by.)"""
        self._channel(sandbox)  # its supervisor still answers (else SandboxError: it died waiting)
        try:
            self.client.api.rename(sandbox.handle["container"], f"airlock-{spec.session_id}")
        except (DockerException, RequestException) as exc:
            raise SandboxError(f"docker could not claim the pooled sandbox: {exc}") from None
        with self._lock:
            channel = self._channels.pop(sandbox.id, None)
            if channel is not None:
                self._channels[spec.session_id] = channel
        return Sandbox(id=spec.session_id, driver=self.name, spec=spec, rootfs_digest=sandbox.rootfs_digest,
                       handle={**sandbox.handle, "tenant": spec.tenant, "pool_id": sandbox.id}, cache_hit=True,
                       warm=True)

    def pooled(self) -> list[tuple[str, str, float]]:
        """(id, state, seconds since creation) of every pooled sandbox of this driver on the host."""
        found = []
        for container in self._containers(pool=True):
            created = container.attrs.get("Created", "")
            found.append((container.name.removeprefix(POOL_PREFIX), container.status, _age_s(created)))
        return found

    def _make(self, spec: SandboxSpec, *, name: str, labels: dict, warm: bool = False) -> Sandbox:
        limits = spec.limits
        tmpfs_options = "uid=65534,gid=65534,nosuid,nodev,exec"
        # gVisor's tmpfs lives in its own kernel's memory, which the sandbox's memory limit bounds.
        workspace_inodes = "" if self.isolation == "gvisor" else f",nr_inodes={limits.disk_mb * INODES_PER_MB}"
        pids_options = {"pids_limit": limits.pids}
        if self.isolation == "gvisor":
            # The host's pids cgroup counts the gVisor kernel's own threads (measured here: ~7
            # per guest process under the ptrace platform), and the sandbox dies when it cannot
            # make one, so it only guards the host; the guest's limit is its RLIMIT_NPROC, which
            # gVisor enforces per uid. It counts a process under the uid that forked it, so the
            # command itself (forked by the supervisor as root, then 65534) is not counted: one less.
            nproc = max(1, limits.pids - 1)
            pids_options = {"pids_limit": limits.pids * 16 + 256,
                            "ulimits": [Ulimit(name="nproc", soft=nproc, hard=nproc)]}
        try:
            api = self.client.api
            host_config = api.create_host_config(
                network_mode="none", read_only=True, cap_drop=["ALL"], cap_add=SUPERVISOR_CAPS,
                security_opt=self._security_options(), ipc_mode="none",
                **pids_options, mem_limit=limits.memory_mb * 2**20, memswap_limit=limits.memory_mb * 2**20,
                nano_cpus=int(limits.cpus * 1e9),
                tmpfs={WORKSPACE: f"size={limits.disk_mb}m,mode=0700,{tmpfs_options}{workspace_inodes}",
                       "/tmp": f"size={limits.tmp_mb}m,mode=0700,{tmpfs_options}",  # noqa: S108
                       "/dev/mqueue": "ro,size=4k,mode=0555"},
                runtime=self.gvisor_runtime if self.isolation == "gvisor" else None,
                log_config=LogConfig(type="none"),
                # The session's egress socket and forwarder, when its policy allows egress.
                binds={spec.egress_dir: {"bind": EGRESS_MOUNT, "mode": "ro"}} if spec.egress_dir else None,
            )
            # Docker's own masked paths, and the host's boot options: /proc/cmdline is not the
            # sandbox's business (the Engine API's HostConfig.MaskedPaths replaces the default list).
            host_config["MaskedPaths"] = MASKED_PATHS
            # A pool's gVisor sandbox, idle until claimed, warms up meanwhile (supervisor.c, warm).
            # Attached stdin, closed when the runner's end closes (it died, or let go): that ends
            # the supervisor, and the sandbox with it.
            container = api.create_container(
                rootfs.IMAGE, [rootfs.SUPERVISOR, *(["warm"] if warm and self.isolation == "gvisor" else [])],
                name=name,
                hostname="sandbox", user="0:0", working_dir="/", environment={}, stdin_open=True, detach=False,
                labels={**labels, LABEL_DRIVER: self.name, rootfs.DIGEST_LABEL: self.image_digest},
                host_config=host_config,
            )
        except APIError as exc:
            if exc.status_code == 409:
                raise SandboxError(f"sandbox {name} already exists") from None
            raise SandboxError(f"docker could not create the sandbox: {exc.explanation}") from None
        except (DockerException, RequestException) as exc:  # the daemon went away after check()
            raise RuntimeUnavailable(_daemon_fix(exc)) from None
        sandbox = Sandbox(id=spec.session_id, driver=self.name, spec=spec, rootfs_digest=self.image_digest,
                          handle={"container": container["Id"]}, cache_hit=not self._image_imported)
        self._image_imported = False  # the next sandbox finds the image in the cache
        try:
            self._start_supervisor(sandbox)
        except BaseException:
            self.destroy(sandbox)
            raise
        return sandbox

    def _start_supervisor(self, sandbox: Sandbox) -> None:
        """Attach to the container before it starts (so no frame is lost), start it, and wait
        for its supervisor's first frame."""
        api = self.client.api
        try:
            sock = api.attach_socket(sandbox.handle["container"],
                                     params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            channel = SupervisorChannel(getattr(sock, "_sock", sock), sandbox.id)
            with self._lock:
                self._channels[sandbox.id] = channel
            api.start(sandbox.handle["container"])
        except APIError as exc:
            raise SandboxError(f"docker could not start the sandbox: {exc.explanation}") from None
        except (DockerException, RequestException) as exc:
            raise RuntimeUnavailable(_daemon_fix(exc)) from None
        try:
            ready = channel.reply(READY_S)
        except ChannelClosed as exc:
            raise SandboxError(f"the sandbox's supervisor did not start: {exc}") from None
        if ready.get("reply") != "ready":
            raise SandboxError(f"the sandbox's supervisor said {ready!r} first, not that it is ready")

    def _channel(self, sandbox: Sandbox) -> SupervisorChannel:
        with self._lock:
            channel = self._channels.get(sandbox.id)
        if channel is None or channel.closed.is_set():
            raise SandboxError("the sandbox is not running (under gVisor an out-of-memory kill ends it)")
        return channel

    def destroy(self, sandbox: Sandbox) -> None:
        """By its container's id: no listing of the host's containers on a session's end."""
        try:
            self.client.api.remove_container(sandbox.handle["container"], force=True, v=True)
        except NotFound:
            pass
        except (DockerException, RequestException) as exc:
            if isinstance(exc, APIError):
                raise SandboxError(f"docker could not remove the sandbox: {exc.explanation}") from None
            raise RuntimeUnavailable(_daemon_fix(exc)) from None
        self._close_channel(sandbox.id)

    def destroy_by_id(self, sandbox_id: str) -> None:
        for container in self._containers(sandbox_id):
            with contextlib.suppress(NotFound):
                container.remove(force=True, v=True)
        self._close_channel(sandbox_id)

    def _close_channel(self, sandbox_id: str) -> None:
        with self._lock:
            channel = self._channels.pop(sandbox_id, None)
        if channel is not None:
            channel.close()

    def list_sandboxes(self) -> list[str]:
        """Sessions' sandboxes, by their names (a pooled one takes its session's when claimed)."""
        return sorted(name for name in (_session_of(c.name) for c in self._containers()) if name)

    def _containers(self, sandbox_id: str | None = None, *, pool: bool = False) -> list:
        filters = [f"{LABEL_DRIVER}={self.name}"] + ([LABEL_POOL] if pool else [])
        name = {"name": sandbox_id} if sandbox_id else {}  # Docker matches part of a name; exactly below
        try:
            found = self.client.containers.list(all=True, filters={"label": filters, **name})
        except (DockerException, RequestException) as exc:
            raise RuntimeUnavailable(_daemon_fix(exc)) from None
        if pool:
            return [c for c in found if c.name.startswith(POOL_PREFIX)]
        if sandbox_id:
            return [c for c in found if c.name in {f"airlock-{sandbox_id}", f"{POOL_PREFIX}{sandbox_id}"}]
        return found

    # -- commands --------------------------------------------------------------------------
    def exec(
        self, sandbox: Sandbox, argv: Sequence[str], *, cwd: str = WORKSPACE,
        env: Mapping[str, str] | None = None, timeout_s: float | None = None, stdin: Stdin | None = None,
        egress: bool = True, bulk: bool = False,
    ) -> Iterator[Chunk | ExitStatus]:
        check_argv(argv)
        argv = egress_argv(sandbox.spec, argv) if egress else list(argv)
        cwd = workspace_cwd(cwd)
        limits = sandbox.spec.limits
        timeout_s = min(timeout_s or limits.command_timeout_s, limits.command_timeout_s)
        channel = self._channel(sandbox)
        started = time.monotonic()
        running = _Running(id=next(self._ids) % 2**32)
        with self._lock:
            if sandbox.id in self._running:
                raise SandboxError("a command is already running in this sandbox")
            self._running[sandbox.id] = running
        try:
            channel.send(exec_request(running.id, argv, cwd, sandbox_env(sandbox.spec, env), timeout_s,
                                      limits.max_output_bytes,
                                      stdin if stdin is None or isinstance(stdin, bytes) else stdin.read()))
        except ChannelClosed:
            with self._lock:
                self._running.pop(sandbox.id, None)
            raise SandboxError("the sandbox is not running (under gVisor an out-of-memory kill ends it)") from None
        except ValueError as exc:  # what exec cannot take fails the command, as exec would, not the sandbox
            with self._lock:
                self._running.pop(sandbox.id, None)
            yield Chunk(stream="stderr", data=f"airlock: cannot run {argv[0]!r}: {exc}\n".encode(errors="replace"))
            yield ExitStatus(exit_code=127, reason="exited", duration_ms=round((time.monotonic() - started) * 1000),
                             output_bytes=0)
            return
        # The supervisor keeps the deadline; this one holds if the supervisor itself stops.
        backstop = deadlines.after(timeout_s + UNRESPONSIVE_S, lambda: self._give_up(sandbox, running))
        ended, output_bytes = None, 0
        try:
            for kind, payload in self._frames(channel, running):
                if kind == b"x":
                    ended = payload
                    break
                output_bytes += len(payload)
                yield Chunk(stream="stdout" if kind == b"1" else "stderr", data=payload)
        finally:
            backstop.cancel()
            if ended is None and not channel.closed.is_set():
                self._drain(channel, running)  # the consumer stopped reading: stop the command
            with self._lock:
                self._running.pop(sandbox.id, None)
        exit_code, reason = self._outcome(sandbox, ended, running)
        yield ExitStatus(exit_code=exit_code, reason=reason, duration_ms=round((time.monotonic() - started) * 1000),
                         output_bytes=output_bytes)

    def _outcome(self, sandbox: Sandbox, ended: dict | None, running: _Running) -> tuple[int | None, str]:
        if ended is None:  # the stream ended: the container died, or the supervisor stopped answering
            state = self._container_state(sandbox)
            deadline = time.monotonic() + STATE_S
            while state.get("Running") and time.monotonic() < deadline:  # the daemon has yet to see it end
                time.sleep(0.02)
                state = self._container_state(sandbox)
            return None, "oom" if state.get("OOMKilled") else (running.reason or "killed")
        reason = ended["reason"]
        if reason in {"timeout", "killed", "output_limit"}:
            return None, reason
        code = ended["exit_code"]
        return (128 - code if code < 0 else code), reason

    def _frames(self, channel: SupervisorChannel, running: _Running, *,
                until: float | None = None) -> Iterator[tuple[bytes, bytes | dict]]:
        """The running command's frames, its exit last (b"x", as a dict). They stop early when
        the stream ends (the end-marker is missed only if it could not be queued), at `until`,
        or once the backstop gave up on the supervisor and even killing the container failed."""
        while True:
            try:
                kind, payload = channel.events.get(timeout=1)
            except queue.Empty:
                now = time.monotonic()
                abandoned = running.gave_up_at and now - running.gave_up_at > DRAIN_S
                if channel.closed.is_set() or abandoned or (until is not None and now > until):
                    return
                continue
            if (kind, payload) == CLOSED:
                return
            if kind != b"x":
                yield kind, payload
                continue
            message = json.loads(payload)
            if message["id"] == running.id:  # (an earlier command's exit, drained late, is not its)
                yield kind, message
                return

    def _drain(self, channel: SupervisorChannel, running: _Running) -> None:
        """Kill a command nobody reads any more and drop what is left of it, up to its exit."""
        with contextlib.suppress(ChannelClosed):
            channel.send(kill_request(running.id))
        for kind, _ in self._frames(channel, running, until=time.monotonic() + DRAIN_S):
            if kind == b"x":
                return
        if not channel.closed.is_set():
            log.warning("a command's supervisor did not end it within %s s of a kill", DRAIN_S)

    def _give_up(self, sandbox: Sandbox, running: _Running) -> None:
        """The supervisor let a command run past its deadline: the sandbox stops (the stream
        ends, and the command with it)."""
        running.reason, running.gave_up_at = "timeout", time.monotonic()
        with contextlib.suppress(DockerException, RequestException):
            self.client.api.kill(sandbox.handle["container"])

    def _container_state(self, sandbox: Sandbox) -> dict:
        try:
            return self.client.api.inspect_container(sandbox.handle["container"])["State"]
        except (NotFound, DockerException, RequestException):
            return {}

    def kill(self, sandbox: Sandbox) -> None:
        """Ask the supervisor to kill the running command (it answers with the command's exit
        `killed`); a kill that comes after its command ended names it, so reaches nothing."""
        with self._lock:
            running = self._running.get(sandbox.id)
            channel = self._channels.get(sandbox.id)
        if running is not None and channel is not None:
            with contextlib.suppress(ChannelClosed):
                channel.send(kill_request(running.id))

    def stats(self, sandbox: Sandbox) -> Stats:
        try:
            raw = self.client.api.stats(sandbox.handle["container"], stream=False)
        except (DockerException, RequestException):  # gone meanwhile: an empty answer, not JSON
            return Stats(cpu_s=None, memory_bytes=None, disk_bytes=None)
        cpu_ns = raw.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage")
        memory = raw.get("memory_stats", {}).get("max_usage") or raw.get("memory_stats", {}).get("usage")
        return Stats(cpu_s=cpu_ns / 1e9 if cpu_ns else None, memory_bytes=memory, disk_bytes=self._disk(sandbox))

    def _disk(self, sandbox: Sandbox) -> int | None:
        try:
            return int(self._channel(sandbox).ask(DISK_REQUEST, STATS_S)["used"])
        except (SandboxError, ChannelClosed, KeyError, TypeError, ValueError):
            return None


def _session_of(name: str) -> str | None:
    """The session id in a sandbox container's name, airlock-<uuid>; None for a pooled one."""
    rest = name.removeprefix("airlock-")
    return rest if rest != name and is_uuid(rest) else None


def _age_s(created: str) -> float:
    """Seconds since Docker's `Created` (RFC 3339 with nanoseconds)."""
    try:
        stamp = datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00")
    except ValueError:
        return 0.0
    return (datetime.now(UTC) - stamp).total_seconds()


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
