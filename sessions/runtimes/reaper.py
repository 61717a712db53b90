"""Orphan reaping: every sandbox on this host that belongs to no active session is destroyed.

A runner calls `reap_orphans` when it starts and periodically after (a runner that died leaves
its sandboxes behind: containers, bubblewrap process trees, workspaces, cgroups)."""

import logging
from collections.abc import Callable, Iterable

from sessions.runtimes.base import Driver

log = logging.getLogger(__name__)


def reap_orphans(driver: Driver, orphans_among: Callable[[list[str]], Iterable[str]]) -> list[str]:
    """Destroy the sandboxes that `orphans_among(present ids)` names; return the ids destroyed.

    A runner names the sandboxes whose session, in its own database, has ended: a sandbox is
    created after its session's row, so an id it does not know belongs to somebody else (another
    deployment on the host, a test) and is left alone."""
    present = driver.list_sandboxes()
    reaped = []
    for sandbox_id in sorted(set(orphans_among(present)) & set(present)):
        try:
            driver.destroy_by_id(sandbox_id)
        except Exception:  # one stuck sandbox must not stop the others from being reaped
            log.exception("could not reap %s sandbox %s", driver.name, sandbox_id)
            continue
        reaped.append(sandbox_id)
    if reaped:
        log.info("reaped %d orphan %s sandbox(es): %s", len(reaped), driver.name, ", ".join(reaped))
    return reaped
