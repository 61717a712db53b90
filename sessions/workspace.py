"""The workspace: files written and read through the API, and the filtered checkout of an
allowlisted local git repository a session may start from.

Every file operation runs inside the sandbox, as its uid 65534, through a fixed Python program
(`python3 -I`): the workspace quota (a tmpfs of the policy's disk_mb) applies, and no path,
symlink or hard link can reach anything the sandbox itself could not. The program walks each
path component with O_NOFOLLOW, so a symlink the agent planted is refused, not followed.

A write is atomic: the bytes go to a new hidden file beside the target, which replaces the target
by rename(2) only once all of them are in, before the write's deadline. Anything that goes wrong
first (the quota, a short body, the deadline, a kill) leaves the old file exactly as it was and
no partial file (docs/architecture.md, "Workspace files")."""

import fnmatch
import io
import json
import subprocess
import tarfile
import time
from dataclasses import dataclass

from django.conf import settings

from sessions.runtimes.base import WORKSPACE, Chunk, Driver, ExitStatus, Sandbox

MAX_PATH = 1024
MAX_LIST_ENTRIES = 10_000
FILE_PROGRAM = r"""
import errno, json, os, secrets, signal, stat, sys, tarfile, time
op, path, limit, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
TEMP = ".airlock-put-"

class NotRegular(Exception):
    pass

def out_of_time(signum, frame):
    raise OSError(errno.ETIMEDOUT, "past the deadline")

# Stop before the driver's watchdog would SIGKILL us: a kill skips the cleanup below.
signal.signal(signal.SIGALRM, out_of_time)
signal.setitimer(signal.ITIMER_REAL, max(deadline - time.time(), 0.001))

def sweep(fd):  # what a write killed before its cleanup left (its whole sandbox killed, say)
    for name in os.listdir(fd):
        if name.startswith(TEMP) and stat.S_ISREG(os.lstat(name, dir_fd=fd).st_mode):
            os.unlink(name, dir_fd=fd)

def parent_fd(parts, create):
    fd = os.open("/workspace", os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    for part in parts:
        if create:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
        except NotADirectoryError:
            if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                raise OSError(errno.ELOOP, part) from None
            raise
        os.close(fd)
        fd = child
    return fd

try:
    parts = [] if path == "." else path.split("/")
    if op == "put":  # `limit` is the exact length of the new content
        fd = parent_fd(parts[:-1], True)
        name, mode = parts[-1], 0o644
        try:
            old = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISLNK(old.st_mode):
                raise OSError(errno.ELOOP, name)
            if stat.S_ISDIR(old.st_mode):
                raise OSError(errno.EISDIR, name)
            if not stat.S_ISREG(old.st_mode):  # a FIFO, socket or device is never replaced
                raise NotRegular
            mode = stat.S_IMODE(old.st_mode)
        sweep(fd)
        temp = TEMP + secrets.token_hex(8)
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=fd)
        try:
            written = 0
            with os.fdopen(out, "wb") as f:
                while block := sys.stdin.buffer.read(65536):
                    written += len(block)
                    f.write(block)
                f.flush()
                os.fchmod(f.fileno(), mode)
            if written != limit:
                raise OSError(errno.EPIPE, "short body")
            signal.setitimer(signal.ITIMER_REAL, 0)  # no alarm between the rename and the answer
            if time.time() > deadline:
                raise OSError(errno.ETIMEDOUT, "past the deadline")
            os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=fd)
            except FileNotFoundError:
                pass
            raise
    elif op == "get":
        fd = parent_fd(parts[:-1], False)
        try:  # O_NONBLOCK: opening a FIFO never waits for a writer
            src = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket
                raise NotRegular from None
            raise
        kind = os.fstat(src).st_mode
        if stat.S_ISDIR(kind):
            raise OSError(errno.EISDIR, parts[-1])
        if not stat.S_ISREG(kind):
            raise NotRegular
        with os.fdopen(src, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            sys.stderr.write("EFBIG")
            sys.exit(3)
        sys.stdout.buffer.write(data)
    elif op == "list":  # `limit` is the most entries told; links are listed, never followed
        # Its own walk: every directory opened O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK, so one the
        # program swaps for a FIFO or a link mid-walk is skipped, never waited on or followed.
        entries, truncated, size = [], False, 0
        stack = [(parent_fd(parts, False), "" if path == "." else path, 0)]
        while stack and not truncated:
            fd, prefix, depth = stack.pop()
            try:
                names = sorted(os.listdir(fd))
            except OSError:
                names = []
            below = []
            for name in names:
                if name.startswith(TEMP):
                    continue
                try:
                    info = os.lstat(name, dir_fd=fd)
                except OSError:  # gone since the listing: not there
                    continue
                if len(entries) == limit or size > 4_000_000:
                    truncated = True
                    break
                kind = ("dir" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode)
                        else "symlink" if stat.S_ISLNK(info.st_mode) else "other")
                shown = os.fsencode(name).decode("utf-8", "backslashreplace")  # a name that is not UTF-8
                relative = f"{prefix}/{shown}" if prefix else shown
                size += len(relative) + 64
                entries.append({"path": relative, "type": kind, "size": info.st_size if kind == "file" else None,
                                "mode": oct(stat.S_IMODE(info.st_mode)), "mtime": int(info.st_mtime)})
                if kind == "dir":
                    if depth >= 32:
                        truncated = True  # deeper than this is not walked (and says so)
                        continue
                    try:
                        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | NOFOLLOW, dir_fd=fd)
                    except OSError:
                        continue
                    below.append((child, relative, depth + 1))
            os.close(fd)
            stack.extend(reversed(below))  # depth first, in name order
        for fd, _, _ in stack:
            os.close(fd)
        sys.stdout.write(json.dumps({"entries": entries, "truncated": truncated}))
    elif op == "untar":
        # The archive was built by the control plane (regular files and directories, relative
        # names without `..`); bookworm's Python predates extraction filters.
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
            archive.extractall("/workspace")
except NotRegular:
    sys.stderr.write("ENOTREG")
    sys.exit(3)
except OSError as exc:
    sys.stderr.write(errno.errorcode.get(exc.errno, "EIO"))
    sys.exit(3)
"""
QUOTA_DETAIL = ("the workspace is full (its size is the policy's limits.disk_mb), and a replaced file needs room "
                "for its old and new content until the write lands; free space by writing an empty file over a "
                "large one, then write again")
ERRORS = {
    "ENOENT": ("not_found", "no such file in the workspace"),
    "EISDIR": ("is_a_directory", "the path is a directory: a directory is listed (GET …/files?path=), not read "
               "or written"),
    "ENAMETOOLONG": ("name_too_long", "a name in the path is longer than 255 bytes, the most the workspace holds"),
    "ENOTDIR": ("not_a_directory", "a component of the path is not a directory"),
    "ELOOP": ("symlink_refused", "the path goes through a symbolic link; links are never followed"),
    "ENOSPC": ("quota_exceeded", QUOTA_DETAIL),
    "EDQUOT": ("quota_exceeded", QUOTA_DETAIL),
    "EFBIG": ("file_too_large", "the file is larger than the API serves"),
    "EACCES": ("permission_denied", "the sandbox's user may not access this path"),
    "ENOTREG": ("not_a_regular_file", "the path is a FIFO, socket or device: only regular files are read or written "
                "through the API"),
    "EPIPE": ("workspace_error", "the file's content did not arrive whole; the workspace is unchanged"),
    "ETIMEDOUT": ("runner_timeout", "the file operation did not finish in time; nothing was written"),
}
# A write lands within this long after the API sends it, or never: the API waits longer than
# this, so its 504 means the write did not land and never will.
WRITE_DEADLINE_S = 60


class WorkspaceError(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


def normalize_path(path: str) -> str:
    """A workspace-relative path, or ValueError: no absolute paths, no `..`, no empty parts."""
    if not path or len(path) > MAX_PATH or "\0" in path or path.startswith("/"):
        raise ValueError("give a relative path inside the workspace, such as tests/test_app.py")
    parts = path.split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise ValueError("the path may not hold empty, `.` or `..` components")
    return path


def _run(driver: Driver, sandbox: Sandbox, op: str, path: str, *, stdin: bytes | None = None,
         limit: int = 0, deadline: float | None = None) -> bytes:
    """`deadline`: a wall-clock time (a sandbox shares its host's clock) by which the operation
    is over. The driver kills it then (or at the policy's command_timeout_s, if sooner); the
    program itself stops a little before, so a write always cleans up, and checks once more just
    before it lands."""
    now = time.time()
    deadline = min(deadline or now + WRITE_DEADLINE_S, now + sandbox.spec.limits.command_timeout_s)
    remaining = deadline - now
    if remaining <= 0:
        raise WorkspaceError(*ERRORS["ETIMEDOUT"])
    stop_at = deadline - min(1.0, remaining / 4)
    stdout, stderr, status = [], [], None
    argv = ["python3", "-I", "-c", FILE_PROGRAM, op, path, str(limit), repr(stop_at)]
    for item in driver.exec(sandbox, argv, cwd=WORKSPACE, stdin=stdin, timeout_s=remaining, egress=False):
        if isinstance(item, Chunk):
            (stdout if item.stream == "stdout" else stderr).append(item.data)
        elif isinstance(item, ExitStatus):
            status = item
    if status is not None and status.reason == "timeout":
        raise WorkspaceError(*ERRORS["ETIMEDOUT"])
    if status is None or status.exit_code != 0:
        name = b"".join(stderr).decode(errors="replace").strip().rsplit("\n", 1)[-1]
        if name in ERRORS:
            raise WorkspaceError(*ERRORS[name])
        reason = status.reason if status else "no exit status"
        raise WorkspaceError("workspace_error", f"the workspace operation failed ({reason}: {name[:200]})")
    return b"".join(stdout)


def file_put(driver: Driver, sandbox: Sandbox, path: str, data: bytes, *, deadline: float | None = None) -> None:
    _run(driver, sandbox, "put", normalize_path(path), stdin=data, limit=len(data), deadline=deadline)


def file_get(driver: Driver, sandbox: Sandbox, path: str, *, max_bytes: int) -> bytes:
    return _run(driver, sandbox, "get", normalize_path(path), limit=max_bytes)


def file_list(driver: Driver, sandbox: Sandbox, path: str, *, max_entries: int = MAX_LIST_ENTRIES) -> dict:
    """`{entries: [{path, type, size, mode, mtime}], truncated}` under a directory (`.`: the
    whole workspace), depth first, sorted by name; symbolic links are listed, not followed."""
    return json.loads(_run(driver, sandbox, "list", "." if path == "." else normalize_path(path), limit=max_entries))


# -- checkout of an allowlisted repository --------------------------------------------------

# Never copied into a workspace, wherever they sit in the tree.
EXCLUDED = (
    ".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.keystore", "id_rsa*", "id_dsa*",
    "id_ecdsa*", "id_ed25519*", ".netrc", ".npmrc", ".pypirc", ".git-credentials", ".dockercfg", "credentials",
    "credentials.*", "*.tfstate", "*.tfvars", "secrets", "secrets.*",
)
EXCLUDED_DIRS = (".git", ".ssh", ".aws", ".gnupg", ".docker", ".kube")


@dataclass(frozen=True)
class Checkout:
    archive: bytes
    files: int
    skipped: list[str]


def allowed_repositories(tenant: str) -> dict[str, str]:
    """Name → path of the repositories a tenant's sessions may start from: those shared with
    every tenant, and its own (which win over a shared one of the same name)."""
    shared, own = {}, {}
    for entry, path in settings.AIRLOCK_WORKSPACE_REPOS:
        scope, _, name = entry.rpartition(":")
        if scope == "":
            shared[name] = path
        elif scope == tenant:
            own[name] = path
    return {**shared, **own}


def excluded(path: str) -> bool:
    """Case-insensitive; a directory named like a secret (`credentials/`, `secrets/`) excludes
    everything under it."""
    parts = path.lower().split("/")
    if any(part in EXCLUDED_DIRS for part in parts[:-1]):
        return True
    return any(fnmatch.fnmatchcase(part, pattern) for part in parts for pattern in EXCLUDED)


def repository_archive(path: str, *, ref: str = "HEAD") -> Checkout:
    """The tracked files of `ref` (never `.git`, so no remote credentials in .git/config), as
    regular files and directories only, without anything that looks like a secret."""
    result = subprocess.run(
        ["/usr/bin/git", "-c", f"safe.directory={path}", "-C", path, "archive", "--format=tar", ref],
        capture_output=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    if result.returncode != 0:
        raise WorkspaceError("checkout_failed", f"git archive failed: {result.stderr.decode(errors='replace')[:300]}")
    out = io.BytesIO()
    files, skipped = 0, []
    with tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:") as source, \
            tarfile.open(fileobj=out, mode="w") as target:
        for member in source:
            name = member.name.rstrip("/")
            unsafe = name.startswith("/") or ".." in name.split("/")
            if not (member.isfile() or member.isdir()) or unsafe or excluded(name):
                skipped.append(member.name)
                continue
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
            files += member.isfile()
    return Checkout(archive=out.getvalue(), files=files, skipped=skipped)


def checkout(driver: Driver, sandbox: Sandbox, repository: str) -> Checkout:
    repositories = allowed_repositories(sandbox.spec.tenant)
    if repository not in repositories:
        raise WorkspaceError("repository_not_allowed", f"{repository!r} is not an allowlisted repository")
    result = repository_archive(repositories[repository])
    _run(driver, sandbox, "untar", ".", stdin=result.archive)
    return result
