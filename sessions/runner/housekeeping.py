"""A runner's upkeep, each loop in a task of its own (docs/architecture.md, "Runner"): the
heartbeat (alone, so nothing slow delays it past the dead-after limit), and housekeeping every
beat: sessions past their time to live or idle expire, sessions another process ended are
released, CPU / memory / disk figures are recorded, runners that stopped beating are declared
dead (their sessions fail), and orphan sandboxes are reaped now and then."""

import asyncio
import logging
import time
from functools import partial

from django.conf import settings

from sessions.persistence import services as persistence
from sessions.runner import records
from sessions.runner.egress import PoolSlots, egress_root, orphan_directories, orphan_slots, remove_directory
from sessions.runtimes import get_driver
from sessions.runtimes.base import RuntimeUnavailable
from sessions.runtimes.pool import reap_pooled
from sessions.runtimes.reaper import reap_orphans

log = logging.getLogger("airlock.runner")
REAPED_DRIVERS = {"bubblewrap", "docker", "gvisor"}


async def beat_forever(runner) -> None:
    while True:
        await asyncio.sleep(settings.AIRLOCK_RUNNER_HEARTBEAT_S)
        try:
            alive = await runner.db(records.runner_heartbeat, runner_id=runner.id, pools=runner.pool_status())
        except Exception:
            log.exception("runner %s could not beat", runner.id)
            continue
        if not alive:  # declared dead meanwhile (paused too long): its sessions have failed
            log.error("runner %s was declared dead; releasing its sessions", runner.id)
            for session_id in list(runner.live):
                runner.spawn(runner.release(session_id))
            await runner.register()


async def housekeep_forever(runner) -> None:
    while True:
        await asyncio.sleep(settings.AIRLOCK_RUNNER_HEARTBEAT_S)
        try:
            await housekeep_once(runner)
        except Exception:
            log.exception("runner %s housekeeping failed", runner.id)


async def housekeep_once(runner) -> None:
    """One round; releases run in their own tasks, and are waited for at the end."""
    busy = {live.id for live in runner.live.values() if live.command_id is not None or not live.jobs.empty()}
    ended = await runner.db(records.sessions_expire, runner_id=runner.id, busy=busy)
    ended += await runner.db(records.inactive_among, session_ids=list(runner.live))
    releases = [runner.spawn(runner.release(session_id)) for session_id in set(ended)]
    await asyncio.gather(*(_record_stats(runner, live) for live in list(runner.live.values())))
    dead = await runner.db(records.runners_declare_dead, local_pids_gone=False, exclude=runner.id)
    if dead or time.monotonic() - runner.last_reap > settings.AIRLOCK_RUNNER_REAP_INTERVAL_S:
        await reap(runner)
    if time.monotonic() - runner.last_prune > settings.AIRLOCK_PRUNE_INTERVAL_S:
        runner.last_prune = time.monotonic()  # snapshots and artifacts past their retention (audited)
        pruned = await runner.db(persistence.prune)
        if pruned.snapshots or pruned.artifacts or pruned.blobs:
            log.info("runner %s pruned %d snapshots, %d artifacts and %d blobs without a record", runner.id,
                     pruned.snapshots, pruned.artifacts, pruned.blobs)
    if releases:
        await asyncio.wait(releases)


async def _record_stats(runner, live) -> None:
    if live.sandbox is None or live.stats_pending:
        return  # a previous call still runs (a slow daemon): do not pile up more
    live.stats_pending = True
    call = runner.loop.run_in_executor(runner.stats_executor, live.driver.stats, live.sandbox)
    call.add_done_callback(lambda _: setattr(live, "stats_pending", False))  # when the thread is free
    try:
        stats = await asyncio.wait_for(asyncio.shield(call), timeout=5)
    except Exception:  # figures are best effort; the sandbox may be going away, or slow to answer
        return
    await runner.db(records.session_stats, session_id=live.id, stats=stats)
    live.stats = stats
    runner.outbox.summary(live)


async def reap(runner) -> list[str]:
    """Destroy this host's sandboxes whose session has ended, for every driver this host can
    reach (a driver it cannot reach has no sandboxes here to reap). What the runner is still
    releasing is not an orphan."""
    runner.last_reap = time.monotonic()
    reaped = []
    slots_kept = {sandbox_id for pool in runner.pools.values() for sandbox_id in pool.ids()}
    for name in sorted(runner.drivers | REAPED_DRIVERS):
        driver = get_driver(name)
        try:
            present = await runner.blocking(driver.list_sandboxes)
        except RuntimeUnavailable:
            continue
        orphans = await runner.db(records.orphans, present=present) - set(runner.live)
        if orphans:
            reaped += await runner.blocking(reap_orphans, driver, lambda _present, orphans=orphans: orphans)
        if driver.supports_pool:  # pooled sandboxes of runners that died
            try:
                pooled = await runner.blocking(driver.pooled)
            except RuntimeUnavailable:
                continue
            kept = runner.pools[name].ids() if name in runner.pools else set()
            gone = await runner.blocking(partial(reap_pooled, driver, kept, pooled=pooled))
            reaped += gone
            slots_kept |= {sandbox_id for sandbox_id, _, _ in pooled} - set(gone)
    # Egress directories left by a runner that died (their proxies died with it), and those of
    # pooled sandboxes that are gone (a claimed one's became its session's: PoolSlots.adopt).
    leftover = orphan_directories(set(runner.live))
    for session_id in await runner.db(records.orphans, present=leftover) if leftover else ():
        await runner.blocking(remove_directory, egress_root() / session_id)
    for pool_id in orphan_slots(slots_kept):
        await runner.blocking(PoolSlots().remove, pool_id)
    if reaped:
        await runner.db(records.runner_reaped, runner_id=runner.id, count=len(reaped))
    return reaped
