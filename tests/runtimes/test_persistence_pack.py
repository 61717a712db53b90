"""Packing and unpacking a workspace on every driver (sessions/persistence/pack.py): what one
sandbox packs, sealed and opened again, unpacks whole in another; links and FIFOs stay out."""

import io
import os
import tempfile

from controlplane.keys import TenantKey
from sessions.persistence.pack import pack, unpack
from sessions.persistence.sealed import Sealer, unseal
from sessions.persistence.tarstream import TarReader
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

