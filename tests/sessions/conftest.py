"""Sessions run on real bubblewrap sandboxes, driven by a real runner.

`runner` starts the embedded runner the way the server does, on an event loop of its own (in
a thread, as the server's loop is to its request threads). Its database work happens in threads,
hence transactional tests. Skipped when bubblewrap cannot work here, except in CI."""

import asyncio
import os

import pytest
import pytest_asyncio

from controlplane.models import ApiKeyScope
from policies_app import services as policy_services
from sessions.runner import set_local_runner
from sessions.runner.core import RunnerService
from sessions.runner.thread import runner_in_thread
from sessions.runtimes import get_driver
from sessions.runtimes.base import RuntimeUnavailable

POLICY = """
mode: enforce
limits: {cpus: 1, memory_mb: 256, pids: 64, disk_mb: 8, command_timeout_s: 20, output_tail_chars: 2000}
commands:
  - id: pytest
    bin: pytest
    prepend_args: ["-q"]
    deny_args: ["^-c", "^-p"]
  - id: python3
    bin: python3
    deny_args: ["^-"]
  - id: sleep
    bin: sleep
    allow_args: ["^[0-9]+$"]
  - id: printf
    bin: printf
env: {set: {GREETING: hello}}
"""


@pytest.fixture(scope="session")
def sandboxes(built_rootfs):
    """bubblewrap, ready."""
    try:
        if isinstance(built_rootfs, RuntimeUnavailable):
            raise built_rootfs
        get_driver("bubblewrap").check()
    except RuntimeUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bubblewrap is required in CI: {exc}")
        pytest.skip(f"bubblewrap unavailable: {exc}")


def running_runner():
    return runner_in_thread("test-runner-loop")


@pytest.fixture
def runner(transactional_db, sandboxes):
    with running_runner() as instance:
        yield instance


def run_on(runner, coroutine, timeout: float = 60):
    """Run a coroutine on the runner's loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coroutine, runner.loop).result(timeout)


def publish(tenant, source: str = POLICY, name: str = "default"):
    policy = tenant.policies.filter(name=name).first() or policy_services.policy_create(
        tenant=tenant, name=name, actor=None)
    version = policy_services.version_create(policy=policy, source=source, actor=None, note="test")
    policy_services.version_publish(version=version, actor=None, note="test")
    return version


@pytest.fixture
def acme_policy(acme):
    return publish(acme)


@pytest.fixture
def agent(acme, acme_policy, make_key, api, runner):
    """An agent of acme: opens sessions with its key and drives them with their tokens."""
    return Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)


@pytest_asyncio.fixture
async def loop_runner(transactional_db, sandboxes):
    """The runner on the test's own event loop, where WebSocket communicators run too (the
    in-memory channel layer serves one loop, as in the server)."""
    instance = RunnerService(embedded=True)
    await instance.start()
    set_local_runner(instance)
    yield instance
    await instance.stop("test finished")
    set_local_runner(None)


@pytest.fixture
def async_agent(acme, acme_policy, make_key, api, loop_runner):
    """The agent, for async tests: call its methods through sync_to_async."""
    return Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)


class Agent:
    def __init__(self, api, key: str):
        self.api, self.key = api, key
        self.client = api(key)

    def open(self, **body) -> dict:
        response = self.client.post("/api/v1/sessions", {"conversation_id": "conv-1", **body},
                                    content_type="application/json")
        assert response.status_code == 201, response.content
        return response.json()

    def as_session(self, session: dict):
        return self.api(session["token"])

    def run(self, session: dict, bin_name: str, *args: str, wait: bool = True, **extra):
        return self.as_session(session).post(
            f"/api/v1/sessions/{session['id']}/commands", {"bin": bin_name, "args": list(args), "wait": wait, **extra},
            content_type="application/json")

    def put(self, session: dict, path: str, data: bytes):
        return self.as_session(session).put(f"/api/v1/sessions/{session['id']}/files/{path}", data,
                                            content_type="application/octet-stream")

    def get(self, session: dict, path: str):
        return self.as_session(session).get(f"/api/v1/sessions/{session['id']}/files/{path}")
