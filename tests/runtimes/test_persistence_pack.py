"""Packing and unpacking a workspace on every driver (sessions/persistence/pack.py): what one
sandbox packs, sealed and opened again, unpacks whole in another; links and FIFOs stay out."""

import io
import os
import tarfile
import tempfile

import pytest

from controlplane.keys import TenantKey
from sessions.persistence.pack import pack, unpack
from sessions.persistence.sealed import Sealer, unseal
from sessions.persistence.tarstream import BadTar, TarReader
from sessions.runtimes.base import ExitStatus

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
    with tempfile.TemporaryFile() as file:  # a restore hands the driver a file (services.checked_tar)
        file.write(archive)
        file.seek(0)
        unpack(driver, target, file)
    assert _run(driver, target, SHOW) == _run(driver, source, SHOW)
    assert _run(driver, target, "import os; print(os.path.lexists('link'), os.path.lexists('fifo'))") == \
        b"False False\n"


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
