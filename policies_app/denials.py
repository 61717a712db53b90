"""Denial metrics: what was refused, when, why, by which rule, for which program, conversation
and session. Every query is scoped to one tenant and one period, counted in whole hours from
the hour the period starts in. Real denials (effect `deny`) and audit mode's would-be denials
(`audit_deny`, allowed anyway) are never mixed: the mode filter picks one or the other.

Counts come from the hourly rollups (policies_app/rollups.py), so they cost the same for a day
or a month; the list and the export read the decision log itself."""

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import NamedTuple

from django import forms
from django.db.models import QuerySet, Sum
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from controlplane.models import Tenant
from policies_app.document import ReasonCode
from policies_app.models import DecisionRecord, DecisionRollup, PolicyVersion
from policies_app.rollups import bucket_of, by_hour

PERIODS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
MODES = {"enforce": "deny", "audit": "audit_deny"}
# dimension -> (the rollup rows it is counted in, the column that holds its value)
DIMENSIONS = {"reason": ("", "reason_code"), "rule": ("", "rule_id"), "subject": ("", "subject"),
              "pattern": ("", "pattern"), "conversation": ("conversation", "group_value"),
              "session": ("session", "group_value")}
TOP = 10


class DenialFilter(forms.Form):
    period = forms.ChoiceField(choices=[(p, p) for p in PERIODS], required=False)
    reason = forms.ChoiceField(choices=[("", "any reason")] + [(r, r) for r in ReasonCode.__args__], required=False)
    mode = forms.ChoiceField(choices=[("enforce", "denied (enforce)"), ("audit", "would be denied (audit)")],
                             required=False)
    version = forms.IntegerField(required=False, min_value=1)
    since_version = forms.IntegerField(required=False, min_value=1)  # insights: what is new since this version

    def __init__(self, *args, tenant: Tenant, **kwargs):
        super().__init__(*args, **kwargs)
        self.tenant = tenant

    def _tenant_version(self, name: str) -> int | None:
        version_id = self.cleaned_data.get(name)
        if version_id and not PolicyVersion.objects.filter(pk=version_id, policy__tenant=self.tenant).exists():
            raise forms.ValidationError("no such policy version in this tenant")
        return version_id

    def clean_version(self):
        return self._tenant_version("version")

    def clean_since_version(self):
        return self._tenant_version("since_version")

    def since(self) -> PolicyVersion | None:
        """The version insights count "new since" from, when one was chosen."""
        version_id = self.cleaned_data.get("since_version")
        return PolicyVersion.objects.select_related("policy").get(pk=version_id) if version_id else None

    def query(self, *, now: datetime | None = None) -> "DenialQuery":
        data = self.cleaned_data
        until = now or timezone.now()
        return DenialQuery(tenant=self.tenant, since=until - PERIODS[data.get("period") or "24h"], until=until,
                           effect=MODES[data.get("mode") or "enforce"], reason=data.get("reason") or "",
                           version_id=data.get("version"))


class Keyed(NamedTuple):
    effect: str
    reason_code: str
    version_id: int
    rule_id: str
    subject: str
    pattern: str
    n: int


@dataclass(frozen=True)
class DenialQuery:
    tenant: Tenant
    since: datetime
    until: datetime
    effect: str = "deny"
    reason: str = ""
    version_id: int | None = None

    @property
    def start(self) -> datetime:
        """Where counting starts: the hour `since` falls in, or its day for a period longer
        than 48 h (whose older hours are compacted into days, see rollups.py)."""
        return bucket_of(self.since, self.hourly)

    def records(self) -> QuerySet[DecisionRecord]:
        records = DecisionRecord.objects.filter(tenant=self.tenant, effect=self.effect, created_at__gte=self.start,
                                                created_at__lt=self.until)
        if self.reason:
            records = records.filter(reason_code=self.reason)
        if self.version_id:
            records = records.filter(policy_version_id=self.version_id)
        return records

    def rollups(self, group_kind: str = "") -> QuerySet[DecisionRollup]:
        rows = DecisionRollup.objects.filter(tenant=self.tenant, effect=self.effect, group_kind=group_kind,
                                           hour__gte=self.start, hour__lt=self.until)
        if self.reason:
            rows = rows.filter(reason_code=self.reason)
        if self.version_id:
            rows = rows.filter(version_id=self.version_id)
        return rows

    @cached_property
    def keyed(self) -> list[Keyed]:
        """The period's counts by every key of the rollups' main rows, whatever the effect,
        reason and version filters: one scan that the totals, the breakdowns and the dormant
        rules (insights) all read."""
        rows = (DecisionRollup.objects.filter(tenant=self.tenant, group_kind="", hour__gte=self.start,
                                              hour__lt=self.until)
                .values_list("effect", "reason_code", "version_id", "rule_id", "subject", "pattern")
                .annotate(n=Sum("count")))
        return [Keyed(*row) for row in rows]

    def chosen(self, effect: str | None = None) -> list[Keyed]:
        """The keyed counts this query's filters select (of `effect`, by default its own)."""
        effect = effect or self.effect
        return [row for row in self.keyed
                if row.effect == effect and (not self.reason or row.reason_code == self.reason)
                and (not self.version_id or row.version_id == self.version_id)]

    def total(self, effect: str | None = None) -> int:
        return sum(row.n for row in self.chosen(effect))

    @property
    def hourly(self) -> bool:
        return by_hour(self.since, self.until)


def over_time(query: DenialQuery) -> list[dict]:
    """Counts per hour (periods up to 48 h) or per day, every bucket present, zeros included."""
    trunc, step = (TruncHour, timedelta(hours=1)) if query.hourly else (TruncDay, timedelta(days=1))
    rows = query.rollups().annotate(bucket=trunc("hour")).values("bucket").annotate(n=Sum("count")).order_by("bucket")
    counts = {row["bucket"]: row["n"] for row in rows}
    buckets, at = [], query.start
    while at < query.until:
        buckets.append({"at": at, "count": counts.get(at, 0)})
        at += step
    return buckets


def top(query: DenialQuery, dimension: str, limit: int = TOP) -> list[dict]:
    group_kind, field = DIMENSIONS[dimension]
    if group_kind == "":
        counts = Counter()
        for row in query.chosen():
            counts[getattr(row, field)] += row.n
        if dimension == "pattern":  # only a command has an argument pattern
            counts.pop("", None)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return [{"value": value, "count": n} for value, n in ranked]
    rows = query.rollups(group_kind).values(field).annotate(n=Sum("count")).order_by("-n", field)[:limit]
    return [{"value": row[field], "count": row["n"]} for row in rows]


def summary(query: DenialQuery) -> dict:
    """Everything the Denials page and its API show for one query."""
    apart = "audit_deny" if query.effect == "deny" else "deny"
    by = {dimension: top(query, dimension) for dimension in DIMENSIONS}
    return {
        "since": query.start, "until": query.until, "mode": "audit" if query.effect == "audit_deny" else "enforce",
        "total": query.total(),
        "other_mode_total": query.total(apart),
        "over_time": over_time(query),
        "argument_patterns": by.pop("pattern"),
        "by": by,
    }


EXPORT_FIELDS = ["id", "created_at", "kind", "subject", "args", "effect", "mode", "reason_code", "rule_id", "policy",
                 "version", "conversation_id", "session_id", "command_id", "message", "hint"]


EXPORT_LIMIT = 100_000  # under ASGI, Django gathers a synchronous stream before it sends it


def export_rows(query: DenialQuery):
    """The query's denials, newest first, as flat rows (the request as stored: redacted), at
    most EXPORT_LIMIT of them: narrow the period or filters for more."""
    records = query.records().select_related("policy_version__policy").order_by("-created_at")[:EXPORT_LIMIT]
    for record in records.iterator(chunk_size=2000):
        version = record.policy_version
        yield {
            "id": str(record.id), "created_at": record.created_at.isoformat(), "kind": record.kind,
            "subject": record.subject, "args": (record.request or {}).get("args", []) if record.kind == "exec" else [],
            "effect": record.effect, "mode": record.mode, "reason_code": record.reason_code, "rule_id": record.rule_id,
            "policy": version.policy.name if version else "", "version": version.number if version else None,
            "conversation_id": record.conversation_id, "session_id": str(record.session_id or ""),
            "command_id": str(record.command_id or ""), "message": record.message, "hint": record.hint,
        }
