import pytest

from controlplane.models import ApiKeyScope, AuditEvent

V1 = """commands:
  - {id: pytest, bin: pytest, deny_args: ["^-c"]}
tests:
  - request: {bin: pytest, args: ["-c", "x"]}
    expect: {allowed: false, reason_code: arg_denied}
"""


@pytest.fixture
def writer(acme, make_key, api):
    return api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ, ApiKeyScope.POLICIES_WRITE]).key)


@pytest.fixture
def reader(acme, make_key, api):
    return api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ], name="reader").key)


def post(client, path, body):
    return client.post(path, body, content_type="application/json")


def test_a_policy_is_created_versioned_published_and_rolled_back_through_the_api(writer):
    assert post(writer, "/api/v1/policies", {"name": "default"}).status_code == 201
    v1 = post(writer, "/api/v1/policies/default/versions", {"source": V1, "note": "first"})
    assert v1.status_code == 201 and v1.json()["number"] == 1 and v1.json()["state"] == "draft"
    assert post(writer, "/api/v1/policies/default/versions/1/publish", {"note": "go"}).json()["state"] == "published"
    v2 = post(writer, "/api/v1/policies/default/versions", {"source": V1.replace("^-c", "^-p")})
    assert v2.status_code == 201
    failing = post(writer, "/api/v1/policies/default/versions/2/publish", {"note": "go"})
    assert failing.status_code == 400 and "tests" in failing.json()["fields"]
    back = post(writer, "/api/v1/policies/default/rollback", {"to": 1, "note": "undo"})
    assert back.status_code == 201 and back.json()["number"] == 3 and back.json()["state"] == "published"
    detail = writer.get("/api/v1/policies/default").json()
    assert detail["published"] == 3 and [v["number"] for v in detail["versions"]] == [3, 2, 1]
    assert AuditEvent.objects.filter(action="policy.rollback", actor__startswith="apikey:alk_").exists()


def test_an_invalid_document_gets_400_with_paths_and_lines(writer):
    post(writer, "/api/v1/policies", {"name": "default"})
    response = post(writer, "/api/v1/policies/default/versions", {"source": "commands:\n  - {id: x, bin: /bin/sh}\n"})
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_policy"
    assert body["errors"][0]["path"] == "commands.0.bin" and body["errors"][0]["line"] == 2


def test_lint_warnings_come_with_the_version(writer):
    post(writer, "/api/v1/policies", {"name": "default"})
    body = post(writer, "/api/v1/policies/default/versions", {"source": "commands: [{id: sh, bin: bash}]"}).json()
    assert body["lint"][0]["rule_id"] == "sh"


def test_evaluate_is_a_dry_run_with_the_full_decision(writer):
    post(writer, "/api/v1/policies", {"name": "default"})
    post(writer, "/api/v1/policies/default/versions", {"source": V1})
    post(writer, "/api/v1/policies/default/versions/1/publish", {"note": "go"})
    decision = post(writer, "/api/v1/policies/default/evaluate", {"request": {"bin": "make"}}).json()
    assert decision["reason_code"] == "bin_not_allowed" and decision["id"] is None
    assert decision["policy_version"]["number"] == 1
    assert set(decision) == {"id", "allowed", "effect", "reason_code", "rule_id", "message", "hint",
                             "policy_version", "mode"}
    from policies_app.models import DecisionRecord

    assert not DecisionRecord.objects.exists()


def test_a_read_only_key_cannot_write(writer, reader):
    post(writer, "/api/v1/policies", {"name": "default"})
    assert reader.get("/api/v1/policies").status_code == 200
    response = post(reader, "/api/v1/policies/default/versions", {"source": V1})
    assert response.status_code == 403 and "policies:write" in response.json()["detail"]
    assert post(reader, "/api/v1/policies", {"name": "other"}).status_code == 403


def test_another_tenants_key_sees_none_of_it(writer, globex, make_key, api):
    post(writer, "/api/v1/policies", {"name": "default"})
    outsider = api(make_key(globex, scopes=[ApiKeyScope.POLICIES_READ, ApiKeyScope.POLICIES_WRITE]).key)
    assert outsider.get("/api/v1/policies").json() == []
    assert outsider.get("/api/v1/policies/default").status_code == 404
    assert post(outsider, "/api/v1/policies/default/versions", {"source": V1}).status_code == 404


def test_malformed_bodies_get_400_with_field_errors(writer):
    post(writer, "/api/v1/policies", {"name": "default"})
    response = post(writer, "/api/v1/policies", {"name": "not a slug!"})
    assert response.status_code == 400 and "name" in response.json()["fields"]
    assert post(writer, "/api/v1/policies/default/rollback", {"to": "x"}).status_code == 400
    assert writer.post("/api/v1/policies", "{", content_type="application/json").status_code == 400


def test_the_policy_json_schema_is_served(reader):
    assert "commands" in reader.get("/api/v1/policy-schema").json()["properties"]


def test_evaluate_judges_an_egress_request_too(writer):
    post(writer, "/api/v1/policies", {"name": "default"})
    post(writer, "/api/v1/policies/default/versions", {"source": V1})
    post(writer, "/api/v1/policies/default/versions/1/publish", {"note": "go"})
    decision = post(writer, "/api/v1/policies/default/evaluate",
                    {"kind": "egress", "request": {"host": "pypi.org", "port": 443}}).json()
    assert decision["reason_code"] == "egress_denied" and decision["allowed"] is False


@pytest.mark.parametrize(("kind", "request_body", "field"), [
    ("exec", {"bin": "make", "timeout_s": "5"}, "timeout_s"),
    ("exec", {"bin": "make", "timeout_s": True}, "timeout_s"),
    ("exec", {"bin": 5}, "bin"),
    ("exec", {"bin": "make", "args": "-j4"}, "args"),
    ("egress", {"host": "pypi.org", "port": "443"}, "port"),
    ("egress", {"host": ["pypi.org"], "port": 443}, "host"),
])
def test_evaluate_types_its_request_as_a_command_or_a_connection(writer, kind, request_body, field):
    post(writer, "/api/v1/policies", {"name": "default"})
    post(writer, "/api/v1/policies/default/versions", {"source": V1})
    post(writer, "/api/v1/policies/default/versions/1/publish", {"note": "go"})
    response = post(writer, "/api/v1/policies/default/evaluate", {"kind": kind, "request": request_body})
    assert response.status_code == 400 and field in response.json()["fields"]["request"], response.json()


def test_review_takes_only_true_or_false_for_replay(writer):
    post(writer, "/api/v1/policies", {"name": "default"})
    for replay in ("yes", 1, "true"):
        response = post(writer, "/api/v1/policies/default/review", {"source": V1, "replay": replay})
        assert response.status_code == 400 and "replay" in response.json()["fields"], replay


def test_review_checks_a_document_without_saving_it(writer, reader):
    post(writer, "/api/v1/policies", {"name": "default"})
    post(writer, "/api/v1/policies/default/versions", {"source": V1})
    post(writer, "/api/v1/policies/default/versions/1/publish", {"note": "go"})
    candidate = V1.replace("^-c", "^-p")
    body = post(reader, "/api/v1/policies/default/review", {"source": candidate}).json()
    assert body["published"] == 1 and body["tests_failed"] == 1
    assert body["tests"][0]["got"]["allowed"] is True and body["tests"][0]["expected"]["allowed"] is False
    assert {"kind": "del", "text": '-  - {id: pytest, bin: pytest, deny_args: ["^-c"]}'} in body["diff"]
    invalid = post(reader, "/api/v1/policies/default/review", {"source": "commands:\n  - {id: x, bin: /bin/sh}\n"})
    assert invalid.status_code == 400 and invalid.json()["errors"][0]["line"] == 2
    assert reader.get("/api/v1/policies/default").json()["versions"][0]["number"] == 1  # nothing was saved
    new = post(reader, "/api/v1/policies/nothing/review", {"source": V1})  # not created yet: reviewed all the same
    assert new.status_code == 200 and new.json()["published"] is None and not new.json()["tests_failed"]


def test_the_denials_api_takes_a_range_and_a_breakdowns_filter(acme, make_key, api):
    from datetime import timedelta

    from django.utils import timezone

    from policies_app import services
    from policies_app.decisions import decide

    policy = services.policy_create(tenant=acme, name="default", actor=None)
    services.version_publish(version=services.version_create(policy=policy, source="commands: []\n", actor=None),
                             actor=None, note="first")
    for conversation in ("a", "a", "b"):
        decide(tenant=acme, policy=policy, request={"bin": "make", "args": []}, conversation_id=conversation)
    client = api(make_key(acme, scopes=["policies:read"]).key)
    assert client.get("/api/v1/denials?conversation=a").json()["total"] == 2
    start = (timezone.now() - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    assert client.get(f"/api/v1/denials?start={start}").json()["total"] == 3
    refused = client.get("/api/v1/denials?end=9999-12-31T23:59")
    assert refused.status_code == 400 and "end" in refused.json()["fields"]
