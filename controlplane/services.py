"""Writes of the core app: tenants, members and API keys. Every change of security state is
recorded in the tenant's audit chain in the same transaction."""

import secrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane import signals
from controlplane.audit import audit_record, user_of
from controlplane.models import ApiKey, ApiKeyScope, Membership, Tenant
from controlplane.roles import Role

User = get_user_model()


@transaction.atomic
def tenant_create(*, slug: str, name: str, actor=None) -> Tenant:
    tenant = Tenant(slug=slug, name=name)
    tenant.full_clean()
    tenant.save()
    audit_record(tenant=tenant, actor=actor, action="tenant.created", target=tenant, data={"slug": slug})
    signals.tenant_created.send(sender=Tenant, tenant=tenant, actor=actor)
    return tenant


@transaction.atomic
def membership_add(*, tenant: Tenant, user: AbstractBaseUser, role: Role, actor=None) -> Membership:
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise ValidationError({"username": f"{user.get_username()} is already a member of {tenant.slug}"})
    membership = Membership.objects.create(tenant=tenant, user=user, role=role)
    audit_record(
        tenant=tenant, actor=actor, action="member.added", target=membership,
        data={"user": user.get_username(), "role": Role(role).label},
    )
    return membership


@transaction.atomic
def membership_set_role(*, membership: Membership, role: Role, actor) -> Membership:
    old = Role(membership.role)
    if old == role:
        return membership
    if old == Role.TENANT_ADMIN:
        _refuse_losing_last_admin(membership)
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        tenant=membership.tenant, actor=actor, action="member.role_changed", target=membership,
        data={"user": membership.user.get_username(), "from": old.label, "to": Role(role).label},
    )
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership, actor) -> None:
    if membership.role == Role.TENANT_ADMIN:
        _refuse_losing_last_admin(membership)
    audit_record(
        tenant=membership.tenant, actor=actor, action="member.removed", target=membership,
        data={"user": membership.user.get_username(), "role": membership.role_name},
    )
    membership.delete()


def _refuse_losing_last_admin(membership: Membership) -> None:
    # Lock the tenant row: two admins demoting each other at once are serialised here.
    Tenant.objects.select_for_update().filter(pk=membership.tenant_id).first()
    admins = Membership.objects.filter(tenant=membership.tenant, role=Role.TENANT_ADMIN)
    if not admins.exclude(pk=membership.pk).exists():
        raise ValidationError({"role": "a tenant keeps at least one tenant_admin"})


@dataclass(frozen=True)
class NewUser:
    user: AbstractBaseUser
    password: str  # shown once to whoever created the account, never stored in clear


@transaction.atomic
def user_create(*, username: str, email: str = "") -> NewUser:
    password = secrets.token_urlsafe(15)
    user = User(username=username, email=email)
    user.set_password(password)
    user.full_clean()
    user.save()
    return NewUser(user=user, password=password)


def user_reset_password(*, user: AbstractBaseUser) -> str:
    password = secrets.token_urlsafe(15)
    user.set_password(password)
    user.save(update_fields=["password"])
    return password


@dataclass(frozen=True)
class NewApiKey:
    api_key: ApiKey
    key: str  # the only time the full key exists outside the caller's hands


@transaction.atomic
def api_key_create(
    *, tenant: Tenant, name: str, scopes: list[str], actor, expires_at: datetime | None = None
) -> NewApiKey:
    unknown = sorted(set(scopes) - set(ApiKeyScope.values))
    if not scopes or unknown:
        raise ValidationError({"scopes": f"choose from {', '.join(ApiKeyScope.values)}"})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "the expiry must be in the future"})
    prefix = secrets.token_hex(4)
    secret = secrets.token_urlsafe(32)
    api_key = ApiKey(
        tenant=tenant, name=name, prefix=prefix, secret_hash=ApiKey.hash_secret(secret),
        scopes=sorted(set(scopes)), expires_at=expires_at,
        created_by=user_of(actor),
    )
    api_key.full_clean()
    api_key.save()
    audit_record(
        tenant=tenant, actor=actor, action="api_key.created", target=api_key,
        data={"name": name, "prefix": prefix, "scopes": api_key.scopes,
              "expires_at": expires_at.isoformat() if expires_at else None},
    )
    return NewApiKey(api_key=api_key, key=f"{ApiKey.PREFIX}{prefix}_{secret}")


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor) -> ApiKey:
    if api_key.revoked_at is not None:
        return api_key
    api_key.revoked_at = timezone.now()
    api_key.save(update_fields=["revoked_at"])
    audit_record(
        tenant=api_key.tenant, actor=actor, action="api_key.revoked", target=api_key,
        data={"name": api_key.name, "prefix": api_key.prefix},
    )
    return api_key


def api_key_touch(*, api_key: ApiKey, now: datetime, interval_s: int) -> None:
    """Record last use, at most once per interval so that a busy key does not write per request."""
    if api_key.last_used_at is None or (now - api_key.last_used_at).total_seconds() >= interval_s:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
