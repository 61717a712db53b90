"""Snapshot and restore of a 100 MB workspace of 10,000 files (sessions/persistence/), p50 / p95,
against a plain `tar` of the same tree measured in the same run.

    .venv/bin/python bench/snapshots.py [--runs N] [--files N] [--mb N] [--driver bubblewrap]

- snapshot: the sandbox packs its workspace (PACK_PROGRAM), the runner reads the stream as
  untrusted and hashes every file, seals it (AES-256-GCM) and stores it through Django's storage
  (the filesystem under the data directory): `services.take`.
- restore: read the blob from storage, open it, check the manifest's signature and every file's
  digest, size, mode and path while the sandbox's tar unpacks each authenticated segment into a
  stage, then move the stage into the new sandbox's empty workspace (`services.unpack_checked`,
  what `services.restore` runs).
- baselines: GNU tar on the host, `tar -cf` of the workspace's own directory to a file beside
  the stored blobs, and `tar -xf` of that file into an empty directory of the same kind (tmpfs).

Targets: snapshot p95 <= 1 s and <= 2x the plain tar; restore p95 <= 0.5 s and <= 2x the plain untar."""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 60)

import django

django.setup()

from figures import host_notes, percentiles  # noqa: E402

from controlplane.keys import TenantKey  # noqa: E402
from sessions.persistence import manifest as mf  # noqa: E402
from sessions.persistence import services  # noqa: E402
from sessions.runtimes import get_driver, rootfs  # noqa: E402
from sessions.runtimes.base import ExitStatus, Limits, SandboxSpec  # noqa: E402

FILL = """
import os, sys
files, size = int(sys.argv[1]), int(sys.argv[2])
for i in range(files):
    d = f"d{i % 100:02d}/e{i % 7}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:05d}.bin", "wb") as f:
        f.write(os.urandom(size))
"""


def ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)  # of 9, a p95 is the slowest sample
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--driver", default="bubblewrap")
    options = parser.parse_args()
    if rootfs.current() is None:
        rootfs.build(progress=lambda message: None)
    driver = get_driver(options.driver)
    driver.check()
    limits = Limits(disk_mb=options.mb * 3, memory_mb=1024, command_timeout_s=600)

    def sandbox():
        return driver.create(SandboxSpec(tenant="bench", session_id=str(uuid.uuid4()), limits=limits))

    source = sandbox()
    size = options.mb * 2**20 // options.files
    events = list(driver.exec(source, ["python3", "-c", FILL, str(options.files), str(size)], timeout_s=600))
    assert isinstance(events[-1], ExitStatus) and events[-1].exit_code == 0, events[-1]
    key = TenantKey(tenant_id=0, version=1, key=os.urandom(32))
    store = services.storage()
    home = Path(store.path("")) if hasattr(store, "path") else None
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)  # a fresh data directory has no store yet
    scratch = Path(tempfile.mkdtemp(prefix="bench-tar-", dir=home))
    tar_file = scratch / "plain.tar"
    print(f"workspace: {options.files} files of {size} bytes ({options.files * size / 2**20:.0f} MiB), "
          f"driver {options.driver}, {options.runs} runs; {host_notes()}")

    snap, plain_tar, blobs = [], [], []
    for _ in range(options.runs):
        started = time.perf_counter()
        subprocess.run(["/bin/tar", "-cf", str(tar_file), "-C", source.handle["workspace"], "."], check=True)
        plain_tar.append(ms(started))
        object_id = str(uuid.uuid4())
        plan = services.Plan(kind="snapshot", object_id=object_id, tenant_id=0, key=key,
                             manifest={"v": 1, "kind": "snapshot", "id": object_id}, max_bytes=options.mb * 2**21)
        started = time.perf_counter()
        taken = services.take(driver, source, plan, [""])
        snap.append(ms(started))
        blobs.append(taken)
    taken = blobs[-1]
    row = SimpleNamespace(id=taken.plan.object_id, blob_name=taken.blob_name, plain_bytes=taken.plain_bytes,
                          manifest=taken.manifest)

    restore, plain_untar = [], []
    for _ in range(options.runs):
        target = scratch / f"untar-{uuid.uuid4().hex[:8]}"
        target.mkdir()
        subprocess.run(["/bin/mount", "-t", "tmpfs", "-o", f"size={options.mb * 3}m", "tmpfs", str(target)], check=True)
        started = time.perf_counter()
        subprocess.run(["/bin/tar", "-xf", str(tar_file), "-C", str(target)], check=True)
        plain_untar.append(ms(started))
        subprocess.run(["/bin/umount", str(target)], check=True)
        target.rmdir()
        fresh = sandbox()
        try:
            started = time.perf_counter()
            assert mf.signature_holds(key, row.manifest, taken.signature)
            services.unpack_checked(driver, fresh, row, key)
            restore.append(ms(started))
        finally:
            driver.destroy(fresh)

    for item in blobs:
        store.delete(item.blob_name)
    tar_file.unlink()
    scratch.rmdir()
    driver.destroy(source)

    rows = [("plain tar -cf (host)", plain_tar), ("snapshot (pack, hash, seal, store)", snap),
            ("plain tar -xf (host)", plain_untar), ("restore (read, open, check, unpack)", restore)]
    figures = {name: percentiles(samples) for name, samples in rows}
    print(f"{'':40} {'p50 ms':>9} {'p95 ms':>9}")
    for name, (p50, p95) in figures.items():
        print(f"{name:40} {p50:9.1f} {p95:9.1f}")
    snap95, tar95 = figures[rows[1][0]][1], figures[rows[0][0]][1]
    restore95, untar95 = figures[rows[3][0]][1], figures[rows[2][0]][1]
    print(f"snapshot p95 {snap95:.0f} ms = {snap95 / tar95:.2f}x plain tar (targets <= 1000 ms and <= 2x)")
    print(f"restore p95 {restore95:.0f} ms = {restore95 / untar95:.2f}x plain untar (targets <= 500 ms and <= 2x)")
    print(f"stored: {taken.stored_bytes} bytes for {taken.plain_bytes} bytes of files")


if __name__ == "__main__":
    main()
