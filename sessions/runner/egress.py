"""A session's way out (docs/architecture.md, "Egress"): its own proxy, on a Unix socket in a
directory that only its sandbox mounts; the pinned policy version judging each connection; and
the record of each, with the command that was running, sent live as a `decision` event.

Decisions are answered at once and written a moment later in batches (a connection is too
frequent for a write each); a command's result is not stored until the decisions its
connections made are, so whoever reads the command finds them."""

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.utils import timezone

from controlplane.redaction import redact, redact_data
from policies_app.decisions import Taken, compiled_version, decision_payload
from policies_app.engine import Decision, VersionRef, evaluate_egress
from sessions.egress import forward
from sessions.egress.proxy import EgressProxy, Limits, Resolver
from sessions.runner import records
from sessions.runtimes.base import EGRESS_FORWARDER, EGRESS_SOCKET, is_uuid
from sessions.runtimes.linux import mount_tmpfs, unmount

log = logging.getLogger("airlock.egress")
NOBODY = 65534
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
DIRECTORY_BYTES = 2**20  # the forwarder (a few KiB) and a socket
BATCH_WAIT_S = 0.05  # decisions wait this long at most to be written with the next ones
WRITE_ATTEMPTS = 3
DATABASE_DECISIONS = 2  # database threads one session's decisions may hold at once
TAKEN_MAX = 4096
# Refused connections a session may have judged and recorded, per second (and in a burst). Past
# that each is refused unjudged, and one such refusal a second is recorded: a sandbox that
# floods the proxy with connections it knows are refused costs the control plane little.
DENIALS_PER_S, DENIAL_BURST = 50, 200
FLOODED = {"allowed": False, "effect": "deny", "reason_code": "limit_exceeded", "rule_id": "egress.refusal_rate",
           "message": f"denied: the session asks for refused connections faster than {DENIALS_PER_S} a second; "
                      "this one was not judged, and such refusals are recorded once a second",
           "hint": "stop retrying what the policy refuses"}
POLICY_FRESH_S = 1.0  # a shadow set on the policy judges this session's connections within this long


def egress_root() -> Path:
    return Path(settings.AIRLOCK_SANDBOX_DIR) / "egress"


DEFAULT_DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306}


def control_plane_ports() -> set[int]:
    """The ports of the server, the database and Redis, which no proxy reaches on this host."""
    ports = {settings.AIRLOCK_PORT}
    database = settings.DATABASES["default"]
    vendor = database["ENGINE"].rsplit(".", 1)[-1]
    if database.get("PORT") or vendor in DEFAULT_DATABASE_PORTS:
        ports.add(int(database.get("PORT") or DEFAULT_DATABASE_PORTS[vendor]))
    if settings.REDIS_URL:
        ports.add(urlsplit(settings.REDIS_URL).port or 6379)
    return ports


def control_plane_names() -> set[str]:
    """The names this control plane answers to (ALLOWED_HOSTS; `.example.com` is the name and
    every name under it): no proxy reaches them, wherever they point."""
    return {name.lower().rstrip(".") for name in settings.ALLOWED_HOSTS if name != "*"}


class SessionEgress:
    """One session's proxy, the directory its sandbox mounts, and its decisions."""

    def __init__(self, runner, live, context: records.EgressContext, *, adopted: bool = False):
        """`adopted`: the session's directory exists already, the one its pooled sandbox mounts
        (PoolSlots.adopt)."""
        self.runner, self.live, self.context = runner, live, context
        self.directory = egress_root() / context.session_id
        self._adopted = adopted
        self.proxy = EgressProxy(
            path=str(self.directory / EGRESS_SOCKET), judge=self,
            resolver=Resolver(test_hosts=dict(settings.AIRLOCK_EGRESS_TEST_HOSTS)),
            limits=Limits(max_bytes=context.max_bytes, max_connections=context.max_connections),
            control_ports=control_plane_ports(), control_names=control_plane_names())
        # Decided, not yet recorded: by id() of the payload, which is held alive here.
        self._taken: collections.OrderedDict[int, tuple[dict, records.Evaluation]] = collections.OrderedDict()
        self._policy: tuple = (None, 0.0)  # the last database verdict (policy row, exceptions) and when
        self._deciding = asyncio.Semaphore(DATABASE_DECISIONS)
        self._denials = TokenBucket(rate=DENIALS_PER_S, burst=DENIAL_BURST)
        self._flood_recorded_at = 0.0
        self._pending: list[Taken] = []
        self._writing: asyncio.Task | None = None
        self._hurry = asyncio.Event()  # set while someone waits for the writes

    async def start(self) -> str:
        """The directory to mount (its socket and the forwarder), ready."""
        if len(self.proxy.path) > SOCKET_PATH_MAX:
            raise OSError(f"the egress socket path {self.proxy.path} is longer than a Unix socket allows "
                          f"({SOCKET_PATH_MAX} bytes); set AIRLOCK_SANDBOX_DIR to a shorter path")
        ensure_egress_root()
        self.directory.mkdir(mode=0o755, exist_ok=self._adopted)
        as_root = os.geteuid() == 0
        if as_root and not self._adopted and self.live.driver.name == "bubblewrap":
            # A file system of its own: a bind mount shows its source's path within its file
            # system in the sandbox's /proc/self/mountinfo, here "/" rather than this host path.
            # (Docker's containers show their layers' host paths whatever is done here.)
            mount_tmpfs(self.directory, size_bytes=DIRECTORY_BYTES, uid=0, gid=0, mode=0o755, inodes=16)
        shutil.copyfile(forward.__file__, self.directory / EGRESS_FORWARDER)
        os.chmod(self.directory / EGRESS_FORWARDER, 0o444)
        # Only this sandbox mounts the directory, and only the sandbox's uid (and root) may connect.
        # A runner that is not root cannot give the socket to a container's uid 65534: then any
        # uid may connect, to a path none can list (a random session id under a 0711 directory).
        mode = 0o600 if as_root or self.live.driver.name == "bubblewrap" else 0o666
        await self.proxy.start(mode=mode, owner=NOBODY if as_root else None)
        return str(self.directory)

    async def close(self) -> None:
        """The proxy stops and its tunnels are cut, its decisions are written, its directory goes:
        checked gone, not assumed."""
        await self.proxy.close()
        await self.flush()
        remove_directory(self.directory)
        if self.directory.exists():
            raise OSError(f"the egress directory {self.directory} is still present after the session")

    # -- the proxy's judge -----------------------------------------------------------------
    def _at_once(self, host: str, port: int) -> records.Evaluation | None:
        """A decision taken on the loop, without the database: the version and its shadow are
        compiled in memory, the policy row (which names the shadow) was read within
        POLICY_FRESH_S, and the policy had no egress exception then (one could turn a denial).
        Else None: the database thread decides."""
        verdict, read_at = self._policy
        if verdict is None or verdict.exceptions or time.monotonic() - read_at > POLICY_FRESH_S:
            return None
        request = {"host": host, "port": port}
        started = time.perf_counter_ns()
        decision = evaluate_egress(compiled_version(self.context.version), request)
        shadow_version = verdict.policy.shadow_version
        shadow = evaluate_egress(compiled_version(shadow_version), request) if shadow_version else None
        return records.Evaluation(decision=decision, record=None, shadow=shadow, shadow_version=shadow_version,
                                  eval_us=(time.perf_counter_ns() - started) // 1000)

    async def decide(self, host: str, port: int) -> dict:
        evaluation = self._at_once(host, port)
        if evaluation is None:
            # A few at a time: a sandbox flooding the proxy must not take the database threads
            # that heartbeats and other sessions need.
            async with self._deciding:
                verdict = await self.runner.db(records.egress_decide, context=self.context, host=host, port=port)
            self._policy = (verdict, time.monotonic())
            evaluation = verdict.evaluation
        if not evaluation.decision.allowed and not self._denials.take():
            return {**FLOODED, "mode": self.context.mode, "policy_version": self.context.ref}  # not judged
        payload = decision_payload(evaluation.decision)
        self._taken[id(payload)] = (payload, evaluation)
        while len(self._taken) > TAKEN_MAX:  # decided, never recorded (the client left mid-way): not kept forever
            self._taken.popitem(last=False)
        return payload

    def record(self, host: str, port: int, decision: dict, policy: dict) -> dict:
        if decision.get("rule_id") == FLOODED["rule_id"]:
            now = time.monotonic()
            if now - self._flood_recorded_at < 1:
                return {**decision, "id": None}
            self._flood_recorded_at = now
        _, evaluation = self._taken.pop(id(policy), (None, None))
        shadow = evaluation.shadow if evaluation and decision is policy else None  # a guard's refusal has none
        stored = {**decision, "id": str(uuid.uuid4())}
        ref = decision.get("policy_version")
        self._pending.append(Taken(
            id=uuid.UUID(stored["id"]), tenant=self.context.tenant, version=self.context.version, kind="egress",
            request={"host": host, "port": port},
            decision=Decision(decision["allowed"], decision["effect"], decision["reason_code"], decision["rule_id"],
                              decision["message"], decision["hint"], decision["mode"],
                              VersionRef(**ref) if ref else None),
            created_at=timezone.now(), session_id=self.context.session_id,
            conversation_id=self.context.conversation_id, command_id=self.live.command_id,
            eval_us=evaluation.eval_us if evaluation else 0,
            shadow_version=evaluation.shadow_version if shadow else None, shadow=shadow))
        if self._writing is None or self._writing.done():
            self._writing = asyncio.ensure_future(self._write())
        secrets = self.runner.secrets  # the stored copy is redacted as it is written; the live one here
        self.runner.outbox.emit(self.live, {
            "event": "decision", "request": redact_data({"host": host, "port": port}, secrets),
            "decision": {**stored, "message": redact(stored["message"], secrets),
                         "hint": redact(stored["hint"], secrets)},
            "command": self.live.command_id})
        return stored

    async def _write(self) -> None:
        while self._pending:
            if not self._hurry.is_set():  # a moment for more to come: one write for many connections
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), BATCH_WAIT_S)
            batch, self._pending = self._pending, []
            for attempt in range(WRITE_ATTEMPTS):
                try:
                    await self.runner.db(records.egress_store, taken=batch)
                    break
                except Exception:  # the database restarting, say: try again, then say what was lost
                    if attempt == WRITE_ATTEMPTS - 1:
                        log.exception("session %s: %d egress decisions could not be recorded",
                                      self.context.session_id, len(batch))
                    else:
                        await asyncio.sleep(0.5 * (attempt + 1))

    async def flush(self) -> None:
        """Return once every decision recorded so far is written."""
        self._hurry.set()
        try:
            while self._writing is not None and not self._writing.done():
                await asyncio.shield(self._writing)
        finally:
            self._hurry.clear()


class TokenBucket:
    def __init__(self, *, rate: float, burst: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def ensure_egress_root() -> Path:
    root = egress_root()
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # noqa: S103 - sandboxes (uid 65534) traverse it to their own directory only
    return root


POOL_SLOT = "pool-"
SLOT_GRACE_S = 120  # a pooled sandbox's directory is made a moment before its container


class PoolSlots:
    """Egress directories of pooled sandboxes (sessions/runtimes/pool.py), `pool-<id>`: each is
    made empty and mounted when its sandbox starts. A session with egress that claims the sandbox
    adopts it: renamed to the session's own directory (the mount follows the directory, not its
    name), its proxy's socket and the forwarder go there, and from then on it is that session's
    like any other. One without egress has it removed: nothing can appear in its mount."""

    def make(self, pool_id: str) -> str:
        directory = ensure_egress_root() / f"{POOL_SLOT}{pool_id}"
        directory.mkdir(mode=0o755)
        return str(directory)

    def remove(self, pool_id: str) -> None:
        remove_directory(egress_root() / f"{POOL_SLOT}{pool_id}")

    def adopt(self, pool_id: str, session_id: str) -> None:
        if not is_uuid(pool_id) or not is_uuid(session_id):
            raise OSError(f"not a pooled sandbox and a session: {pool_id!r}, {session_id!r}")
        os.rename(egress_root() / f"{POOL_SLOT}{pool_id}", egress_root() / session_id)


def orphan_slots(kept: set[str]) -> list[str]:
    """Pool ids with a directory here that is not in `kept` and older than SLOT_GRACE_S."""
    root = egress_root()
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        pool_id = child.name.removeprefix(POOL_SLOT)
        if child.name.startswith(POOL_SLOT) and pool_id not in kept:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - child.stat().st_mtime > SLOT_GRACE_S:
                    found.append(pool_id)
    return sorted(found)


def remove_directory(directory: Path) -> None:
    """The directory and what is in it, its own file system (SessionEgress.start) unmounted first."""
    if os.geteuid() == 0:
        unmount(directory)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)


def orphan_directories(live: set[str]) -> list[str]:
    """Session ids with an egress directory on this host that no live session of this runner owns."""
    root = egress_root()
    if not root.is_dir():
        return []
    return sorted(child.name for child in root.iterdir() if is_uuid(child.name) and child.name not in live)
