"""Reads of policies, always scoped to a tenant."""

from django.db.models import F, QuerySet
from django.shortcuts import get_object_or_404

from controlplane.models import Tenant
from policies_app.models import DecisionRecord, Policy, PolicyVersion


def policy_list(tenant: Tenant) -> QuerySet[Policy]:
    return Policy.objects.filter(tenant=tenant).select_related("tenant")


def policy_get(tenant: Tenant, name: str) -> Policy:
    return get_object_or_404(policy_list(tenant), name=name)


def version_get(tenant: Tenant, policy_name: str, number: int) -> PolicyVersion:
    return get_object_or_404(
        PolicyVersion.objects.select_related("policy", "author"), policy__tenant=tenant, policy__name=policy_name,
        number=number,
    )


def shadow_differences(policy: Policy, *, limit: int = 50) -> QuerySet[DecisionRecord]:
    """Recent live decisions where the shadow candidate judged differently."""
    return (DecisionRecord.objects.filter(tenant=policy.tenant, shadow_version__policy=policy,
                                          shadow_allowed__isnull=False)
            .exclude(shadow_allowed=F("allowed")).select_related("policy_version", "shadow_version")
            .order_by("-created_at")[:limit])
