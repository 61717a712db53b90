"""The runner's database side: small synchronous functions it calls from its worker threads."""

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from controlplane.models import Tenant
from controlplane.redaction import configured_secrets
from policies_app import decisions
from policies_app.decisions import Evaluation
from policies_app.document import Limits as document_limits
from policies_app.models import Policy, PolicyException, PolicyVersion
from sessions import lifecycle, services
from sessions.models import ACTIVE_STATES, Runner, Session, SessionState, Snapshot
from sessions.output import CommandOutput
from sessions.runtimes.base import ExitStatus, Limits, SandboxSpec, Stats

session_ready = lifecycle.session_ready
session_finish = lifecycle.session_finish
session_touch = services.session_touch
command_fail_queued = services.command_fail_queued


def runner_register(*, runner_id: str, embedded: bool, drivers: list[str]) -> None:
    Runner.objects.update_or_create(pk=runner_id, defaults={
        "hostname": socket.gethostname()[:255], "pid": os.getpid(), "embedded": embedded, "drivers": drivers,
        "memory_mb": settings.AIRLOCK_RUNNER_MEMORY_MB,
        "heartbeat_at": timezone.now(), "stopped_at": None, "stop_reason": "",
    })


def runner_heartbeat(*, runner_id: str, pools: dict | None = None) -> bool:
    """False when this runner was declared dead meanwhile. `pools`: its warm pools now."""
    return bool(Runner.objects.filter(pk=runner_id, stopped_at__isnull=True).update(
        heartbeat_at=timezone.now(), **({"pools": pools} if pools else {})))


def runner_reaped(*, runner_id: str, count: int) -> None:
    Runner.objects.filter(pk=runner_id).update(reaped=F("reaped") + count)


def runner_stopped(*, runner_id: str, reason: str) -> None:
    Runner.objects.filter(pk=runner_id, stopped_at__isnull=True).update(stopped_at=timezone.now(), stop_reason=reason)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def runners_declare_dead(*, local_pids_gone: bool, exclude: str) -> list[str]:
    """Runners that stopped beating (or, on this host, whose process is gone) are dead: each
    active session they owned fails. Returns their ids. A runner never declares itself."""
    now = timezone.now()
    candidates = Runner.objects.filter(stopped_at__isnull=True).exclude(pk=exclude)
    stale = set(candidates.filter(heartbeat_at__lt=now - timedelta(seconds=settings.AIRLOCK_RUNNER_DEAD_AFTER_S))
                .values_list("pk", flat=True))
    if local_pids_gone:
        for runner in candidates.filter(hostname=socket.gethostname()[:255]).exclude(pid=os.getpid()):
            if _pid_gone(runner.pid):
                stale.add(runner.pk)
    dead = []
    for runner_id in sorted(stale):
        reason = "stopped answering (no heartbeat)"
        declared = Runner.objects.filter(pk=runner_id, stopped_at__isnull=True).update(stopped_at=now,
                                                                                      stop_reason=reason)
        if not declared:
            continue  # another runner declared it first
        dead.append(runner_id)
        owned = Session.objects.filter(runner_id=runner_id, state__in=ACTIVE_STATES).values_list("pk", flat=True)
        for session_id in owned:
            session_finish(session_id=session_id, state=SessionState.FAILED, reason=f"its runner {runner_id} {reason}")
    return dead


@dataclass(frozen=True)
class EgressContext:
    """What a session's egress proxy needs to judge and record, read once."""

    session_id: str
    tenant: Tenant
    version: PolicyVersion
    conversation_id: str
    max_bytes: int | None
    max_connections: int | None
    mode: str  # the version's, for the refusals the proxy makes itself
    ref: dict  # the version as a decision shows it: {policy, number, sha256}


def sandbox_limits(limits) -> Limits:
    """A policy document's limits, as a sandbox is made with them."""
    return Limits(cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids, disk_mb=limits.disk_mb,
                  command_timeout_s=limits.command_timeout_s, max_output_bytes=limits.output_mb * 2**20)


def pool_limits(*, driver: str) -> Limits:
    """A warm pool's first profile: the limits of the newest session on its driver (the policies
    in use), else those of a policy that sets none."""
    newest = Session.objects.filter(driver=driver).select_related("policy_version").order_by("-created_at").first()
    if newest is None:
        return sandbox_limits(document_limits())
    return sandbox_limits(decisions.compiled_version(newest.policy_version).document.limits)


@dataclass(frozen=True)
class Opening:
    """What a session being created asks of its runner."""

    spec: SandboxSpec
    driver: str
    repository: str  # an allowlisted repository to check out, or ""
    egress: EgressContext | None  # None: its policy allows none (no proxy, no socket, its own loopback only)
    persist: bool  # snapshot the workspace when it ends
    resume: Snapshot | None  # restore this snapshot (checked again, byte by byte) before it is ready
    resume_same_rootfs: bool


def sandbox_spec(*, session_id) -> Opening | None:
    session = Session.objects.select_related("tenant", "policy_version__policy", "resumed_from__tenant").filter(
        pk=session_id, state=SessionState.CREATING).first()
    if session is None:
        return None
    version = session.policy_version
    document = decisions.compiled_version(version).document  # parsed once per version, as decisions are
    network = document.network
    egress = EgressContext(
        session_id=str(session.pk), tenant=session.tenant, version=version, conversation_id=session.conversation_id,
        max_bytes=network.max_bytes, max_connections=network.max_connections, mode=document.mode,
        ref={"policy": version.policy.name, "number": version.number, "sha256": version.sha256},
    ) if network.egress == "allowlist" else None
    spec = SandboxSpec(
        tenant=session.tenant.slug, session_id=str(session.pk), limits=sandbox_limits(document.limits),
        env=dict(document.env.set), isolation="gvisor" if session.driver == "gvisor" else "standard",
    )
    return Opening(spec=spec, driver=session.driver, repository=session.workspace_source, egress=egress,
                   persist=session.persist, resume=session.resumed_from,
                   resume_same_rootfs=document.persistence.resume_same_rootfs)


def snapshot_wanted(*, session_id) -> bool:
    """A persistent session that ended or expired leaves a snapshot; a killed or failed one does not."""
    return Session.objects.filter(pk=session_id, persist=True,
                                  state__in=(SessionState.ENDED, SessionState.EXPIRED)).exists()


def snapshot_failed(*, session_id, detail: str) -> None:
    Session.objects.filter(pk=session_id).update(snapshot_error=detail[:500])


@dataclass(frozen=True)
class EgressVerdict:
    evaluation: Evaluation
    policy: Policy  # as read for this decision: the shadow it names
    exceptions: bool  # whether the policy has any egress exception, live or ended (its hint tells)


def egress_decide(*, context: EgressContext, host: str, port: int) -> EgressVerdict:
    """The pinned version's decision on one connection (its exceptions and shadow included),
    not recorded yet: egress_store records it with the proxy's outcome."""
    policy = Policy.objects.select_related("shadow_version").get(pk=context.version.policy_id)  # its shadow now
    evaluation = decisions.decide(tenant=context.tenant, policy=policy, request={"host": host, "port": port},
                                  session_id=context.session_id, conversation_id=context.conversation_id,
                                  version=context.version, record=False, count=True, kind="egress")
    exceptions = PolicyException.objects.filter(tenant=context.tenant, policy=policy, kind="egress").exists()
    return EgressVerdict(evaluation=evaluation, policy=policy, exceptions=exceptions)


def egress_store(*, taken: list[decisions.Taken]) -> None:
    decisions.store_taken(taken, configured_secrets())


@dataclass(frozen=True)
class CommandPlan:
    argv: list[str]
    stored_argv: list[str]  # redacted: what events and pages show
    cwd: str
    timeout_s: int
    tail_chars: int

    @property
    def label(self) -> str:
        return " ".join(self.stored_argv)[:200]


def command_plan(message: dict) -> CommandPlan:
    """What to run, as the broker sent it. `argv` is unredacted: the stored one has its secrets
    redacted and is for reading, not for running."""
    return CommandPlan(argv=list(message["argv"]), stored_argv=list(message["stored_argv"]), cwd=message["cwd"],
                       timeout_s=message["timeout_s"], tail_chars=message["tail_chars"])


command_start = services.command_start


def command_finish(*, session_id, command_id, started_at, status: ExitStatus, output: CommandOutput) -> dict:
    return services.command_finish(
        session_id=session_id, command_id=command_id, started_at=started_at, exit_code=status.exit_code,
        reason=status.reason, output=output.tail.text, truncated=output.tail.truncated,
        output_bytes=status.output_bytes, duration_ms=status.duration_ms,
    )


def session_stats(*, session_id, stats: Stats) -> None:
    services.session_record_stats(session_id=session_id, cpu_s=stats.cpu_s, memory_bytes=stats.memory_bytes,
                                  disk_bytes=stats.disk_bytes)


def sessions_expire(*, runner_id: str, busy: set[str]) -> list[str]:
    """This runner's sessions past their TTL, or idle (no command) past the idle timeout."""
    now = timezone.now()
    idle_since = now - timedelta(seconds=settings.AIRLOCK_SESSION_IDLE_TIMEOUT_S)
    expired = []
    owned = Session.objects.filter(runner_id=runner_id, state=SessionState.READY)
    for session_id, expires_at, last_activity in owned.values_list("pk", "expires_at", "last_activity_at"):
        if expires_at <= now:
            reason = "its time to live (the policy's session_ttl_s) ran out"
        elif last_activity <= idle_since and str(session_id) not in busy:
            reason = f"idle for {settings.AIRLOCK_SESSION_IDLE_TIMEOUT_S} s"
        else:
            continue
        if session_finish(session_id=session_id, state=SessionState.EXPIRED, reason=reason):
            expired.append(str(session_id))
    return expired


def inactive_among(*, session_ids: list[str]) -> list[str]:
    """Those of the given sessions that have ended (by another process, or a message lost)."""
    if not session_ids:
        return []
    active = {str(pk) for pk in Session.objects.filter(pk__in=session_ids, state__in=ACTIVE_STATES)
              .values_list("pk", flat=True)}
    return [session_id for session_id in session_ids if session_id not in active]


def orphans(*, present: list[str]) -> set[str]:
    """Among sandbox ids present on this host, those whose session here has ended."""
    ended = Session.objects.filter(pk__in=present).exclude(state__in=ACTIVE_STATES).values_list("pk", flat=True)
    return {str(session_id) for session_id in ended}
