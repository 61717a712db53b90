"""The runtime conformance suite runs every test against every driver, on real sandboxes.

A driver that cannot work on this host is skipped with the reason, except where the
environment requires it: AIRLOCK_REQUIRE_DOCKER=1 for docker and gvisor, CI=true for
bubblewrap. The root filesystem (and the Docker image) are built on first use when missing."""

import os
import uuid
from typing import NoReturn

import pytest

from sessions.runtimes import get_driver
from sessions.runtimes.base import Driver, Limits, RuntimeUnavailable, SandboxSpec

DRIVERS = ["bubblewrap", "docker", "gvisor"]


def _required(name: str) -> bool:
    if name == "bubblewrap":
        return os.environ.get("CI") == "true"
    return os.environ.get("AIRLOCK_REQUIRE_DOCKER") == "1"


def unavailable(name: str, exc: Exception) -> NoReturn:
    """Skip, or fail where the environment requires the driver."""
    if _required(name):
        pytest.fail(f"{name} is required here but unavailable: {exc}")
    pytest.skip(f"{name} unavailable: {exc}")


def checked_driver(name: str, built_rootfs) -> Driver:
    """The driver `name`, checked on this host, with its root filesystem built."""
    try:
        if isinstance(built_rootfs, RuntimeUnavailable):
            raise built_rootfs
        instance = get_driver(name)
        instance.check()
    except RuntimeUnavailable as exc:
        unavailable(name, exc)
    return instance


@pytest.fixture(params=DRIVERS, scope="session")
def driver(request, built_rootfs):
    return checked_driver(request.param, built_rootfs)


@pytest.fixture
def make_sandbox(driver):
    created = []

    def make(**limits):
        spec = SandboxSpec(tenant="conformance", session_id=str(uuid.uuid4()),
                           limits=Limits(**{"command_timeout_s": 20, **limits}))
        sandbox = driver.create(spec)
        created.append(sandbox)
        return sandbox

    yield make
    for sandbox in created:
        driver.destroy(sandbox)


@pytest.fixture
def sandbox(make_sandbox):
    return make_sandbox()
