"""Exceptions: exactly one command, until it expires, counted on every use, never honoured after
it expires or is revoked, never waiving a hard refusal, never crossing tenants."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from controlplane.models import ApiKeyScope, AuditEvent
from policies_app import services
from policies_app.decisions import compiled_version, decide, replay
from policies_app.exceptions import exception_grant, exception_revoke
from policies_app.models import DecisionRecord, PolicyException

SOURCE = "commands:\n  - {id: pytest, bin: pytest, deny_args: ['^-c']}\n"


@pytest.fixture
def policy(acme):
    policy = services.policy_create(tenant=acme, name="default", actor=None)
    services.version_publish(version=services.version_create(policy=policy, source=SOURCE, actor=None), actor=None,
                             note="test")
    return policy


def grant(policy, bin_name="make", args=("test",), *, hours=1, **kwargs):
    return exception_grant(policy=policy, bin_name=bin_name, args=list(args), expires_at=timezone.now()
                           + timedelta(hours=hours), reason="release freeze hotfix", ticket="SEC-12", actor=None,
                           **kwargs)


def judge(tenant, policy, request, **kwargs):
    return decide(tenant=tenant, policy=policy, request=request, **kwargs)


def test_an_exception_allows_exactly_its_command_and_counts_each_use(acme, policy):
    exception = grant(policy)
    evaluation = judge(acme, policy, {"bin": "make", "args": ["test"]})
    decision = evaluation.decision
    assert decision.allowed and decision.effect == "allow" and decision.argv == ("make", "test")
    assert decision.rule_id == f"exception:{exception.id}" and "SEC-12" in decision.message
    assert evaluation.record.rule_id == decision.rule_id
    judge(acme, policy, {"bin": "make", "args": ["test"]})
    judge(acme, policy, {"bin": "make", "args": ["test"]}, record=False)  # a dry run is not a use
    exception.refresh_from_db()
    assert exception.use_count == 2 and exception.last_used_at is not None
    for broader in ({"bin": "make", "args": []}, {"bin": "make", "args": ["test", "install"]},
                    {"bin": "make", "args": ["all"]}, {"bin": "make", "args": ["test"], "cwd": "/workspace/sub"},
                    {"bin": "gmake", "args": ["test"]}):
        assert not judge(acme, policy, broader).decision.allowed, broader
    exception.refresh_from_db()
    assert exception.use_count == 2


def test_an_expired_exception_is_refused_and_the_denial_says_so(acme, policy):
    exception = grant(policy)
    after = exception.expires_at + timedelta(seconds=1)
    decision = judge(acme, policy, {"bin": "make", "args": ["test"]}, at=after).decision
    assert not decision.allowed and decision.reason_code == "bin_not_allowed"
    assert f"exception {exception.short_id}" in decision.hint and "expired at" in decision.hint
    PolicyException.objects.filter(pk=exception.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    assert not judge(acme, policy, {"bin": "make", "args": ["test"]}).decision.allowed
    exception.refresh_from_db()
    assert exception.use_count == 0 and exception.state() == "expired"


def test_a_revoked_exception_is_never_honoured_again(acme, policy):
    exception = grant(policy)
    assert judge(acme, policy, {"bin": "make", "args": ["test"]}).decision.allowed
    exception_revoke(grant=exception, actor=None)
    decision = judge(acme, policy, {"bin": "make", "args": ["test"]}).decision
    assert not decision.allowed and "was revoked" in decision.hint
    assert AuditEvent.objects.filter(tenant=acme, action="policy.exception_revoked").count() == 1


def test_an_exception_waives_an_argument_rule_but_never_a_hard_refusal(acme, policy):
    grant(policy, "pytest", ["-c", "setup.cfg"])
    assert judge(acme, policy, {"bin": "pytest", "args": ["-c", "setup.cfg"]}).decision.allowed
    over_limit = judge(acme, policy, {"bin": "pytest", "args": ["-c", "setup.cfg"], "timeout_s": 9999}).decision
    assert not over_limit.allowed and over_limit.reason_code == "limit_exceeded"
    outside = judge(acme, policy, {"bin": "pytest", "args": ["-c", "setup.cfg"], "cwd": "/tmp"}).decision
    assert not outside.allowed and outside.reason_code == "path_outside_workspace"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"bin_name": "/usr/bin/make"}, "bin"),
    ({"args": ["../../etc/shadow"]}, "args"),
    ({"args": ["--token", "[redacted]"]}, "args"),
    ({"cwd": "/etc"}, "cwd"),
    ({"hours": -1}, "expires_at"),
    ({"hours": 24 * 91}, "expires_at"),
])
def test_a_grant_that_is_not_narrow_or_not_temporary_is_refused_with_its_field(policy, kwargs, field):
    with pytest.raises(ValidationError) as refused:
        grant(policy, **kwargs)
    assert field in refused.value.message_dict
    assert not PolicyException.objects.exists()


def test_exceptions_never_cross_tenants(acme, globex, policy, make_key, api):
    exception = grant(policy)
    other = services.policy_create(tenant=globex, name="default", actor=None)
    services.version_publish(version=services.version_create(policy=other, source=SOURCE, actor=None), actor=None,
                             note="test")
    assert not judge(globex, other, {"bin": "make", "args": ["test"]}).decision.allowed
    client = api(make_key(globex, scopes=[ApiKeyScope.POLICIES_READ, ApiKeyScope.POLICIES_WRITE]).key)
    assert client.get(f"/api/v1/exceptions/{exception.pk}").status_code == 404
    assert client.post(f"/api/v1/exceptions/{exception.pk}/revoke").status_code == 404
    assert client.get("/api/v1/exceptions").json() == []
    denial = judge(acme, policy, {"bin": "git", "args": ["push"]}).record
    response = client.post("/api/v1/exceptions", {"decision": str(denial.pk), "ttl_s": 3600, "reason": "mine now"},
                           content_type="application/json")
    assert response.status_code == 404
    exception.refresh_from_db()
    assert exception.state() == "active"


def test_replay_leaves_out_what_an_exception_allowed(acme, policy):
    grant(policy)
    judge(acme, policy, {"bin": "make", "args": ["test"]})
    result = replay(policy=policy, compiled=compiled_version(policy.published_version()))
    assert result.breakages == 0 and result.replayed == 0


def test_the_api_grants_from_a_denial_lists_and_revokes(acme, policy, make_key, api):
    denial = judge(acme, policy, {"bin": "make", "args": ["lint"], "cwd": "/workspace/app"}).record
    writer = api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ, ApiKeyScope.POLICIES_WRITE]).key)
    created = writer.post("/api/v1/exceptions", {"decision": str(denial.pk), "ttl_s": 3600, "reason": "CI migration",
                                                 "ticket": "OPS-7"}, content_type="application/json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["bin"], body["args"], body["cwd"], body["state"]) == ("make", ["lint"], "/workspace/app", "active")
    assert body["created_by"].startswith("apikey:") and body["from_decision"] == str(denial.pk)
    assert judge(acme, policy, {"bin": "make", "args": ["lint"], "cwd": "/workspace/app"}).decision.allowed
    listed = writer.get("/api/v1/exceptions").json()
    assert [item["use_count"] for item in listed] == [1]
    revoked = writer.post(f"/api/v1/exceptions/{body['id']}/revoke").json()
    assert revoked["state"] == "revoked" and revoked["revoked_by"].startswith("apikey:")
    reader = api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ]).key)
    assert reader.post("/api/v1/exceptions", {"policy": "default", "bin": "make", "ttl_s": 3600, "reason": "x y z"},
                       content_type="application/json").status_code == 403


@pytest.mark.parametrize(("body", "field"), [
    ({"policy": "default", "bin": "make", "reason": "needed"}, "expires_at"),
    ({"policy": "default", "bin": "make", "reason": "needed", "ttl_s": 60, "expires_at": "2030-01-01T00:00:00Z"},
     "expires_at"),
    ({"policy": "default", "reason": "needed", "ttl_s": 3600}, "bin"),
    ({"policy": "default", "bin": "make", "reason": "needed", "ttl_s": 10}, "ttl_s"),
    ({"policy": "default", "bin": "make", "reason": "needed", "expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
    ({"policy": "default", "bin": "make", "args": ["/etc/passwd"], "reason": "needed", "ttl_s": 3600}, "args"),
    ({"policy": "default", "bin": "make", "args": "test", "reason": "needed", "ttl_s": 3600}, "args"),
    ({"policy": "default", "bin": "make", "reason": " ", "ttl_s": 3600}, "reason"),
])
def test_bad_exception_requests_get_400_with_their_field(acme, policy, make_key, api, body, field):
    writer = api(make_key(acme, scopes=[ApiKeyScope.POLICIES_WRITE]).key)
    response = writer.post("/api/v1/exceptions", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert not PolicyException.objects.exists()


def test_a_security_admin_grants_one_from_a_denial_and_a_viewer_cannot(acme, policy, alice, bob, client_for):
    denial = judge(acme, policy, {"bin": "make", "args": ["test"]}).record
    form = {"lifetime": "8h", "reason": "hotfix during the freeze", "ticket": "SEC-9"}
    assert client_for(bob).post(f"/t/acme/denials/{denial.pk}/except", form).status_code == 403
    page = client_for(alice).get(f"/t/acme/denials/{denial.pk}/").content.decode()
    assert 'data-testid="grant-exception"' in page
    missing = client_for(alice).post(f"/t/acme/denials/{denial.pk}/except", {"lifetime": "8h", "reason": ""})
    assert missing.status_code == 400 and not PolicyException.objects.exists()
    response = client_for(alice).post(f"/t/acme/denials/{denial.pk}/except", form, follow=True)
    exception = PolicyException.objects.get()
    assert exception.created_by == "user:alice" and exception.from_decision == denial.pk
    assert timedelta(hours=7, minutes=59) < exception.expires_at - timezone.now() <= timedelta(hours=8)
    judge(acme, policy, {"bin": "make", "args": ["test"]})
    listing = client_for(bob).get("/t/acme/exceptions/").content.decode()
    assert "make test" in response.content.decode() and "SEC-9" in listing and ">1</td>" in listing
    assert client_for(bob).post(f"/t/acme/exceptions/{exception.pk}/revoke").status_code == 403
    client_for(alice).post(f"/t/acme/exceptions/{exception.pk}/revoke")
    exception.refresh_from_db()
    assert exception.state() == "revoked"
    assert DecisionRecord.objects.filter(tenant=acme, rule_id=f"exception:{exception.pk}").count() == 1


def test_revoked_grants_never_hide_a_live_one(acme, policy):
    for _ in range(25):  # later expiries, all revoked
        exception_revoke(grant=grant(policy, hours=24 * 80), actor=None)
    live = grant(policy, hours=1)
    decision = judge(acme, policy, {"bin": "make", "args": ["test"]}).decision
    assert decision.allowed and decision.rule_id == f"exception:{live.id}"


def test_a_grant_runs_the_command_as_the_rule_that_denied_it_would_have(acme):
    framed = services.policy_create(tenant=acme, name="framed", actor=None)
    source = "commands:\n  - {id: npm-test, bin: npm, prepend_args: [test, --], deny_args: ['^--watch']}\n"
    services.version_publish(version=services.version_create(policy=framed, source=source, actor=None), actor=None,
                             note="test")
    grant(framed, "npm", ["--watch"])
    decision = judge(acme, framed, {"bin": "npm", "args": ["--watch"]}).decision
    assert decision.allowed and decision.argv == ("npm", "test", "--", "--watch")  # never `npm --watch`


def test_the_shadow_candidate_sees_the_same_exceptions(acme, policy):
    candidate = services.version_create(policy=policy, source=SOURCE + "  - {id: git, bin: git}\n", actor=None)
    services.policy_set_shadow(policy=policy, version=candidate, actor=None)
    grant(policy)
    record = judge(acme, policy, {"bin": "make", "args": ["test"]}).record
    assert record.allowed and record.shadow_allowed is True and not record.shadow_differs


def test_an_egress_exception_allows_exactly_its_host_and_port_and_never_the_deny_set(acme, policy, make_key, api):
    def connect(host, port=80, **kwargs):
        return judge(acme, policy, {"host": host, "port": port}, kind="egress", **kwargs)

    denial = connect("files.example").record
    assert denial.reason_code == "egress_denied"
    writer = api(make_key(acme, scopes=[ApiKeyScope.POLICIES_READ, ApiKeyScope.POLICIES_WRITE]).key)
    created = writer.post("/api/v1/exceptions", {"decision": str(denial.pk), "ttl_s": 3600, "reason": "mirror outage",
                                                 "ticket": "OPS-9"}, content_type="application/json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["kind"], body["host"], body["port"], body["bin"]) == ("egress", "files.example", 80, "")
    allowed = connect("files.example").decision
    assert allowed.allowed and allowed.rule_id == f"exception:{body['id']}" and "OPS-9" in allowed.message
    for other in (("files.example", 443), ("www.files.example", 80), ("files.example.evil", 80)):
        assert not connect(*other).decision.allowed, other
    assert PolicyException.objects.get(pk=body["id"]).use_count == 1
    writer.post(f"/api/v1/exceptions/{body['id']}/revoke")
    refused = connect("files.example").decision
    assert not refused.allowed and "was revoked" in refused.hint
    for bad in ({"host": "127.0.0.1", "port": 8000}, {"host": "*.example", "port": 80},
                {"host": "files.example", "port": 0}, {"host": "files.example"}):
        response = writer.post("/api/v1/exceptions", {"policy": "default", "ttl_s": 3600, "reason": "needed", **bad},
                               content_type="application/json")
        assert response.status_code == 400, (bad, response.content)
        assert set(response.json()["fields"]) & {"host", "port"}, (bad, response.content)
    literal = connect("169.254.169.254").record  # a guard's refusal: no exception can waive it
    response = writer.post("/api/v1/exceptions", {"decision": str(literal.pk), "ttl_s": 3600, "reason": "needed"},
                           content_type="application/json")
    assert response.status_code == 400 and "egress_address_denied" in response.json()["fields"]["decision"][0]
