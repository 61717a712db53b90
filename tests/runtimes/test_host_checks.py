"""A driver that cannot work on this host says so in one line that names the fix."""

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from sessions.runtimes import get_driver, rootfs
from sessions.runtimes.base import RuntimeUnavailable, SandboxError, SandboxSpec
from sessions.runtimes.bubblewrap import BubblewrapDriver
from sessions.runtimes.cgroups import CgroupManager
from sessions.runtimes.docker_driver import DockerDriver
from sessions.runtimes.reaper import reap_orphans
from tests.runtimes.conftest import checked_driver


def test_bubblewrap_missing_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match=r"apt-get install -y bubblewrap"):
        BubblewrapDriver(sandbox_dir=tmp_path).check()


def test_a_docker_daemon_that_is_down_names_the_fix(tmp_path):
    driver = DockerDriver(base_url=f"unix://{tmp_path}/docker.sock")
    with pytest.raises(RuntimeUnavailable, match=r"Docker daemon is not reachable.*dockerd"):
        driver.check()


def test_an_unregistered_gvisor_runtime_names_the_fix(built_rootfs):
    checked_driver("docker", built_rootfs)  # an engine to ask
    driver = DockerDriver(isolation="gvisor", gvisor_runtime="runsc-not-registered")
    with pytest.raises(RuntimeUnavailable, match=r"runsc-not-registered.*daemon.json"):
        driver.check()


def test_a_tree_built_without_a_compiler_has_no_supervisor_and_docker_refuses_it(monkeypatch, tmp_path,
                                                                                built_rootfs):
    """bubblewrap runs on such a tree; the Docker drivers name the fix instead of starting a
    container whose pid 1 is missing."""
    said = []
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    rootfs._build_supervisor(tmp_path, said.append)
    assert not (tmp_path / rootfs.SUPERVISOR.lstrip("/")).exists()
    assert "no C compiler" in said[0] and "build_rootfs --force" in said[0]
    checked_driver("docker", built_rootfs)  # an engine to ask
    monkeypatch.setattr(rootfs, "SUPERVISOR", "/usr/local/lib/airlock/not-built")
    with pytest.raises(RuntimeUnavailable, match=r"no supervisor.*apt-get install -y gcc.*build_rootfs --force"):
        DockerDriver().check()


def test_an_unknown_driver_is_refused():
    with pytest.raises(RuntimeUnavailable, match="unknown sandbox driver 'lxc'"):
        get_driver("lxc")


@pytest.mark.parametrize("session_id", ["../../etc", "{12345678-1234-5678-1234-567812345678}",
                                        "12345678123456781234567812345678"])
def test_a_session_id_must_be_a_canonical_uuid(session_id):
    with pytest.raises(SandboxError, match="canonical UUID"):
        SandboxSpec(tenant="acme", session_id=session_id)


def test_only_the_none_network_is_accepted():
    with pytest.raises(SandboxError, match="no network"):
        SandboxSpec(tenant="acme", session_id=str(uuid.uuid4()), network="host")


def test_runtime_check_reports_each_driver(capsys):
    with contextlib.suppress(CommandError):  # non-zero when bubblewrap cannot work here
        call_command("runtime_check", "bubblewrap")
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("root filesystem")
    assert out.splitlines()[1].startswith("bubblewrap")


def test_reap_orphans_destroys_only_what_no_active_session_owns(driver, make_sandbox):
    active, orphan = make_sandbox(), make_sandbox()
    reaped = reap_orphans(driver, lambda present: [orphan.id] if orphan.id in present else [])
    assert reaped == [orphan.id]
    assert set(driver.list_sandboxes()) >= {active.id}
    assert orphan.id not in driver.list_sandboxes()


def test_a_bubblewrap_without_the_options_airlock_uses_is_named_too_old(monkeypatch, tmp_path, built_rootfs):
    checked_driver("bubblewrap", built_rootfs)  # a real bwrap to wrap
    wrappers = Path(tempfile.mkdtemp())  # bwrap runs as nobody: it must be able to read the wrapper
    wrappers.chmod(0o755)
    old = wrappers / "bwrap"  # a real bwrap that, like bubblewrap 0.4, does not know --size
    old.write_text(f"#!/usr/bin/python3\nimport os, sys\nif '--size' in sys.argv:\n"
                   f"    sys.exit('bwrap: Unknown option --size')\nos.execv({shutil.which('bwrap')!r}, sys.argv)\n")
    old.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrappers}:{os.environ['PATH']}")
    try:
        with pytest.raises(RuntimeUnavailable, match=r"too old.*Unknown option --size.*0\.5 or newer"):
            BubblewrapDriver(sandbox_dir=tmp_path).check()
    finally:
        shutil.rmtree(wrappers)


def test_a_docker_daemon_lost_after_its_check_names_the_fix(tmp_path, built_rootfs):
    driver = checked_driver("docker", built_rootfs)
    gone = DockerDriver(base_url=f"unix://{tmp_path}/docker.sock")
    gone._checked, gone.image_digest, gone._image_imported = True, driver.image_digest, False  # checked, then lost
    with pytest.raises(RuntimeUnavailable, match=r"Docker daemon is not reachable.*dockerd"):
        gone.create(SandboxSpec(tenant="acme", session_id=str(uuid.uuid4())))


def test_deployments_with_their_own_sandbox_directories_never_see_each_others_sandboxes(tmp_path, built_rootfs):
    checked_driver("bubblewrap", built_rootfs)
    ours, theirs = BubblewrapDriver(sandbox_dir=tmp_path / "ours"), BubblewrapDriver(sandbox_dir=tmp_path / "theirs")
    sandbox = theirs.create(SandboxSpec(tenant="acme", session_id=str(uuid.uuid4())))
    try:
        assert sandbox.id in theirs.list_sandboxes()
        assert sandbox.id not in ours.list_sandboxes() and ours.list_orphans(set()) == []
    finally:
        theirs.destroy(sandbox)


def test_a_host_without_root_or_cgroups_is_told_what_the_sandbox_lacks(tmp_path):
    driver = BubblewrapDriver(sandbox_dir=tmp_path, cgroups=CgroupManager(root=tmp_path))  # no hierarchy there
    driver.as_root = False  # as an ordinary user's runner is
    assert [line.split(" (")[0].split(":")[0] for line in driver.weaker_here()] == [
        "no /workspace size quota", "rlimits instead of cgroups"]
    assert get_driver("docker").weaker_here() == []


def test_a_starting_driver_removes_the_cgroups_nobody_serves(tmp_path):
    """Earlier deployments (and tests) leave `airlock-*` groups behind: the next driver to start
    removes those whose sandbox directory is gone, and unrecorded ones that hold no process,
    but never a group whose directory still exists or that still holds a process."""
    import subprocess

    from sessions.runtimes.bubblewrap import cgroup_group

    gone, live = tmp_path / "gone", tmp_path / "live"
    gone.mkdir()
    live.mkdir()
    old = CgroupManager(group=cgroup_group(gone), owner=gone)
    if not old.available:
        pytest.skip("no writable cgroup hierarchy here (needs root)")
    kept = CgroupManager(group=cgroup_group(live), owner=live)
    legacy, busy = (CgroupManager(group=f"airlock-{uuid.uuid4().hex[:12]}") for _ in range(2))  # no record
    sandbox = str(uuid.uuid4())
    for manager in (old, kept, legacy, busy):
        manager.create(sandbox, memory_mb=64, pids=16, cpus=1)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        busy.attach(sandbox, sleeper.pid)
        shutil.rmtree(gone)
        CgroupManager(group=cgroup_group(tmp_path), owner=tmp_path)  # the next one to start
        assert not any(path.exists() for path in old.paths(sandbox).values())
        assert not any(path.exists() for path in legacy.paths(sandbox).values())
        assert all(path.exists() for path in kept.paths(sandbox).values())
        assert all(path.exists() for path in busy.paths(sandbox).values())
    finally:
        sleeper.kill()
        sleeper.wait()
        for manager in (kept, busy):
            manager.remove(sandbox)
            for base in manager.bases.values():
                base.rmdir()


def test_each_tenants_sandboxes_share_one_cpu_weight(tmp_path, built_rootfs):
    """Under contention each tenant with work gets an equal share of the CPU, however many
    sessions it runs: its sandboxes' cgroups sit in one level of its own, with the default
    weight, and the level goes with its last sandbox."""
    driver = BubblewrapDriver(sandbox_dir=tmp_path)
    if not driver.cgroups.available:
        pytest.skip("no writable cgroup hierarchy here (needs root)")
    made = {name: [driver.create(SandboxSpec(tenant=name, session_id=str(uuid.uuid4()))) for _ in range(count)]
            for name, count in (("big", 3), ("small", 1))}
    try:
        levels = {name: {path.parent for sandbox in sandboxes for path in driver.cgroups.paths(sandbox.id).values()}
                  for name, sandboxes in made.items()}
        assert all(len(paths) == len(driver.cgroups.bases) for paths in levels.values())  # one level per tenant
        assert not levels["big"] & levels["small"]
        for level in levels["big"] | levels["small"]:
            weight = level / ("cpu.weight" if driver.cgroups.version == 2 else "cpu.shares")
            if weight.exists():
                assert weight.read_text().strip() in {"100", "1024"}  # the default: every tenant the same
        assert set(driver.list_sandboxes()) == {sandbox.id for sandboxes in made.values() for sandbox in sandboxes}
    finally:
        for sandboxes in made.values():
            for sandbox in sandboxes:
                driver.destroy(sandbox)
    assert not any(level.exists() for paths in levels.values() for level in paths)
