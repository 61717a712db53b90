"""Denial metrics: what was refused, when, why, by which rule, for which program, conversation
and session. Every query is scoped to one tenant and one period, counted in whole hours from
the hour the period starts in. Real denials (effect `deny`) and audit mode's would-be denials
(`audit_deny`, allowed anyway) are never mixed: the mode filter picks one or the other.

Counts come from the hourly rollups (policies_app/rollups.py), so they cost the same for a day
or a month; the list and the export read the decision log itself. A filter the rollups cannot
answer exactly (a rule, a program, an argument pattern, a conversation or a session: a breakdown's
row clicked) is answered from one scan of the period's decisions instead (`DenialQuery.exact`),
at most SCAN_LIMIT of them."""

from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import NamedTuple

from django import forms
from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from controlplane.models import Tenant
from policies_app.document import ReasonCode
from policies_app.models import DecisionRecord, DecisionRollup, PolicyVersion
from policies_app.rollups import argument_pattern, bucket_of, by_hour

PERIODS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
MODES = {"enforce": "deny", "audit": "audit_deny"}
# dimension -> (the rollup rows it is counted in, the column that holds its value)
DIMENSIONS = {"reason": ("", "reason_code"), "rule": ("", "rule_id"), "subject": ("", "subject"),
              "pattern": ("", "pattern"), "conversation": ("conversation", "group_value"),
              "session": ("session", "group_value")}
TOP = 10
SCAN_LIMIT = 200_000
MAX_RANGE = timedelta(days=366)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)  # a From or To before it is a typing slip, not a period
# The breakdowns whose rows, clicked, filter the page by their value (the filter bears the name).
DRILL = ("reason", "rule", "subject", "pattern", "conversation", "session")


class DenialFilter(forms.Form):
    period = forms.ChoiceField(choices=[(p, p) for p in PERIODS], required=False)
    reason = forms.ChoiceField(choices=[("", "any reason")] + [(r, r) for r in ReasonCode.__args__], required=False)
    mode = forms.ChoiceField(choices=[("enforce", "denied (enforce)"), ("audit", "would be denied (audit)")],
                             required=False)
    version = forms.IntegerField(required=False, min_value=1)
    since_version = forms.IntegerField(required=False, min_value=1)  # insights: what is new since this version
    start = forms.DateTimeField(required=False, label="From (UTC)",
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    end = forms.DateTimeField(required=False, label="To (UTC)",
                              widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    rule = forms.CharField(required=False, max_length=255)
    subject = forms.CharField(required=False, max_length=255)
    pattern = forms.CharField(required=False, max_length=255)
    conversation = forms.CharField(required=False, max_length=200)
    session = forms.UUIDField(required=False)
    q = forms.CharField(required=False, max_length=200, label="Search")

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

    def clean(self):
        data = super().clean()
        start, end, now = data.get("start"), data.get("end"), timezone.now()
        for name in ("start", "end"):
            if data.get(name) and not EARLIEST <= data[name] <= now + timedelta(days=1):
                self.add_error(name, f"must be between {EARLIEST:%Y-%m-%d} and now")
        start, end = data.get("start"), data.get("end")
        if start and start >= (end or now):
            self.add_error("end" if end else "start", "must be after From" if end else "must be before now")
        elif start and (end or now) - start > MAX_RANGE:
            self.add_error("start", "a range is at most 366 days")
        return data

    def since(self) -> PolicyVersion | None:
        """The version insights count "new since" from, when one was chosen."""
        version_id = self.cleaned_data.get("since_version")
        return PolicyVersion.objects.select_related("policy").get(pk=version_id) if version_id else None

    def query(self, *, now: datetime | None = None) -> "DenialQuery":
        """The period (From/To when given, else the last `period` up to now) and the filters."""
        data = self.cleaned_data
        until = data.get("end") or now or timezone.now()
        since = data.get("start") or until - PERIODS[data.get("period") or "24h"]
        return DenialQuery(tenant=self.tenant, since=since, until=until,
                           effect=MODES[data.get("mode") or "enforce"], reason=data.get("reason") or "",
                           version_id=data.get("version"), rule=data.get("rule") or "",
                           subject=data.get("subject") or "", pattern=data.get("pattern") or "",
                           conversation=data.get("conversation") or "",
                           session=str(data["session"]) if data.get("session") else "")


class Scanned(NamedTuple):
    created_at: datetime
    effect: str
    reason_code: str
    version_id: int
    rule_id: str
    subject: str
    pattern: str
    conversation: str
    session: str


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
    rule: str = ""
    subject: str = ""
    pattern: str = ""
    conversation: str = ""
    session: str = ""

    def undrilled(self) -> "DenialQuery":
        """The same period and filters without a breakdown's row: what insights judge (a rule is
        dormant, or a version's rate rose, over all its decisions, not over one conversation's)."""
        return replace(self, rule="", subject="", pattern="", conversation="", session="")

    @property
    def exact(self) -> bool:
        """Filtered by what the rollups cannot answer exactly: counted from the decisions."""
        return bool(self.rule or self.subject or self.pattern or self.conversation or self.session)

    @property
    def start(self) -> datetime:
        """Where counting starts: the hour `since` falls in, or its day for a period longer
        than 48 h (whose older hours are compacted into days, see rollups.py)."""
        return bucket_of(self.since, self.hourly)

    def records(self, *, any_effect: bool = False) -> QuerySet[DecisionRecord]:
        """The period's decisions that the filters select (the argument pattern apart: `matches`)."""
        records = DecisionRecord.objects.filter(tenant=self.tenant, created_at__gte=self.start,
                                                created_at__lt=self.until)
        if not any_effect:
            records = records.filter(effect=self.effect)
        for field, value in (("reason_code", self.reason), ("policy_version_id", self.version_id),
                             ("rule_id", self.rule), ("subject", self.subject or self.pattern.split(" ")[0]),
                             ("conversation_id", self.conversation), ("session_id", self.session or None)):
            if value:
                records = records.filter(**{field: value})
        return records

    def matches(self, record_kind: str, request) -> bool:
        return not self.pattern or (record_kind == "exec" and argument_pattern(request)[:255] == self.pattern)

    @cached_property
    def scanned(self) -> list["Scanned"]:
        """The exact query's decisions of every effect, newest first, one row each (at most SCAN_LIMIT)."""
        rows = (self.records(any_effect=True).order_by("-created_at")
                .values_list("created_at", "effect", "reason_code", "policy_version_id", "rule_id", "subject",
                             "kind", "request", "conversation_id", "session_id")[:SCAN_LIMIT])
        scanned = []
        for (created, effect, reason, version, rule, subject, kind, request, conversation,
             session) in rows.iterator(chunk_size=2000):
            pattern = argument_pattern(request)[:255] if kind == "exec" else ""
            if self.pattern and pattern != self.pattern:
                continue
            scanned.append(Scanned(created, effect, reason or "", version or 0, rule or "", subject or "",
                                   pattern, conversation or "", str(session or "")))
        return scanned

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
        if self.exact:
            counts = Counter((row.effect, row.reason_code, row.version_id, row.rule_id, row.subject, row.pattern)
                             for row in self.scanned)
            return [Keyed(*key, n) for key, n in counts.items()]
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
    if query.exact:
        counts = Counter(bucket_of(row.created_at, query.hourly) for row in _chosen_scan(query))
    else:
        rows = (query.rollups().annotate(bucket=trunc("hour")).values("bucket").annotate(n=Sum("count"))
                .order_by("bucket"))
        counts = {row["bucket"]: row["n"] for row in rows}
    buckets, at = [], query.start
    while at < query.until:
        buckets.append({"at": at, "count": counts.get(at, 0)})
        at += step
    return buckets


def _chosen_scan(query: DenialQuery) -> list[Scanned]:
    return [row for row in query.scanned if row.effect == query.effect
            and (not query.reason or row.reason_code == query.reason)
            and (not query.version_id or row.version_id == query.version_id)]


def top(query: DenialQuery, dimension: str, limit: int = TOP) -> list[dict]:
    group_kind, field = DIMENSIONS[dimension]
    if query.exact and group_kind:
        counts = Counter(getattr(row, group_kind) for row in _chosen_scan(query))
        counts.pop("", None)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return [{"value": value, "count": n} for value, n in ranked]
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
        "exact": query.exact, "scanned": len(query.scanned) if query.exact else None,
        "total": query.total(),
        "other_mode_total": query.total(apart),
        "over_time": over_time(query),
        "argument_patterns": by.pop("pattern"),
        "by": by,
    }


LIST_SCAN = 10_000  # a list filtered by argument pattern (computed, not stored) looks at this many


def latest(query: DenialQuery, search: str = ""):
    """The query's denials, newest first, for the list: its filters, and `search` in the program,
    rule, conversation or explanation. A queryset, or a list when filtered by pattern."""
    records = query.records().select_related("policy_version__policy").order_by("-created_at")
    if search:
        records = records.filter(Q(subject__icontains=search) | Q(rule_id__icontains=search)
                                 | Q(conversation_id__icontains=search) | Q(message__icontains=search))
    if query.pattern:
        return [record for record in records[:LIST_SCAN] if query.matches(record.kind, record.request)]
    return records


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
