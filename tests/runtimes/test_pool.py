"""Warm pools on real Docker and gVisor sandboxes: a claimed sandbox is its session's alone and
holds nothing of another, a miss starts cold, a pool follows the limits sessions ask for, and a
runner killed with its pool full leaves nothing behind once a runner reaps."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sessions.runtimes.base import Limits, SandboxError, SandboxSpec
from sessions.runtimes.pool import RETARGET_AFTER, WarmPool, reap_pooled
from tests.runtimes.conftest import checked_driver
from tests.runtimes.helpers import py, run

ROOT = Path(__file__).resolve().parents[2]
LIMITS = Limits(command_timeout_s=20)


@pytest.fixture(params=["docker", "gvisor"], scope="module")
def pooling(request, built_rootfs):
    return checked_driver(request.param, built_rootfs)


@pytest.fixture
def pool(pooling):
    pool = WarmPool(pooling, 2, LIMITS)
    yield pool
    pool.drain()


def spec(**changes) -> SandboxSpec:
    return dataclasses.replace(SandboxSpec(tenant="acme", session_id=str(uuid.uuid4()), limits=LIMITS), **changes)


def fill(pool: WarmPool) -> None:
    while pool.wanted():
        pool.fill_once()


def test_a_claim_binds_a_started_sandbox_to_its_session_and_the_pool_never_hands_it_out_again(pooling, pool):
    fill(pool)
    waiting = {sandbox.id for sandbox in pool.ready}
    first, second = spec(), spec()
    claimed = pool.claim(first)
    try:
        assert claimed is not None and claimed.warm and claimed.id == first.session_id
        assert first.session_id in pooling.list_sandboxes()  # listed, reaped and destroyed as the session's
        assert run(pooling, claimed, ["sh", "-c", "echo $AIRLOCK_X"], env={"AIRLOCK_X": "bound"}).stdout == "bound\n"
        other = pool.claim(second)
        assert other is not None and other.handle["container"] != claimed.handle["container"]
        assert pool.claim(spec()) is None  # empty now: a miss, never an error
        assert (pool.hits, pool.misses) == (2, 1)
        assert {sandbox.id for sandbox in pool.ready} == set() and waiting.isdisjoint(pooling.list_sandboxes())
        pooling.destroy(other)
    finally:
        pooling.destroy(claimed)
    assert first.session_id not in pooling.list_sandboxes()


def test_a_pooled_sandbox_holds_nothing_of_an_earlier_session(pooling, pool):
    """The one before leaves a file, a process and its environment; the next, from the pool,
    sees none of them."""
    fill(pool)
    token = f"airlock-{uuid.uuid4().hex}"
    before = pool.claim(spec(env={"EARLIER_SECRET": token}))
    py(pooling, before, "import subprocess, sys; open('/workspace/left', 'w').write(sys.argv[1]); "
       "open('/tmp/left', 'w').write(sys.argv[1]); "
       "subprocess.Popen(['sleep', '300', sys.argv[1]], start_new_session=True)", token)
    pooling.destroy(before)
    fill(pool)
    after = pool.claim(spec())
    try:
        look = (
            "import json, os\n"
            "procs = [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in os.listdir('/proc')\n"
            "         if p.isdigit() and int(p) != os.getpid()]\n"
            "print(json.dumps({'workspace': os.listdir('/workspace'), 'tmp': os.listdir('/tmp'),\n"
            "                  'env': dict(os.environ), 'procs': procs}))\n"
        )
        seen = json.loads(py(pooling, after, look).stdout)
        assert seen["workspace"] == [] and seen["tmp"] == []
        assert "EARLIER_SECRET" not in seen["env"] and token not in json.dumps(seen)
        assert len(seen["procs"]) == 1, seen["procs"]  # the supervisor
    finally:
        pooling.destroy(after)


def test_a_session_the_pool_cannot_serve_starts_cold_and_the_pool_follows_the_limits_in_use(pooling, pool):
    fill(pool)
    old = {sandbox.id for sandbox in pool.ready}
    assert pool.claim(spec(), egress=True) is None  # a pool without slots has no mount for a proxy: cold
    assert {sandbox.id for sandbox in pool.ready} == old
    bigger = dataclasses.replace(LIMITS, memory_mb=768)
    for _ in range(RETARGET_AFTER - 1):
        assert pool.claim(spec(limits=bigger)) is None  # another profile: cold
        assert {sandbox.id for sandbox in pool.ready} == old  # once is not a change of the policies in use
    assert pool.claim(spec(limits=bigger)) is None  # again: the pool drains and follows
    assert pool.ready == [] and pool.limits == bigger
    fill(pool)
    assert old.isdisjoint(pooling.list_sandboxes() + [i for i, _, _ in pooling.pooled()])
    claimed = pool.claim(spec(limits=bigger))
    try:
        assert claimed is not None and claimed.spec.limits.memory_mb == 768
        inspect = pooling.client.api.inspect_container(claimed.handle["container"])
        assert inspect["HostConfig"]["Memory"] == 768 * 2**20
    finally:
        pooling.destroy(claimed)


KEEP_A_POOL = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
import django
django.setup()
from sessions.runtimes import get_driver
from sessions.runtimes.base import Limits
from sessions.runtimes.pool import WarmPool
pool = WarmPool(get_driver(sys.argv[2]), 2, Limits())
while pool.wanted():
    pool.fill_once()
print(" ".join(sandbox.id for sandbox in pool.ready), flush=True)
time.sleep(300)
"""


def test_a_killed_runner_leaves_no_pooled_sandbox_once_a_runner_reaps(pooling):
    env = {**os.environ, "SECRET_KEY": os.environ.get("SECRET_KEY", "k" * 60)}
    keeper = subprocess.Popen([sys.executable, "-c", KEEP_A_POOL, str(ROOT), pooling.name], stdout=subprocess.PIPE,
                              env=env, text=True)
    try:
        ids = keeper.stdout.readline().split()
        assert len(ids) == 2
        running = {i for i, state, _ in pooling.pooled() if state == "running"}
        assert set(ids) <= running
        assert not set(reap_pooled(pooling, set())) & set(ids)  # a live runner's pool is left alone
    finally:
        keeper.send_signal(signal.SIGKILL)
        keeper.wait(10)
    deadline = time.monotonic() + 20
    while {i for i, state, _ in pooling.pooled() if state == "running"} & set(ids):
        assert time.monotonic() < deadline, "pooled sandboxes kept running after their runner was killed"
        time.sleep(0.1)
    assert set(reap_pooled(pooling, set())) >= set(ids)
    assert not set(ids) & {i for i, _, _ in pooling.pooled()}


def test_a_pooled_sandbox_that_died_while_it_waited_is_passed_over(pooling, pool):
    fill(pool)
    dead, alive = pool.ready
    pooling.client.api.kill(dead.handle["container"])
    deadline = time.monotonic() + 20
    while not pooling._channels[dead.id].closed.is_set():  # its attach stream ends with it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    claimed = pool.claim(spec())
    try:
        assert claimed is not None and claimed.handle["container"] == alive.handle["container"]
        assert run(pooling, claimed, ["true"]).status.exit_code == 0
        assert dead.id not in {i for i, _, _ in pooling.pooled()}  # destroyed, not left waiting
    finally:
        pooling.destroy(claimed)


def test_a_sandbox_that_starts_while_the_pool_is_drained_is_destroyed_not_kept(pooling):
    """The runner stops (drain) while its filler still starts a sandbox in a thread."""
    pool = WarmPool(pooling, 1, LIMITS)
    before = {i for i, _, _ in pooling.pooled()}
    prepare = pooling.prepare

    def prepare_then_drain(limits, **options):
        sandbox = prepare(limits, **options)
        pool.drain()
        return sandbox

    pooling.prepare = prepare_then_drain
    try:
        pool.fill_once()
    finally:
        del pooling.prepare
    assert pool.ready == [] and pool.claim(spec()) is None
    assert {i for i, _, _ in pooling.pooled()} <= before


def test_sessions_of_two_policies_taking_turns_do_not_churn_the_pool(pooling, pool):
    fill(pool)
    other = dataclasses.replace(LIMITS, memory_mb=384)
    claimed = []
    try:
        for _ in range(4):
            assert pool.claim(spec(limits=other)) is None
            claimed.append(pool.claim(spec()))
            assert claimed[-1] is not None and claimed[-1].warm
            fill(pool)
        assert pool.limits == LIMITS and (pool.hits, pool.misses) == (4, 4)
    finally:
        for sandbox in claimed:
            pooling.destroy(sandbox)


def test_limits_no_sandbox_can_start_with_here_send_the_pool_back_to_the_last_that_worked(pooling, pool):
    fill(pool)
    impossible = dataclasses.replace(LIMITS, cpus=float(os.cpu_count() * 16))  # valid, and more than the host has
    for _ in range(RETARGET_AFTER):
        assert pool.claim(spec(limits=impossible)) is None
    assert pool.limits == impossible
    with pytest.raises(SandboxError):
        pool.fill_once()
    assert pool.limits == LIMITS  # back to what worked: the pool serves the others again
    fill(pool)
    for _ in range(RETARGET_AFTER + 1):
        assert pool.claim(spec(limits=impossible)) is None
    assert pool.limits == LIMITS and len(pool.ready) == 2  # and is not sent there again


def test_a_pooled_sandbox_of_a_root_filesystem_since_replaced_is_drained_not_handed_out(pooling, pool):
    fill(pool)
    old = {sandbox.id for sandbox in pool.ready}
    current = pooling.image_digest
    pooling.image_digest = "sha256:" + "0" * 64  # what a rebuilt and re-imported tree would give
    try:
        assert pool.claim(spec()) is None
        assert pool.ready == [] and old <= pool.ids()  # waiting to be destroyed by the filler
    finally:
        pooling.image_digest = current
    pool.fill_once()
    assert old.isdisjoint({i for i, _, _ in pooling.pooled()})


def test_the_drivers_named_as_pooling_are_the_ones_that_support_a_pool():
    from sessions.runtimes import DRIVERS, POOLED_DRIVERS, get_driver

    assert {name for name in DRIVERS if get_driver(name).supports_pool} == set(POOLED_DRIVERS)
