"""Warm pools (docs/architecture.md, "Warm pools"): sandboxes started ahead of their sessions.

A pool keeps `size` started sandboxes of one driver and one profile: the limits a container is
made with (CPUs, memory, pids, workspace and /tmp sizes) and the root filesystem's digest (a
sandbox of an image that has since been replaced is drained, not handed out). They hold no
tenant data: no command has run in them, their workspace is empty, and the environment is bound
per command. A claim hands one to exactly one session, which destroys it at its end: a pooled
sandbox is never reused. The runner refills the pool in the background.

Each pooled sandbox mounts an empty egress directory of its own (`slots`, made by the runner):
a session with egress that claims it has its proxy put there. A claim misses, and the session
starts cold, when the pool is empty, when the session's limits are not the pool's profile (after
RETARGET_AFTER such sessions in a row the pool drains and refills with theirs: the policies in
use changed), or when the session has egress and the pool has no slots. A miss is never an
error."""

import logging
import threading
import uuid
from dataclasses import astuple, dataclass
from typing import Protocol

from sessions.runtimes.base import Driver, Limits, Sandbox, SandboxError, SandboxSpec

log = logging.getLogger("airlock.runtimes")
RETARGET_AFTER = 3  # sessions in a row asking for other limits before the pool follows them


@dataclass(frozen=True)
class Profile:
    cpus: float
    memory_mb: int
    pids: int
    disk_mb: int
    tmp_mb: int

    @classmethod
    def of(cls, limits: Limits) -> "Profile":
        return cls(limits.cpus, limits.memory_mb, limits.pids, limits.disk_mb, limits.tmp_mb)

    def label(self) -> str:
        return "/".join(str(value) for value in astuple(self))


class Slots(Protocol):
    def make(self, pool_id: str) -> str: ...  # an empty directory for a pooled sandbox to mount

    def remove(self, pool_id: str) -> None: ...


class WarmPool:
    def __init__(self, driver: Driver, size: int, limits: Limits, slots: Slots | None = None):
        self.driver, self.size, self.slots = driver, size, slots
        self.limits = limits
        self.ready: list[Sandbox] = []
        self.hits = self.misses = 0
        self._drained: list[Sandbox] = []  # of an earlier profile, for the filler to destroy
        self._closed = False  # drained for good: the runner stops
        self._asked: tuple[Profile | None, int] = (None, 0)  # another profile, asked for n times in a row
        self._good: Limits | None = None  # the last limits a sandbox started with
        self._failed: set[Profile] = set()  # profiles no sandbox could start with here
        self._lock = threading.Lock()

    @property
    def profile(self) -> Profile:
        return Profile.of(self.limits)

    def ids(self) -> set[str]:
        with self._lock:
            return {sandbox.id for sandbox in self.ready + self._drained}

    def claim(self, spec: SandboxSpec, *, egress: bool = False) -> Sandbox | None:
        """The session's sandbox from the pool, bound to it; None on a miss (then start cold).
        With `egress`, the sandbox mounts a directory for the session's proxy (the runner adopts
        it: PoolSlots); without, that directory is removed. A pooled sandbox that died while it
        waited is destroyed, and the next one tried."""
        while True:
            sandbox = self._take(spec, egress)
            if sandbox is None:
                with self._lock:
                    self.misses += 1
                return None
            try:
                bound = self.driver.bind(sandbox, spec)
            except SandboxError as exc:
                log.warning("warm pool of %s: sandbox %s could not be claimed (%s)", self.driver.name, sandbox.id, exc)
                self._destroy(sandbox)
                continue
            if not egress and self.slots is not None:
                self.slots.remove(sandbox.id)  # nothing can appear in its mount any more
                bound.handle.pop("egress_dir", None)
                bound.handle.pop("pool_id", None)
            with self._lock:
                self.hits += 1
            return bound

    def _take(self, spec: SandboxSpec, egress: bool) -> Sandbox | None:
        with self._lock:
            if spec.egress_dir is not None or self._closed:
                return None
            asked = Profile.of(spec.limits)
            if asked != self.profile:
                self._follow(asked, spec.limits)
                return None
            self._asked = (None, 0)
            # The root filesystem is part of the profile: one rebuilt since a sandbox started
            # (a new image digest) leaves that sandbox to be drained, not handed out.
            digest = getattr(self.driver, "image_digest", None)
            stale = [sandbox for sandbox in self.ready if digest and sandbox.rootfs_digest != digest]
            if stale:
                self._drained += stale
                self.ready = [sandbox for sandbox in self.ready if sandbox not in stale]
            for index, sandbox in enumerate(self.ready):
                if not egress or "egress_dir" in sandbox.handle:  # it mounts a directory for the proxy
                    return self.ready.pop(index)
            return None

    def _follow(self, asked: Profile, limits: Limits) -> None:
        """Sessions ask for other limits: after RETARGET_AFTER in a row, the pool drains and
        refills with them (sessions of two policies taking turns do not churn it), unless no
        sandbox could start with them here."""
        other, count = self._asked
        count = count + 1 if other == asked else 1
        self._asked = (asked, count)
        if count < RETARGET_AFTER or asked in self._failed:
            return
        log.info("warm pool of %s: sessions now ask for %s, not %s; draining and refilling",
                 self.driver.name, asked.label(), self.profile.label())
        self._drained += self.ready
        self.ready = []
        self.limits = limits
        self._asked = (None, 0)

    def status(self) -> dict:
        with self._lock:
            return {"size": self.size, "ready": len(self.ready), "profile": self.profile.label(),
                    "hits": self.hits, "misses": self.misses}

    def wanted(self) -> int:
        with self._lock:
            return max(0, self.size - len(self.ready)) + len(self._drained)

    def fill_once(self) -> None:
        """In a thread: destroy drained sandboxes, then start one if the pool is short."""
        with self._lock:
            drained, self._drained = self._drained, []
            short = len(self.ready) < self.size
            limits = self.limits
        for sandbox in drained:
            self._destroy(sandbox)
        if not short:
            return
        pool_id = str(uuid.uuid4())
        egress_dir = self.slots.make(pool_id) if self.slots is not None else None
        try:
            sandbox = self.driver.prepare(limits, pool_id=pool_id, egress_dir=egress_dir)
        except BaseException as exc:
            if self.slots is not None:
                self.slots.remove(pool_id)
            if isinstance(exc, SandboxError):
                self._cannot_start(limits)
            raise
        with self._lock:
            self._good = limits
            if not self._closed and limits == self.limits and len(self.ready) < self.size:
                self.ready.append(sandbox)
                return
        self._destroy(sandbox)  # the profile changed, or the pool closed, while it started

    def _cannot_start(self, limits: Limits) -> None:
        """No sandbox starts with these limits here (more CPUs than the host has, say): the pool
        goes back to the last limits that worked, and does not follow these again."""
        with self._lock:
            if limits != self.limits or self._good is None or self._good == limits:
                return
            self._failed.add(Profile.of(limits))
            log.warning("warm pool of %s: no sandbox starts with %s here; back to %s", self.driver.name,
                        Profile.of(limits).label(), Profile.of(self._good).label())
            self.limits = self._good

    def drain(self) -> None:
        """Destroy every sandbox the pool holds, and any it is starting (the runner stops)."""
        with self._lock:
            self._closed = True
            sandboxes, self.ready, self._drained = self.ready + self._drained, [], []
        for sandbox in sandboxes:
            self._destroy(sandbox)

    def _destroy(self, sandbox: Sandbox) -> None:
        try:
            self.driver.destroy(sandbox)
            if self.slots is not None:
                self.slots.remove(sandbox.id)
        except Exception:  # the runner's reaper removes what is left
            log.exception("warm pool of %s: could not destroy %s", self.driver.name, sandbox.id)


def reap_pooled(driver: Driver, kept: set[str], *, pooled: list | None = None,
                created_grace_s: float = 120) -> list[str]:
    """Destroy pooled sandboxes on this host that no live pool holds and that can serve nobody:
    stopped (their runner died, which closed their supervisor's stdin) or never started. A
    running one belongs to another runner's pool and is left alone. `pooled`: the driver's
    listing (Driver.pooled), when the caller has it already."""
    reaped = []
    for sandbox_id, state, age_s in driver.pooled() if pooled is None else pooled:
        if sandbox_id in kept:
            continue
        if state in {"exited", "dead"} or (state == "created" and age_s > created_grace_s):
            try:
                driver.destroy_by_id(sandbox_id)
            except Exception:
                log.exception("could not reap pooled %s sandbox %s", driver.name, sandbox_id)
                continue
            reaped.append(sandbox_id)
    if reaped:
        log.info("reaped %d pooled %s sandbox(es) of runners that died", len(reaped), driver.name)
    return reaped
