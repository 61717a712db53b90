"""Packing a workspace into a tar, and unpacking one, inside the sandbox as its uid 65534.

A whole workspace is packed by the sandbox's own GNU tar (`TAR_ARGV`). `PACK_PROGRAM` (the
sandbox's `python3 -I -S`), for named paths and for a workspace GNU tar cannot read, walks them one directory
descriptor at a time with O_NOFOLLOW: a symbolic link is never followed, neither as a path's
component nor as an entry; links, FIFOs, sockets and devices are left out and named on stderr
(never opened: a FIFO is opened O_NONBLOCK and checked before it is read). It writes regular files
and directories only, with their modes, as ustar (pax for long paths) on stdout; the host reads
that stream as untrusted (tarstream.py). A file or directory its owner made unreadable (mode 000)
is read by giving its owner read access for the moment, then its mode back. Nothing is written
into the workspace, so a workspace at its quota packs too.

Unpacking runs the sandbox's own GNU tar into a stage, a directory of the workspace that no
command sees (none runs before the session is ready), while the host checks the same bytes against
the signed manifest (services.py; on Docker the driver takes the whole input first): regular files
and directories, relative paths, modes kept. `settle` then moves what the stage holds into place
once every check holds, or removes it."""

import dataclasses
import json
from collections.abc import Callable

from sessions.persistence.tarstream import BadTar, TarReader, TooLarge
from sessions.runtimes.base import WORKSPACE, Chunk, Driver, ExitStatus, Sandbox, Stdin
from sessions.workspace import ERRORS as FILE_ERRORS
from sessions.workspace import WorkspaceError

HELPER_TIMEOUT_S = 300  # packing or unpacking (its check included) a large workspace: longer than a command may take
PACK_PROGRAM = r"""
import errno, json, os, stat, sys
limit, roots = int(sys.argv[1]), json.loads(sys.argv[2])
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
DIR = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW
out, total, written = bytearray(), 0, set()

def flush():
    view = memoryview(bytes(out))
    out.clear()
    while view:
        view = view[os.write(1, view):]

def header(name, mode, size, mtime, kind):
    if len(name) > 100:
        record = b" path=" + name + b"\n"
        length = len(record) + len(str(len(record)))
        length = len(record) + len(str(length))  # the length counts its own digits
        record = str(length).encode() + record
        header(b"././@PaxHeader", 0o644, len(record), 0, b"x")
        out.extend(record + b"\0" * (-len(record) % 512))
        name = b""
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:108] = b"%07o\0" % mode
    block[108:124] = b"0000000\x000000000\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"%011o\0" % max(0, min(int(mtime), 0o77777777777))
    block[148:156] = b"        "
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b"%06o\0 " % sum(block)
    out.extend(block)

def skip(why, path):
    sys.stderr.write(json.dumps([why, os.fsdecode(path)]) + "\n")

def readable(name, fd, st, need):
    # Its owner made it unreadable: open it for the moment, keep its mode to write back.
    if st.st_mode & need == need:
        return None
    os.chmod(name, stat.S_IMODE(st.st_mode) | need, dir_fd=fd)  # lstat said: no link (nothing else runs)
    return stat.S_IMODE(st.st_mode)

def add_file(fd, name, path, st):
    global total
    restore = readable(name, fd, st, stat.S_IRUSR)
    try:
        src = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=fd)
    finally:
        if restore is not None:
            os.chmod(name, restore, dir_fd=fd)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return skip("not a regular file", path)
        size = st.st_size
        total += size
        if total > limit:
            sys.stderr.write("EFBIG\n")
            sys.exit(3)
        header(path, stat.S_IMODE(st.st_mode), size, st.st_mtime, b"0")
        left = size
        while left:
            piece = os.read(src, min(left, 1 << 20))
            if not piece:  # it shrank meanwhile: the tar stays whole
                piece = b"\0" * left
            out.extend(piece)
            left -= len(piece)
            if len(out) >= 1 << 20:
                flush()
        out.extend(b"\0" * (-size % 512))
    finally:
        os.close(src)

def add_dir(fd, path, st):
    if path not in written:
        written.add(path)
        header(path, stat.S_IMODE(st.st_mode), 0, st.st_mtime, b"5")
    names = sorted(os.listdir(fd))
    for name in names:
        encoded = os.fsencode(name)
        child = path + b"/" + encoded if path else encoded
        add(fd, name, child)

def add(fd, name, path):
    if path in written:
        return
    try:
        path.decode("utf-8")
    except UnicodeDecodeError:
        return skip("its name is not UTF-8", path)
    st = os.lstat(name, dir_fd=fd)
    if stat.S_ISREG(st.st_mode):
        written.add(path)
        add_file(fd, name, path, st)
    elif stat.S_ISDIR(st.st_mode):
        restore = readable(name, fd, st, stat.S_IRUSR | stat.S_IXUSR)
        try:
            child = os.open(name, DIR, dir_fd=fd)
            try:
                add_dir(child, path, st)
            finally:
                os.close(child)
        finally:
            if restore is not None:
                os.chmod(name, restore, dir_fd=fd)
    else:
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        skip(kind + " (never followed or read)", path)

try:
    top = os.open("/workspace", DIR)
    for root in roots:
        if not root:  # the whole workspace
            for name in sorted(os.listdir(top)):
                add(top, name, os.fsencode(name))
            continue
        parts, fd, path = root.split("/"), os.dup(top), b""
        for part in parts[:-1]:  # its directories, each as itself (never through a link)
            st = os.lstat(part, dir_fd=fd)
            if stat.S_ISLNK(st.st_mode):
                raise OSError(errno.ELOOP, part)
            path = path + b"/" + os.fsencode(part) if path else os.fsencode(part)
            child = os.open(part, DIR, dir_fd=fd)
            if path not in written:
                written.add(path)
                header(path, stat.S_IMODE(st.st_mode), 0, st.st_mtime, b"5")
            os.close(fd)
            fd = child
        last = parts[-1]
        if stat.S_ISLNK(os.lstat(last, dir_fd=fd).st_mode):
            raise OSError(errno.ELOOP, last)
        add(fd, last, os.fsencode(root))
        os.close(fd)
    out.extend(b"\0" * 1024)
    flush()
except OSError as exc:
    sys.stderr.write(errno.errorcode.get(exc.errno, "EIO") + " " + json.dumps(os.fsdecode(exc.filename or "")) + "\n")
    sys.exit(3)
"""
UNPACK_ARGV = ["/bin/tar", "--extract", "--file=-", "--directory", WORKSPACE, "--preserve-permissions",
               "--no-same-owner", "--no-overwrite-dir", "--warning=no-timestamp"]
SETTLE_PROGRAM = r"""
import os, stat, sys
stage, keep = sys.argv[1], sys.argv[2] == "keep"
if not os.path.lexists(stage):  # an empty tree: the tar made no stage
    sys.exit(0)
if keep:
    for name in os.listdir(stage):
        path, mode = stage + "/" + name, os.lstat(stage + "/" + name).st_mode
        locked = stat.S_ISDIR(mode) and not mode & stat.S_IWUSR  # moving a directory rewrites its ".."
        if locked:
            os.chmod(path, stat.S_IMODE(mode) | stat.S_IWUSR)
        os.rename(path, name)
        if locked:
            os.chmod(name, stat.S_IMODE(mode))
    os.rmdir(stage)
else:  # depth first, each directory opened to its owner before it is read
    stack = [stage]
    while stack:
        path = stack[-1]
        os.chmod(path, 0o700)
        inner = []
        for name in os.listdir(path):
            child = path + "/" + name
            if stat.S_ISDIR(os.lstat(child).st_mode):
                inner.append(child)
            else:
                os.unlink(child)
        if inner:
            stack.extend(inner)
        else:
            os.rmdir(stack.pop())
"""
# The packer's errors, as the workspace's file operations name them (one table), and its own.
ERRORS = {**{name: FILE_ERRORS[name] for name in ("ENOENT", "ELOOP", "ENOTDIR", "EACCES")},
          "EFBIG": ("too_large", "the files are larger than the policy's persistence.max_mb")}


@dataclasses.dataclass
class PackResult:
    entries: list[dict]  # {path, type: file | dir, mode, size?, sha256?}
    skipped: list[dict]  # {path, why}
    file_bytes: int


def _helper(sandbox: Sandbox, max_output: int) -> Sandbox:
    """The sandbox as Airlock's own helpers use it: more time and output than a command gets."""
    limits = dataclasses.replace(sandbox.spec.limits, command_timeout_s=HELPER_TIMEOUT_S, max_output_bytes=max_output)
    return dataclasses.replace(sandbox, spec=dataclasses.replace(sandbox.spec, limits=limits))


TAR_ARGV = ["/bin/tar", "--create", "--file=-", "--directory", WORKSPACE, "--format=gnu", "--hard-dereference",
            "--sort=name", "--one-file-system", "."]


class Unreadable(Exception):
    """GNU tar met an entry its owner made unreadable: pack with PACK_PROGRAM instead."""


def pack(driver: Driver, sandbox: Sandbox, roots: list[str], *, max_bytes: int,
         sink: Callable[[bytes], None], careful: bool = False) -> PackResult:
    """Tar `roots` (workspace-relative paths; [""] for the whole workspace) to `sink` as it is made,
    read as untrusted on the way: only regular files and directories reach `sink`. The whole
    workspace goes through the sandbox's GNU tar (links are archived as links, never followed,
    and left out here; FIFOs are never read), three times as fast as PACK_PROGRAM, which packs
    named paths, and a workspace GNU tar cannot read whole (`careful`; Unreadable says so).
    WorkspaceError names what went wrong."""
    reader = TarReader(max_bytes, emit=sink)
    fast = roots == [""] and not careful
    argv = TAR_ARGV if fast else ["python3", "-I", "-S", "-c", PACK_PROGRAM, str(max_bytes), json.dumps(roots)]
    stderr, status = [], None
    try:
        # The tar is its files plus a header for each entry: room for a million of them past max_bytes.
        for item in driver.exec(_helper(sandbox, max_bytes + (512 << 20)), argv, cwd=WORKSPACE, egress=False,
                                bulk=True):
            if isinstance(item, Chunk):
                if item.stream == "stdout":
                    reader.feed(item.data)
                elif sum(map(len, stderr)) < 1 << 20:
                    stderr.append(item.data)
            elif isinstance(item, ExitStatus):
                status = item
    except TooLarge:
        raise WorkspaceError(*ERRORS["EFBIG"]) from None
    except BadTar as exc:
        raise WorkspaceError("workspace_error", f"the workspace's archive was not well formed: {exc}") from None
    lines = b"".join(stderr).decode(errors="replace").splitlines()
    if fast and status is not None and status.exit_code == 2 and any("Permission denied" in line for line in lines):
        raise Unreadable
    if status is None or status.exit_code not in ((0, 1) if fast else (0,)):  # GNU tar: 1, a file changed
        last = lines[-1] if lines else ""
        code, _, name = last.partition(" ")
        if code in ERRORS:
            where = json.loads(name) if name.startswith('"') else ""
            raise WorkspaceError(ERRORS[code][0], ERRORS[code][1] + (f": {where}" if where else ""))
        reason = status.reason if status else "no exit status"
        raise WorkspaceError("workspace_error", f"packing the workspace failed ({reason}: {last[:200]})")
    try:
        entries = reader.close()
    except BadTar as exc:
        raise WorkspaceError("workspace_error", f"the workspace's archive was not well formed: {exc}") from None
    skipped = list(reader.skipped)
    for line in lines if not fast else ():
        try:
            why, path = json.loads(line)
            skipped.append({"path": str(path)[:1024], "why": str(why)[:100]})
        except (ValueError, TypeError):
            continue
    return PackResult(entries=entries, skipped=skipped[:1000], file_bytes=reader.file_bytes)


def unpack(driver: Driver, sandbox: Sandbox, archive: Stdin, *, stage: str | None) -> None:
    """Extract a tar (bytes, or a file read from where it stands: a pipe too) into `stage`, a
    directory of the workspace that it makes, which `settle` moves into place or removes; with
    no stage, into the workspace itself (a tar checked whole beforehand)."""
    # Every member under the stage (the tar holds no link); from a pipe, whole 1 MiB reads.
    argv = [*UNPACK_ARGV, *([f"--transform=s|^|{stage}/|"] if stage else []), "--read-full-records",
            "--blocking-factor=2048"]
    _restoring(driver, sandbox, argv, stdin=archive)


def settle(driver: Driver, sandbox: Sandbox, stage: str, *, keep: bool) -> None:
    """Move what `unpack` left in `stage` into the workspace (`keep`), or remove it."""
    _restoring(driver, sandbox, ["python3", "-I", "-S", "-c", SETTLE_PROGRAM, stage, "keep" if keep else "drop"])


def _restoring(driver: Driver, sandbox: Sandbox, argv: list[str], *, stdin: Stdin | None = None) -> None:
    """Run one step of a restore in the sandbox; WorkspaceError, with what it said, unless it exits 0."""
    said, status = [], None
    for item in driver.exec(_helper(sandbox, 1 << 20), argv, cwd=WORKSPACE, stdin=stdin, egress=False):
        if isinstance(item, Chunk):
            said.append(item.data)
        elif isinstance(item, ExitStatus):
            status = item
    if status is None or status.exit_code != 0:
        text = b"".join(said).decode(errors="replace").strip()
        if "No space left" in text or "Disk quota" in text:
            raise WorkspaceError("quota_exceeded", "the snapshot does not fit this session's workspace "
                                 "(its policy's limits.disk_mb)")
        reason = status.reason if status else "no exit status"
        raise WorkspaceError("workspace_error", f"restoring the workspace failed ({reason}: {text[-300:]})")
