"""Sessions, the commands run in them, and the runners that own their sandboxes.

A session's state only moves forward: creating → ready → one of ended / killed / expired /
failed; sessions/lifecycle.py moves it."""

import hashlib
import secrets
import uuid

from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "ast_"  # noqa: S105 - a prefix, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class SessionState(models.TextChoices):
    CREATING = "creating"
    READY = "ready"
    ENDED = "ended"
    KILLED = "killed"
    EXPIRED = "expired"
    FAILED = "failed"


ACTIVE_STATES = (SessionState.CREATING, SessionState.READY)


class SessionQuerySet(models.QuerySet):
    def active(self):
        return self.filter(state__in=ACTIVE_STATES)


class Session(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.CASCADE, related_name="agent_sessions")
    conversation_id = models.CharField(max_length=200, db_index=True)
    policy_version = models.ForeignKey("policies_app.PolicyVersion", on_delete=models.PROTECT, related_name="+")
    driver = models.CharField(max_length=20)
    rootfs_digest = models.CharField(max_length=80, blank=True)
    runner = models.ForeignKey("Runner", null=True, on_delete=models.SET_NULL, related_name="sessions")
    state = models.CharField(max_length=10, choices=SessionState.choices, default=SessionState.CREATING)
    state_reason = models.CharField(max_length=500, blank=True)
    token_hash = models.CharField(max_length=64, unique=True)
    workspace_source = models.CharField(max_length=100, blank=True)  # an allowlisted repository's name
    created_by = models.CharField(max_length=100)  # the actor label: apikey:alk_… or a username
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    last_activity_at = models.DateTimeField(default=timezone.now)
    prepare_ms = models.PositiveIntegerField(null=True, blank=True)  # sandbox + workspace ready, in the runner
    # The host memory its limits let it hold (memory, /workspace and /tmp), reserved on its runner.
    reserved_mb = models.PositiveIntegerField(default=0)
    cache_hit = models.BooleanField(null=True)  # the root filesystem was in the local cache
    warm = models.BooleanField(null=True)  # the sandbox came from a warm pool (null: not ready yet)
    # Persistence (sessions/persistence/): its workspace is snapshotted when it ends; it started from a snapshot.
    persist = models.BooleanField(default=False)
    resumed_from = models.ForeignKey("Snapshot", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    snapshot_error = models.CharField(max_length=500, blank=True)  # why its end's snapshot was not taken
    # The last resource figures the runner saw (CPU seconds, memory bytes, disk bytes).
    cpu_s = models.FloatField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)
    disk_bytes = models.BigIntegerField(null=True, blank=True)

    objects = SessionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "state", "created_at"]),
            models.Index(fields=["tenant", "conversation_id"]),
            models.Index(fields=["state", "expires_at"]),
        ]

    def __str__(self) -> str:
        return f"session {self.id} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def running_command(self) -> "CommandRun | None":
        """The running command, from prefetched commands (the dashboard's list)."""
        running = [c for c in self.commands.all() if c.state == CommandState.RUNNING]
        return running[-1] if running else None

    @property
    def running_label(self) -> str:
        running = self.running_command
        return " ".join(running.argv)[:200] if running else ""


class CommandState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    EXITED = "exited"
    TIMEOUT = "timeout"
    KILLED = "killed"
    FAILED = "failed"


FINISHED_COMMAND_STATES = (CommandState.EXITED, CommandState.TIMEOUT, CommandState.KILLED, CommandState.FAILED)


class CommandRun(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="commands")
    argv = models.JSONField()  # what runs (the rule's prepend_args included), secrets redacted
    cwd = models.CharField(max_length=1000, default="/workspace")
    timeout_s = models.PositiveIntegerField()
    decision = models.ForeignKey("policies_app.DecisionRecord", on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=10, choices=CommandState.choices, default=CommandState.QUEUED)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=20, blank=True)  # exited / timeout / killed / oom / output_limit / …
    output = models.TextField(blank=True)  # the redacted tail, stdout and stderr interleaved
    truncated = models.BooleanField(default=False)
    output_bytes = models.BigIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["session", "created_at"]), models.Index(fields=["state"])]

    def __str__(self) -> str:
        return f"{' '.join(self.argv)[:60]} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_COMMAND_STATES


class Packed(models.Model):
    """A tree of workspace files, sealed and stored (sessions/persistence/): the blob is a tar
    encrypted with a key derived from the tenant's data key; `manifest` lists every file's path,
    size, mode and SHA-256 and the provenance, signed (`signature`) with another key derived from
    it. Rows are never edited: a delete removes the row and its blob, audited."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.CASCADE, related_name="+")
    conversation_id = models.CharField(max_length=200)
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    manifest = models.JSONField()
    signature = models.CharField(max_length=64)
    digest = models.CharField(max_length=64)  # the content's address: SHA-256 of its files' listing
    blob_name = models.CharField(max_length=300)
    stored_bytes = models.BigIntegerField()  # the sealed blob
    plain_bytes = models.BigIntegerField()  # its files' sizes
    files = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        abstract = True
        ordering = ["-created_at"]


class Snapshot(Packed):
    """A session's workspace as it ended; the next session of the conversation may resume it."""

    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta(Packed.Meta):
        indexes = [models.Index(fields=["tenant", "conversation_id", "created_at"]),
                   models.Index(fields=["expires_at"])]

    def __str__(self) -> str:
        return f"snapshot {self.id}"


class Artifact(Packed):
    """Workspace paths a session packed by name, with their provenance."""

    name = models.CharField(max_length=100)

    class Meta(Packed.Meta):
        indexes = [models.Index(fields=["tenant", "conversation_id", "created_at"]),
                   models.Index(fields=["expires_at"])]

    def __str__(self) -> str:
        return f"artifact {self.name} ({self.id})"


class Runner(models.Model):
    """A process that owns sandboxes: the server itself (embedded) or a `manage.py runner`.
    It proves it is alive with `heartbeat_at`; one that stops beating is declared dead and its
    sessions fail."""

    id = models.CharField(primary_key=True, max_length=64)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    embedded = models.BooleanField(default=False)
    drivers = models.JSONField(default=list)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=200, blank=True)
    reaped = models.PositiveIntegerField(default=0, help_text="orphan sandboxes this runner destroyed")
    memory_mb = models.PositiveIntegerField(default=0, help_text="host memory its sessions may reserve in all "
                                            "(AIRLOCK_RUNNER_MEMORY_MB)")
    # Its warm pools as of its last beat: {driver: {"size": n, "ready": n, "profile": "cpus/memory/..."}}.
    pools = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"runner {self.id}"


def runner_channel(runner_id: str) -> str:
    return f"airlock.runner.{runner_id}"


def session_group(session_id) -> str:
    return f"session.{session_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}.sessions"
