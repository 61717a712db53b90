"""A driver that cannot work on this host says so in one line that names the fix."""

import contextlib
import uuid

import pytest
from django.core.management import CommandError, call_command

from sessions.runtimes import get_driver
from sessions.runtimes.base import RuntimeUnavailable, SandboxError, SandboxSpec
from sessions.runtimes.bubblewrap import BubblewrapDriver
from sessions.runtimes.docker_driver import DockerDriver
from sessions.runtimes.reaper import reap_orphans


def test_bubblewrap_missing_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match=r"apt-get install -y bubblewrap"):
        BubblewrapDriver(sandbox_dir=tmp_path).check()


def test_a_docker_daemon_that_is_down_names_the_fix(tmp_path):
    driver = DockerDriver(base_url=f"unix://{tmp_path}/docker.sock")
    with pytest.raises(RuntimeUnavailable, match=r"Docker daemon is not reachable.*dockerd"):
        driver.check()


def test_an_unregistered_gvisor_runtime_names_the_fix():
    driver = DockerDriver(isolation="gvisor", gvisor_runtime="runsc-not-registered")
    try:
        get_driver("docker").check()
    except RuntimeUnavailable as exc:
        pytest.skip(f"no Docker engine to ask: {exc}")
    with pytest.raises(RuntimeUnavailable, match=r"runsc-not-registered.*daemon.json"):
        driver.check()


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
