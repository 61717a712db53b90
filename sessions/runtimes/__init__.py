"""Sandbox runtimes behind one interface (see base.Driver). `get_driver(name)` returns the
process-wide instance of a driver; it keeps the state of the commands that run in it."""

import threading

from sessions.runtimes.base import Driver, RuntimeUnavailable

DRIVERS = ("bubblewrap", "docker", "gvisor")
POOLED_DRIVERS = ("docker", "gvisor")  # the ones whose Driver.supports_pool (warm pools: pool.py)
_instances: dict[str, Driver] = {}
_lock = threading.Lock()


def get_driver(name: str) -> Driver:
    with _lock:
        if name not in _instances:
            _instances[name] = _make(name)
        return _instances[name]


def _make(name: str) -> Driver:
    if name == "bubblewrap":
        from sessions.runtimes.bubblewrap import BubblewrapDriver

        return BubblewrapDriver()
    if name in {"docker", "gvisor"}:
        from sessions.runtimes.docker_driver import DockerDriver

        return DockerDriver(isolation="gvisor" if name == "gvisor" else "standard")
    raise RuntimeUnavailable(f"unknown sandbox driver {name!r}; choose one of {', '.join(DRIVERS)}")
