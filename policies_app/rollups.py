"""Hourly rollups of decisions, kept beside the decision log, so the Denials page and its
insights sum thousands of rows instead of grouping millions.

Every decision adds one to the row of its hour keyed by effect, reason, rule, program and policy
version (and, for a denied command, its argument pattern). A denial (effect `deny` or
`audit_deny`) also adds one to a row each for its conversation and session (those rows leave rule,
program and pattern empty, so their number stays that of the conversations and sessions). The
increment is one INSERT … ON CONFLICT DO UPDATE, atomic in PostgreSQL and SQLite alike.

Hours older than COMPACT_AFTER are merged into one row per day (the row of its midnight hour) by
`compact`, which `manage.py prune_decisions` runs: a month then reads about a thirtieth of the
rows. So a period up to 48 h is counted in whole hours from the hour it starts in, and a longer
one in whole days (UTC) from the day it starts in."""

import re
from collections import Counter
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Sum
from django.db.models.functions import TruncDay

from policies_app.models import DecisionRecord, DecisionRollup

KEY_COLUMNS = ["tenant_id", "hour", "effect", "reason_code", "version_id", "rule_id", "subject", "pattern",
               "group_kind", "group_value"]
_NUMBER = re.compile(r"^\d+(\.\d+)?$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


COMPACT_LOCK = 0x41524C4B  # the PostgreSQL advisory lock that serialises compactions
HOURLY_UP_TO = timedelta(hours=48)  # a period this long or shorter is counted by the hour
COMPACT_AFTER = timedelta(days=3)  # kept hour by hour: the 48 h a period counts by the hour, and a margin


def hour_of(at: datetime) -> datetime:
    """The UTC hour `at` falls in (hours are keys: an offset of +05:30 must not shift them)."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def day_of(at: datetime) -> datetime:
    """The UTC day `at` falls in, as its midnight."""
    return hour_of(at).replace(hour=0)


def by_hour(since: datetime, until: datetime) -> bool:
    """Whether a period is counted (and charted) hour by hour; a longer one goes by the day."""
    return until - since <= HOURLY_UP_TO


def bucket_of(at: datetime, hourly: bool) -> datetime:
    return hour_of(at) if hourly else day_of(at)


def rollup_keys(record: DecisionRecord) -> list[tuple]:
    base = (record.tenant_id, hour_of(record.created_at), record.effect, record.reason_code,
            record.policy_version_id or 0)
    if record.effect == "allow":
        return [(*base, record.rule_id, record.subject, "", "", "")]
    pattern = argument_pattern(record.request)[:255] if record.kind == "exec" else ""
    keys = [(*base, record.rule_id, record.subject, pattern, "", "")]
    if record.conversation_id:
        keys.append((*base, "", "", "", "conversation", record.conversation_id))
    if record.session_id:
        keys.append((*base, "", "", "", "session", str(record.session_id)))
    return keys


def argument_pattern(request: dict) -> str:
    """A request's shape: its program with each argument reduced to what kind it is, so that
    `pytest tests/a.py` and `pytest tests/b.py` group together (an intent)."""
    if not isinstance(request, dict):
        return ""
    shapes = [_shape(arg) for arg in request.get("args") or [] if isinstance(arg, str)]
    return " ".join([str(request.get("bin", "")), *shapes]).strip()


def _shape(arg: str) -> str:
    """`--flag` and `--key=…` as written; a URL, a text of several words (a script: `bash -c
    <text>`), a number, a path (with a slash, or a file's name) or any other word as its kind."""
    if arg.startswith("-") and not _NUMBER.match(arg[1:]):
        return arg.split("=", 1)[0] + ("=…" if "=" in arg else "")
    if _URL.match(arg):
        return "<url>"
    if any(char.isspace() for char in arg.strip()):
        return "<text>"
    if _NUMBER.match(arg.lstrip("-")):
        return "<n>"
    if "/" in arg or arg in {".", ".."} or "." in arg.strip("."):
        return "<path>"
    return "<arg>"


def count_decision(record: DecisionRecord) -> None:
    """Add one decision to its rollup rows."""
    _add([(key, 1) for key in rollup_keys(record)])


def count_decisions(records: list[DecisionRecord]) -> None:
    """Add many decisions to their rollup rows, one upsert per distinct row."""
    counted = Counter(key for record in records for key in rollup_keys(record))
    _add(list(counted.items()))


def _add(counted: list[tuple[tuple, int]]) -> None:
    """Add each count to its key's row, creating the row when it is missing."""
    table = DecisionRollup._meta.db_table
    columns = ", ".join(KEY_COLUMNS)
    for start in range(0, len(counted), 500):
        batch = counted[start:start + 500]
        values = ", ".join([f"({', '.join(['%s'] * (len(KEY_COLUMNS) + 1))})"] * len(batch))
        params = []
        for key, n in batch:
            params += [*key[:1], connection.ops.adapt_datetimefield_value(key[1]), *key[2:], n]
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({columns}, count) VALUES {values} "  # noqa: S608 - names are ours
                f"ON CONFLICT ({columns}) DO UPDATE SET count = {table}.count + excluded.count", params)


@transaction.atomic
def compact(now: datetime | None = None) -> int:
    """Merge the hourly rows of every whole day older than COMPACT_AFTER into the row of the
    day's midnight hour; returns how many hourly rows were merged. Sums are unchanged, and a
    second run finds nothing to do."""
    if connection.vendor == "postgresql":  # one compaction at a time: two would both add the same hours
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [COMPACT_LOCK])
    before = day_of((now or datetime.now(UTC)) - COMPACT_AFTER)
    hourly = DecisionRollup.objects.filter(hour__lt=before).exclude(hour__hour=0)
    fields = ["tenant_id", "day", *KEY_COLUMNS[2:]]
    merged = (hourly.annotate(day=TruncDay("hour", tzinfo=UTC)).values_list(*fields).annotate(n=Sum("count"))
              .order_by())
    counted = [(tuple(row[:-1]), row[-1]) for row in merged]
    moved, _ = hourly.delete()  # first: the midnight rows they are added to are not in `hourly`
    _add(counted)
    return moved
