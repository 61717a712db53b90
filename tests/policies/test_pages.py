import pytest
from django.urls import reverse

from controlplane.roles import Role
from policies_app import services
from policies_app.decisions import decide
from policies_app.models import PolicyVersion

V1 = "commands:\n  - {id: pytest, bin: pytest}\n"


@pytest.fixture
def sam(acme, alice, make_member):
    return make_member(acme, "sam", Role.SECURITY_ADMIN)


@pytest.fixture
def policy(acme, alice):
    policy = services.policy_create(tenant=acme, name="default", actor=alice)
    version = services.version_create(policy=policy, source=V1, actor=alice)
    services.version_publish(version=version, actor=alice, note="first")
    return policy


def test_a_security_admin_edits_checks_saves_and_publishes(sam, policy, acme, client_for):
    client = client_for(sam)
    edit = reverse("policy-edit", args=["acme", "default"])
    invalid = client.post(edit, {"source": "commands:\n  - id: make\n    bin: [\n", "action": "check"})
    assert invalid.status_code == 400
    assert b"line 4:" in invalid.content or b"line 3:" in invalid.content
    decide(tenant=acme, policy=policy, request={"bin": "make", "args": ["test"]})
    fixed = V1 + "  - {id: make-test, bin: make, allow_args: [test]}\n"
    checked = client.post(edit, {"source": fixed, "action": "replay"}).content.decode()
    assert '<span class="d-add">+  - {id: make-test, bin: make, allow_args: [test]}</span>' in checked
    assert "deny → allow" in checked and "make-test" in checked
    saved = client.post(edit, {"source": fixed, "action": "save", "note": "make test"})
    assert saved["Location"] == reverse("policy-version", args=["acme", "default", 2])
    missing_note = client.post(reverse("policy-publish", args=["acme", "default", 2]), {"note": ""})
    assert missing_note.status_code == 400
    client.post(reverse("policy-publish", args=["acme", "default", 2]), {"note": "allow make test"})
    assert policy.published_version().number == 2
    client.post(reverse("policy-rollback", args=["acme", "default", 1]), {"note": "undo"})
    assert policy.published_version().number == 3
    assert policy.published_version().source == V1


def test_a_viewer_reads_but_cannot_change(bob, policy, client_for):
    client = client_for(bob)
    for url in [reverse("policies", args=["acme"]), reverse("policy", args=["acme", "default"]),
                reverse("policy-version", args=["acme", "default", 1])]:
        page = client.get(url)
        assert page.status_code == 200
        assert b"Publish v" not in page.content and b"Edit (new draft)" not in page.content
    assert client.get(reverse("policy-edit", args=["acme", "default"])).status_code == 403
    assert client.post(reverse("policy-publish", args=["acme", "default", 1]), {"note": "x"}).status_code == 403
    response = client.post(reverse("policy-rollback", args=["acme", "default", 1]), {"note": "x"})
    assert response.status_code == 403
    assert PolicyVersion.objects.count() == 1


def test_an_operator_cannot_publish(acme, alice, policy, make_member, client_for):
    operator = make_member(acme, "oscar", Role.OPERATOR)
    response = client_for(operator).post(reverse("policy-publish", args=["acme", "default", 1]), {"note": "x"})
    assert response.status_code == 403


def test_an_outsider_gets_404_for_policy_pages(policy, charlie, client_for):
    client = client_for(charlie)
    assert client.get(reverse("policy", args=["acme", "default"])).status_code == 404
    assert client.get(reverse("policy", args=["globex", "default"])).status_code == 404
    assert client.get(reverse("policy-version", args=["globex", "default", 1])).status_code == 404


def test_a_new_policy_starts_from_a_safe_template(sam, client_for):
    client = client_for(sam)
    response = client.post(reverse("policy-create", args=["acme"]), {"name": "ci"})
    assert response["Location"] == reverse("policy-edit", args=["acme", "ci"])
    editor = client.get(response["Location"]).content.decode()
    assert "Default deny" in editor and "deny_args" in editor


def test_the_editors_check_answers_marks_at_their_lines_and_the_review_panel(sam, policy, client_for, bob, charlie):
    check = reverse("policy-check", args=["acme", "default"])
    source = (V1 + "  - {id: sh, bin: bash}\ntests:\n  - request: {bin: make}\n    expect: {allowed: true}\n"
              "limits: {cpus: 99}\n")
    answer = client_for(sam).post(check, {"source": source}).json()
    assert answer["valid"] is False
    assert answer["marks"] == [{"line": 7, "severity": "error",
                                "message": "limits.cpus: Input should be less than or equal to 16"}]
    assert 'data-testid="policy-errors"' in answer["panel"]
    answer = client_for(sam).post(check, {"source": source.replace("cpus: 99", "cpus: 1"), "replay": "1"}).json()
    assert [(mark["line"], mark["severity"]) for mark in answer["marks"]] == [(3, "warning"), (5, "error")]
    assert "allows the shell" in answer["marks"][0]["message"] and "test 1 fails" in answer["marks"][1]["message"]
    assert 'data-testid="policy-replay"' in answer["panel"]
    assert policy.versions.count() == 1  # nothing saved
    assert client_for(sam).post(check, {}).status_code == 400
    assert client_for(bob).post(check, {"source": V1}).status_code == 403  # a viewer edits nothing
    assert client_for(charlie).post(check, {"source": V1}).status_code == 404
    assert client_for(sam).get(check).status_code == 405


def test_the_editors_try_box_judges_a_request_with_the_unsaved_document(sam, policy, client_for):
    judge = reverse("policy-try", args=["acme", "default"])
    draft = V1 + "  - {id: make, bin: make, allow_args: [test]}\n"
    allowed = client_for(sam).post(judge, {"source": draft, "bin": "make", "args": "test"}).json()
    assert allowed["decision"]["effect"] == "allow" and allowed["decision"]["rule_id"] == "make"
    denied = client_for(sam).post(judge, {"source": draft, "bin": "make", "args": "'test' install"}).json()
    assert denied["request"]["args"] == ["test", "install"] and denied["decision"]["reason_code"] == "arg_denied"
    outside = client_for(sam).post(judge, {"source": draft, "bin": "pytest", "args": "../x", "cwd": "/workspace"})
    assert outside.json()["decision"]["reason_code"] == "path_outside_workspace"
    unclosed = client_for(sam).post(judge, {"source": draft, "bin": "make", "args": "'test"})
    assert unclosed.status_code == 400 and "args" in unclosed.json()["fields"]
    broken = client_for(sam).post(judge, {"source": "commands: [", "bin": "make"})
    assert broken.status_code == 400 and broken.json()["error"] == "invalid_policy"
    assert client_for(sam).post(judge, {"source": draft}).status_code == 400  # no program
    from policies_app.models import DecisionRecord

    assert not DecisionRecord.objects.filter(tenant=policy.tenant).exists()  # a dry run records nothing
