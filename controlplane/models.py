import hashlib
import hmac
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.roles import Role, can


class Tenant(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.PositiveSmallIntegerField(choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_user_and_tenant")]
        ordering = ["tenant__slug", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role_name}"

    @property
    def role_name(self) -> str:
        return Role(self.role).label

    def can(self, action: str) -> bool:
        return can(self.role, action)


class ApiKeyScope(models.TextChoices):
    SESSIONS = "sessions", "sessions: create and drive sessions, run commands, read their files"
    POLICIES_READ = "policies:read", "policies:read: read policies, versions and decisions"
    POLICIES_WRITE = "policies:write", "policies:write: draft, test, replay and publish policies"
    METRICS = "metrics:read", "metrics:read: read this tenant's operations metrics at /metrics"


class ApiKey(models.Model):
    """A tenant's API key. Only a SHA-256 of the secret is stored: the key cannot be recovered.

    The key reads `alk_<prefix>_<secret>`; the prefix is public and indexes the lookup, the
    256-bit secret makes a fast hash safe (there is nothing to brute-force)."""

    PREFIX = "alk_"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.display_prefix})"

    @property
    def display_prefix(self) -> str:
        return f"{self.PREFIX}{self.prefix}_…"

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()

    def secret_matches(self, secret: str) -> bool:
        return hmac.compare_digest(self.secret_hash, self.hash_secret(secret))

    def state_at(self, now) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    @property
    def state(self) -> str:
        return self.state_at(timezone.now())


class AppendOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise PermissionError("audit events are append-only")

    def delete(self):
        raise PermissionError("audit events are append-only")

    def bulk_update(self, objs, fields, batch_size=None):
        raise PermissionError("audit events are append-only")


class AuditEvent(models.Model):
    """One change of security state. Append-only (the database refuses UPDATE and DELETE) and
    chained per tenant: `hash` is an HMAC of the previous event's hash and a canonical JSON of
    this event (controlplane/audit.py)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="audit_events")
    seq = models.PositiveBigIntegerField()
    created_at = models.DateTimeField()
    # PROTECT: the row is append-only (SET_NULL would be an UPDATE the database refuses); a user
    # who acted is deactivated, not deleted.
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=50, blank=True)
    target_id = models.CharField(max_length=100, blank=True)
    data = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["-seq"]
        constraints = [models.UniqueConstraint(fields=["tenant", "seq"], name="one_audit_seq_per_tenant")]
        indexes = [
            models.Index(fields=["tenant", "action", "created_at"]),
            models.Index(fields=["tenant", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}#{self.seq} {self.action} by {self.actor}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise PermissionError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("audit events are append-only")


class DataKey(models.Model):
    """One of a tenant's data keys (controlplane/keys.py), stored only wrapped by the master key,
    which the database never holds. Snapshots and artifacts name the version they were sealed with."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="data_keys")
    version = models.PositiveIntegerField()
    wrapped = models.BinaryField()  # nonce + AES-256-GCM of the key under the master key
    master_id = models.CharField(max_length=16)  # which master key wrapped it (keys.master_id)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "version"], name="one_data_key_per_version")]
        ordering = ["tenant_id", "-version"]

    def __str__(self) -> str:
        return f"data key v{self.version} of {self.tenant_id}"
