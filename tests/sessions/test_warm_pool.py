"""A runner's warm pool through the API, on real Docker sandboxes: sessions come from it and say
so, it refills, a session it cannot serve starts cold, and what it holds goes when it stops."""

import os
import time
import uuid

import pytest

from controlplane.models import ApiKeyScope
from policies_app.models import DecisionRecord
from sessions.models import Runner, Session
from sessions.runner import records
from sessions.runner.egress import egress_root
from sessions.runtimes import get_driver
from sessions.runtimes.base import Limits, RuntimeUnavailable
from sessions.runtimes.pool import RETARGET_AFTER
from tests.sessions.conftest import Agent, publish, run_on, running_runner
from tests.upstreams import Upstreams

BIGGER = "commands:\n  - {id: echo, bin: echo}\nlimits: {memory_mb: 640}\n"


@pytest.fixture
def docker():
    driver = get_driver("docker")
    try:
        driver.check()
    except RuntimeUnavailable as exc:
        if os.environ.get("AIRLOCK_REQUIRE_DOCKER") == "1":
            pytest.fail(f"docker is required here: {exc}")
        pytest.skip(f"docker unavailable: {exc}")
    return driver


def wait_until(predicate, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sessions_come_from_the_warm_pool_say_so_and_the_pool_refills(transactional_db, sandboxes, docker, acme,
                                                                       acme_policy, make_key, api, settings):
    settings.AIRLOCK_RUNTIME, settings.AIRLOCK_WARM_POOL = "docker", {"docker": 2}
    agent = Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)
    with running_runner() as runner:
        pool = runner.pools["docker"]
        # No session on Docker yet: the pool starts with a policy's default limits, and the first
        # sessions, whose policy sets its own, start cold; the pool follows them.
        for n in range(RETARGET_AFTER):
            assert agent.open(conversation_id=f"first-{n}")["warm"] is False
        wait_until(lambda: len(pool.ready) == 2 and pool.limits.memory_mb == 256)
        waiting = {sandbox.handle["container"] for sandbox in pool.ready}
        session = agent.open()
        assert session["warm"] is True and session["driver"] == "docker"
        row = Session.objects.get(pk=session["id"])
        assert row.warm is True and row.prepare_ms is not None
        result = agent.run(session, "printf", "from the pool").json()
        assert (result["exit_code"], result["output"]) == (0, "from the pool")
        container = docker.client.api.inspect_container(f"airlock-{session['id']}")["Id"]
        assert container in waiting
        wait_until(lambda: len(pool.ready) == 2)  # refilled in the background
        assert container not in {sandbox.handle["container"] for sandbox in pool.ready}
        assert agent.as_session(session).delete(f"/api/v1/sessions/{session['id']}").status_code in {200, 204}
        wait_until(lambda: session["id"] not in docker.list_sandboxes())  # destroyed, never reused

        # Limits the pool was not made with: cold, and the pool follows them.
        publish(acme, BIGGER)
        for n in range(RETARGET_AFTER):
            assert agent.open(conversation_id=f"bigger-{n}")["warm"] is False
        wait_until(lambda: len(pool.ready) == 2 and pool.limits.memory_mb == 640)
        assert agent.open(conversation_id="bigger-again")["warm"] is True
        run_on(runner, _beat(runner))  # its heartbeat writes what the Metrics page reads
        assert Runner.objects.get(pk=runner.id).pools["docker"]["size"] == 2
        held = pool.ids()
    # A runner that stops destroys what its pool held.
    left = {sandbox_id for sandbox_id, _, _ in docker.pooled()}
    assert not held & left
    # The next runner's pool starts with the limits of the newest session on its driver.
    with running_runner() as runner:
        assert runner.pools["docker"].limits.memory_mb == 640


async def _beat(runner):
    await runner.db(records.runner_heartbeat, runner_id=runner.id, pools=runner.pool_status())


def test_a_runner_that_starts_removes_the_pooled_sandboxes_of_one_that_was_killed(transactional_db, sandboxes,
                                                                                   docker, settings):
    """A killed runner's attach streams close, so its pooled sandboxes stop; the next runner on
    the host removes them when it starts, and leaves a live runner's alone."""
    settings.AIRLOCK_WARM_POOL = {}
    killed = [docker.prepare(Limits(), pool_id=str(uuid.uuid4())) for _ in range(2)]
    alive = docker.prepare(Limits(), pool_id=str(uuid.uuid4()))
    try:
        for sandbox in killed:
            docker._channels[sandbox.id].close()  # what the kernel does to a killed process's sockets
        wait_until(lambda: all(not docker.client.api.inspect_container(s.handle["container"])["State"]["Running"]
                               for s in killed))
        with running_runner():
            pass
        present = {sandbox_id for sandbox_id, _, _ in docker.pooled()}
        assert not {sandbox.id for sandbox in killed} & present
        assert alive.id in present
    finally:
        docker.destroy(alive)


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    servers = Upstreams(tmp_path_factory.mktemp("upstreams"))
    yield servers
    servers.close()


@pytest.mark.parametrize("driver", ["docker", "gvisor"])
def test_a_session_with_egress_takes_a_pooled_sandbox_and_its_proxy_goes_there(
        transactional_db, sandboxes, docker, driver, acme, make_key, api, settings, upstreams):
    """The pooled sandbox mounts an empty directory of its own; the session adopts it for its
    proxy: pip installs through it, the connection is judged and recorded, the directory is the
    session's (and goes with it), and a session without egress gets none."""
    settings.AIRLOCK_WARM_POOL = {driver: 2}
    settings.AIRLOCK_EGRESS_TEST_HOSTS = upstreams.test_hosts()
    settings.AIRLOCK_PORT = upstreams.port(upstreams.control_plane)
    publish(acme, egress_policy(driver))
    agent = Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)
    with running_runner() as runner:
        pool = runner.pools[driver]
        for n in range(RETARGET_AFTER):
            agent.open(conversation_id=f"teaches-the-pool-the-limits-{n}")
        wait_until(lambda: len(pool.ready) == 2 and pool.limits.memory_mb == 512, 60)
        session = agent.open()
        assert session["warm"] is True
        directory = egress_root() / session["id"]
        assert (directory / "proxy.sock").is_socket()
        assert not list(egress_root().glob(f"pool-{session['id']}*"))
        pip = agent.run(session, "pip", "install", "--index-url", "http://pypi.test/simple/", "--trusted-host",
                        "pypi.test", "--disable-pip-version-check", "--no-cache-dir", "airlock-probe").json()
        assert pip["exit_code"] == 0, pip["output"]
        recorded = DecisionRecord.objects.filter(session_id=session["id"], kind="egress")
        assert {record.subject for record in recorded} == {"pypi.test:80"}
        assert agent.as_session(session).delete(f"/api/v1/sessions/{session['id']}").status_code in {200, 204}
        wait_until(lambda: not directory.exists())

        publish(acme, egress_policy(driver, egress=False))
        wait_until(lambda: len(pool.ready) == 2)
        plain = agent.open(conversation_id="no-egress")
        assert plain["warm"] is True
        listing = agent.run(plain, "python3", "-c", "import os; print(os.listdir('/run/airlock'))").json()
        assert listing["output"].strip() == "[]"  # an empty directory that can never fill
        assert not (egress_root() / plain["id"]).exists()
        mounts = docker.client.api.inspect_container(f"airlock-{plain['id']}")["Mounts"]
        source = next(mount["Source"] for mount in mounts if mount["Destination"] == "/run/airlock")
        assert source.startswith(str(egress_root() / "pool-")) and not os.path.exists(source)
        for sandbox in pool.ready:  # the ones still waiting keep theirs
            assert (egress_root() / f"pool-{sandbox.id}").is_dir()


def egress_policy(driver: str, *, egress: bool = True) -> str:
    runtime = "{driver: docker}" if driver == "docker" else "{isolation: gvisor}"
    network = "network: {egress: allowlist, allow: [pypi.test:80]}\n" if egress else ""
    return (f"runtime: {runtime}\nlimits: {{memory_mb: 512, pids: 128, disk_mb: 64, command_timeout_s: 90}}\n"
            "commands:\n  - {id: python3, bin: python3}\n  - {id: pip, bin: pip}\n" + network)
