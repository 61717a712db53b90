"""A runner's warm pool through the API, on real Docker sandboxes: sessions come from it and say
so, it refills, a session it cannot serve starts cold, and what it holds goes when it stops."""

import os
import time

import pytest

from controlplane.models import ApiKeyScope
from sessions.models import Runner, Session
from sessions.runner import records
from sessions.runtimes import get_driver
from sessions.runtimes.base import Limits, RuntimeUnavailable
from tests.sessions.conftest import Agent, publish, run_on, running_runner

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
        # session, whose policy sets its own, starts cold; the pool follows it.
        assert agent.open(conversation_id="first")["warm"] is False
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
        cold = agent.open(conversation_id="bigger")
        assert cold["warm"] is False
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
    killed = [docker.prepare(Limits()) for _ in range(2)]
    alive = docker.prepare(Limits())
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
