"""Denial metrics against hand-counted fixtures: every aggregate, the filters, export, scoping."""

import csv
import io
import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from controlplane.models import ApiKeyScope
from policies_app import exceptions, services
from policies_app.decisions import decide
from policies_app.denials import DenialQuery, summary
from policies_app.models import DecisionRecord
from policies_app.rollups import argument_pattern

ENFORCED = "commands:\n  - {id: pytest, bin: pytest, deny_args: ['^-c']}\n"
AUDITED = "mode: audit\ncommands:\n  - {id: pytest, bin: pytest}\n"


def publish(tenant, name: str, source: str):
    policy = services.policy_create(tenant=tenant, name=name, actor=None)
    version = services.version_create(policy=policy, source=source, actor=None)
    services.version_publish(version=version, actor=None, note="test")
    return policy


def record(tenant, policy, request: dict, *, ago: timedelta, conversation: str = ""):
    return decide(tenant=tenant, policy=policy, request=request, conversation_id=conversation,
                  at=timezone.now() - ago).record


@pytest.fixture
def traffic(acme, globex):
    """acme, last 24 h: 3 x `make test` (bin_not_allowed, conv-a), 2 x `pytest -c x` (arg_denied,
    conv-b), 1 allowed; 3 days ago: 1 x `make`; audit mode: 2 would-be denials. globex: 4."""
    enforced, audited = publish(acme, "default", ENFORCED), publish(acme, "audited", AUDITED)
    for _ in range(3):
        record(acme, enforced, {"bin": "make", "args": ["test"]}, ago=timedelta(hours=1), conversation="conv-a")
    for _ in range(2):
        record(acme, enforced, {"bin": "pytest", "args": ["-c", "x"]}, ago=timedelta(hours=2), conversation="conv-b")
    record(acme, enforced, {"bin": "pytest", "args": ["tests/"]}, ago=timedelta(hours=1))
    record(acme, enforced, {"bin": "make", "args": []}, ago=timedelta(days=3))
    for _ in range(2):
        record(acme, audited, {"bin": "bash", "args": ["-c", "id"]}, ago=timedelta(minutes=5), conversation="conv-c")
    other = publish(globex, "default", ENFORCED)
    for _ in range(4):
        record(globex, other, {"bin": "make", "args": ["test"]}, ago=timedelta(minutes=1), conversation="conv-a")


def query(tenant, **kwargs) -> DenialQuery:
    now = timezone.now()
    period = kwargs.pop("period", timedelta(hours=24))
    return DenialQuery(tenant=tenant, since=now - period, until=now + timedelta(seconds=1), **kwargs)


def counts(rows) -> dict:
    return {row["value"]: row["count"] for row in rows}


def test_every_aggregate_matches_the_hand_count(acme, traffic):
    result = summary(query(acme))
    assert result["total"] == 5
    assert result["other_mode_total"] == 2  # audit mode's would-be denials, kept apart
    assert counts(result["by"]["reason"]) == {"bin_not_allowed": 3, "arg_denied": 2}
    assert counts(result["by"]["rule"]) == {"": 3, "pytest": 2}
    assert counts(result["by"]["subject"]) == {"make": 3, "pytest": 2}
    assert counts(result["by"]["conversation"]) == {"conv-a": 3, "conv-b": 2}
    assert counts(result["argument_patterns"]) == {"make <arg>": 3, "pytest -c <arg>": 2}
    buckets = result["over_time"]
    assert len(buckets) in {24, 25} and sum(b["count"] for b in buckets) == 5
    assert [b["count"] for b in buckets if b["count"]] == [2, 3]  # two hours ago, then one hour ago


def test_the_period_reason_and_mode_filters(acme, traffic):
    week = summary(query(acme, period=timedelta(days=7)))
    assert week["total"] == 6 and len(week["over_time"]) in {7, 8}
    assert query(acme, reason="arg_denied").records().count() == 2
    audit = summary(query(acme, effect="audit_deny"))
    assert audit["total"] == 2 and audit["other_mode_total"] == 5
    assert counts(audit["by"]["subject"]) == {"bash": 2}


def test_a_version_filter_counts_only_that_version(acme, traffic):
    version = acme.policies.get(name="default").published_version()
    assert query(acme, version_id=version.pk).records().count() == 5


def test_argument_patterns_group_requests_of_the_same_shape():
    assert argument_pattern({"bin": "pytest", "args": ["tests/a.py", "-k", "slow", "--maxfail=3"]}) == \
        "pytest <path> -k <arg> --maxfail=…"
    assert argument_pattern({"bin": "sleep", "args": ["600"]}) == "sleep <n>"
    assert argument_pattern({"bin": "curl", "args": ["-fsS", "https://example.org/x.sh"]}) == "curl -fsS <url>"
    assert argument_pattern({"bin": "bash", "args": ["-c", "cat /etc/shadow"]}) == "bash -c <text>"
    assert argument_pattern({"bin": "git", "args": ["clone", "git@host:x/y.git", "--depth", "1"]}) == \
        "git <arg> <path> --depth <n>"
    assert argument_pattern({"bin": "python3", "args": ["-1", "setup.py", "..", "main"]}) == \
        "python3 <n> <path> <path> <arg>"


def test_the_denials_page_shows_the_figures_and_a_chart(acme, bob, client_for, traffic):
    page = client_for(bob).get("/t/acme/denials/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-testid="denial-total">5<' in html
    assert '<canvas id="denials-chart"' in html and "vendor/chartjs/chart.umd.min.js" in html
    assert "bin_not_allowed" in html and "conv-a" in html
    assert client_for(bob).get("/t/acme/denials/?period=forever").status_code == 400


def test_a_denial_opens_with_its_request_and_explanation(acme, bob, client_for, traffic):
    denial = DecisionRecord.objects.filter(tenant=acme, reason_code="arg_denied").first()
    page = client_for(bob).get(f"/t/acme/denials/{denial.pk}/").content.decode()
    assert "matches <code>^-c</code>" in page and "drop <code>-c</code>" in page and "`" not in page.split("<main")[1]


def test_exports_hold_the_periods_denials_as_csv_and_json(acme, bob, client_for, traffic):
    response = client_for(bob).get("/t/acme/denials/?period=24h&format=csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 5 and {row["subject"] for row in rows} == {"make", "pytest"}
    assert {row["args"] for row in rows if row["subject"] == "pytest"} == {"'-c x"}  # no spreadsheet formula
    response = client_for(bob).get("/t/acme/denials/?mode=audit&format=json")
    data = json.loads(b"".join(response.streaming_content))
    assert len(data) == 2 and data[0]["effect"] == "audit_deny"


def test_denials_never_cross_tenants(acme, charlie, client_for, traffic, make_key, api, globex):
    assert client_for(charlie).get("/t/acme/denials/").status_code == 404
    denial = DecisionRecord.objects.filter(tenant=acme, allowed=False).first()
    assert client_for(charlie).get(f"/t/globex/denials/{denial.pk}/").status_code == 404
    body = api(make_key(globex, scopes=[ApiKeyScope.POLICIES_READ]).key).get("/api/v1/denials").json()
    assert body["total"] == 4 and counts(body["by"]["conversation"]) == {"conv-a": 4}


def test_the_api_serves_the_same_summary(acme, traffic, make_key, api):
    client = api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ]).key)
    body = client.get("/api/v1/denials?period=7d").json()
    assert body["total"] == 6 and body["mode"] == "enforce"
    bad = client.get("/api/v1/denials?period=forever")
    assert bad.status_code == 400 and "period" in bad.json()["fields"]


def test_the_rollups_agree_with_the_decision_log(acme, traffic):
    from policies_app.models import DecisionRollup

    for effect in ("deny", "audit_deny", "allow"):
        logged = DecisionRecord.objects.filter(tenant=acme, effect=effect).count()
        rolled = sum(DecisionRollup.objects.filter(tenant=acme, effect=effect, group_kind="")
                     .values_list("count", flat=True))
        assert rolled == logged
    # An allowed decision is counted by rule and program only, not by conversation or session.
    assert not DecisionRollup.objects.filter(tenant=acme, effect="allow").exclude(group_kind="").exists()


def test_pruning_drops_old_rollups_with_old_decisions(acme, traffic):
    from django.core.management import call_command

    from policies_app.models import DecisionRollup

    record(acme, acme.policies.get(name="default"), {"bin": "make"}, ago=timedelta(days=100))
    call_command("prune_decisions", stdout=io.StringIO())
    assert not DecisionRollup.objects.filter(hour__lt=timezone.now() - timedelta(days=90)).exists()
    assert summary(query(acme, period=timedelta(days=30)))["total"] == 6


def allow_this(client, record):
    return client.post(f"/t/acme/denials/{record.pk}/allow")


def test_allow_this_drafts_the_narrowest_rule_and_shows_its_replay(acme, alice, client_for, traffic):
    from policies_app.decisions import compiled_version
    from policies_app.engine import evaluate

    policy = acme.policies.get(name="default")
    published = policy.published_version()
    denial = DecisionRecord.objects.filter(tenant=acme, subject="make", request__args=["test"]).first()
    response = allow_this(client_for(alice), denial)
    assert response.status_code == 201
    draft = policy.versions.order_by("-number").first()
    assert draft.number == published.number + 1 and policy.published_version() == published  # not published
    page = response.content.decode()
    assert 'data-testid="policy-replay"' in page and "3 widened" in page and "0 broken" in page
    compiled = compiled_version(draft)
    assert evaluate(compiled, {"bin": "make", "args": ["test"]}).allowed
    for broader in ({"bin": "make", "args": ["all"]}, {"bin": "make", "args": ["test", "install"]},
                    {"bin": "make", "args": []}, {"bin": "make", "args": ["tests"]}):
        assert not evaluate(compiled, broader).allowed, broader
    from policies_app.decisions import replay

    result = replay(policy=policy, compiled=compiled)
    assert (result.widenings, result.breakages) == (3, 0)  # exactly the three `make test` denials flip
    assert result.groups[0].examples[0] == {"bin": "make", "args": ["test"]}


def test_allow_this_is_for_security_admins_and_only_where_a_rule_can_decide(acme, bob, alice, client_for, traffic):
    denial = DecisionRecord.objects.filter(tenant=acme, subject="make").first()
    assert allow_this(client_for(bob), denial).status_code == 403
    hard = decide(tenant=acme, policy=acme.policies.get(name="default"),
                  request={"bin": "pytest", "args": ["../../etc/passwd"]}).record
    assert "not decided by a command rule" in client_for(alice).get(f"/t/acme/denials/{hard.pk}/").content.decode()
    before = acme.policies.get(name="default").versions.count()
    response = allow_this(client_for(alice), hard)
    assert response.status_code == 302 and acme.policies.get(name="default").versions.count() == before
    secret = decide(tenant=acme, policy=acme.policies.get(name="default"),
                    request={"bin": "deploy", "args": ["--token", "hunter2hunter2"]}).record
    assert allow_this(client_for(alice), secret).status_code == 302  # stored redacted: cannot be allowed exactly


def test_allow_this_with_an_expiry_drafts_a_rule_that_stops_allowing_then(acme, alice, client_for, traffic):
    from policies_app.decisions import compiled_version
    from policies_app.engine import evaluate
    from policies_app.lint import lint
    from policies_app.services import version_document

    denial = DecisionRecord.objects.filter(tenant=acme, subject="make", request__args=["test"]).first()
    response = client_for(alice).post(f"/t/acme/denials/{denial.pk}/allow", {"expires": "7d"})
    assert response.status_code == 201
    draft = acme.policies.get(name="default").versions.order_by("-number").first()
    rule = draft.document["commands"][-1]
    compiled = compiled_version(draft)
    assert evaluate(compiled, {"bin": "make", "args": ["test"]}).allowed
    later = timezone.now() + timedelta(days=7, minutes=1)
    expired = evaluate(compiled, {"bin": "make", "args": ["test"]}, at=later)
    assert not expired.allowed and expired.rule_id == rule["id"] and "expired at" in expired.message
    assert not lint(version_document(draft))
    assert client_for(alice).post(f"/t/acme/denials/{denial.pk}/allow", {"expires": "forever"}).status_code == 302


def test_an_expired_rule_and_its_test_never_block_the_next_publish(acme, traffic):
    from policies_app.lint import lint
    from policies_app.services import version_document

    policy = acme.policies.get(name="default")
    source = ("commands:\n  - {id: pytest, bin: pytest}\n"
              "  - {id: allow-make, bin: make, exact_args: [test], expires: '2020-01-01T00:00:00Z'}\n"
              "tests:\n  - request: {bin: make, args: [test]}\n    expect: {allowed: true, rule_id: allow-make}\n")
    version = services.version_create(policy=policy, source=source, actor=None)
    services.version_publish(version=version, actor=None, note="the old narrow rule has expired")  # no test failure
    assert policy.published_version() == version
    assert not decide(tenant=acme, policy=policy, request={"bin": "make", "args": ["test"]}).decision.allowed
    assert [w.rule_id for w in lint(version_document(version))] == ["allow-make"]  # flagged as expired


def test_allow_this_keeps_the_prepend_args_of_the_rule_that_denied(acme, alice, client_for):
    policy = services.policy_create(tenant=acme, name="framed", actor=None)
    source = "commands:\n  - {id: npm-test, bin: npm, prepend_args: [test, --], deny_args: ['^--watch']}\n"
    services.version_publish(version=services.version_create(policy=policy, source=source, actor=None), actor=None,
                             note="test")
    denial = decide(tenant=acme, policy=policy, request={"bin": "npm", "args": ["--watch"]}).record
    assert client_for(alice).post(f"/t/acme/denials/{denial.pk}/allow").status_code == 201
    rule = policy.versions.order_by("-number").first().document["commands"][-1]
    assert (rule["exact_args"], rule["prepend_args"]) == (["--watch"], ["test", "--"])


# -- insights ------------------------------------------------------------------------------

V1 = "commands:\n  - {id: pytest, bin: pytest, deny_args: ['^-c']}\n"
V2 = ("commands:\n  - {id: pytest, bin: pytest, deny_args: ['^-c', '^tests/slow']}\n"
      "  - {id: npm-test, bin: npm, prepend_args: [test]}\n")


@pytest.fixture
def two_versions(acme):
    """v1 published 3 days ago: 2 days ago, 10 allowed, 1 `make` and 1 `pytest -c x` denied. v2
    (stricter, plus an `npm` rule) published 10 hours ago: 5 hours ago, 4 allowed, 6 `pytest
    tests/slow…` denied (arg_denied like `-c x`, but a new intent) and 2 `make` denied (not new)."""
    from policies_app.models import PolicyPublication

    policy = services.policy_create(tenant=acme, name="default", actor=None)
    versions = []
    for source, ago in ((V1, timedelta(days=3)), (V2, timedelta(hours=10))):
        version = services.version_create(policy=policy, source=source, actor=None)
        publication = services.version_publish(version=version, actor=None, note="test")
        PolicyPublication.objects.filter(pk=publication.pk).update(created_at=timezone.now() - ago)
        versions.append(version)
    v1, v2 = versions

    def run(version, request, ago, times):
        for _ in range(times):
            decide(tenant=acme, policy=policy, version=version, request=request, at=timezone.now() - ago)

    run(v1, {"bin": "pytest", "args": ["tests/"]}, timedelta(days=2), 10)
    run(v1, {"bin": "make", "args": []}, timedelta(days=2), 1)
    run(v1, {"bin": "pytest", "args": ["-c", "x"]}, timedelta(days=2), 1)
    run(v2, {"bin": "pytest", "args": ["tests/"]}, timedelta(hours=5), 4)
    run(v2, {"bin": "pytest", "args": ["tests/slow_db.py"]}, timedelta(hours=5), 6)
    run(v2, {"bin": "make", "args": []}, timedelta(hours=5), 2)
    return v1, v2


def test_insights_match_the_hand_count(acme, two_versions):
    from policies_app.insights import insights

    v1 = two_versions[0]
    found = insights(query(acme, period=timedelta(days=7)))
    assert found["new_since"]["version"] == 2  # by default, the last published version
    assert [(r["pattern"], r["reason_code"], r["count"]) for r in found["new_since"]["denials"]] == \
        [("pytest <path>", "arg_denied", 6)]
    assert [(r["rule_id"], r["version"]) for r in found["dormant_rules"]] == [("npm-test", 2)]
    rates = {row["version"]: row for row in found["version_rates"]}
    assert (rates[2]["decisions"], rates[2]["denials"], rates[1]["decisions"], rates[1]["denials"]) == (12, 8, 12, 2)
    assert rates[2]["spike"] and rates[2]["previous_version"] == 1 and not rates[1]["spike"]
    since_v1 = insights(query(acme, period=timedelta(days=7)), v1)["new_since"]["denials"]
    assert {(r["pattern"], r["count"]) for r in since_v1} == {("pytest <path>", 6), ("make", 3), ("pytest -c <arg>", 1)}
    recent = insights(query(acme, period=timedelta(hours=1)))
    assert {r["rule_id"] for r in recent["dormant_rules"]} == {"pytest", "npm-test"}  # nothing decided this hour


def test_the_denials_page_and_api_show_the_insights(acme, bob, client_for, two_versions, make_key, api, globex):
    html = client_for(bob).get("/t/acme/denials/?period=7d").content.decode()
    assert 'data-insight="dormant"' in html and "npm-test" in html
    assert 'data-testid="spike"' in html and "16.7 % under v1 → 66.7 %" in html
    client = api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ]).key)
    body = client.get(f"/api/v1/denials?period=7d&since_version={two_versions[0].pk}").json()
    assert body["insights"]["new_since"]["version"] == 1 and len(body["insights"]["new_since"]["denials"]) == 3
    other = services.version_create(policy=services.policy_create(tenant=globex, name="g", actor=None), source=V1,
                                    actor=None)
    refused = client.get(f"/api/v1/denials?since_version={other.pk}")
    assert refused.status_code == 400 and "since_version" in refused.json()["fields"]


def test_compaction_merges_old_hours_into_days_and_changes_no_count(acme, traffic):
    from policies_app.models import DecisionRollup
    from policies_app.rollups import compact

    policy = acme.policies.get(name="default")
    for hours in (5 * 24 + 1, 5 * 24 + 3, 5 * 24 + 7, 8 * 24 + 2):  # three hours of one day, one of another
        record(acme, policy, {"bin": "make", "args": ["test"]}, ago=timedelta(hours=hours), conversation="conv-a")

    def figures():
        month, day = summary(query(acme, period=timedelta(days=30))), summary(query(acme))
        return month["total"], month["by"], month["argument_patterns"], [b["count"] for b in month["over_time"]], \
            day["total"], [b["count"] for b in day["over_time"]]

    before, rows = figures(), DecisionRollup.objects.count()
    assert before[0] == 10
    assert compact() > 0
    assert figures() == before  # the same counts, from fewer rows
    assert DecisionRollup.objects.count() < rows
    old = DecisionRollup.objects.filter(hour__lt=timezone.now() - timedelta(days=4))
    assert old.exists() and all(row.hour.hour == 0 for row in old)
    assert compact() == 0  # nothing left to merge
    keys = list(DecisionRollup.objects.values_list("tenant", "hour", "effect", "reason_code", "version_id", "rule_id",
                                                   "subject", "pattern", "group_kind", "group_value"))
    assert len(keys) == len(set(keys))  # one row per key: a merged day is never a second row


def test_allow_this_is_not_offered_for_a_shell_or_a_request_a_rule_would_still_leave_refused(acme, alice, client_for):
    policy = publish(acme, "default", ENFORCED)
    shell = record(acme, policy, {"bin": "bash", "args": ["-c", "pytest"]}, ago=timedelta(minutes=1))
    # `cat` is unknown, so the engine stops at bin_not_allowed; the path would refuse it next.
    hidden_path = record(acme, policy, {"bin": "cat", "args": ["/etc/shadow"]}, ago=timedelta(minutes=1))
    plain = record(acme, policy, {"bin": "make", "args": ["test"]}, ago=timedelta(minutes=1))
    before = policy.versions.count()
    for denial, why in ((shell, "runs arbitrary code even for one exact script"),
                        (hidden_path, "even a rule for exactly this request leaves it refused")):
        page = client_for(alice).get(f"/t/acme/denials/{denial.pk}/").content.decode()
        assert why in page, page
        assert allow_this(client_for(alice), denial).status_code == 302
        with pytest.raises(ValidationError, match=why.split(" (")[0]):
            exceptions.exception_from_denial(record=denial, expires_at=timezone.now() + timedelta(hours=1),
                                             reason="test", ticket="", actor=None)
    assert policy.versions.count() == before  # nothing drafted
    assert allow_this(client_for(alice), plain).status_code == 201 and policy.versions.count() == before + 1


def test_a_denial_whose_narrow_rule_is_published_says_so_instead_of_failing(acme, alice, client_for):
    policy = publish(acme, "default", ENFORCED)
    denial = record(acme, policy, {"bin": "make", "args": ["test"]}, ago=timedelta(minutes=1))
    assert allow_this(client_for(alice), denial).status_code == 201
    services.version_publish(version=policy.versions.first(), actor=None, note="allow make test")
    page = client_for(alice).get(f"/t/acme/denials/{denial.pk}/").content.decode()
    assert "published since, allows this request" in page  # the session that was denied kept v1
    assert "v2, published since, already allows it" in page  # so neither Allow this nor an exception
    assert allow_this(client_for(alice), denial).status_code == 302  # refused with its reason, nothing drafted


COMMENTED = """# Reviewed by security every Monday.
mode: enforce
commands:
  # Tests only; never a shell.
  - id: pytest
    bin: pytest        # the runner
    deny_args: ['^-c']

# Egress: nothing yet (ticket SEC-12).
tests:
  - request: {bin: pytest, args: ['-c', 'x']}
    expect: {allowed: false, reason_code: arg_denied}
"""


def test_allow_this_adds_the_rule_and_its_test_and_keeps_every_comment_and_line(acme, alice, client_for):
    import difflib

    policy = publish(acme, "default", COMMENTED)
    denial = record(acme, policy, {"bin": "make", "args": ["test"]}, ago=timedelta(minutes=1))
    response = allow_this(client_for(alice), denial)
    assert response.status_code == 201
    draft = policy.versions.order_by("-number").first()
    diff = [line for line in difflib.ndiff(COMMENTED.splitlines(), draft.source.splitlines()) if line[:1] in "+-?"]
    assert [line for line in diff if line[:1] != "+"] == []  # nothing removed or changed
    added = "\n".join(line[2:] for line in diff)
    assert "null" not in added and "bin: make" in added and "exact_args: [test]" in added
    assert added.count("# Allow this: denial") == 1 and len(diff) == 6  # comment, rule (3), test (2)
    assert draft.source.index("bin: make") < draft.source.index("# Egress: nothing yet")
    page = response.content.decode()  # the version page's diff against the published version: those lines
    assert page.count('class="d-add"') == 6 and 'class="d-del"' not in page


def test_allow_this_twice_on_one_denial_opens_the_first_draft_instead_of_a_copy(acme, alice, client_for):
    policy = publish(acme, "default", COMMENTED)
    denial = record(acme, policy, {"bin": "make", "args": ["test"]}, ago=timedelta(minutes=1))
    assert allow_this(client_for(alice), denial).status_code == 201
    again = allow_this(client_for(alice), denial)
    assert again.status_code == 302 and again.url == "/t/acme/policies/default/v/2/"
    assert policy.versions.count() == 2
    other = record(acme, policy, {"bin": "make", "args": ["lint"]}, ago=timedelta(minutes=1))
    assert allow_this(client_for(alice), other).status_code == 201 and policy.versions.count() == 3


def test_replay_reports_flips_against_the_published_version_not_the_verdicts_of_the_time(acme):
    from policies_app.decisions import replay
    from policies_app.document import parse_yaml
    from policies_app.engine import VersionRef, compile_policy

    policy = publish(acme, "default", ENFORCED)
    for _ in range(2):  # denied under v1
        record(acme, policy, {"bin": "make", "args": ["test"]}, ago=timedelta(minutes=5))
    with_make = ENFORCED + "  - {id: make, bin: make, exact_args: [test]}\n"
    services.version_publish(version=services.version_create(policy=policy, source=with_make, actor=None),
                             actor=None, note="make test")
    candidate = parse_yaml(with_make + "  - {id: ls, bin: ls}\n")
    result = replay(policy=policy, compiled=compile_policy(candidate, VersionRef("default", 3, candidate.sha256())))
    assert (result.widenings, result.breakages) == (0, 0)  # v2, published, already allows `make test`
    narrower = parse_yaml(ENFORCED)
    result = replay(policy=policy, compiled=compile_policy(narrower, VersionRef("default", 3, narrower.sha256())))
    assert (result.widenings, result.breakages) == (0, 2)  # dropping it would break what v2 allows


def test_add_as_a_test_opens_the_editor_with_the_denial_as_a_test_and_saves_nothing(acme, alice, bob, client_for):
    policy = publish(acme, "default", COMMENTED)
    denial = record(acme, policy, {"bin": "bash", "args": ["-c", "cat /etc/shadow"]}, ago=timedelta(minutes=1))
    detail = client_for(alice).get(f"/t/acme/denials/{denial.pk}/").content.decode()
    assert f"/t/acme/policies/default/edit?test_from={denial.pk}" in detail
    assert 'data-testid="add-as-test"' not in client_for(bob).get(f"/t/acme/denials/{denial.pk}/").content.decode()
    editor = client_for(alice).get(f"/t/acme/policies/default/edit?test_from={denial.pk}")
    source = editor.context["form"].initial["source"]
    assert source.startswith(COMMENTED) and policy.versions.count() == 1  # appended, nothing saved
    from policies_app.document import parse_yaml

    test = parse_yaml(source).tests[-1]
    assert (test.request.bin, test.request.args) == ("bash", ["-c", "cat /etc/shadow"])
    assert test.expect.model_dump(exclude_none=True) == {"allowed": False, "reason_code": "bin_not_allowed"}
    assert f"From denial {denial.pk}" in source
    assert editor.context["review"].tests_failed == 0  # the published version refuses it so
    bogus = client_for(alice).get("/t/acme/policies/default/edit?test_from=not-a-uuid")
    assert bogus.status_code == 200 and bogus.context["form"].initial["source"] == COMMENTED
    assert "there is no such denial" in bogus.content.decode()
    limit = record(acme, policy, {"bin": "pytest", "args": ["/etc/passwd"]}, ago=timedelta(minutes=1))
    assert limit.reason_code == "path_outside_workspace"  # one a test can hold too
    assert "From denial" in client_for(alice).get(f"/t/acme/policies/default/edit?test_from={limit.pk}").context[
        "form"].initial["source"]


def test_a_breakdowns_row_filters_the_page_to_it_and_counts_exactly(acme, bob, client_for, traffic):
    client = client_for(bob)
    page = client.get("/t/acme/denials/?period=24h").content.decode()
    assert 'href="?period=24h&amp;rule=pytest"' in page  # every row is a link that adds its filter
    assert 'href="?period=24h&amp;conversation=conv-a"' in page
    assert 'href="?period=24h&amp;pattern=make%20%3Carg%3E"' in page
    only = client.get("/t/acme/denials/?period=24h&conversation=conv-a")
    assert only.context["summary"]["total"] == 3 and only.context["summary"]["exact"] is True
    assert counts(only.context["summary"]["by"]["subject"]) == {"make": 3}
    assert sum(bucket["count"] for bucket in only.context["summary"]["over_time"]) == 3
    assert only.context["page"].paginator.count == 3
    assert 'data-testid="drill-filters"' in only.content.decode()
    pattern = client.get("/t/acme/denials/?period=24h&pattern=pytest+-c+<arg>")
    assert pattern.context["summary"]["total"] == 2 and pattern.context["page"].paginator.count == 2
    assert counts(pattern.context["summary"]["by"]["conversation"]) == {"conv-b": 2}
    both = client.get("/t/acme/denials/?period=24h&rule=pytest&conversation=conv-a")
    assert both.context["summary"]["total"] == 0  # conv-a's denials were `make`, not the pytest rule's
    other = client.get("/t/acme/denials/?period=24h&conversation=conv-a&mode=audit")
    assert other.context["summary"]["total"] == 0 and other.context["summary"]["other_mode_total"] == 3


def test_the_latest_denials_are_paged_and_searched(acme, bob, client_for):
    policy = publish(acme, "default", ENFORCED)
    for index in range(60):
        record(acme, policy, {"bin": "make", "args": [f"target{index}"]}, ago=timedelta(minutes=1),
               conversation="conv-many" if index % 2 else "conv-few")
    client = client_for(bob)
    first = client.get("/t/acme/denials/?period=1h")
    assert first.context["page"].paginator.count == 60 and len(first.context["page"]) == 50
    second = client.get("/t/acme/denials/?period=1h&page=2").content.decode()
    assert "page 2 of 2" in second and second.count("/t/acme/denials/") >= 10
    assert 'href="?period=1h&amp;page=1"' in second  # the filters kept, one page number
    found = client.get("/t/acme/denials/?period=1h&q=conv-few")
    assert found.context["page"].paginator.count == 30
    assert found.context["summary"]["total"] == 60  # the search narrows the list, not the counts
    assert client.get("/t/acme/denials/?period=1h&q=nothing-like-it").context["page"].paginator.count == 0


def test_a_custom_range_counts_only_its_hours(acme, bob, client_for):
    policy = publish(acme, "default", ENFORCED)
    record(acme, policy, {"bin": "make", "args": []}, ago=timedelta(days=3))
    record(acme, policy, {"bin": "make", "args": []}, ago=timedelta(hours=1))
    now = timezone.now()
    start = (now - timedelta(days=4)).strftime("%Y-%m-%dT%H:%M")
    end = (now - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    client = client_for(bob)
    page = client.get(f"/t/acme/denials/?start={start}&end={end}")
    assert page.status_code == 200 and page.context["summary"]["total"] == 1
    backwards = client.get(f"/t/acme/denials/?start={end}&end={start}")
    assert backwards.status_code == 400 and "must be after From" in backwards.content.decode()
    too_long = client.get(f"/t/acme/denials/?start={(now - timedelta(days=400)).strftime('%Y-%m-%dT%H:%M')}")
    assert too_long.status_code == 400
    future = (now + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    for query in ("end=9999-12-31T23:59", "end=0001-01-01T00:00", "start=0001-01-01T00:00", f"start={future}",
                  "end=9999-12-31T23:59&format=csv"):
        assert client.get(f"/t/acme/denials/?{query}").status_code == 400, query  # never a 500
    assert client.get(f"/t/acme/denials/?start={future}").content.decode().count("must be") == 1


def test_add_as_a_test_never_offers_a_broken_document(acme, alice, client_for):
    source = ("commands: [{id: pytest, bin: pytest}]\n"
              "tests: [\n  {request: {bin: pytest}, expect: {allowed: true}},  # ok\n]\n")
    policy = publish(acme, "default", source)
    denial = record(acme, policy, {"bin": "make", "args": []}, ago=timedelta(minutes=1))
    editor = client_for(alice).get(f"/t/acme/policies/default/edit?test_from={denial.pk}")
    assert editor.context["form"].initial["source"] == source  # left as it was
    assert "add the test by hand" in editor.content.decode() and not editor.context["review"].errors


def test_allow_this_that_cannot_keep_the_layout_writes_the_document_without_its_defaults(acme, alice, client_for):
    source = "commands: [\n  {id: pytest, bin: pytest},  # tests\n]\n"  # a comment inside a flow list
    policy = publish(acme, "default", source)
    denial = record(acme, policy, {"bin": "make", "args": ["test"]}, ago=timedelta(minutes=1))
    assert allow_this(client_for(alice), denial).status_code == 201
    draft = policy.versions.order_by("-number").first().source
    assert "written anew" in draft and "null" not in draft and "exact_args:" in draft


def test_a_drilled_page_judges_dormant_rules_over_the_whole_period(acme, bob, client_for, traffic):
    drilled = client_for(bob).get("/t/acme/denials/?period=24h&rule=pytest").context["insights"]
    whole = client_for(bob).get("/t/acme/denials/?period=24h").context["insights"]
    assert drilled["dormant_rules"] == whole["dormant_rules"]
    assert drilled["version_rates"] == whole["version_rates"]
