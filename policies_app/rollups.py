"""Hourly rollups of decisions, kept beside the decision log, so the Denials page and its
insights sum thousands of rows instead of grouping millions.

Every decision adds one to the row of its hour keyed by effect, reason, rule, program and policy
version (and, for a denied command, its argument pattern). A denial (effect `deny` or
`audit_deny`) also adds one to a row each for its conversation and session (those rows leave rule,
program and pattern empty, so their number stays that of the conversations and sessions). The
increment is one INSERT … ON CONFLICT DO UPDATE, atomic in PostgreSQL and SQLite alike. A period
is counted in whole hours, from the hour its start falls in."""

import re
from datetime import UTC, datetime

from django.db import connection

from policies_app.models import DecisionRecord, DecisionRollup

KEY_COLUMNS = ["tenant_id", "hour", "effect", "reason_code", "version_id", "rule_id", "subject", "pattern",
               "group_kind", "group_value"]
_NUMBER = re.compile(r"^\d+$")


def hour_of(at: datetime) -> datetime:
    """The UTC hour `at` falls in (hours are keys: an offset of +05:30 must not shift them)."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


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
    shapes = []
    for arg in request.get("args") or []:
        if not isinstance(arg, str):
            continue
        if arg.startswith("-"):
            shapes.append(arg.split("=", 1)[0] + ("=…" if "=" in arg else ""))
        elif _NUMBER.match(arg):
            shapes.append("<n>")
        elif "/" in arg or "." in arg:
            shapes.append("<path>")
        else:
            shapes.append("<arg>")
    return " ".join([str(request.get("bin", "")), *shapes]).strip()


def count_decision(record: DecisionRecord) -> None:
    """Add one decision to its rollup rows."""
    keys = rollup_keys(record)
    table = DecisionRollup._meta.db_table
    columns = ", ".join(KEY_COLUMNS)
    values = ", ".join([f"({', '.join(['%s'] * len(KEY_COLUMNS))}, 1)"] * len(keys))
    params = []
    for key in keys:
        params += [*key[:1], connection.ops.adapt_datetimefield_value(key[1]), *key[2:]]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}, count) VALUES {values} "  # noqa: S608 - names are ours
            f"ON CONFLICT ({columns}) DO UPDATE SET count = {table}.count + excluded.count", params)
