"""A session's way out (docs/architecture.md, "Egress"): its own proxy, on a Unix socket in a
directory that only its sandbox mounts; the pinned policy version judging each connection; and
the record of each, with the command that was running, sent live as a `decision` event.

Decisions are answered at once and written a moment later in batches (a connection is too
frequent for a write each); a command's result is not stored until the decisions its
connections made are, so whoever reads the command finds them."""

import asyncio
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

from policies_app.decisions import Taken, compiled_version, decision_payload
from policies_app.engine import Decision, VersionRef, evaluate_egress
from sessions.egress import forward
from sessions.egress.proxy import EgressProxy, Limits, Resolver
from sessions.runner import records
from sessions.runtimes.base import EGRESS_FORWARDER, EGRESS_SOCKET, is_uuid

log = logging.getLogger("airlock.egress")
NOBODY = 65534
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
BATCH_WAIT_S = 0.05  # decisions wait this long at most to be written with the next ones
POLICY_FRESH_S = 1.0  # a shadow set on the policy judges this session's connections within this long


def egress_root() -> Path:
    return Path(settings.AIRLOCK_SANDBOX_DIR) / "egress"


def control_plane_ports() -> set[int]:
    """The ports of the server, the database and Redis, which no proxy reaches on this host."""
    ports = {settings.AIRLOCK_PORT}
    database_port = settings.DATABASES["default"].get("PORT")
    if database_port:
        ports.add(int(database_port))
    if settings.REDIS_URL:
        ports.add(urlsplit(settings.REDIS_URL).port or 6379)
    return ports


class SessionEgress:
    """One session's proxy, the directory its sandbox mounts, and its decisions."""

    def __init__(self, runner, live, context: records.EgressContext):
        self.runner, self.live, self.context = runner, live, context
        self.directory = egress_root() / context.session_id
        self.proxy = EgressProxy(
            path=str(self.directory / EGRESS_SOCKET), judge=self,
            resolver=Resolver(test_hosts=dict(settings.AIRLOCK_EGRESS_TEST_HOSTS)),
            limits=Limits(max_bytes=context.max_bytes, max_connections=context.max_connections),
            control_ports=control_plane_ports())
        self._taken: dict[int, tuple[dict, records.Evaluation]] = {}  # by id() of the payload, held alive here
        self._policy: tuple = (None, 0.0)  # the policy row and when it was read (for its shadow)
        self._pending: list[Taken] = []
        self._writing: asyncio.Task | None = None
        self._hurry = asyncio.Event()  # set while someone waits for the writes

    async def start(self) -> str:
        """The directory to mount (its socket and the forwarder), ready."""
        if len(self.proxy.path) > SOCKET_PATH_MAX:
            raise OSError(f"the egress socket path {self.proxy.path} is longer than a Unix socket allows "
                          f"({SOCKET_PATH_MAX} bytes); set AIRLOCK_SANDBOX_DIR to a shorter path")
        root = egress_root()
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(root, 0o711)  # noqa: S103 - sandboxes (uid 65534) traverse it to their own directory only
        self.directory.mkdir(mode=0o755)
        shutil.copyfile(forward.__file__, self.directory / EGRESS_FORWARDER)
        os.chmod(self.directory / EGRESS_FORWARDER, 0o444)
        # Only the sandbox's uid (and root) may connect; only this sandbox mounts the directory.
        await self.proxy.start(mode=0o600, owner=NOBODY if os.geteuid() == 0 else None)
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
    def _allowed_at_once(self, host: str, port: int) -> records.Evaluation | None:
        """An allow decided on the loop, without the database: the version and its shadow are
        compiled in memory, and the policy row (which names the shadow) was read within
        POLICY_FRESH_S. Anything else goes to the database thread."""
        policy, read_at = self._policy
        if policy is None or time.monotonic() - read_at > POLICY_FRESH_S:
            return None
        request = {"host": host, "port": port}
        started = time.perf_counter_ns()
        decision = evaluate_egress(compiled_version(self.context.version), request)
        shadow = (evaluate_egress(compiled_version(policy.shadow_version), request)
                  if policy.shadow_version_id else None)
        if not decision.allowed or decision.effect != "allow" or (shadow is not None and shadow.effect != "allow"):
            return None
        return records.Evaluation(decision=decision, record=None, shadow=shadow,
                                  shadow_version=policy.shadow_version if shadow else None,
                                  eval_us=(time.perf_counter_ns() - started) // 1000)

    async def decide(self, host: str, port: int) -> dict:
        evaluation = self._allowed_at_once(host, port)
        if evaluation is None:  # a denial (exceptions may apply), a shadow that differs, or a stale policy row
            evaluation = await self.runner.db(records.egress_decide, context=self.context, host=host, port=port)
            self._policy = (evaluation.policy, time.monotonic())
        payload = decision_payload(evaluation.decision)
        self._taken[id(payload)] = (payload, evaluation)
        return payload

    def record(self, host: str, port: int, decision: dict, policy: dict) -> dict:
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
        self._drop_stale()
        if self._writing is None or self._writing.done():
            self._writing = asyncio.ensure_future(self._write())
        self.runner.emit(self.live, {"event": "decision", "decision": stored, "request": {"host": host, "port": port},
                                     "command": self.live.command_id})
        return stored

    def _drop_stale(self) -> None:
        # A decision the proxy never recorded (its client left mid-way) is not kept forever.
        if len(self._taken) > 4096:
            self._taken.clear()

    async def _write(self) -> None:
        while self._pending:
            if not self._hurry.is_set():  # a moment for more to come: one write for many connections
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), BATCH_WAIT_S)
            batch, self._pending = self._pending, []
            started = time.monotonic()
            try:
                await self.runner.db(records.egress_store, taken=batch)
            except Exception:
                log.exception("session %s: %d egress decisions could not be recorded", self.context.session_id,
                              len(batch))
            if time.monotonic() - started > 1:
                log.warning("session %s: recording egress decisions took %.1f s", self.context.session_id,
                            time.monotonic() - started)

    async def flush(self) -> None:
        """Return once every decision recorded so far is written."""
        self._hurry.set()
        try:
            while self._writing is not None and not self._writing.done():
                await asyncio.shield(self._writing)
        finally:
            self._hurry.clear()


def remove_directory(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)


def orphan_directories(live: set[str]) -> list[str]:
    """Session ids with an egress directory on this host that no live session of this runner owns."""
    root = egress_root()
    if not root.is_dir():
        return []
    return sorted(child.name for child in root.iterdir() if is_uuid(child.name) and child.name not in live)
