"""The runner's event loop side: it receives work (directly from its own server, or over the
channel layer), keeps one worker per session that runs that session's jobs in order, and
publishes output as it comes.

Blocking work (sandbox creation, a command's exec, the database) runs in threads; the loop
only moves messages, so a runner embedded in the server never blocks the server's requests.
Invariants: one job at a time per session (a sandbox runs one command at a time); every event
of a session carries the next sequence number, so a subscriber that missed some knows it; the
outbox is bounded, and output that does not fit is dropped (the stored tail still has it)."""

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import resource
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections

from controlplane.redaction import configured_secrets
from sessions.models import SessionState, runner_channel, session_group, tenant_group
from sessions.output import CommandOutput
from sessions.runner import records
from sessions.runner.egress import SessionEgress, egress_root, orphan_directories, remove_directory
from sessions.runtimes import get_driver
from sessions.runtimes.base import Chunk, Driver, ExitStatus, RuntimeUnavailable, Sandbox, SandboxError, Stats
from sessions.runtimes.reaper import reap_orphans
from sessions.workspace import WRITE_DEADLINE_S, WorkspaceError, checkout, file_get, file_put

log = logging.getLogger("airlock.runner")
MERGE_CHARS = 64 * 1024  # consecutive output of one stream is sent as one event up to this size
REAPED_DRIVERS = {"bubblewrap", "docker", "gvisor"}
OUTBOX_CHARS = 8 * 2**20  # past this much unsent output, new output is dropped (subscribers see `lagged`)


def _answer_queued(live: "LiveSession") -> None:
    """Answer every queued job `session_not_active` (a caller may be waiting for it)."""
    while not live.jobs.empty():
        _, done = live.jobs.get_nowait()
        if done is not None and not done.done():
            done.set_result({"ok": False, "error": "session_not_active", "detail": "the session ended"})


def _close_connections_and_shutdown(executor: ThreadPoolExecutor) -> None:
    """Each worker thread closes its own database connections (they are per thread), then the
    pool ends. The barrier makes every worker take exactly one of the closing tasks."""
    workers = len(executor._threads)
    if workers:
        barrier = threading.Barrier(workers)

        def close() -> None:
            connections.close_all()
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)

        concurrent.futures.wait([executor.submit(close) for _ in range(workers)], timeout=10)
    executor.shutdown(wait=True, cancel_futures=True)


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
    output: CommandOutput | None = None
    seq: int = 0
    releasing: asyncio.Task | None = None
    stats: Stats | None = None
    stats_pending: bool = False
    snapshot_seqs: set = field(default_factory=set)  # sequence numbers snapshots stopped at
    egress: SessionEgress | None = None  # its proxy, when its policy allows egress


class Runner:
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
        self._outbox: collections.deque = collections.deque()
        self._outbox_chars = 0
        self._outbox_ready = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._inflight: set[asyncio.Task] = set()
        self._last_reap = 0.0

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        _raise_descriptor_limit()
        await self._register()
        await self.db(records.runners_declare_dead, local_pids_gone=True, exclude=self.id)
        await self.reap()
        self._tasks = [asyncio.create_task(coro) for coro in (self._listen(), self._beat(), self._housekeep(),
                                                              self._publish())]
        log.info("runner %s started (%s)", self.id, "embedded" if self.embedded else "separate")
        if settings.AIRLOCK_EGRESS_TEST_HOSTS:
            log.warning("AIRLOCK_EGRESS_TEST_HOSTS is set: sandboxes reach %s on loopback, past egress's deny set. "
                        "It is for tests and benchmarks only; never set it in production",
                        ", ".join(sorted(settings.AIRLOCK_EGRESS_TEST_HOSTS)))

    async def _register(self) -> None:
        await self.db(records.runner_register, runner_id=self.id, embedded=self.embedded, drivers=sorted(self.drivers))

    async def stop(self, reason: str = "runner stopped") -> None:
        for task in self._tasks:
            task.cancel()
        for session_id in list(self.live):
            await self.db(records.session_finish, session_id=session_id, state=SessionState.FAILED, reason=reason)
            await self.release(session_id)
        await self.db(records.runner_stopped, runner_id=self.id, reason=reason)
        for executor in (self.executor, self.db_executor, self.stats_executor):
            await asyncio.to_thread(_close_connections_and_shutdown, executor)

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
            self._spawn(self._dispatch(message))

    async def _dispatch(self, message: dict) -> None:
        result = await self.handle(message)
        if message.get("reply_to"):
            await self.layer.send(message["reply_to"], {"type": message.get("reply_type", "runner.reply"), **result})

    async def handle(self, message: dict) -> dict:
        """Do what one message asks and return the reply: {ok: true, …} or {ok: false, error, detail}."""
        handlers = {
            "session.create": self._create, "command.run": self._command, "file.put": self._file,
            "file.get": self._file, "session.release": self._release, "session.snapshot": self._snapshot,
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
        spec_info = await self.db(records.sandbox_spec, session_id=session_id)
        if spec_info is None:
            return {"ok": False, "error": "session_not_active", "detail": "the session is not being created"}
        spec, driver_name, repository, egress = spec_info
        live = LiveSession(id=session_id, tenant_id=message["tenant"], driver=None)
        self.live[session_id] = live
        try:
            live.driver = get_driver(driver_name)
            self.drivers.add(driver_name)
            preparing = time.perf_counter()
            if egress is not None:
                live.egress = SessionEgress(self, live, egress)
                spec = dataclasses.replace(spec, egress_dir=await live.egress.start())
            live.sandbox = await self.blocking(live.driver.create, spec)
            if repository:
                await self.blocking(checkout, live.driver, live.sandbox, repository)
            prepare_ms = round((time.perf_counter() - preparing) * 1000)
        except (RuntimeUnavailable, SandboxError, WorkspaceError, OSError) as exc:
            detail = getattr(exc, "detail", None) or str(exc)
            await self.db(records.session_finish, session_id=session_id, state=SessionState.FAILED, reason=detail)
            await self.release(session_id)
            return {"ok": False, "error": "sandbox_unavailable", "detail": detail}
        released_meanwhile = live.releasing is not None or self.live.get(session_id) is not live
        if released_meanwhile or not await self.db(records.session_ready, session_id=session_id,
                                                   rootfs_digest=live.sandbox.rootfs_digest, prepare_ms=prepare_ms,
                                                   cache_hit=live.sandbox.cache_hit):
            # Killed or ended while it was being created: a release that ran before the sandbox
            # existed could not destroy it, so it is destroyed here (after any release in flight).
            if live.releasing is not None:
                await asyncio.shield(live.releasing)
            await self.blocking(live.driver.destroy, live.sandbox)
            if self.live.get(session_id) is live:
                del self.live[session_id]
            return {"ok": False, "error": "session_not_active", "detail": "the session ended while it was created"}
        live.worker = asyncio.create_task(self._work(live))
        return {"ok": True}

    def _enqueue(self, session_id: str, job) -> asyncio.Future | None:
        live = self.live.get(session_id)
        if live is None or live.worker is None or live.releasing is not None:
            return None
        done = self.loop.create_future()
        live.jobs.put_nowait((job, done))
        return done

    async def _command(self, message: dict) -> dict:
        plan = records.command_plan(message)
        done = self._enqueue(message["session"], lambda live: self._run_command(live, message["command"], plan))
        if done is None:
            await self.db(records.command_fail_queued, command_id=message["command"], reason="session not active")
            return {"ok": False, "error": "session_not_active", "detail": "the session is not active on its runner"}
        return await done if message.get("wait") else {"ok": True}

    async def _file(self, message: dict) -> dict:
        if message["type"] == "file.put":
            # The sender's deadline, or ours from now if that is sooner (never from when the job
            # starts): a write queued behind a long command lands before its caller stops waiting,
            # or never.
            deadline = min(message.get("deadline", float("inf")), time.time() + WRITE_DEADLINE_S)
            work = lambda live: self.blocking(  # noqa: E731
                lambda: file_put(live.driver, live.sandbox, message["path"], message["data"], deadline=deadline))
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

        done = self._enqueue(message["session"], job)
        if done is None:
            return {"ok": False, "error": "session_not_active", "detail": "the session is not active on its runner"}
        return await done

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
            job, done = await live.jobs.get()
            if job is None:
                return
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
        self.emit(live, {"event": "command.started", "command": command_id, "argv": plan.stored_argv})
        self._summary(live)
        try:
            status = await self.blocking(self._exec, live, command_id, plan, output)
        except Exception as exc:  # a driver failure ends the command `failed`, never `running` forever
            log.warning("command %s of session %s could not run: %s", command_id, live.id, exc)
            status = None
        status = status or ExitStatus(exit_code=None, reason="failed", duration_ms=0)
        for stream, text in output.flush():
            self._emit_output(live, command_id, stream, text)
        result = None
        started_at = await started
        if live.egress is not None:  # whoever reads the command finds the decisions its connections made
            await live.egress.flush()
        if started_at is not None:  # else it was cancelled meanwhile (its session ended): that state stays
            written = await self.db(records.command_finish, command_id=command_id, status=status, output=output)
            # Plain values only: the reply may cross the channel layer (msgpack).
            result = {**written, "state": str(written["state"]), "started_at": started_at.isoformat(),
                      "ended_at": written["ended_at"].isoformat()}
        self._spawn(self.db(records.session_touch, session_id=live.id))
        self.emit(live, {"event": "command.exited", "command": command_id, "exit_code": status.exit_code,
                         "reason": status.reason, "duration_ms": status.duration_ms,
                         "truncated": output.tail.truncated})
        live.command_id, live.output, live.running_label = None, None, ""
        self._summary(live)
        return {"ok": True, "command": result}

    def _exec(self, live: LiveSession, command_id: str, plan: records.CommandPlan,
              output: CommandOutput) -> ExitStatus:
        """In a thread: run the command, hand each redacted piece of output to the loop."""
        status = None
        for item in live.driver.exec(live.sandbox, plan.argv, cwd=plan.cwd, timeout_s=plan.timeout_s):
            if isinstance(item, Chunk):
                text = output.feed(item.stream, item.data)  # redacted here; kept in the tail on the loop
                if text:
                    self.loop.call_soon_threadsafe(self._emit_output, live, command_id, item.stream, text)
            elif isinstance(item, ExitStatus):
                status = item
        return status

    async def _record_stats(self, live: LiveSession) -> None:
        if live.sandbox is None or live.stats_pending:
            return  # a previous call still runs (a slow daemon): do not pile up more
        live.stats_pending = True
        call = self.loop.run_in_executor(self.stats_executor, live.driver.stats, live.sandbox)
        call.add_done_callback(lambda _: setattr(live, "stats_pending", False))  # when the thread is free
        try:
            stats = await asyncio.wait_for(asyncio.shield(call), timeout=5)
        except Exception:  # figures are best effort; the sandbox may be going away, or slow to answer
            return
        await self.db(records.session_stats, session_id=live.id, stats=stats)
        live.stats = stats
        self._summary(live)

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
            live.jobs.put_nowait((None, None))
            deadline = time.monotonic() + 30
            while live.worker is not None and not live.worker.done() and time.monotonic() < deadline:
                if live.sandbox is not None:
                    await self.blocking(live.driver.kill, live.sandbox)
                await asyncio.wait([live.worker], timeout=0.5)
            if live.worker is not None and not live.worker.done():
                log.error("session %s: its worker did not stop within 30 s", live.id)
            _answer_queued(live)
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

    # -- events ----------------------------------------------------------------------------
    def _emit_output(self, live: LiveSession, command_id: str, stream: str, text: str) -> None:
        if live.output is not None:
            live.output.keep(text)  # the stored tail has it even when the stream drops it
        if self._outbox_chars + len(text) > OUTBOX_CHARS:
            live.seq += 1  # dropped: the gap in sequence numbers tells subscribers they lagged
            return
        self.emit(live, {"event": "command.output", "command": command_id, "stream": stream, "data": text})

    def emit(self, live: LiveSession, event: dict) -> None:
        live.seq += 1
        event = {**event, "session": live.id, "seq": live.seq, "seq_from": live.seq}
        self._outbox.append((session_group(live.id), event))
        self._outbox_chars += len(event.get("data", ""))
        self._outbox_ready.set()

    def _summary(self, live: LiveSession) -> None:
        stats = live.stats or Stats(cpu_s=None, memory_bytes=None, disk_bytes=None)
        self._outbox.append((tenant_group(live.tenant_id), {
            "event": "session.activity", "session": live.id, "running": live.running_label,
            "cpu_s": stats.cpu_s, "memory_bytes": stats.memory_bytes}))
        self._outbox_ready.set()

    async def _publish(self) -> None:
        """The one sender: events leave in order; consecutive output of one stream is merged."""
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                group, event = self._outbox.popleft()
                self._outbox_chars -= len(event.get("data", ""))
                while event["event"] == "command.output" and self._outbox and len(event["data"]) < MERGE_CHARS:
                    next_group, following = self._outbox[0]
                    live = self.live.get(event["session"])
                    if (next_group != group or following["event"] != "command.output"
                            or following["command"] != event["command"] or following["stream"] != event["stream"]
                            or following["seq"] != event["seq"] + 1
                            or (live is not None and event["seq"] in live.snapshot_seqs)):
                        break
                    self._outbox.popleft()
                    self._outbox_chars -= len(following["data"])
                    event = {**event, "data": event["data"] + following["data"], "seq": following["seq"]}
                live = self.live.get(event.get("session", ""))
                if live is not None and live.snapshot_seqs and "seq" in event:
                    live.snapshot_seqs = {seq for seq in live.snapshot_seqs if seq > event["seq"]}
                try:
                    await self.layer.group_send(group, {"type": "airlock.event", "event": event})
                except Exception:
                    log.exception("could not publish an event to %s", group)

    # -- housekeeping ----------------------------------------------------------------------
    def _spawn(self, awaitable) -> asyncio.Future:
        task = asyncio.ensure_future(awaitable)
        self._inflight.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._inflight.discard)
        return task

    async def _beat(self) -> None:
        """The heartbeat, alone in its task: nothing slow can delay it past the dead-after limit."""
        while True:
            await asyncio.sleep(settings.AIRLOCK_RUNNER_HEARTBEAT_S)
            try:
                alive = await self.db(records.runner_heartbeat, runner_id=self.id)
            except Exception:
                log.exception("runner %s could not beat", self.id)
                continue
            if not alive:  # declared dead meanwhile (paused too long): its sessions have failed
                log.error("runner %s was declared dead; releasing its sessions", self.id)
                for session_id in list(self.live):
                    self._spawn(self.release(session_id))
                await self._register()

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(settings.AIRLOCK_RUNNER_HEARTBEAT_S)
            try:
                await self.housekeep_once()
            except Exception:
                log.exception("runner %s housekeeping failed", self.id)

    async def housekeep_once(self) -> None:
        """Expire this runner's sessions past their TTL or idle; release those another process
        ended; record CPU, memory and disk figures; declare runners that stopped beating dead
        (their sessions fail); reap orphans now and then. Releases run in their own tasks."""
        busy = {live.id for live in self.live.values() if live.command_id is not None or not live.jobs.empty()}
        ended = await self.db(records.sessions_expire, runner_id=self.id, busy=busy)
        ended += await self.db(records.inactive_among, session_ids=list(self.live))
        releases = [self._spawn(self.release(session_id)) for session_id in set(ended)]
        await asyncio.gather(*(self._record_stats(live) for live in list(self.live.values())))
        dead = await self.db(records.runners_declare_dead, local_pids_gone=False, exclude=self.id)
        if dead or time.monotonic() - self._last_reap > settings.AIRLOCK_RUNNER_REAP_INTERVAL_S:
            await self.reap()
        if releases:
            await asyncio.wait(releases)

    async def reap(self) -> list[str]:
        """Destroy this host's sandboxes whose session has ended, for every driver this host can
        reach (a driver it cannot reach has no sandboxes here to reap). What this runner is
        still releasing is not an orphan."""
        self._last_reap = time.monotonic()
        reaped = []
        for name in sorted(self.drivers | REAPED_DRIVERS):
            driver = get_driver(name)
            try:
                present = await self.blocking(driver.list_sandboxes)
            except RuntimeUnavailable:
                continue
            orphans = await self.db(records.orphans, present=present) - set(self.live)
            if orphans:
                reaped += await self.blocking(reap_orphans, driver, lambda _present, orphans=orphans: orphans)
        # Egress directories left by a runner that died (their proxies died with it).
        leftover = orphan_directories(set(self.live))
        for session_id in await self.db(records.orphans, present=leftover) if leftover else ():
            await self.blocking(remove_directory, egress_root() / session_id)
        if reaped:
            await self.db(records.runner_reaped, runner_id=self.id, count=len(reaped))
        return reaped
