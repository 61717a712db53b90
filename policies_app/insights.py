"""Insights for tuning a policy, read from the hourly decision rollups: what is denied since a
version was published that was never denied before it, which rules decided nothing in the
period (dormant), and each version's denial rate in the period, with a spike after a publish
called out. Hours are the unit: a publish counts from the hour it happened in (from its day once
its hours are compacted into days, see rollups.py)."""

from collections import defaultdict
from datetime import timedelta

from django.db.models import Min, Sum
from django.utils import timezone

from policies_app.denials import TOP, DenialQuery
from policies_app.models import DecisionRollup, Policy, PolicyPublication, PolicyVersion
from policies_app.rollups import COMPACT_AFTER, day_of, hour_of

LOOKBACK = timedelta(days=30)  # "never denied before" means: not in the 30 days before the publish
RECENT_PUBLICATIONS = 10
# A version's denial rate is a spike when it is at least twice its predecessor's, ten points
# above it, and made of at least SPIKE_MIN_DENIALS denials (a handful proves nothing).
SPIKE_FACTOR, SPIKE_POINTS, SPIKE_MIN_DENIALS = 2.0, 0.10, 5
PUBLISHING = (PolicyPublication.PUBLISH, PolicyPublication.ROLLBACK)


def _rows(tenant, effect: str):
    return DecisionRollup.objects.filter(tenant=tenant, effect=effect, group_kind="")


def first_published(version: PolicyVersion):
    publication = version.publications.filter(action__in=PUBLISHING).order_by("id").first()
    return publication.created_at if publication else None


def new_since(query: DenialQuery, version: PolicyVersion, limit: int = TOP) -> list[dict]:
    """Denied intents (a command's argument pattern, else the program or path, with the reason)
    seen since `version` was first published that were not denied in the LOOKBACK before it;
    most denied first."""
    published_at = first_published(version)
    if published_at is None:
        return []
    # Hours older than the compaction horizon are merged into days: count from the day then.
    recent = published_at >= day_of(timezone.now() - COMPACT_AFTER)
    start = hour_of(published_at) if recent else day_of(published_at)
    rows = _rows(query.tenant, query.effect).filter(hour__gte=start, hour__lt=query.until)
    before = _rows(query.tenant, query.effect).filter(hour__lt=start, hour__gte=start - LOOKBACK)
    if query.reason:
        rows, before = rows.filter(reason_code=query.reason), before.filter(reason_code=query.reason)
    key = ("subject", "pattern", "reason_code")
    seen = set(before.values_list(*key).distinct())
    fresh = [{"subject": row["subject"], "pattern": row["pattern"], "reason_code": row["reason_code"],
              "count": row["n"], "first_seen": row["first"]}
             for row in rows.values(*key).annotate(n=Sum("count"), first=Min("hour"))
             if (row["subject"], row["pattern"], row["reason_code"]) not in seen]
    return sorted(fresh, key=lambda row: (-row["count"], row["pattern"] or row["subject"]))[:limit]


def dormant_rules(query: DenialQuery) -> list[dict]:
    """Rules of each published version that decided nothing (allowed or denied) in the period,
    under any version of their policy."""
    dormant = []
    for policy in Policy.objects.filter(tenant=query.tenant).order_by("name"):
        published = policy.published_version()
        if published is None:
            continue
        versions = set(policy.versions.values_list("pk", flat=True))
        used = {row.rule_id for row in query.keyed if row.version_id in versions}
        dormant += [{"policy": policy.name, "version": published.number, "rule_id": rule["id"], "bin": rule["bin"]}
                    for rule in published.document.get("commands", []) if rule["id"] not in used]
    return dormant


def version_rates(query: DenialQuery, limit: int = RECENT_PUBLICATIONS) -> list[dict]:
    """The last `limit` publishes (and rollbacks), newest first: each version's decisions and
    denials (real and would-be) in the period (a version decides from its publish on, so a
    period reaching back to the publish counts all of it), and whether its rate spiked against
    the version published before it in the same policy."""
    publications = list(PolicyPublication.objects.filter(policy__tenant=query.tenant)
                        .select_related("policy", "version").order_by("-id")[:limit + 20])
    counts = defaultdict(lambda: {"decisions": 0, "denials": 0})
    for row in query.keyed:
        counts[row.version_id]["decisions"] += row.n
        if row.effect != "allow":
            counts[row.version_id]["denials"] += row.n
    rates = []
    for index, publication in enumerate(publications[:limit]):
        if publication.action not in PUBLISHING:
            continue
        figures = counts[publication.version_id]
        rate = figures["denials"] / figures["decisions"] if figures["decisions"] else None
        previous = next((p for p in publications[index + 1:]
                         if p.policy_id == publication.policy_id and p.action in PUBLISHING), None)
        before = counts[previous.version_id] if previous else None
        before_rate = before["denials"] / before["decisions"] if before and before["decisions"] else None
        spike = (rate is not None and before_rate is not None and figures["denials"] >= SPIKE_MIN_DENIALS
                 and rate >= before_rate * SPIKE_FACTOR and rate - before_rate >= SPIKE_POINTS)
        rates.append({"policy": publication.policy.name, "version": publication.version.number,
                      "version_id": publication.version_id, "published_at": publication.created_at,
                      "action": publication.action, **figures, "rate": rate,
                      "previous_version": previous.version.number if previous else None,
                      "previous_rate": before_rate, "spike": spike})
    return rates


def insights(query: DenialQuery, since: PolicyVersion | None = None) -> dict:
    """Everything the Insights panel shows. `since`: the version "new since" counts from; by
    default the tenant's last published one."""
    if since is None:
        last = (PolicyPublication.objects.filter(policy__tenant=query.tenant, action__in=PUBLISHING)
                .select_related("version__policy").order_by("-id").first())
        since = last.version if last else None
    return {
        "new_since": {"policy": since.policy.name, "version": since.number, "version_id": since.pk,
                      "published_at": first_published(since), "denials": new_since(query, since)} if since else None,
        "dormant_rules": dormant_rules(query),
        "version_rates": version_rates(query),
    }
