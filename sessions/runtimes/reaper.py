"""Orphan reaping: every sandbox on this host that belongs to no active session is destroyed.

A runner calls `reap_orphans` when it starts and every REAP_INTERVAL_S after (a runner that
died leaves its sandboxes behind: containers, bubblewrap process trees, workspaces, cgroups)."""

import logging
from collections.abc import Callable, Iterable

from sessions.runtimes import get_driver
from sessions.runtimes.base import Driver, RuntimeUnavailable

REAP_INTERVAL_S = 60
log = logging.getLogger(__name__)


def reap_orphans(driver: Driver, active_ids: Iterable[str]) -> list[str]:
    """Destroy the driver's sandboxes whose id is not in active_ids; return the ids destroyed."""
    reaped = []
    for sandbox_id in driver.list_orphans(set(active_ids)):
        try:
            driver.destroy_by_id(sandbox_id)
        except Exception:  # one stuck sandbox must not stop the others from being reaped
            log.exception("could not reap %s sandbox %s", driver.name, sandbox_id)
            continue
        reaped.append(sandbox_id)
    if reaped:
        log.info("reaped %d orphan %s sandbox(es): %s", len(reaped), driver.name, ", ".join(reaped))
    return reaped


def reap_all_drivers(drivers: Iterable[str], active_ids: Callable[[], Iterable[str]]) -> dict[str, list[str]]:
    """Reap every available driver; a driver that cannot work on this host is skipped."""
    reaped = {}
    for name in drivers:
        try:
            driver = get_driver(name)
            driver.check()
        except RuntimeUnavailable:
            continue
        reaped[name] = reap_orphans(driver, active_ids())
    return reaped
