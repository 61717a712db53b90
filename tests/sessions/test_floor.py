"""A session runs with its tenant's version checked against the platform floor in force."""

from policies_app import services
from policies_app.models import DecisionRecord
from sessions.models import Session


def test_a_version_the_floor_has_narrowed_below_opens_no_session_and_the_refusal_is_recorded(agent, acme):
    session = agent.open()  # before any floor: fine
    floor = "limits: {memory_mb: 64}\ncommands: [{id: pytest, bin: pytest}]\n"
    services.floor_set(source=floor, actor=None, note="small hosts", accept_breaking=True)
    response = agent.client.post("/api/v1/sessions", {"conversation_id": "after-floor"},
                                 content_type="application/json")
    body = response.json()
    assert response.status_code == 403 and body["error"] == "policy_outside_floor"
    assert body["decision"]["rule_id"] == "platform.floor" and "widens the platform floor v1" in body["detail"]
    assert "limits.memory_mb" in body["detail"] and "publish a version within the platform floor" in (
        body["decision"]["hint"])
    assert not Session.objects.filter(conversation_id="after-floor").exists()
    assert DecisionRecord.objects.filter(tenant=acme, kind="session", rule_id="platform.floor").count() == 1
    assert Session.objects.get(pk=session["id"]).state == "ready"  # a running session is left to end
