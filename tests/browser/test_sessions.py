"""The operator's view in real Chromium: the live list, the live terminal, the Kill button,
against real bubblewrap sandboxes run by the server's embedded runner."""

import re

import pytest

from tests.browser.test_first_run import log_in
from tests.http import call_api

pytestmark = pytest.mark.browser
XSS = (b"print('\\x1b[31mred alert\\x1b[0m <img src=x onerror=\"window.__pwned=1\"> '\n"
       b"      '<script>window.__pwned=2</script>')\n")


def call(server, method: str, path: str, body=None, token: str | None = None, raw: bytes | None = None):
    return call_api(server.url, method, path, bearer=token or server.api_key, body=body, raw=raw)


def open_session(server, **body) -> dict:
    status, session = call(server, "POST", "/api/v1/sessions", {"conversation_id": "browser", **body})
    assert status == 201, session
    return session


def test_the_live_list_shows_a_session_as_it_starts(page, demo_server):
    log_in(page, demo_server)
    page.wait_for_selector("[data-live-status]:text('live')")
    session = open_session(demo_server, conversation_id="conv-appears")
    row = page.locator(f"tr[data-session='{session['id']}']")
    row.wait_for()
    assert row.locator("[data-field='conversation_id']").inner_text() == "conv-appears"
    assert "ready" in row.inner_text()


def test_output_renders_colours_as_text_and_never_as_markup(page, demo_server):
    session = open_session(demo_server)
    path = f"/api/v1/sessions/{session['id']}"
    assert call(demo_server, "PUT", f"{path}/files/xss.py", raw=XSS, token=session["token"])[0] == 204
    log_in(page, demo_server)
    page.goto(f"{demo_server.url}/t/demo/sessions/{session['id']}/")
    page.wait_for_selector("[data-live-status]:text('live')")
    status, _ = call(demo_server, "POST", f"{path}/commands", {"bin": "python3", "args": ["xss.py"]},
                     token=session["token"])
    assert status == 202
    terminal = page.locator("[data-terminal]")
    terminal.locator("text=[exit 0").wait_for()
    text = terminal.inner_text()
    assert '<img src=x onerror="window.__pwned=1">' in text and "<script>window.__pwned=2</script>" in text
    assert terminal.locator("img, script").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert terminal.locator("span.fg-1", has_text="red alert").count() == 1


def test_the_kill_button_stops_a_running_sleep(page, demo_server):
    session = open_session(demo_server, policy="ops")
    path = f"/api/v1/sessions/{session['id']}"
    status, command = call(demo_server, "POST", f"{path}/commands", {"bin": "sleep", "args": ["600"]},
                           token=session["token"])
    assert status == 202
    log_in(page, demo_server)
    page.goto(f"{demo_server.url}/t/demo/sessions/{session['id']}/")
    page.locator("[data-terminal]").locator("text=$ sleep 600").wait_for()
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("kill").click()
    page.wait_for_url(re.compile(rf"/sessions/{session['id']}/$"))
    page.locator("[data-session-state]:text('killed')").wait_for()
    status, body = call(demo_server, "GET", f"{path}/commands/{command['id']}")
    assert (status, body["state"], body["reason"]) == (200, "killed", "killed")
    assert call(demo_server, "GET", path)[1]["state"] == "killed"
