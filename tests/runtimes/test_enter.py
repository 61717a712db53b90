"""The bubblewrap driver's cgroup helper (sessions/runtimes/enter.c, enter.py): built once into
a directory only root may write, it joins each group it is given and then runs the program, or
fails before the program starts."""

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from sessions.runtimes import enter
from sessions.runtimes.base import Limits, SandboxError, SandboxSpec
from sessions.runtimes.bubblewrap import BubblewrapDriver
from sessions.runtimes.cgroups import CgroupManager
from tests.runtimes.conftest import checked_driver
from tests.runtimes.helpers import run

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
    assert "cannot join the sandbox's cgroups" in ran.stderr and "no-such-group" not in ran.stderr
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


def test_a_directory_above_it_that_others_may_write_is_refused(tmp_path):
    """Whoever may rename a directory above the helper's could put a program of theirs in its
    place, which root would run before every command."""
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # not sticky: anyone may move its entries
    assert enter.helper(loose / "bin") is None


def test_a_file_under_its_name_that_does_not_run_is_built_again(private):
    path = Path(enter.helper(private))
    enter.forget(private)
    path.write_bytes(b"not a program")
    assert enter.helper(private) == str(path)
    assert subprocess.run([str(path), "--", "/bin/true"], env={}).returncode == 0


def test_a_helper_gone_fails_one_command_and_the_runner_moves_the_next_ones(built_rootfs):
    checked_driver("bubblewrap", built_rootfs)  # a bwrap that works here
    place = Path(tempfile.mkdtemp(prefix="airlock-enter-"))  # one the sandbox's uid 65534 may traverse
    place.chmod(0o711)
    driver = BubblewrapDriver(sandbox_dir=place)
    driver.check()
    if driver._enter is None:
        shutil.rmtree(place)
        pytest.skip("no cgroups here: the helper is not used")
    sandbox = driver.create(SandboxSpec(tenant="t", session_id=str(uuid.uuid4()), limits=Limits(pids=16)))
    try:
        assert run(driver, sandbox, ["true"]).status.exit_code == 0
        Path(driver._enter).unlink()
        with pytest.raises(SandboxError, match="cgroup helper could not run") as failed:
            run(driver, sandbox, ["true"])
        assert str(place) not in str(failed.value)  # no host path for the agent
        for _ in range(3):  # moved by the runner now, still within the sandbox's limits
            assert run(driver, sandbox, ["true"]).status.exit_code == 0
        fork_bomb = run(driver, sandbox, ["python3", "-c", "import os\nfor _ in range(40): os.fork() or os._exit(0)"])
        assert fork_bomb.status.exit_code != 0 and "Resource temporarily unavailable" in fork_bomb.stderr
    finally:
        driver.destroy(sandbox)
        shutil.rmtree(place)
