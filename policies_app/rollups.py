"""Hourly rollups of denials, kept beside the decision log, so the Denials page sums thousands
of rows instead of grouping millions.

Every denial (effect `deny` or `audit_deny`) adds one to up to three rows of its hour: one keyed
by reason, rule, program and policy version, and one each for its conversation and session
(those rows leave rule and program empty, so their number stays that of the conversations and
sessions). The increment is one INSERT … ON CONFLICT DO UPDATE, atomic in PostgreSQL and SQLite
alike. A period is counted in whole hours, from the hour its start falls in."""

from datetime import UTC, datetime

from django.db import connection

from policies_app.models import DecisionRecord, DenialRollup

KEY_COLUMNS = ["tenant_id", "hour", "effect", "reason_code", "version_id", "rule_id", "subject", "group_kind",
               "group_value"]


def hour_of(at: datetime) -> datetime:
    """The UTC hour `at` falls in (hours are keys: an offset of +05:30 must not shift them)."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def rollup_keys(record: DecisionRecord) -> list[tuple]:
    base = (record.tenant_id, hour_of(record.created_at), record.effect, record.reason_code,
            record.policy_version_id or 0)
    keys = [(*base, record.rule_id, record.subject, "", "")]
    if record.conversation_id:
        keys.append((*base, "", "", "conversation", record.conversation_id))
    if record.session_id:
        keys.append((*base, "", "", "session", str(record.session_id)))
    return keys


def count_denial(record: DecisionRecord) -> None:
    """Add one denial to its rollup rows (an allowed decision is not counted)."""
    if record.effect == "allow":
        return
    keys = rollup_keys(record)
    table = DenialRollup._meta.db_table
    columns = ", ".join(KEY_COLUMNS)
    values = ", ".join([f"({', '.join(['%s'] * len(KEY_COLUMNS))}, 1)"] * len(keys))
    params = []
    for key in keys:
        params += [*key[:1], connection.ops.adapt_datetimefield_value(key[1]), *key[2:]]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}, count) VALUES {values} "  # noqa: S608 - names are ours
            f"ON CONFLICT ({columns}) DO UPDATE SET count = {table}.count + excluded.count", params)
