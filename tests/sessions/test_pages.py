"""The operator dashboard's pages: the live list, a session's page, Kill and bulk kill."""

from controlplane.models import AuditEvent
from sessions.models import Session


def test_the_list_shows_the_tenants_sessions_and_finds_ended_ones_by_conversation(agent, alice, client_for):
    live = agent.open(conversation_id="conv-live")
    ended = agent.open(conversation_id="conv-old")
    agent.as_session(ended).delete(f"/api/v1/sessions/{ended['id']}")
    page = client_for(alice).get("/t/acme/sessions/").content.decode()
    assert live["id"] in page and ended["id"] in page
    assert 'data-ws="/ws/t/acme/sessions/"' in page
    found = client_for(alice).get("/t/acme/sessions/?conversation_id=conv-old").content.decode()
    assert ended["id"] in found and live["id"] not in found
    active = client_for(alice).get("/t/acme/sessions/?state=active").content.decode()
    assert live["id"] in active and ended["id"] not in active


def test_a_sessions_page_shows_its_commands_and_output_as_text(agent, alice, client_for):
    session = agent.open()
    agent.run(session, "printf", "<script>alert(1)</script><img src=x onerror=alert(2)>")
    agent.run(session, "bash", "-c", "id")
    page = client_for(alice).get(f"/t/acme/sessions/{session['id']}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    assert "<script>alert(1)" not in page
    assert "printf" in page and f'data-ws="/ws/sessions/{session["id"]}/"' in page
    assert "bin_not_allowed" in page and "`bash` is a shell" in page  # the refusal, explained


def test_a_sessions_stored_output_downloads_as_a_text_file(agent, bob, client_for):
    session = agent.open()
    agent.run(session, "printf", "<b>first</b>\\n")
    agent.run(session, "printf", "no newline")
    response = client_for(bob).get(f"/t/acme/sessions/{session['id']}/output.txt")  # a viewer may read it
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain") and "attachment" in response["Content-Disposition"]
    assert response.content.decode() == ("$ printf <b>first</b>\\n\n<b>first</b>\n[exit 0 · exited]\n"
                                         "$ printf no newline\nno newline\n[exit 0 · exited]\n")


def test_only_a_page_with_a_terminal_admits_style_attributes(agent, alice, client_for):
    session = agent.open()
    terminal_page = client_for(alice).get(f"/t/acme/sessions/{session['id']}/")
    list_page = client_for(alice).get("/t/acme/sessions/")
    assert "style-src-attr 'unsafe-inline'" in terminal_page.headers["Content-Security-Policy"]
    assert "style-src-attr" not in list_page.headers["Content-Security-Policy"]
    for page in (terminal_page, list_page):  # <style> elements: by this response's nonce only
        policy = page.headers["Content-Security-Policy"]
        nonce = policy.split("'nonce-")[1].split("'")[0]
        assert f'<meta name="csp-nonce" content="{nonce}">' in page.content.decode()
        assert "script-src 'self';" in policy and "unsafe-inline' " not in policy.split("style-src-attr")[0]
    assert terminal_page.headers["Content-Security-Policy"] != client_for(alice).get(
        f"/t/acme/sessions/{session['id']}/").headers["Content-Security-Policy"]  # a new nonce each time


def test_outsiders_cannot_see_a_session(agent, charlie, client_for):
    session = agent.open()
    assert client_for(charlie).get(f"/t/acme/sessions/{session['id']}/").status_code == 404
    assert client_for(charlie).post(f"/t/acme/sessions/{session['id']}/kill").status_code == 404
    assert client_for(charlie).get(f"/t/acme/sessions/{session['id']}/output.txt").status_code == 404


def test_only_operators_and_above_may_kill(agent, alice, bob, client_for, acme):
    session = agent.open()
    viewer_page = client_for(bob).get(f"/t/acme/sessions/{session['id']}/").content.decode()
    assert 'data-testid="kill"' not in viewer_page
    assert client_for(bob).post(f"/t/acme/sessions/{session['id']}/kill").status_code == 403
    assert Session.objects.get(pk=session["id"]).state == "ready"
    admin_page = client_for(alice).get(f"/t/acme/sessions/{session['id']}/").content.decode()
    assert 'data-testid="kill"' in admin_page and "data-confirm" in admin_page
    response = client_for(alice).post(f"/t/acme/sessions/{session['id']}/kill")
    assert response.status_code == 302
    assert Session.objects.get(pk=session["id"]).state == "killed"
    event = AuditEvent.objects.get(tenant=acme, action="session.killed")
    assert event.actor == "user:alice"


def test_bulk_kill_by_conversation_spares_the_others(agent, alice, client_for, acme):
    doomed = [agent.open(conversation_id="runaway") for _ in range(2)]
    spared = agent.open(conversation_id="fine")
    response = client_for(alice).post("/t/acme/sessions/kill", {"conversation_id": "runaway"})
    assert response.status_code == 302
    assert {Session.objects.get(pk=s["id"]).state for s in doomed} == {"killed"}
    assert Session.objects.get(pk=spared["id"]).state == "ready"
    assert AuditEvent.objects.filter(tenant=acme, action="session.killed").count() == 2
    client_for(alice).post("/t/acme/sessions/kill", {"scope": "tenant"})
    assert Session.objects.get(pk=spared["id"]).state == "killed"
