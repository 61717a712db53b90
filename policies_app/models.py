"""Policies and their immutable versions. A version's content never changes (the ORM refuses,
and database triggers refuse an UPDATE or DELETE from anywhere); which version is published is
the append-only history of PolicyPublication rows, so every state change is a new row. What
the triggers cannot stop (DDL) `audit_verify` finds against the audit chain (integrity.py)."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class ImmutableQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise PermissionError(f"{self.model._meta.verbose_name_plural} are immutable")

    def delete(self):
        raise PermissionError(f"{self.model._meta.verbose_name_plural} are immutable")


class Immutable(models.Model):
    """Written once: the ORM refuses an update or a delete (and database triggers both)."""

    objects = ImmutableQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise PermissionError(f"{self._meta.verbose_name_plural} are immutable")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError(f"{self._meta.verbose_name_plural} are immutable")


class Policy(models.Model):
    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.PROTECT, related_name="policies")
    name = models.SlugField(max_length=63)
    created_at = models.DateTimeField(default=timezone.now)
    # A candidate evaluated beside the published version on live traffic (never enforced).
    shadow_version = models.ForeignKey("PolicyVersion", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="one_policy_name_per_tenant")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"

    def published_version(self) -> "PolicyVersion | None":
        last = self.publications.select_related("version").order_by("-id").first()
        return last.version if last is not None and last.action != PolicyPublication.RETIRE else None


class PolicyVersion(Immutable):
    policy = models.ForeignKey(Policy, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    document = models.JSONField()  # the canonical document
    source = models.TextField()  # the YAML as its author wrote it, comments included
    sha256 = models.CharField(max_length=64)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    note = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["policy", "number"], name="one_version_number_per_policy")]
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"{self.policy.name} v{self.number}"

    def state(self, published: "PolicyVersion | None") -> str:
        if published is not None and published.pk == self.pk:
            return "published"
        return "retired" if self.publications.exists() else "draft"


class FloorVersion(Immutable):
    """The platform floor (policies_app/floor.py): a deployment-wide policy document that every
    tenant's policy may only narrow. Versions only grow; the newest is in force."""

    number = models.PositiveIntegerField(unique=True)
    document = models.JSONField()  # the canonical document
    source = models.TextField()
    sha256 = models.CharField(max_length=64)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"platform floor v{self.number}"


class ContainmentScore(models.Model):
    """A containment eval's scorecard for one version on one driver (sessions/evals/): each
    probe's pass or fail with its evidence, as it ran."""

    version = models.ForeignKey(PolicyVersion, on_delete=models.CASCADE, related_name="scores")
    driver = models.CharField(max_length=20)
    eval_version = models.PositiveIntegerField()  # the derived eval policy's version it ran under
    airlock_version = models.CharField(max_length=40)
    created_at = models.DateTimeField(default=timezone.now)
    seconds = models.FloatField()
    passed = models.BooleanField()
    results = models.JSONField()  # [{probe, checks, passed, evidence, seconds}]

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"containment eval of {self.version} on {self.driver}"


class PolicyPublication(models.Model):
    """Append-only: each publish, rollback or retire of a policy, in order."""

    PUBLISH, ROLLBACK, RETIRE = "publish", "rollback", "retire"
    policy = models.ForeignKey(Policy, on_delete=models.PROTECT, related_name="publications")
    version = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="publications")
    action = models.CharField(max_length=16, choices=[(a, a) for a in (PUBLISH, ROLLBACK, RETIRE)])
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    note = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.action} {self.version}"


class DecisionRecord(models.Model):
    """Every decision, as made: what was asked (secrets redacted), by whom, under which version,
    and the outcome; with the shadow candidate's outcome beside it when there is one."""

    KINDS = [("exec", "exec"), ("file", "file"), ("egress", "egress"), ("session", "session"), ("resume", "resume"),
             ("artifact", "artifact")]
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.CASCADE, related_name="+")
    session_id = models.UUIDField(null=True, blank=True)
    # The command that was running when an egress connection was attempted (none for the rest).
    command_id = models.UUIDField(null=True, blank=True)
    conversation_id = models.CharField(max_length=200, blank=True)
    policy_version = models.ForeignKey(PolicyVersion, null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="+")
    mode = models.CharField(max_length=10)
    kind = models.CharField(max_length=10, choices=KINDS, default="exec")
    request = models.JSONField()
    # What was asked for, in one column for grouping: the program (exec), the path (file),
    # host:port (egress) or the snapshot asked for (resume).
    subject = models.CharField(max_length=255, blank=True)
    allowed = models.BooleanField()
    effect = models.CharField(max_length=12)
    reason_code = models.CharField(max_length=32, blank=True)
    rule_id = models.CharField(max_length=64, blank=True)
    message = models.TextField()
    hint = models.TextField(blank=True)
    eval_us = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    shadow_version = models.ForeignKey(PolicyVersion, null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="+")
    shadow_allowed = models.BooleanField(null=True)
    shadow_effect = models.CharField(max_length=12, blank=True)
    shadow_reason_code = models.CharField(max_length=32, blank=True)
    shadow_rule_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "created_at"]),
            models.Index(fields=["tenant", "reason_code", "created_at"]),
            models.Index(fields=["tenant", "allowed", "created_at"]),
            models.Index(fields=["tenant", "effect", "created_at"]),
            models.Index(fields=["session_id", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.effect} {self.request.get('bin', '')} ({self.reason_code or self.rule_id})"

    @property
    def shadow_differs(self) -> bool:
        return self.shadow_allowed is not None and self.shadow_allowed != self.allowed


class DecisionRollup(models.Model):
    """Hourly decision counts (see policies_app/rollups.py): what the Denials page and the
    insights sum. Denials are counted by reason, rule, program, conversation and session;
    allowed decisions only by rule and program."""

    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    effect = models.CharField(max_length=12)
    reason_code = models.CharField(max_length=32, blank=True)
    version_id = models.PositiveBigIntegerField(default=0)  # the policy version; 0 when none was published
    rule_id = models.CharField(max_length=64, blank=True)
    subject = models.CharField(max_length=255, blank=True)
    pattern = models.CharField(max_length=255, blank=True)  # a denied command's argument pattern
    group_kind = models.CharField(max_length=12, blank=True)  # "", "conversation" or "session"
    group_value = models.CharField(max_length=200, blank=True)
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["tenant", "hour", "effect", "reason_code", "version_id", "rule_id", "subject", "pattern",
                    "group_kind", "group_value"], name="one_decision_rollup_row_per_key")]
        indexes = [models.Index(fields=["tenant", "effect", "group_kind", "hour"]),
                   models.Index(fields=["tenant", "group_kind", "hour"])]  # every effect at once (DenialQuery.keyed)

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 {self.effect} {self.reason_code} x{self.count}"


class PolicyException(models.Model):
    """A narrow, temporary grant: this tenant's policy allows exactly this program with exactly
    these arguments in this cwd (kind exec), or exactly this host and port (kind egress), until
    `expires_at`, for a stated reason or ticket. It is consulted only when the policy's rules
    deny (never for a hard refusal), counted each time it allows, and never honoured once
    expired or revoked (see policies_app/exceptions.py)."""

    KINDS = [("exec", "exec"), ("egress", "egress")]
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.CASCADE, related_name="+")
    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="exceptions")
    kind = models.CharField(max_length=10, choices=KINDS, default="exec")
    bin = models.CharField(max_length=64, blank=True)
    args = models.JSONField(default=list)
    cwd = models.CharField(max_length=1000, default="/workspace")
    host = models.CharField(max_length=253, blank=True)  # egress: the exact host and port
    port = models.PositiveIntegerField(null=True, blank=True)
    reason = models.TextField()
    ticket = models.CharField(max_length=100, blank=True)
    expires_at = models.DateTimeField()
    created_by = models.CharField(max_length=100)  # the actor label: a username or apikey:alk_…
    created_at = models.DateTimeField(default=timezone.now)
    from_decision = models.UUIDField(null=True, blank=True)  # the denial it was granted from
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=100, blank=True)
    use_count = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "policy", "bin"])]

    def __str__(self) -> str:
        return f"exception {self.short_id}: {self.command}"

    @property
    def short_id(self) -> str:
        return self.id.hex[:8]

    @property
    def command(self) -> str:
        """What it allows, in one line: the command, or host:port."""
        if self.kind == "egress":
            return f"{self.host}:{self.port}"
        return " ".join([self.bin, *self.args])

    def state(self, now=None) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expires_at <= (now or timezone.now()) else "active"
