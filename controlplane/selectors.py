"""Reads of the core app. Every one is scoped to a tenant (or to the memberships of a user), so
that a cross-tenant read cannot be written by accident: HTML views, API and consumers use these."""

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from controlplane import rows
from controlplane.models import ApiKey, AuditEvent, Membership, Tenant


def memberships_of(user: AbstractBaseUser) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")


def membership_for(user: AbstractBaseUser, tenant_slug: str) -> Membership:
    """The user's membership in the tenant, or 404: an outsider cannot tell the tenant exists."""
    if not user.is_authenticated:
        raise Http404
    return get_object_or_404(memberships_of(user), tenant__slug=tenant_slug)


def member_list(tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")


def member_get(tenant: Tenant, membership_id: int) -> Membership:
    return get_object_or_404(member_list(tenant), pk=membership_id)


def api_key_list(tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant).select_related("created_by")


def api_key_get(tenant: Tenant, key_id) -> ApiKey:
    return get_object_or_404(api_key_list(tenant), pk=key_id)


def api_key_by_prefix(prefix: str) -> ApiKey | None:
    """The one read that is not tenant-scoped: it is how a request finds its tenant (on every
    request of a key: one statement compiled once, controlplane/rows.py; the prefix is unique)."""
    return rows.get(ApiKey, {"prefix": prefix}, related=("tenant",))


def audit_event_list(
    tenant: Tenant, *, actor: str = "", action: str = "", since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.filter(tenant=tenant)
    if actor:
        events = events.filter(actor__icontains=actor)
    if action:
        events = events.filter(action__startswith=action)
    if since:
        events = events.filter(created_at__gte=since)
    if until:
        events = events.filter(created_at__lt=until)
    return events.order_by("-seq")


def audit_actions(tenant: Tenant) -> list[str]:
    return list(AuditEvent.objects.filter(tenant=tenant).order_by("action").values_list("action", flat=True).distinct())
