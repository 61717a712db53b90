"""The policy engine's speed: decisions per second of `evaluate` on a realistic policy (one
core, no I/O), beside a baseline measured in the same run (compiling the same regexes' match
on the same arguments, the floor any engine pays); and the time to replay 100,000 recorded
requests against a draft on PostgreSQL (a database of its own, dropped and re-created).

    .venv/bin/python bench/policy.py [--decisions N] [--replay N] [--database-url postgres://…/airlock_bench_policy]

Targets: >= 50,000 decisions/s on one core; replay of 100,000 requests <= 10 s."""

import argparse
import json
import os
import random
import re
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POLICY = """
mode: enforce
limits: {cpus: 1, memory_mb: 512, pids: 128, disk_mb: 256, command_timeout_s: 60}
commands:
  - id: pytest
    bin: pytest
    prepend_args: ["-q"]
    deny_args: ["^-c", "^-p", "^--rootdir", "^--confcutdir"]
  - id: python3
    bin: python3
    deny_args: ["^-"]
  - id: npm-test
    bin: npm
    prepend_args: ["test", "--"]
    deny_args: ["^--prefix"]
  - id: git-read
    bin: git
    allow_args: ["status", "diff", "log", "show", "--stat", "--oneline", "-n", "[0-9]+", "HEAD(~[0-9]+)?"]
    max_args: 6
  - id: make-test
    bin: make
    allow_args: ["test", "lint", "check"]
    max_args: 1
  - id: ls
    bin: ls
    allow_args: ["-la?", "[A-Za-z0-9_./-]+"]
filesystem: {workspace: /workspace, arg_paths: workspace_only}
"""
DRAFT = POLICY.replace('["test", "lint", "check"]', '["test", "lint", "check", "all"]')  # widens `make all`


def requests(count: int, seed: int = 3) -> list[dict]:
    """A mix like agents send: about a third allowed, the rest denied for each kind of reason."""
    rng = random.Random(seed)  # noqa: S311 - synthetic data, reproducible
    shapes = [
        lambda: {"bin": "pytest", "args": [f"tests/test_{rng.randrange(40)}.py", "-k", "slow"]},
        lambda: {"bin": "pytest", "args": ["-c", "evil.ini"]},
        lambda: {"bin": "python3", "args": [f"scripts/job_{rng.randrange(9)}.py", "--fast"]},
        lambda: {"bin": "python3", "args": ["-c", "import os"]},
        lambda: {"bin": "git", "args": ["log", "--oneline", "-n", str(rng.randrange(50))]},
        lambda: {"bin": "git", "args": ["push", "origin"]},
        lambda: {"bin": "make", "args": [rng.choice(["test", "all", "lint"])]},
        lambda: {"bin": "ls", "args": ["-la", rng.choice(["src", "../etc", "/etc/passwd", "tests/unit"])]},
        lambda: {"bin": "bash", "args": ["-c", "curl http://x"]},
        lambda: {"bin": "npm", "args": ["--prefix", "/opt/elsewhere"]},
    ]
    return [rng.choice(shapes)() for _ in range(count)]


def bench_engine(count: int) -> None:
    from policies_app.document import parse_yaml
    from policies_app.engine import VersionRef, compile_policy, evaluate

    document = parse_yaml(POLICY)
    compiled = compile_policy(document, VersionRef("default", 1, document.sha256()))
    batch = requests(count)
    for request in batch[:1000]:  # warm-up
        evaluate(compiled, request)
    started = time.perf_counter()
    allowed = sum(evaluate(compiled, request).allowed for request in batch)
    engine_s = time.perf_counter() - started
    patterns = [re.compile(p) for rule in document.commands for p in rule.deny_args]
    started = time.perf_counter()
    for request in batch:
        for arg in request["args"]:
            any(p.search(arg) for p in patterns)
    floor_s = time.perf_counter() - started
    rate = count / engine_s
    verdict = "ok" if rate >= 50_000 else "BELOW target 50,000/s"
    print(f"  engine: {count:,} decisions in {engine_s:.2f} s = {rate:,.0f} decisions/s on one core ({verdict}); "
          f"{allowed / count:.0%} allowed")
    print(f"  baseline (the deny regexes alone on the same arguments): {count / floor_s:,.0f}/s; "
          f"engine / baseline time: {engine_s / floor_s:.1f}x")


def bench_replay(count: int, url: str) -> None:
    from urllib.parse import urlsplit

    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(parts._replace(path="/postgres").geturl(), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = url
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 60)
    os.environ["AIRLOCK_LOG_LEVEL"] = "WARNING"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.db import connection

    from controlplane import services
    from policies_app import services as policy_services
    from policies_app.decisions import compile_policy, replay
    from policies_app.document import parse_yaml
    from policies_app.engine import VersionRef, evaluate

    tenant = services.tenant_create(slug="bench", name="Bench")
    policy = policy_services.policy_create(tenant=tenant, name="default", actor=None)
    version = policy_services.version_create(policy=policy, source=POLICY, actor=None)
    compiled = compile_policy(parse_yaml(POLICY), VersionRef("default", 1, version.sha256))
    now = datetime.now(UTC)
    started = time.perf_counter()
    with connection.cursor() as cursor, cursor.cursor.copy(
            "COPY policies_app_decisionrecord (id, tenant_id, policy_version_id, mode, kind, request, subject, "
            "allowed, effect, reason_code, rule_id, message, hint, eval_us, created_at, conversation_id, "
            "shadow_effect, shadow_reason_code, shadow_rule_id) FROM STDIN") as copy:
        for index, request in enumerate(requests(count, seed=11)):
            decision = evaluate(compiled, request)
            copy.write_row((uuid.uuid4(), tenant.pk, version.pk, "enforce", "exec", json.dumps(request),
                            request["bin"], decision.allowed, decision.effect, decision.reason_code or "",
                            decision.rule_id or "", decision.message, decision.hint, 10,
                            now - timedelta(seconds=index), "", "", "", ""))
    load_s = time.perf_counter() - started
    draft = parse_yaml(DRAFT)
    started = time.perf_counter()
    result = replay(policy=policy, compiled=compile_policy(draft, VersionRef("default", 2, draft.sha256())),
                    limit=count)
    replay_s = time.perf_counter() - started
    verdict = "ok" if replay_s <= 10 else "ABOVE target 10 s"
    print(f"  replay: {result.replayed:,} recorded requests against a draft in {replay_s:.2f} s ({verdict}); "
          f"{result.widenings:,} widenings, {result.breakages:,} breakages (loading them took {load_s:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--replay", type=int, default=100_000)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/airlock_bench_policy")
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 60)
    print("Policy engine benchmark")
    bench_engine(options.decisions)
    bench_replay(options.replay, options.database_url)


if __name__ == "__main__":
    main()
