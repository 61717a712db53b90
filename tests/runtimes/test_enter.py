"""The bubblewrap driver's cgroup helper (sessions/runtimes/enter.c, enter.py): built once into
a directory only root may write, it joins each group it is given and then runs the program, or
fails before the program starts."""

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from sessions.runtimes import enter
from sessions.runtimes.cgroups import CgroupManager

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("cc") or shutil.which("gcc")),
                                reason="the helper is built and used by a root runner with a C compiler")


@pytest.fixture
def private(tmp_path):
    directory = tmp_path / "bin"
    directory.mkdir(mode=0o700)
    return directory


def test_built_once_and_run_from_a_private_directory(private):
    path = enter.helper(private)
    assert path is not None and Path(path).parent == private
    assert enter.helper(private) == path  # built once
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    ran = subprocess.run([path, "--", "/bin/echo", "runs"], capture_output=True, text=True, env={})
    assert (ran.returncode, ran.stdout) == (0, "runs\n")


def test_a_group_it_cannot_join_stops_it_before_the_program(private, tmp_path):
    marker = tmp_path / "ran"
    ran = subprocess.run([enter.helper(private), str(tmp_path / "no-such-group" / "tasks"), "--",
                          "/usr/bin/touch", str(marker)], capture_output=True, text=True, env={})
    assert ran.returncode == 127
    assert "cannot join the cgroup of" in ran.stderr and "no-such-group" in ran.stderr
    assert not marker.exists()


def test_it_joins_the_sandboxs_groups(private):
    cgroups = CgroupManager(group=f"airlock-enter-test-{uuid.uuid4().hex[:8]}")
    if not cgroups.available:
        pytest.skip("no writable cgroup hierarchy here")
    sandbox_id = str(uuid.uuid4())
    cgroups.create(sandbox_id, memory_mb=64, pids=16, cpus=1, tenant="t")
    try:
        ran = subprocess.run([enter.helper(private), *cgroups.entry_files(sandbox_id), "--", "/bin/cat",
                              "/proc/self/cgroup"], capture_output=True, text=True, env={}, check=True)
        joined = [line for line in ran.stdout.splitlines() if line.endswith(f"/{sandbox_id}")]
        assert len(joined) == len(cgroups.paths(sandbox_id)), ran.stdout
    finally:
        cgroups.remove(sandbox_id)  # its group, and its tenant's level
        for base in cgroups.bases.values():
            base.rmdir()


def test_a_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert enter.helper(shared) is None
    assert list(shared.iterdir()) == []  # nothing built where another user could replace it
