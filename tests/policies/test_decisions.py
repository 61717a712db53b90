import pytest

from policies_app import services
from policies_app.decisions import decide, decision_payload, replay
from policies_app.document import parse_yaml
from policies_app.engine import VersionRef, compile_policy
from policies_app.models import DecisionRecord

PUBLISHED = "commands:\n  - {id: pytest, bin: pytest, deny_args: ['^-c']}\n"
CANDIDATE = "commands:\n  - {id: pytest, bin: pytest}\n  - {id: make-test, bin: make, allow_args: [test]}\n"


@pytest.fixture
def policy(acme, alice):
    policy = services.policy_create(tenant=acme, name="default", actor=alice)
    version = services.version_create(policy=policy, source=PUBLISHED, actor=alice)
    services.version_publish(version=version, actor=alice, note="first")
    return policy


def test_every_decision_is_recorded_with_its_version_and_timing(acme, policy):
    evaluation = decide(tenant=acme, policy=policy, request={"bin": "make", "args": ["all"]},
                        conversation_id="conv-1")
    record = DecisionRecord.objects.get(pk=evaluation.record.pk)
    assert (record.allowed, record.reason_code, record.conversation_id) == (False, "bin_not_allowed", "conv-1")
    assert record.policy_version == policy.published_version()
    assert record.eval_us >= 0 and record.kind == "exec"
    payload = decision_payload(evaluation.decision, record)
    assert payload["policy_version"] == {"policy": "default", "number": 1, "sha256": record.policy_version.sha256}
    assert payload["id"] == str(record.id)


def test_secrets_in_a_request_are_redacted_before_they_are_stored(acme, policy):
    request = {"bin": "pytest", "args": ["--token=ghp_" + "a" * 36, "AKIAABCDEFGHIJKLMNOP", "my-own-secret-value"]}
    evaluation = decide(tenant=acme, policy=policy, request=request, secrets=["my-own-secret-value"])
    stored = DecisionRecord.objects.get(pk=evaluation.record.pk).request
    assert stored["args"] == ["--token=[redacted]", "[redacted]", "[redacted]"]


def test_secrets_quoted_in_the_message_and_hint_are_redacted_too(acme, policy):
    token = "ghp_" + "b" * 36
    record = decide(tenant=acme, policy=policy, request={"bin": "pytest", "args": ["-c", token]}).record
    record = DecisionRecord.objects.get(pk=record.pk)
    assert token not in record.message + record.hint + str(record.request)


def test_a_policy_with_nothing_published_denies_by_default(acme, alice):
    policy = services.policy_create(tenant=acme, name="empty", actor=alice)
    decision = decide(tenant=acme, policy=policy, request={"bin": "pytest"}).decision
    assert (decision.allowed, decision.reason_code) == (False, "default_deny")
    assert "publish" in decision.hint


def test_a_dry_run_is_not_recorded(acme, policy):
    decide(tenant=acme, policy=policy, request={"bin": "pytest"}, record=False)
    assert not DecisionRecord.objects.exists()


def test_the_shadow_candidate_is_judged_beside_the_published_version(acme, alice, policy):
    candidate = services.version_create(policy=policy, source=CANDIDATE, actor=alice)
    services.policy_set_shadow(policy=policy, version=candidate, actor=alice)
    evaluation = decide(tenant=acme, policy=policy, request={"bin": "make", "args": ["test"]})
    record = evaluation.record
    assert (record.allowed, record.shadow_allowed, record.shadow_rule_id) == (False, True, "make-test")
    assert record.shadow_differs
    same = decide(tenant=acme, policy=policy, request={"bin": "pytest"}).record
    assert not same.shadow_differs


def test_replay_shows_widenings_and_breakages_grouped_by_rule_with_examples(acme, globex, policy):
    for request in [{"bin": "make", "args": ["test"]}, {"bin": "make", "args": ["test"]},
                    {"bin": "pytest", "args": ["-c", "x"]}, {"bin": "pytest", "args": ["tests"]},
                    {"bin": "make", "args": ["deploy"]}]:
        decide(tenant=acme, policy=policy, request=request)
    decide(tenant=globex, policy=None, request={"bin": "make", "args": ["test"]})  # another tenant's traffic
    stricter = CANDIDATE.replace("{id: pytest, bin: pytest}", "{id: pytest, bin: pytest, allow_args: ['-x']}")
    document = parse_yaml(stricter)
    result = replay(policy=policy, compiled=compile_policy(document, VersionRef("default", 2, document.sha256())))
    assert (result.replayed, result.widenings, result.breakages) == (5, 2, 1)
    widening = result.groups[0]
    assert (widening.direction, widening.rule_id, widening.count) == ("widening", "make-test", 2)
    assert widening.examples == [{"bin": "make", "args": ["test"]}] * 2
    breakage = result.groups[1]
    assert (breakage.direction, breakage.reason_code, breakage.rule_id) == ("breakage", "arg_denied", "pytest")
    assert breakage.examples == [{"bin": "pytest", "args": ["tests"]}]


def test_replay_respects_its_limit(acme, policy):
    for _ in range(5):
        decide(tenant=acme, policy=policy, request={"bin": "make"})
    document = parse_yaml(CANDIDATE)
    result = replay(policy=policy, compiled=compile_policy(document, VersionRef("default", 2, document.sha256())),
                    limit=3)
    assert result.replayed == 3


def test_the_policy_page_lists_where_the_shadow_differs(acme, alice, policy, client_for):
    from django.urls import reverse

    candidate = services.version_create(policy=policy, source=CANDIDATE, actor=alice)
    services.policy_set_shadow(policy=policy, version=candidate, actor=alice)
    decide(tenant=acme, policy=policy, request={"bin": "make", "args": ["test"]})
    decide(tenant=acme, policy=policy, request={"bin": "pytest", "args": ["tests"]})
    page = client_for(alice).get(reverse("policy", args=["acme", "default"])).content.decode()
    assert "<code>make test</code>" in page and "<code>pytest tests</code>" not in page


def test_decisions_past_the_retention_are_pruned(acme, policy):
    from datetime import timedelta
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    old = decide(tenant=acme, policy=policy, request={"bin": "make"}).record
    DecisionRecord.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=91))
    decide(tenant=acme, policy=policy, request={"bin": "make"})
    out = StringIO()
    call_command("prune_decisions", stdout=out)
    assert "deleted 1 decision" in out.getvalue()
    assert DecisionRecord.objects.count() == 1


def test_egress_decisions_are_recorded_and_replayed_by_their_kind(acme, policy):
    evaluation = decide(tenant=acme, policy=policy, request={"host": "pypi.org", "port": 443}, kind="egress")
    record = DecisionRecord.objects.get(pk=evaluation.record.pk)
    assert (record.kind, record.allowed, record.reason_code) == ("egress", False, "egress_denied")
    opened = parse_yaml(PUBLISHED + "network: {egress: allowlist, allow: ['pypi.org:443']}\n")
    result = replay(policy=policy, compiled=compile_policy(opened, VersionRef("default", 2, opened.sha256())))
    assert (result.replayed, result.widenings) == (1, 1)
    assert result.groups[0].rule_id == "network.allow"


def test_a_session_kept_on_an_older_version_is_told_that_the_published_one_allows_it(acme, policy):
    import uuid

    session = uuid.uuid4()
    v1 = policy.published_version()
    denied = decide(tenant=acme, policy=policy, request={"bin": "git", "args": ["status"]}, version=v1,
                    session_id=session).decision
    assert not denied.allowed and "v2" not in denied.hint
    v2 = services.version_create(policy=policy, source="commands:\n  - {id: git, bin: git}\n", actor=None)
    services.version_publish(version=v2, actor=None, note="git")
    dry_run = decide(tenant=acme, policy=policy, request={"bin": "git", "args": []}, version=v1, record=False)
    assert "session" not in dry_run.decision.hint  # a dry run of an old version is no session's
    pinned = decide(tenant=acme, policy=policy, request={"bin": "git", "args": ["status"]}, version=v1,
                    session_id=session)
    assert not pinned.decision.allowed and pinned.decision.reason_code == "bin_not_allowed"
    assert pinned.decision.hint.startswith(f"v{v2.number} of policy `default`, published since this session opened, "
                                           "allows it") and "a new session runs under" in pinned.record.hint
    still = decide(tenant=acme, policy=policy, request={"bin": "make", "args": []}, version=v1,
                   session_id=session).decision
    assert "published since" not in still.hint  # v2 refuses it too: the usual hint
