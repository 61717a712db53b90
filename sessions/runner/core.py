"""The runner's event loop side: it takes messages from its channel on the channel layer (the
one way the server reaches it, in this process or another), creates sandboxes, keeps one worker
per session that runs that session's commands and file operations in order, releases sessions,
and hands live events to its outbox (outbox.py); its upkeep is in housekeeping.py, its database
side in records.py.

Blocking work (sandbox creation, a command's exec, the database) runs in threads; the loop
only moves messages, so a runner embedded in the server never blocks the server's requests.
Invariant: one job at a time per session (a sandbox runs one command at a time)."""

import asyncio
import contextlib
import dataclasses
import logging
import os
import resource
import secrets
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections

from controlplane.redaction import configured_secrets
from controlplane.threads import close_connections_and_shutdown
from sessions import layer
from sessions.models import SessionState, runner_channel
from sessions.output import CommandOutput
from sessions.persistence import services as persistence
from sessions.rate import Rate
from sessions.runner import housekeeping, local_runner, records, set_local_runner
from sessions.runner.egress import PoolSlots, SessionEgress
from sessions.runner.outbox import Outbox
from sessions.runtimes import get_driver
from sessions.runtimes.base import Chunk, Driver, ExitStatus, RuntimeUnavailable, Sandbox, SandboxError, Stats
from sessions.runtimes.pool import WarmPool
from sessions.workspace import WRITE_DEADLINE_S, WorkspaceError, checkout, file_get, file_list, file_put

log = logging.getLogger("airlock.runner")
REPLY_GRACE_S = 1  # for clocks of hosts that differ a little
OUTPUT_BURST = 256 * 1024  # bytes of a tenant's output read at once before its rate applies
MAX_QUEUED = 16  # jobs (commands, file operations) waiting in one session's queue


def _answer_queued(live: "LiveSession") -> None:
    """Answer every queued job `session_not_active` (a caller may be waiting for it)."""
    while not live.jobs.empty():
        _, done, _ = live.jobs.get_nowait()
        if done is not None and not done.done():
            done.set_result({"ok": False, "error": "session_not_active", "detail": "the session ended"})


def _raise_descriptor_limit() -> None:
    """Egress proxies hold descriptors for the sandboxes' connections (sessions/egress/proxy.py
    caps them by this limit): take the soft limit up to the hard one, as servers do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _with_connection(function, kwargs: dict):
    """Run database work; a connection that broke (the database restarted) is dropped so that
    the next call opens a fresh one."""
    try:
        return function(**kwargs)
    except (InterfaceError, OperationalError):
        connections.close_all()
        raise


@dataclass
class LiveSession:
    id: str
    tenant_id: int
    driver: Driver
    sandbox: Sandbox | None = None
    jobs: asyncio.Queue = field(default_factory=asyncio.Queue)
    worker: asyncio.Task | None = None
    command_id: str | None = None
    running_label: str = ""
    running_since: float | None = None  # when the running command started (epoch seconds)
    output: CommandOutput | None = None
    seq: int = 0
    releasing: asyncio.Task | None = None
    stats: Stats | None = None
    stats_pending: bool = False
    snapshot_seqs: set = field(default_factory=set)  # sequence numbers snapshots stopped at
    egress: SessionEgress | None = None  # its proxy, when its policy allows egress
    reserved_mb: int = 0  # of the runner's AIRLOCK_RUNNER_MEMORY_MB (sessions/admission.py)
    persist: bool = False  # its workspace is snapshotted when it ends (sessions/persistence/)


class RunnerService:
    """The live runner of this process (its row, the world's view of it, is models.Runner)."""

    def __init__(self, *, embedded: bool):
        host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())[:40]
        self.id = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
        self.embedded = embedded
        self.channel = runner_channel(self.id)
        self.layer = get_channel_layer()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.live: dict[str, LiveSession] = {}
        self.drivers: set[str] = {settings.AIRLOCK_RUNTIME}
        self.executor = ThreadPoolExecutor(settings.AIRLOCK_RUNNER_THREADS, thread_name_prefix="airlock-runner")
        # Database work on a few threads of its own: their connections end with the runner.
        self.db_executor = ThreadPoolExecutor(4, thread_name_prefix="airlock-runner-db")
        self.stats_executor = ThreadPoolExecutor(2, thread_name_prefix="airlock-runner-stats")
        self.secrets = configured_secrets()
        self.outbox = Outbox(self.layer, self.live.get)
        self._tasks: list[asyncio.Task] = []
        self._inflight: set[asyncio.Task] = set()
        self.last_reap = 0.0
        self.last_prune = 0.0
        self._rates: dict[int, Rate] = {}  # of output, one per tenant
        self._rates_lock = threading.Lock()
        self.pools: dict[str, WarmPool] = {}  # warm pools by driver (AIRLOCK_WARM_POOL)
        self._pool_wanted: dict[str, asyncio.Event] = {}

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        layer.serve_on(self.loop)  # start-up publishes too (sessions of dead runners fail)
        _raise_descriptor_limit()
        await self.register()
        await self.db(records.runners_declare_dead, local_pids_gone=True, exclude=self.id)
        await housekeeping.reap(self)
        self._tasks = [asyncio.create_task(coro) for coro in (
            self._listen(), housekeeping.beat_forever(self), housekeeping.housekeep_forever(self),
            self.outbox.send_forever(), *await self._pools_start())]
        log.info("runner %s started (%s)", self.id, "embedded" if self.embedded else "separate")
        if settings.AIRLOCK_EGRESS_TEST_HOSTS:
            log.warning("AIRLOCK_EGRESS_TEST_HOSTS is set: sandboxes reach %s on loopback, past egress's deny set. "
                        "It is for tests and benchmarks only; never set it in production",
                        ", ".join(sorted(settings.AIRLOCK_EGRESS_TEST_HOSTS)))

    async def _pools_start(self) -> list:
        """A warm pool, and the task that fills it, per driver AIRLOCK_WARM_POOL names."""
        fillers = []
        for name, size in sorted(settings.AIRLOCK_WARM_POOL.items()):
            driver = get_driver(name)
            if size and driver.supports_pool:
                self.pools[name] = WarmPool(driver, size, await self.db(records.pool_limits, driver=name),
                                            slots=PoolSlots())
                self._pool_wanted[name] = asyncio.Event()
                self.drivers.add(name)
                fillers.append(self._fill_forever(name))
        return fillers

    def pool_status(self) -> dict:
        return {name: pool.status() for name, pool in self.pools.items()}

    async def _fill_forever(self, name: str) -> None:
        pool, wanted, failures = self.pools[name], self._pool_wanted[name], 0
        while True:
            if not pool.wanted():
                await wanted.wait()
                wanted.clear()
                continue
            try:
                await self.blocking(pool.fill_once)
                failures = 0
            except Exception as exc:  # the filler lives on: sessions start cold meanwhile
                failures += 1
                if failures == 1:
                    log.warning("runner %s: the warm pool of %s cannot start a sandbox (%s: %s); retrying",
                                self.id, name, type(exc).__name__, exc)
                await asyncio.sleep(min(60, 2 ** failures))

    async def register(self) -> None:
        await self.db(records.runner_register, runner_id=self.id, embedded=self.embedded, drivers=sorted(self.drivers))

    async def stop(self, reason: str = "runner stopped") -> None:
        for task in self._tasks:
            task.cancel()
        for session_id in list(self.live):
            await self.db(records.session_finish, session_id=session_id, state=SessionState.FAILED, reason=reason)
            await self.release(session_id)
        for pool in self.pools.values():
            await self.blocking(pool.drain)
        await self.db(records.runner_stopped, runner_id=self.id, reason=reason)
        for executor in (self.executor, self.db_executor, self.stats_executor):
            await asyncio.to_thread(close_connections_and_shutdown, executor)

    def blocking(self, function, *args):
        return self.loop.run_in_executor(self.executor, function, *args)

    def db(self, function, **kwargs):
        return self.loop.run_in_executor(self.db_executor, _with_connection, function, kwargs)

    # -- messages --------------------------------------------------------------------------
    async def _listen(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except Exception:  # Redis went away for a moment: keep listening, do not die
                log.exception("runner %s could not receive; retrying in 1 s", self.id)
                await asyncio.sleep(1)
                continue
            self.spawn(self._dispatch(message))

    async def _dispatch(self, message: dict) -> None:
        result = await self.handle(message)
        if not message.get("reply_to"):
            return
        if time.time() > message.get("reply_by", float("inf")) + REPLY_GRACE_S:
            log.info("runner %s: a reply to %s came after its caller stopped waiting; dropped",
                     self.id, message.get("type"))
            return
        try:
            await self.layer.send(message["reply_to"], {"type": message.get("reply_type", "runner.reply"), **result})
        except ChannelFull:  # its process has stopped taking messages (a reply has room: settings.CHANNEL_CAPACITY)
            log.warning("runner %s: a reply to %s was dropped: its caller's process has a full channel",
                        self.id, message.get("type"))

    async def handle(self, message: dict) -> dict:
        """Do what one message asks and return the reply: {ok: true, …} or {ok: false, error, detail}."""
        handlers = {
            "session.create": self._create, "command.run": self._command, "file.put": self._file,
            "file.get": self._file, "file.list": self._file, "session.release": self._release,
            "session.snapshot": self._snapshot, "artifact.pack": self._artifact,
        }
        handler = handlers.get(message.get("type"))
        if handler is None:
            return {"ok": False, "error": "unknown_message", "detail": f"unknown message {message.get('type')!r}"}
        try:
            return await handler(message)
        except Exception as exc:  # the reply must always come: a caller waits for it
            log.exception("runner %s could not handle %s", self.id, message.get("type"))
            return {"ok": False, "error": "runner_error", "detail": f"{type(exc).__name__}: {exc}"[:500]}

    async def _create(self, message: dict) -> dict:
        session_id = message["session"]
        opening = await self.db(records.sandbox_spec, session_id=session_id)
        if opening is None:
            return {"ok": False, "error": "session_not_active", "detail": "the session is not being created"}
        spec, driver_name, egress = opening.spec, opening.driver, opening.egress
        reserved = sum(other.reserved_mb for other in self.live.values())
        need = message.get("reserved_mb", 0)
        if reserved + need > settings.AIRLOCK_RUNNER_MEMORY_MB:  # exact here: placement raced, or limits grew
            detail = (f"this runner's sessions reserve {reserved} of its {settings.AIRLOCK_RUNNER_MEMORY_MB} MB "
                      f"(AIRLOCK_RUNNER_MEMORY_MB); this one needs {need} MB")
            await self.db(records.session_finish, session_id=session_id, state=SessionState.FAILED, reason=detail)
            return {"ok": False, "error": "no_capacity", "detail": detail}
        live = LiveSession(id=session_id, tenant_id=message["tenant"], driver=None, reserved_mb=need,
                           persist=opening.persist)
        self.live[session_id] = live
        try:
            live.driver = get_driver(driver_name)
            self.drivers.add(driver_name)
            preparing = time.perf_counter()
            pool = self.pools.get(driver_name)
            if pool is not None:
                live.sandbox = await self.blocking(partial(pool.claim, spec, egress=egress is not None))
                self._pool_wanted[driver_name].set()
            if egress is not None:  # its proxy, in the directory the sandbox mounts (or will)
                pooled = live.sandbox is not None
                if pooled:
                    await self.blocking(PoolSlots().adopt, live.sandbox.handle.pop("pool_id"), session_id)
                live.egress = SessionEgress(self, live, egress, adopted=pooled)
                spec = dataclasses.replace(spec, egress_dir=await live.egress.start())
                if pooled:
                    live.sandbox.spec = spec
            if live.sandbox is None:
                live.sandbox = await self.blocking(live.driver.create, spec)
            if opening.repository:
                await self.blocking(checkout, live.driver, live.sandbox, opening.repository)
            if opening.resume is not None:  # every byte checked before one is restored
                await self.blocking(partial(persistence.restore, live.driver, live.sandbox, opening.resume,
                                            require_rootfs=opening.resume_same_rootfs))
            prepare_ms = round((time.perf_counter() - preparing) * 1000)
        except persistence.ProvenanceError as exc:
            await self.db(records.session_finish, session_id=session_id, state=SessionState.FAILED, reason=exc.message)
            await self.release(session_id)
            return {"ok": False, "error": exc.reason_code, "rule_id": exc.rule_id, "detail": exc.message,
                    "hint": exc.hint}
        except (RuntimeUnavailable, SandboxError, WorkspaceError, OSError) as exc:
            detail = getattr(exc, "detail", None) or str(exc)
            await self.db(records.session_finish, session_id=session_id, state=SessionState.FAILED, reason=detail)
            await self.release(session_id)
            return {"ok": False, "error": "sandbox_unavailable", "detail": detail}
        released_meanwhile = live.releasing is not None or self.live.get(session_id) is not live
        if released_meanwhile or not await self.db(records.session_ready, session_id=session_id,
                                                   rootfs_digest=live.sandbox.rootfs_digest, prepare_ms=prepare_ms,
                                                   cache_hit=live.sandbox.cache_hit, warm=live.sandbox.warm):
            # Killed or ended while it was being created: a release that ran before the sandbox
            # existed could not destroy it, so it is destroyed here (after any release in flight).
            if live.releasing is not None:
                await asyncio.shield(live.releasing)
            await self._snapshot_at_end(live)  # none is taken: its snapshot_error says why
            await self.blocking(live.driver.destroy, live.sandbox)
            if self.live.get(session_id) is live:
                del self.live[session_id]
            return {"ok": False, "error": "session_not_active", "detail": "the session ended while it was created"}
        live.worker = asyncio.create_task(self._work(live))
        return {"ok": True}

    def _enqueue(self, session_id: str, job, *, reply_by: float | None = None) -> asyncio.Future | dict | None:
        """The job's future; None when the session is not active here; a refusal (a dict) when
        its queue is full: a session holds at most MAX_QUEUED jobs, so calls that gave up (and
        their file bodies) cannot pile up in the runner. A job whose caller stopped waiting
        before it started (`reply_by`) is dropped unrun."""
        live = self.live.get(session_id)
        if live is None or live.worker is None or live.releasing is not None:
            return None
        if live.jobs.qsize() >= MAX_QUEUED:
            return {"ok": False, "error": "session_busy", "detail": f"the session already has {MAX_QUEUED} commands "
                    "and file operations queued; wait for them to run"}
        done = self.loop.create_future()
        live.jobs.put_nowait((job, done, reply_by + REPLY_GRACE_S if reply_by is not None else float("inf")))
        return done

    async def _command(self, message: dict) -> dict:
        plan = records.command_plan(message)
        done = self._enqueue(message["session"], lambda live: self._run_command(live, message["command"], plan))
        if done is None or isinstance(done, dict):
            reason = "session not active" if done is None else "session busy"
            await self.db(records.command_fail_queued, command_id=message["command"], reason=reason)
            return done or {"ok": False, "error": "session_not_active",
                            "detail": "the session is not active on its runner"}
        return await done if message.get("wait") else {"ok": True}

    async def _file(self, message: dict) -> dict:
        if message["type"] == "file.put":
            # The sender's deadline, or ours from now if that is sooner (never from when the job
            # starts): a write queued behind a long command lands before its caller stops waiting,
            # or never.
            deadline = min(message.get("deadline", float("inf")), time.time() + WRITE_DEADLINE_S)
            work = lambda live: self.blocking(  # noqa: E731
                lambda: file_put(live.driver, live.sandbox, message["path"], message["data"], deadline=deadline))
        elif message["type"] == "file.list":
            work = lambda live: self.blocking(lambda: file_list(live.driver, live.sandbox, message["path"]))  # noqa: E731
        else:
            work = lambda live: self.blocking(  # noqa: E731
                lambda: file_get(live.driver, live.sandbox, message["path"], max_bytes=settings.AIRLOCK_MAX_FILE_BYTES))

        async def job(live: LiveSession) -> dict:
            try:
                data = await work(live)
            except WorkspaceError as exc:
                return {"ok": False, "error": exc.code, "detail": exc.detail}
            await self.db(records.session_touch, session_id=live.id)
            return {"ok": True, "data": data} if data is not None else {"ok": True}

        done = self._enqueue(message["session"], job, reply_by=message.get("reply_by"))
        if done is None:
            return {"ok": False, "error": "session_not_active", "detail": "the session is not active on its runner"}
        return done if isinstance(done, dict) else await done

    async def _artifact(self, message: dict) -> dict:
        """Pack workspace paths into an artifact, in order with the session's other jobs."""
        async def job(live: LiveSession) -> dict:
            try:
                row = await self._take(live, "artifact", message["paths"], name=message["name"],
                                       actor=message["actor"])
            except WorkspaceError as exc:
                return {"ok": False, "error": exc.code, "detail": exc.detail}
            await self.db(records.session_touch, session_id=live.id)
            return {"ok": True, "artifact": str(row.pk)}

        done = self._enqueue(message["session"], job, reply_by=message.get("reply_by"))
        if done is None:
            return {"ok": False, "error": "session_not_active", "detail": "the session is not active on its runner"}
        return done if isinstance(done, dict) else await done

    async def _take(self, live: LiveSession, kind: str, roots: list[str], *, actor: str, name: str = ""):
        """Pack, seal, store and record a snapshot or an artifact of the session's workspace."""
        plan = await self.db(persistence.plan_for, session_id=live.id, kind=kind, object_id=str(uuid.uuid4()),
                             name=name)
        taken = await self.blocking(persistence.take, live.driver, live.sandbox, plan, roots)
        return await self.db(persistence.record, taken=taken, actor=actor)

    async def _snapshot_at_end(self, live: LiveSession) -> None:
        """A persistent session that ended or expired leaves its workspace as a snapshot; why not,
        when it could not, is kept on the session (`snapshot_error`)."""
        if not live.persist or live.sandbox is None or not await self.db(records.snapshot_wanted, session_id=live.id):
            return
        if live.worker is None:  # ended while it was created: its workspace is not whole (a checkout, a restore)
            await self.db(records.snapshot_failed, session_id=live.id,
                          detail="no snapshot was taken: the session ended before it was ready")
            return
        try:
            await self._take(live, "snapshot", [""], actor=f"session:{live.id}")
        except Exception as exc:
            detail = getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}"
            log.warning("session %s: its snapshot was not taken: %s", live.id, detail)
            await self.db(records.snapshot_failed, session_id=live.id, detail=f"no snapshot was taken: {detail}")

    async def _release(self, message: dict) -> dict:
        await self.release(message["session"])
        return {"ok": True}

    async def _snapshot(self, message: dict) -> dict:
        """What a late subscriber missed of the running command: its tail so far, and the
        sequence number it reaches (later events follow it)."""
        live = self.live.get(message["session"])
        if live is None or live.command_id is None or live.output is None:
            return {"ok": True, "command": None, "output": "", "seq": live.seq if live else 0}
        live.snapshot_seqs.add(live.seq)  # the publisher does not merge events across this point
        return {"ok": True, "command": live.command_id, "output": live.output.tail.text, "seq": live.seq}

    # -- a session's worker ----------------------------------------------------------------
    async def _work(self, live: LiveSession) -> None:
        while True:
            job, done, reply_by = await live.jobs.get()
            if job is None:
                return
            if time.time() > reply_by:  # its caller gave up: never run it
                if not done.done():
                    done.set_result({"ok": False, "error": "runner_timeout", "detail": "its caller stopped waiting"})
                continue
            try:
                result = await job(live)
            except Exception as exc:
                log.exception("a job of session %s failed", live.id)
                result = {"ok": False, "error": "runner_error", "detail": f"{type(exc).__name__}: {exc}"[:500]}
            if not done.done():
                done.set_result(result or {"ok": True})

    async def _run_command(self, live: LiveSession, command_id: str, plan: records.CommandPlan) -> dict:
        if live.releasing is not None:
            return {"ok": False, "error": "session_not_active", "detail": "the session ended"}
        # Marking it running overlaps the sandbox's start; the exit is written after it.
        started = asyncio.ensure_future(self.db(records.command_start, command_id=command_id))
        output = CommandOutput(tail_chars=plan.tail_chars, secrets=self.secrets)
        live.command_id, live.output, live.running_label = command_id, output, plan.label
        live.running_since = time.time()
        self.outbox.emit(live, {"event": "command.started", "command": command_id, "argv": plan.stored_argv})
        self.outbox.summary(live)
        try:
            status = await self.blocking(self._exec, live, command_id, plan, output)
        except Exception as exc:  # a driver failure ends the command `failed`, never `running` forever
            log.warning("command %s of session %s could not run: %s", command_id, live.id, exc)
            status = None
        status = status or ExitStatus(exit_code=None, reason="failed", duration_ms=0)
        for stream, text in output.flush():
            self.outbox.output(live, command_id, stream, text)
        result = None
        started_at = await started
        if live.egress is not None:  # whoever reads the command finds the decisions its connections made
            await live.egress.flush()
        if started_at is not None:  # else it was cancelled meanwhile (its session ended): that state stays
            written = await self.db(records.command_finish, session_id=live.id, command_id=command_id,
                                    started_at=started_at, status=status, output=output)
            # Plain values only: the reply may cross the channel layer (msgpack).
            result = {**written, "state": str(written["state"]), "started_at": started_at.isoformat(),
                      "ended_at": written["ended_at"].isoformat()}
        else:
            self.spawn(self.db(records.session_touch, session_id=live.id))
        self.outbox.emit(live, {"event": "command.exited", "command": command_id, "exit_code": status.exit_code,
                         "reason": status.reason, "duration_ms": status.duration_ms,
                         "truncated": output.tail.truncated})
        live.command_id, live.output, live.running_label, live.running_since = None, None, "", None
        self.outbox.summary(live)
        return {"ok": True, "command": result}

    def _exec(self, live: LiveSession, command_id: str, plan: records.CommandPlan,
              output: CommandOutput) -> ExitStatus:
        """In a thread: run the command, hand each redacted piece of output to the loop, at most
        AIRLOCK_OUTPUT_BYTES_PER_S for the session's tenant, in bursts of OUTPUT_BURST: a faster
        writer waits on its own writes (its pipe stays full while this thread waits)."""
        status = None
        rate = self._output_rate(live.tenant_id)
        for item in live.driver.exec(live.sandbox, plan.argv, cwd=plan.cwd, timeout_s=plan.timeout_s):
            if isinstance(item, Chunk):
                text = output.feed(item.stream, item.data)  # redacted here; kept in the tail on the loop
                if text:
                    self.loop.call_soon_threadsafe(self.outbox.output, live, command_id, item.stream, text)
                if wait := rate.take(max(len(item.data), output.take_scanned())):
                    time.sleep(wait)
            elif isinstance(item, ExitStatus):
                status = item
        return status

    def _output_rate(self, tenant_id: int) -> Rate:
        """The tenant's: its sessions on this runner share it."""
        with self._rates_lock:
            rate = self._rates.get(tenant_id)
            if rate is None or rate.per_s != settings.AIRLOCK_OUTPUT_BYTES_PER_S:
                rate = self._rates[tenant_id] = Rate(settings.AIRLOCK_OUTPUT_BYTES_PER_S, OUTPUT_BURST)
            return rate

    async def release(self, session_id: str) -> None:
        """Stop everything a session runs and destroy its sandbox (its row has already ended).
        Queued jobs are answered `session_not_active`; the running command ends `killed`."""
        live = self.live.get(session_id)
        if live is None:
            return
        if live.releasing is None:  # a kill and the housekeeping may ask at once: one release
            live.releasing = asyncio.create_task(self._release_now(live))
        await asyncio.shield(live.releasing)

    async def _release_now(self, live: LiveSession) -> None:
        """No job is accepted once this starts (`live.releasing` is set). The running command is
        killed, and killed again until the worker stops: a command whose start raced the first
        kill dies too. Whatever fails, the session leaves `self.live`; a sandbox that could not
        be destroyed is left to the reaper (its session has ended)."""
        try:
            _answer_queued(live)
            live.jobs.put_nowait((None, None, None))
            deadline = time.monotonic() + 30
            while live.worker is not None and not live.worker.done() and time.monotonic() < deadline:
                if live.sandbox is not None:
                    await self.blocking(live.driver.kill, live.sandbox)
                await asyncio.wait([live.worker], timeout=0.5)
            if live.worker is not None and not live.worker.done():
                log.error("session %s: its worker did not stop within 30 s", live.id)
            _answer_queued(live)
            await self._snapshot_at_end(live)
            if live.sandbox is not None:
                await self.blocking(self._destroy, live)
        except Exception:
            log.exception("session %s could not be released; the reaper will destroy its sandbox", live.id)
        finally:
            if live.egress is not None:  # whatever became of the sandbox, its way out closes
                try:
                    await live.egress.close()
                except Exception:
                    log.exception("session %s: its egress proxy could not be closed", live.id)
            if self.live.get(live.id) is live:
                del self.live[live.id]

    def _destroy(self, live: LiveSession) -> None:
        live.driver.destroy(live.sandbox)
        if live.sandbox.id in live.driver.list_sandboxes():  # checked gone, not assumed
            raise SandboxError(f"sandbox {live.sandbox.id} is still present after destroy")

    def spawn(self, awaitable) -> asyncio.Future:
        task = asyncio.ensure_future(awaitable)
        self._inflight.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._inflight.discard)
        return task


_starting: asyncio.Lock | None = None
_stopped = False


async def ensure_embedded_runner() -> None:
    """Start the server's own runner on the running loop once (at start-up, or at the server's
    first request), unless it was stopped."""
    global _starting
    if local_runner() is not None or not settings.AIRLOCK_EMBEDDED_RUNNER or _stopped:
        return
    if _starting is None:
        _starting = asyncio.Lock()
    async with _starting:
        if local_runner() is None and not _stopped:
            runner = RunnerService(embedded=True)
            await runner.start()
            set_local_runner(runner)


async def stop_embedded_runner(reason: str) -> None:
    """Stop the server's own runner, if it runs: its sessions end `failed` with `reason` and
    their sandboxes are destroyed. The server stops it before its connections close; none is
    started again (a request on a connection still open meanwhile finds no runner)."""
    global _stopped
    _stopped = True
    if _starting is not None:
        async with _starting:  # a start under way ends first, then this stops what it started
            pass
    runner = local_runner()
    if runner is None or not runner.embedded:
        return
    await runner.stop(reason)  # it is still the process's runner while it stops: its events go out
    set_local_runner(None)
