"""Packing and unpacking a workspace on every driver (sessions/persistence/pack.py): what one
sandbox packs, sealed and opened again, unpacks whole in another; links and FIFOs stay out."""

import io
import os
import tarfile
import tempfile
import uuid
from types import SimpleNamespace

import pytest

from controlplane.keys import TenantKey
from sessions.persistence import services as persistence
from sessions.persistence.pack import pack, settle, unpack
from sessions.persistence.sealed import Sealer, unseal
from sessions.persistence.tarstream import BadTar, TarReader
from sessions.runtimes.base import ExitStatus
from sessions.workspace import WorkspaceError

TREE = """
import os
os.makedirs("a/b", exist_ok=True)
os.makedirs("empty", exist_ok=True)
open("a/b/data.bin", "wb").write(bytes(range(256)) * 4096)
open("tool", "wb").write(b"#!/bin/sh\\n")
os.chmod("tool", 0o751)
os.symlink("/etc/passwd", "link")
os.mkfifo("fifo")
"""
SHOW = "import os; print(sorted((p, oct(os.lstat(p).st_mode)) for p in ('a/b/data.bin', 'tool', 'empty')))"


def _run(driver, sandbox, code: str) -> bytes:
    events = list(driver.exec(sandbox, ["python3", "-c", code]))
    assert isinstance(events[-1], ExitStatus) and events[-1].exit_code == 0, events
    return b"".join(e.data for e in events[:-1] if e.stream == "stdout")


def test_a_workspace_packed_in_one_sandbox_unpacks_whole_in_another(driver, make_sandbox):
    source, target = make_sandbox(), make_sandbox()
    _run(driver, source, TREE)
    key = TenantKey(tenant_id=1, version=1, key=os.urandom(32))
    sealer = Sealer(key, "object")
    parts = [sealer.header]
    packed = pack(driver, source, [""], max_bytes=8 << 20, sink=lambda data: parts.extend(sealer.feed(data)))
    parts.append(sealer.finish())
    assert {item["path"] for item in packed.skipped} == {"link", "fifo"}
    archive = b"".join(bytes(part) for part in unseal(key, "object", io.BytesIO(b"".join(parts))))  # views: copied
    reader = TarReader(8 << 20)
    reader.feed(archive)
    assert reader.close() == packed.entries  # what is stored is exactly what the manifest lists
    with tempfile.TemporaryFile() as file:
        file.write(archive)
        file.seek(0)
        unpack(driver, target, file, stage=".stage")
    assert _run(driver, target, "import os; print(os.listdir())") == b"['.stage']\n"  # nothing in place yet
    settle(driver, target, ".stage", keep=True)
    assert _run(driver, target, SHOW) == _run(driver, source, SHOW)
    assert _run(driver, target, "import os; print(os.path.lexists('link'), os.path.lexists('fifo'))") == \
        b"False False\n"


# Three 1 MiB segments and more, a directory its owner cannot write at the top (moving it into
# place rewrites its ".."), and the last file the last in the tar: its digest is checked last.
BIG_TREE = """
import os
os.makedirs("big/inner", exist_ok=True)
for i in range(3):
    open(f"big/inner/part{i}", "wb").write(os.urandom(1 << 20))
os.makedirs("sealed/deep", exist_ok=True)
open("sealed/deep/note", "w").write("kept")
os.chmod("sealed/deep", 0o500)
os.chmod("sealed", 0o500)
open("zlast", "w").write("the last file")
"""
LIST = """
import os
out = []
for root, dirs, files in os.walk("."):
    out += sorted(os.path.join(root, n)[2:] + ("/" if n in dirs else "") for n in dirs + files)
print(sorted(out))
"""


def _taken(driver, source, key: TenantKey, max_bytes: int) -> SimpleNamespace:
    """The source's workspace taken as a snapshot (services.take), as a restore finds its row."""
    object_id = str(uuid.uuid4())
    plan = persistence.Plan(kind="snapshot", object_id=object_id, tenant_id=1, key=key,
                            manifest={"v": 1, "kind": "snapshot", "id": object_id}, max_bytes=max_bytes)
    taken = persistence.take(driver, source, plan, [""])
    return SimpleNamespace(id=object_id, blob_name=taken.blob_name, plain_bytes=taken.plain_bytes,
                           manifest=taken.manifest)


@pytest.fixture
def stored(driver, make_sandbox):
    """BIG_TREE's workspace taken as a snapshot: its source, and the row and key."""
    source = make_sandbox(disk_mb=64)
    _run(driver, source, BIG_TREE)
    key = TenantKey(tenant_id=1, version=1, key=os.urandom(32))
    row = _taken(driver, source, key, 32 << 20)
    yield source, row, key
    persistence.storage().delete(row.blob_name)


def test_a_checked_restore_brings_the_workspace_back_whole(driver, make_sandbox, stored):
    source, row, key = stored
    target = make_sandbox(disk_mb=64)
    persistence.unpack_checked(driver, target, row, key)
    assert _run(driver, target, LIST) == _run(driver, source, LIST)
    assert _run(driver, target, "import os; print(oct(os.stat('sealed').st_mode & 0o777), open('zlast').read())") \
        == b"0o500 the last file\n"


def test_a_restore_that_fails_its_checks_leaves_nothing_in_the_workspace(driver, make_sandbox, stored):
    """The sandbox's tar unpacks segments as they authenticate, before the last one and before
    the digests are compared: whatever it unpacked goes, and nothing was ever in place."""
    _, row, key = stored
    store = persistence.storage()
    with store.open(row.blob_name, "rb") as handle:
        blob = bytearray(handle.read())
    good = bytes(blob)
    blob[-100] ^= 1  # in the last segment: three have reached the tar
    with open(store.path(row.blob_name), "wb") as handle:
        handle.write(blob)
    target = make_sandbox(disk_mb=64)
    with pytest.raises(persistence.ProvenanceError) as refused:
        persistence.unpack_checked(driver, target, row, key)
    assert refused.value.rule_id == "persistence.blob"
    assert _run(driver, target, "import os; print(os.listdir())") == b"[]\n"

    with open(store.path(row.blob_name), "wb") as handle:  # whole again, but the last file's digest is not
        handle.write(good)
    assert row.manifest["files"][-1]["path"] == "zlast"
    row.manifest["files"][-1]["sha256"] = "0" * 64
    target = make_sandbox(disk_mb=64)
    with pytest.raises(persistence.ProvenanceError) as refused:
        persistence.unpack_checked(driver, target, row, key)
    assert refused.value.rule_id == "persistence.digest"
    assert _run(driver, target, "import os; print(os.listdir())") == b"[]\n"


def _reader_that_stops(code: int, *, read: int = 65536):
    """In place of `unpack`: a tar that makes its stage and a file in it, reads `read` bytes of
    the archive, then exits with `code`."""
    def unpack(driver, sandbox, archive, *, stage):
        program = (f"import os, sys; os.makedirs({stage!r}); open({stage!r} + '/part', 'w').write('x')\n"
                   f"left = {read}\nwhile left > 0:\n"
                   f"    left -= len(os.read(0, min(left, 65536)) or b'x' * left)\nsys.exit({code})")
        status = list(driver.exec(sandbox, ["python3", "-c", program], stdin=archive, egress=False))[-1]
        if status.exit_code != 0:
            raise WorkspaceError("workspace_error", f"the tar failed ({status.exit_code})")
    return unpack


def test_a_failed_check_is_reported_even_when_the_tar_stopped_first(driver, make_sandbox, stored, monkeypatch):
    """The tar failing early (its quota, its sandbox gone) must not hide a blob that fails its
    checks behind the tar's error: the check runs to its end, and what the tar unpacked goes."""
    _, row, key = stored
    store = persistence.storage()
    with store.open(row.blob_name, "rb") as handle:
        tampered = bytearray(handle.read())
    tampered[-100] ^= 1
    with open(store.path(row.blob_name), "wb") as handle:
        handle.write(tampered)
    monkeypatch.setattr(persistence, "unpack", _reader_that_stops(2))
    target = make_sandbox(disk_mb=64)
    with pytest.raises(persistence.ProvenanceError) as refused:
        persistence.unpack_checked(driver, target, row, key)
    assert refused.value.rule_id == "persistence.blob"
    assert _run(driver, target, "import os; print(os.listdir())") == b"[]\n"


def test_a_failed_check_is_reported_even_when_its_stage_cannot_be_removed(driver, make_sandbox, stored,
                                                                         monkeypatch):
    """Removing the stage failed too (its sandbox went): the refusal still names the check."""
    _, row, key = stored
    row.manifest["files"][-1]["sha256"] = "0" * 64

    def cannot(driver, sandbox, stage, *, keep):
        raise WorkspaceError("workspace_error", "the sandbox is gone")

    monkeypatch.setattr(persistence, "settle", cannot)
    with pytest.raises(persistence.ProvenanceError) as refused:
        persistence.unpack_checked(driver, make_sandbox(disk_mb=64), row, key)
    assert refused.value.rule_id == "persistence.digest"


@pytest.mark.parametrize("unread", [65536, 2 << 20])
def test_a_tar_that_exits_0_before_the_archive_ends_is_not_kept(driver, make_sandbox, stored, monkeypatch, unread):
    """Every check holds, the tar says it succeeded, yet it left the archive's end unread: less
    than the pipe holds, or more. Its stage goes, and the restore fails saying so."""
    if driver.name != "bubblewrap":
        pytest.skip("Docker's driver reads the whole input before the command starts; what a command leaves "
                    "unread is not seen there (the sandbox's GNU tar reads its input to the end)")
    _, row, key = stored
    archive = len(persistence.check_bytes(row, key))
    monkeypatch.setattr(persistence, "unpack", _reader_that_stops(0, read=max(archive - unread, 0)))
    target = make_sandbox(disk_mb=64)
    with pytest.raises(WorkspaceError, match=f"last {min(unread, archive)} bytes unread"):
        persistence.unpack_checked(driver, target, row, key)
    assert _run(driver, target, "import os; print(os.listdir())") == b"[]\n"


FILL_INODES = """
import os
n = 0
try:
    while True:
        open(f"f{n}", "w").close()
        n += 1
except OSError as exc:
    print(exc.errno, n)
"""


def test_a_workspace_full_of_files_restores(driver, make_sandbox):
    """Its inodes all taken: the stage a restore unpacks into would need one more, so the
    restore checks the whole tar first and unpacks it in place (services.unpack_checked)."""
    if driver.name == "gvisor":
        pytest.skip("gVisor's tmpfs has no inode limit (its memory limit bounds it)")
    source = make_sandbox(disk_mb=1)
    errno_, files = _run(driver, source, FILL_INODES).split()
    assert errno_ == b"28"  # ENOSPC
    key = TenantKey(tenant_id=1, version=1, key=os.urandom(32))
    row = _taken(driver, source, key, 1 << 20)
    try:
        target = make_sandbox(disk_mb=1)
        persistence.unpack_checked(driver, target, row, key)
        assert _run(driver, target, "import os; print(len(os.listdir()))") == files + b"\n"
    finally:
        persistence.storage().delete(row.blob_name)


SMALL_FILES = "import os\nfor i in range(4000):\n    open(f'f{i}', 'wb').write(os.urandom(1024))"


@pytest.mark.parametrize("tree", ["large", "small files"])
def test_a_tree_larger_than_the_workspace_is_refused_without_a_second_read(driver, make_sandbox, stored,
                                                                            monkeypatch, tree):
    """Its files take more than the workspace holds (3 MiB in 1 MB; or 4 MB of 1 KiB files, a 4
    KiB page each, in 8 MB): the inode fallback above would only read and check the whole blob
    again to fail the same way."""
    _, row, key = stored
    disk_mb = 1
    if tree == "small files":
        source = make_sandbox(disk_mb=64)
        _run(driver, source, SMALL_FILES)
        row, disk_mb = _taken(driver, source, key, 8 << 20), 8

    def read_again(*args):
        raise AssertionError("the blob was read a second time")

    monkeypatch.setattr(persistence, "check_bytes", read_again)
    target = make_sandbox(disk_mb=disk_mb)
    try:
        with pytest.raises(WorkspaceError) as refused:
            persistence.unpack_checked(driver, target, row, key)
        assert refused.value.code == "quota_exceeded"
        assert _run(driver, target, "import os; print(os.listdir())") == b"[]\n"
    finally:
        if tree == "small files":
            persistence.storage().delete(row.blob_name)


def test_links_with_long_names_or_targets_are_left_out_and_the_rest_packs(driver, make_sandbox):
    """GNU tar writes a long link target as a header of its own (K): the link is left out with
    it, as a short one is; before, the whole snapshot failed."""
    source = make_sandbox()
    _run(driver, source, "import os; open('kept', 'w').write('x'); os.symlink('/' + 'x' * 150, 'far');"
                         "os.symlink('kept', 'l' * 120); os.symlink('/' + 'y' * 150, 'z' * 120)")
    packed = pack(driver, source, [""], max_bytes=1 << 20, sink=lambda data: None)
    assert [entry["path"] for entry in packed.entries] == ["kept"]
    assert {item["path"] for item in packed.skipped} == {"far", "l" * 120, "z" * 120}


def _tar(*members: tuple[tarfile.TarInfo, bytes], format: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=format) as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _read(archive: bytes) -> list[dict]:
    reader = TarReader(1 << 20)
    reader.feed(archive)
    return reader.close()


def test_a_pax_record_other_than_a_path_is_refused():
    """GNU tar would honour it on unpacking (a size, a link's target, an owner) where the reader
    did not look: the stream would not be what was checked."""
    long_name = tarfile.TarInfo("d/" + "n" * 120)
    assert [entry["path"] for entry in _read(_tar((long_name, b"ok"), format=tarfile.PAX_FORMAT))] == [long_name.name]
    for record in ({"size": "1"}, {"linkpath": "/etc/passwd"}, {"comment": "x"}):
        info = tarfile.TarInfo("file")
        info.pax_headers = {**record, "path": "file"}
        with pytest.raises(BadTar, match="other than a path"):
            _read(_tar((info, b"data"), format=tarfile.PAX_FORMAT))


def test_a_long_link_target_before_a_file_is_refused():
    info = tarfile.TarInfo("file")
    info.linkname = "/" + "t" * 150  # tarfile writes its K header whatever the member's type
    with pytest.raises(BadTar, match="has a link's target but is not a link"):
        _read(_tar((info, b"data"), format=tarfile.GNU_FORMAT))


def _with_field(archive: bytes, start: int, value: bytes) -> bytes:
    """The first header's field at `start` set to `value`, its checksum made right again."""
    header = bytearray(archive[:512])
    header[start:start + len(value)] = value
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + archive[512:]


def test_a_number_that_is_not_plain_octal_is_refused():
    """int() takes a sign and underscores where GNU tar reads neither: a size of -1, or 0_12,
    would make the reader and the tar that unpacks it see different archives."""
    archive = _tar((tarfile.TarInfo("file"), b"0123456789"), format=tarfile.GNU_FORMAT)
    assert [entry["size"] for entry in _read(archive)] == [10]
    for size in (b"-0000000012\0", b"00000000_12\0", b"+0000000012\0", b" 0x000000a\0"):
        with pytest.raises(BadTar, match="not an octal number"):
            _read(_with_field(archive, 124, size))


def test_a_header_whose_checksum_does_not_add_up_is_refused():
    archive = _tar((tarfile.TarInfo("f" * 99), b"x" * 700), format=tarfile.GNU_FORMAT)
    assert [entry["path"] for entry in _read(archive)] == ["f" * 99]
    for start, value in ((0, b"g"), (300, b"\xff"), (511, b"\x01")):  # a byte changed, the checksum kept
        altered = bytearray(archive)
        altered[start:start + 1] = value
        with pytest.raises(BadTar, match="checksum does not match"):
            _read(bytes(altered))
