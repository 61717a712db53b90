"""The Denials page and its API on real volume: loads 1,000,000 decisions (30 days of one tenant,
35 % denials, 5 % audit-mode would-be denials; sessions of ~30 min, conversations of ~2 h) into a
PostgreSQL database of its own with COPY, builds their hourly rollups (what recording each
decision does one row at a time: counted while loading, and one INSERT … SELECT per grouping), then
prints p50 / p95 of the page (rendered, logged in) and of GET /api/v1/denials for the 24 h,
7 d and 30 d periods, beside a baseline measured in the same run: a bare COUNT(*) of the
period's denials.

    .venv/bin/python bench/denials.py [--rows N] [--runs N] [--database-url postgres://…/airlock_bench]

Target: p95 <= 300 ms. The database (default airlock_bench on 127.0.0.1) is dropped and
re-created; nothing else is touched."""

import argparse
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from figures import percentiles  # noqa: E402 - bench/ is on sys.path when a benchmark runs


def prepare_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 60)
    os.environ["ALLOWED_HOSTS"] = "testserver"
    os.environ["AIRLOCK_LOG_LEVEL"] = "WARNING"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


REASONS = [("bin_not_allowed", "", 0.45), ("arg_denied", "pytest", 0.3), ("path_outside_workspace", "python3", 0.15),
           ("limit_exceeded", "", 0.05), ("egress_denied", "", 0.05)]
PROGRAMS = ["make", "bash", "curl", "npm", "pip", "rm", "git", "docker", "ssh", "node"]


def load(rows: int, tenant, version) -> float:
    """COPY the decisions in; returns seconds taken."""
    from django.db import connection

    rng = random.Random(7)  # noqa: S311 - synthetic data, reproducible
    now = datetime.now(UTC)
    columns = ["id", "tenant_id", "session_id", "conversation_id", "policy_version_id", "mode", "kind", "request",
               "subject", "allowed", "effect", "reason_code", "rule_id", "message", "hint", "eval_us", "created_at",
               "shadow_allowed", "shadow_effect", "shadow_reason_code", "shadow_rule_id"]
    from policies_app.rollups import argument_pattern

    base_rows = Counter()
    started = time.perf_counter()
    with connection.cursor() as cursor:
        copy_sql = f"COPY policies_app_decisionrecord ({', '.join(columns)}) FROM STDIN"
        with cursor.cursor.copy(copy_sql) as copy:
            for _ in range(rows):
                at = now - timedelta(seconds=rng.random() * 30 * 86400)
                roll = rng.random()
                # Sessions live about half an hour (the default TTL), conversations a few hours.
                slot = int(at.timestamp() // 1800)
                session = str(uuid.UUID(int=slot * 8 + rng.randrange(8)))
                conversation = f"conv-{slot // 4}-{rng.randrange(4)}"
                if roll < 0.60:
                    request, subject = {"bin": "pytest", "args": [f"tests/test_{rng.randrange(50)}.py"]}, "pytest"
                    values = (True, "allow", "", "pytest", "allowed by rule `pytest`", "")
                else:
                    reason, rule, _ = rng.choices(REASONS, weights=[w for *_, w in REASONS])[0]
                    subject = rule or rng.choice(PROGRAMS)
                    request = {"bin": subject, "args": [rng.choice(["-c", "x", "../etc", "test", "-p", "600"])]}
                    effect = "audit_deny" if roll > 0.95 else "deny"
                    values = (effect == "audit_deny", effect, reason, rule, f"denied: {reason}", "a hint")
                allowed, effect, reason_code, rule_id, message, hint = values
                base_rows[(at.replace(minute=0, second=0, microsecond=0), effect, reason_code, rule_id, subject,
                           "" if effect == "allow" else argument_pattern(request))] += 1
                copy.write_row((uuid.UUID(int=rng.getrandbits(128)), tenant.pk, session, conversation, version.pk,
                                "enforce", "exec", json.dumps(request), subject, allowed, effect, reason_code, rule_id,
                                message, hint, rng.randrange(5, 40), at, None, "", "", ""))
        # The hourly rollups, as recording each decision would have built them (rollups.py):
        # every decision by rule, program and (a denial) argument pattern, counted while
        # generating; denials also by conversation and session, grouped by PostgreSQL.
        columns = ["tenant_id", "hour", "effect", "reason_code", "version_id", "rule_id", "subject", "pattern",
                   "group_kind", "group_value", "count"]
        with cursor.cursor.copy(f"COPY policies_app_decisionrollup ({', '.join(columns)}) FROM STDIN") as copy:
            for (hour, effect, reason_code, rule_id, subject, pattern), count in base_rows.items():
                copy.write_row((tenant.pk, hour, effect, reason_code, version.pk, rule_id, subject, pattern, "", "",
                                count))
        for group_kind, value in (("conversation", "conversation_id"), ("session", "session_id::text")):
            cursor.execute(
                "INSERT INTO policies_app_decisionrollup (tenant_id, hour, effect, reason_code, version_id, "  # noqa: S608 - fixed text
                "rule_id, subject, pattern, group_kind, group_value, count) SELECT tenant_id, "
                "date_trunc('hour', created_at), effect, reason_code, coalesce(policy_version_id, 0), '', '', '', "
                f"'{group_kind}', {value}, count(*) FROM policies_app_decisionrecord WHERE effect <> 'allow' "
                "GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10")
        cursor.execute("ANALYZE policies_app_decisionrecord")
        cursor.execute("ANALYZE policies_app_decisionrollup")
    return time.perf_counter() - started




def measure(function, runs: int) -> tuple[float, float]:
    function()  # warm-up
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return percentiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/airlock_bench")
    options = parser.parse_args()
    prepare_database(options.database_url)
    setup_django(options.database_url)

    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from controlplane import services
    from controlplane.models import ApiKeyScope
    from controlplane.roles import Role
    from policies_app import services as policy_services
    from policies_app.models import PolicyPublication
    from policies_app.rollups import compact

    tenant = services.tenant_create(slug="bench", name="Bench")
    admin = services.user_create(username="bench-admin").user
    services.membership_add(tenant=tenant, user=admin, role=Role.VIEWER)
    policy = policy_services.policy_create(tenant=tenant, name="default", actor=None)
    version = policy_services.version_create(policy=policy, actor=None,
                                             source="commands:\n  - {id: pytest, bin: pytest}\n")
    # Published half-way through the 30 days, so the insights ("new since", dormant rules,
    # denial rate by version) have both halves to compare.
    publication = policy_services.version_publish(version=version, actor=None, note="bench")
    PolicyPublication.objects.filter(pk=publication.pk).update(created_at=timezone.now() - timedelta(days=15))
    key = services.api_key_create(tenant=tenant, name="bench", scopes=[ApiKeyScope.POLICIES_READ], actor=None).key
    seconds = load(options.rows, tenant, version)
    print(f"Denials benchmark: {options.rows:,} decisions loaded into PostgreSQL in {seconds:.1f} s")
    # What the daily `manage.py prune_decisions` has done by now: hours older than 3 days merged
    # into days.
    started = time.perf_counter()
    merged = compact()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE policies_app_decisionrollup")
    print(f"  rollups compacted: {merged:,} hourly rows merged into days in {time.perf_counter() - started:.1f} s")
    page = Client()
    page.force_login(admin)
    api = Client(headers={"Authorization": f"Bearer {key}"})
    print(f"  {'':<34} {'p50 ms':>8} {'p95 ms':>8}")
    for period in ("24h", "7d", "30d"):
        span = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}[period]
        since = timezone.now() - span

        def count(since=since):
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM policies_app_decisionrecord WHERE tenant_id = %s AND effect = "
                               "'deny' AND created_at >= %s", [tenant.pk, since])

        def get_page(period=period):
            assert page.get(f"/t/bench/denials/?period={period}").status_code == 200

        def get_api(period=period):
            assert api.get(f"/api/v1/denials?period={period}").status_code == 200

        for name, function in ((f"baseline COUNT(*) {period}", count), (f"Denials page {period}", get_page),
                               (f"GET /api/v1/denials {period}", get_api)):
            p50, p95 = measure(function, options.runs)
            verdict = "" if name.startswith("baseline") else ("  ok" if p95 <= 300 else "  ABOVE target 300 ms")
            print(f"  {name:<34} {p50:8.1f} {p95:8.1f}{verdict}")


if __name__ == "__main__":
    main()
