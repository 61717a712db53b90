"""Reads of policies, always scoped to a tenant."""

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from controlplane.models import Tenant
from policies_app.models import Policy, PolicyVersion


def policy_list(tenant: Tenant) -> QuerySet[Policy]:
    return Policy.objects.filter(tenant=tenant).select_related("tenant")


def policy_get(tenant: Tenant, name: str) -> Policy:
    return get_object_or_404(policy_list(tenant), name=name)


def version_get(tenant: Tenant, policy_name: str, number: int) -> PolicyVersion:
    return get_object_or_404(
        PolicyVersion.objects.select_related("policy", "author"), policy__tenant=tenant, policy__name=policy_name,
        number=number,
    )
