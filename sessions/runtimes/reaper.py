"""Orphan reaping: every sandbox on this host that belongs to no active session is destroyed.

A runner calls `reap_orphans` when it starts and periodically after (a runner that died leaves
its sandboxes behind: containers, bubblewrap process trees, workspaces, cgroups)."""

import logging
from collections.abc import Iterable

from sessions.runtimes.base import Driver

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

