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
    assert "bin_not_allowed" in page and "<code>bash</code> is a shell" in page  # the refusal, explained


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


def test_publishing_says_how_many_active_sessions_keep_an_older_version(agent, alice, client_for, acme):
    from policies_app import services

    first, second = agent.open(), agent.open()
    ended = agent.open()
    agent.as_session(ended).delete(f"/api/v1/sessions/{ended['id']}")
    policy = acme.policies.get(name="default")
    draft = services.version_create(policy=policy, source="commands: []\n", actor=None)
    response = client_for(alice).post(f"/t/acme/policies/default/v/{draft.number}/publish", {"note": "tighter"},
                                      follow=True)
    page = response.content.decode()
    assert f"Published v{draft.number}." in page
    assert "2 active sessions are still on an older version (v1: 2)" in page  # the ended one is not counted
    assert f"new sessions get v{draft.number}" in page
    detail = client_for(alice).get("/t/acme/policies/default/").content.decode()
    assert 'data-testid="pinned-v1">2<' in detail and f'data-testid="pinned-v{draft.number}">—<' in detail
    for session in (first, second):
        agent.as_session(session).delete(f"/api/v1/sessions/{session['id']}")
    assert 'data-testid="pinned-v1">—<' in client_for(alice).get("/t/acme/policies/default/").content.decode()


def test_a_kill_sent_with_a_stale_token_is_offered_again_and_then_kills(agent, alice):
    import re

    from django.test import Client

    session = agent.open()
    path = f"/t/acme/sessions/{session['id']}/"
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    stale = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', browser.get(path).content.decode()).group(1)
    browser.cookies["csrftoken"] = "a" * 32  # the login was renewed in another tab: a new secret
    refused = browser.post(f"{path}kill", {"csrfmiddlewaretoken": stale}, headers={"Origin": "http://testserver"})
    page = refused.content.decode()
    assert refused.status_code == 403 and 'data-testid="csrf-retry"' in page and "CSRF verification" not in page
    assert Session.objects.get(pk=session["id"]).state == "ready"  # nothing was done
    fresh = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert f'action="{path}kill"' in page
    retried = browser.post(f"{path}kill", {"csrfmiddlewaretoken": fresh}, headers={"Origin": "http://testserver"})
    assert retried.status_code == 302 and Session.objects.get(pk=session["id"]).state == "killed"


def test_a_form_from_another_site_is_explained_and_never_offered_again(agent, alice):
    from django.test import Client

    session = agent.open()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    refused = browser.post(f"/t/acme/sessions/{session['id']}/kill", {"csrfmiddlewaretoken": "x" * 32},
                           headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403 and 'data-testid="csrf-retry"' not in refused.content.decode()
    assert "did not come from one of Airlock's own pages" in refused.content.decode()
    assert Session.objects.get(pk=session["id"]).state == "ready"


def test_a_stale_login_form_is_never_written_back_into_the_page(alice):
    from django.test import Client
    from django.urls import reverse

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)  # logged in again elsewhere: this tab's login form went stale
    browser.cookies["csrftoken"] = "b" * 32
    refused = browser.post(reverse("login") + "?next=/t/acme/", {"csrfmiddlewaretoken": "c" * 32, "username": "alice",
                                                                 "password": "hunter2-secret"},
                           headers={"Origin": "http://testserver"})
    page = refused.content.decode()
    assert refused.status_code == 403 and "hunter2" not in page and 'data-testid="csrf-retry"' not in page
    assert "no-store" in refused["Cache-Control"]


def test_the_list_sorts_by_a_column_either_way_and_ignores_an_unknown_order(agent, alice, client_for):
    first, second = agent.open(conversation_id="b-conv"), agent.open(conversation_id="a-conv")
    client = client_for(alice)

    def order(query: str) -> list[str]:
        page = client.get(f"/t/acme/sessions/?{query}")
        assert page.status_code == 200
        return [str(session.pk) for session in page.context["page"]]

    assert order("sort=conversation") == [second["id"], first["id"]]
    assert order("sort=-conversation") == [first["id"], second["id"]]
    assert order("sort=age") == [second["id"], first["id"]]  # newest first
    assert order("sort=-age") == [first["id"], second["id"]]
    assert order("sort=password') OR 1=1") == order("sort=age")  # only the named columns
