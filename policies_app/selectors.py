"""Reads of policies, always scoped to a tenant."""

from django.apps import apps
from django.db.models import Count, F, QuerySet
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


def pinned_sessions(policy: Policy) -> dict[int, int]:
    """Active sessions of the policy by the version each was opened with (and keeps until it ends):
    {number: count}. Sessions are the sessions app's, read by label, never imported (an app below
    it: docs/architecture.md, "What may import what")."""
    sessions = apps.get_model("agent_sessions", "Session").objects.active()
    rows = (sessions.filter(tenant=policy.tenant, policy_version__policy=policy)
            .values("policy_version__number").annotate(count=Count("pk")))
    return {row["policy_version__number"]: row["count"] for row in rows}


def pinned_message(policy: Policy, published: PolicyVersion) -> str:
    """What publishing leaves behind: the active sessions still on older versions, or ""."""
    older = {number: count for number, count in pinned_sessions(policy).items() if number != published.number}
    if not older:
        return ""
    total = sum(older.values())
    each = ", ".join(f"v{number}: {count}" for number, count in sorted(older.items()))
    return (f"{total} active session{'s are' if total != 1 else ' is'} still on an older version ({each}): a session "
            f"keeps the version it was opened with until it ends; new sessions get v{published.number}.")


def scorecard(version: PolicyVersion | None) -> dict:
    """The newest containment eval of `version` on each driver it ran on, and its probes as rows
    of probe by driver: {scores, rows: [{probe, checks, results: [result or None, per score]}]}."""
    latest = {}
    for score in version.scores.order_by("-created_at")[:50] if version is not None else []:
        latest.setdefault(score.driver, score)
    scores = sorted(latest.values(), key=lambda score: score.driver)
    by_driver = [{result["probe"]: result for result in score.results} for score in scores]
    probes = list(dict.fromkeys(result["probe"] for score in scores for result in score.results))
    rows = [{"probe": probe, "checks": next(r[probe]["checks"] for r in by_driver if probe in r),
             "results": [results.get(probe) for results in by_driver]} for probe in probes]
    return {"scores": scores, "rows": rows}
