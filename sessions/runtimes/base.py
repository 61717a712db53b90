"""The sandbox driver interface: one contract, several runtimes (bubblewrap, Docker, gVisor).

A driver turns a SandboxSpec into a Sandbox, runs argv lists in it (never a shell), streams
their output as Chunk events that end with one ExitStatus, and destroys it without a trace.
Every driver passes the same conformance suite (tests/runtimes/)."""

import posixpath
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Literal

WORKSPACE = "/workspace"
Stdin = bytes | BinaryIO  # a command's whole standard input: bytes, or a file (with a descriptor) from where it stands
ExitReason = Literal["exited", "timeout", "killed", "oom", "output_limit"]
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# A session whose policy allows egress: its proxy's socket directory appears here, and each
# command runs behind the forwarder, which listens on the sandbox's loopback at EGRESS_PORT.
EGRESS_MOUNT = "/run/airlock"
EGRESS_SOCKET = "proxy.sock"
EGRESS_FORWARDER = "forward.py"
EGRESS_PORT = 3128


class RuntimeUnavailable(Exception):
    """The driver cannot work on this host. The message names the fix, in one line."""


class SandboxError(Exception):
    """A sandbox could not be created, used or destroyed."""


@dataclass(frozen=True)
class Limits:
    cpus: float = 1.0
    memory_mb: int = 512
    pids: int = 128
    disk_mb: int = 256
    tmp_mb: int = 64
    command_timeout_s: float = 15.0
    max_output_bytes: int = 16 << 20  # past this the command is killed with reason output_limit


@dataclass(frozen=True)
class SandboxSpec:
    tenant: str
    session_id: str
    limits: Limits = field(default_factory=Limits)
    env: Mapping[str, str] = field(default_factory=dict)
    network: Literal["none"] = "none"
    isolation: Literal["standard", "gvisor"] = "standard"
    # The host directory holding this session's egress proxy socket and the forwarder, mounted
    # read-only at EGRESS_MOUNT in this sandbox alone; None: no way out at all.
    egress_dir: str | None = None

    def __post_init__(self):
        # Ids become paths, cgroup and container names: only canonical UUIDs.
        if not is_uuid(self.session_id):
            raise SandboxError(f"session id {self.session_id!r} is not a canonical UUID")
        if self.network != "none":
            raise SandboxError(f"network {self.network!r} is not supported; sandboxes have no network")
        if self.egress_dir is not None and not posixpath.isabs(self.egress_dir):
            raise SandboxError(f"egress_dir {self.egress_dir!r} is not an absolute path")


@dataclass
class Sandbox:
    id: str
    driver: str
    spec: SandboxSpec
    rootfs_digest: str
    handle: dict = field(default_factory=dict)  # driver-specific: paths, container id
    cache_hit: bool = True  # the root filesystem (or its image) was ready in the local cache
    warm: bool = False  # claimed from a warm pool (pool.py), not started for its session


@dataclass(frozen=True)
class Chunk:
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int | None
    reason: ExitReason
    duration_ms: int
    output_bytes: int = 0


@dataclass(frozen=True)
class Stats:
    cpu_s: float | None
    memory_bytes: int | None
    disk_bytes: int | None


def sandbox_env(spec: "SandboxSpec", exec_env: Mapping[str, str] | None) -> dict[str, str]:
    """The whole environment of a sandboxed process: built from the policy, nothing inherited.
    With egress, every variable a common client reads for its proxy names the forwarder."""
    env = {"PATH": DEFAULT_PATH, "HOME": WORKSPACE, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}  # noqa: S108
    if spec.egress_dir is not None:
        env.update(PROXY_ENV)
    env.update(spec.env)
    env.update(exec_env or {})
    return env


_PROXY = f"http://127.0.0.1:{EGRESS_PORT}"
# Files a workspace may hold, per MB of its size: its inodes live in the host kernel's memory, so
# a workspace of empty files must stop as one of data does (a node_modules tree: ~10-100k files).
INODES_PER_MB = 1024
# curl, wget, pip (requests), git (libcurl), Python's urllib and most HTTP clients read these;
# npm reads its npm_config_ forms. The sandbox's own loopback stays direct.
PROXY_ENV = {
    **{name: _PROXY for base in ("http_proxy", "https_proxy", "all_proxy") for name in (base, base.upper())},
    "npm_config_proxy": _PROXY, "npm_config_https_proxy": _PROXY,
    "no_proxy": "localhost,127.0.0.1,::1", "NO_PROXY": "localhost,127.0.0.1,::1",
}


def egress_argv(spec: "SandboxSpec", argv: Sequence[str]) -> list[str]:
    """What runs in the sandbox for `argv`: behind the forwarder when the session has egress
    (the sandbox's own Python, isolated from the environment and the working directory)."""
    if spec.egress_dir is None:
        return list(argv)
    return ["/usr/bin/python3", "-I", "-S", f"{EGRESS_MOUNT}/{EGRESS_FORWARDER}", str(EGRESS_PORT),
            f"{EGRESS_MOUNT}/{EGRESS_SOCKET}", "--", *argv]


def is_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except (ValueError, TypeError, AttributeError):
        return False


def check_argv(argv: Sequence[str]) -> None:
    if not argv or not all(isinstance(arg, str) and "\0" not in arg for arg in argv):
        raise SandboxError("argv must be a non-empty list of strings without NUL bytes")


def workspace_cwd(cwd: str) -> str:
    normal = posixpath.normpath(posixpath.join(WORKSPACE, cwd))
    if normal != WORKSPACE and not normal.startswith(WORKSPACE + "/"):
        raise SandboxError(f"cwd {cwd!r} is outside {WORKSPACE}")
    return normal


class Driver(ABC):
    name: str

    @abstractmethod
    def check(self) -> None:
        """Raise RuntimeUnavailable, naming the fix, when this host cannot run the driver."""

    @abstractmethod
    def create(self, spec: SandboxSpec) -> Sandbox: ...

    @abstractmethod
    def exec(
        self, sandbox: Sandbox, argv: Sequence[str], *, cwd: str = WORKSPACE,
        env: Mapping[str, str] | None = None, timeout_s: float | None = None, stdin: Stdin | None = None,
        egress: bool = True, bulk: bool = False,
    ) -> Iterator[Chunk | ExitStatus]:
        """Run argv; yield Chunks as output arrives, then exactly one ExitStatus. `stdin`, when
        given, is the whole of the command's standard input: bytes, or an open file with a
        descriptor, read from where it stands (a driver may hand the file itself to the command,
        which then reads a file, not a pipe); else /dev/null.
        With `egress` (and a session that has it) the command runs behind the forwarder;
        Airlock's own helper programs pass False: they need no network. `bulk`: the command
        writes a great deal at once (a workspace's tar), so the driver may let more of it wait
        for the reader (the writer then runs on while the reader parses)."""

    @abstractmethod
    def kill(self, sandbox: Sandbox) -> None:
        """Kill whatever runs in the sandbox; a running exec ends with reason `killed`."""

    @abstractmethod
    def destroy(self, sandbox: Sandbox) -> None:
        """Kill everything and remove every trace of the sandbox from the host. Idempotent."""

    @abstractmethod
    def list_sandboxes(self) -> list[str]:
        """Ids of every sandbox of this driver present on the host."""

    @abstractmethod
    def destroy_by_id(self, sandbox_id: str) -> None:
        """Destroy a sandbox known only by its id (an orphan left by a dead runner)."""

    @abstractmethod
    def stats(self, sandbox: Sandbox) -> Stats: ...

    # A driver whose sandboxes take long to start keeps a warm pool (pool.py) through these.
    supports_pool = False

    def prepare(self, limits: Limits, *, pool_id: str, egress_dir: str | None = None) -> Sandbox:
        """A started sandbox with these limits that belongs to nobody yet, known as `pool_id`;
        `egress_dir`, an empty directory it mounts at EGRESS_MOUNT for its session's proxy."""
        raise NotImplementedError

    def bind(self, sandbox: Sandbox, spec: SandboxSpec) -> Sandbox:
        """Make a prepared sandbox the one of `spec`'s session."""
        raise NotImplementedError

    def pooled(self) -> list[tuple[str, str, float]]:
        """(id, state, age in seconds) of the prepared sandboxes of this driver on the host."""
        return []

    def list_orphans(self, active_ids: set[str]) -> list[str]:
        return sorted(set(self.list_sandboxes()) - set(active_ids))

    def weaker_here(self) -> list[str]:
        """What this host lets the driver enforce less strictly than the README promises."""
        return []

    def slower_here(self) -> list[str]:
        """Host settings that make the driver slower than it could be, with the fix."""
        return []


class OutputTail:
    """Keeps the last `limit` characters of a stream of bytes, in bounded memory.

    Decoding is incremental, so a multi-byte character split across chunks is not mangled, and
    invalid UTF-8 becomes U+FFFD instead of an error."""

    def __init__(self, limit: int):
        import codecs

        self.limit = limit
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self.total_chars = 0

    def feed(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        self.total_chars += len(text)
        self._text = (self._text + text)[-self.limit:]

    @property
    def text(self) -> str:
        return self._text

    @property
    def truncated(self) -> bool:
        return self.total_chars > self.limit
