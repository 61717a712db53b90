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
    text = terminal.inner_text().replace("\xa0", " ")
    assert '<img src=x onerror="window.__pwned=1">' in text and "<script>window.__pwned=2</script>" in text
    assert terminal.locator("img, script").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert terminal.locator("span.xterm-fg-1", has_text="red alert").count() == 1


# Colours of every kind, a progress bar drawn with \r, and 100,000 lines between them.
FLOOD = (b"import sys\n"
         b"colours = '\\x1b[38;5;31mblue256\\x1b[0m \\x1b[38;2;255;128;0mtruecolor\\x1b[0m \\x1b[30;47mblack\\x1b[0m'\n"
         b"print(colours)\n"
         b"for i in range(1, 100001): print(i)\n"
         b"for p in range(0, 101, 5): sys.stdout.write(f'\\rprogress {p}%'); sys.stdout.flush()\n"
         b"print()\n"
         b"print(colours)\n")


def test_a_hundred_thousand_lines_render_with_every_colour_and_the_tab_stays_responsive(page, demo_server):
    session = open_session(demo_server)
    path = f"/api/v1/sessions/{session['id']}"
    assert call(demo_server, "PUT", f"{path}/files/flood.py", raw=FLOOD, token=session["token"])[0] == 204
    log_in(page, demo_server)
    page.goto(f"{demo_server.url}/t/demo/sessions/{session['id']}/")
    page.wait_for_selector("[data-live-status]:text('live')")
    status, _ = call(demo_server, "POST", f"{path}/commands", {"bin": "python3", "args": ["flood.py"]},
                     token=session["token"])
    assert status == 202
    page.wait_for_function("() => Airlock.terminalLines().some((line) => line.startsWith('[exit'))", timeout=60_000)
    lines = page.evaluate("Airlock.terminalLines()")
    assert lines[-1].startswith("[exit 0 · exited") and lines[-2] == "blue256 truecolor black"  # no blank between
    assert "100000" in lines and [line for line in lines if "progress" in line] == ["progress 100%"]
    assert page.evaluate("1 + 1") == 2  # the tab answers
    assert page.locator("[data-terminal-cut]").is_visible()  # says that older lines left the view
    terminal = page.locator("[data-terminal]")
    assert terminal.locator("span.xterm-fg-31", has_text="blue256").count() == 1
    assert terminal.locator("span.xterm-fg-0.xterm-bg-7", has_text="black").count() == 1
    truecolor = terminal.locator("span", has_text="truecolor")
    assert truecolor.evaluate("(span) => getComputedStyle(span).color") == "rgb(255, 128, 0)"
    page.get_by_label("Search the output").fill("99999")
    page.get_by_label("Search the output").press("Enter")
    assert page.evaluate("Airlock.terminalSelection()") == "99999"
    page.reload()  # the stored tail, as the Commands table draws it: the progress bar is one line there too
    page.locator("details[data-stored-output] summary").last.click()
    stored = page.locator("[data-stored-terminal] .xterm-rows").last
    stored.locator("text=progress 100%").wait_for()
    assert stored.inner_text().count("progress") == 1 and "(only the last part is kept)" in page.locator(
        "details[data-stored-output] summary").last.inner_text()


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


def test_the_session_page_shows_a_running_command_and_its_seconds_and_its_tables_follow(page, demo_server):
    session = open_session(demo_server, policy="ops")
    path = f"/api/v1/sessions/{session['id']}"
    log_in(page, demo_server)
    page.goto(f"{demo_server.url}/t/demo/sessions/{session['id']}/")
    page.wait_for_selector("[data-live-status]:text('live')")
    assert page.locator("[data-commands]").inner_text().count("No command has run yet.") == 1
    status, command = call(demo_server, "POST", f"{path}/commands", {"bin": "sleep", "args": ["3"]},
                           token=session["token"])
    assert status == 202
    row = page.locator(f"[data-commands] tr[data-command='{command['id']}']")
    row.locator("[data-field=state]:text('running')").wait_for()
    page.locator("[data-session-state]", has_text=re.compile(r"^running · [1-9] s$")).wait_for()
    assert re.fullmatch(r"\d+ s…", row.locator("[data-field=duration_ms]").inner_text())
    assert page.locator("[data-commands]").inner_text().count("No command has run yet.") == 0
    row.locator("[data-field=state]:text('exited')").wait_for(timeout=15_000)
    assert row.locator("[data-field=exit_code]").inner_text() == "0"
    assert int(row.locator("[data-field=duration_ms]").inner_text()) >= 3000
    assert page.locator("[data-session-state]").inner_text() == "ready"
    status, _ = call(demo_server, "POST", f"{path}/commands", {"bin": "sleep", "args": ["forever"]},
                     token=session["token"])
    assert status == 403
    page.locator("[data-decisions] tr", has_text="sleep forever").locator("text=arg_denied").wait_for()


def test_the_list_shows_a_running_command_with_its_seconds_and_sorts_by_a_column(page, demo_server):
    session = open_session(demo_server, policy="ops", conversation_id="zz-runaway")
    log_in(page, demo_server)
    page.wait_for_selector("[data-live-status]:text('live')")
    status, _ = call(demo_server, "POST", f"/api/v1/sessions/{session['id']}/commands",
                     {"bin": "sleep", "args": ["30"]}, token=session["token"])
    assert status == 202
    badge = page.locator(f"tr[data-session='{session['id']}'] [data-field=state]")
    badge.filter(has_text=re.compile(r"^running · [1-9]\d* s$")).wait_for()
    page.reload()  # as the server renders it, counted from the command's start
    badge.filter(has_text=re.compile(r"^running · \d+ s$")).wait_for()
    page.get_by_role("link", name="Conversation").click()
    page.wait_for_url(re.compile(r"sort=conversation"))
    conversations = page.locator("[data-field=conversation_id]").all_inner_texts()
    assert conversations == sorted(conversations)
    page.get_by_role("link", name=re.compile("^Conversation")).click()
    page.wait_for_url(re.compile(r"sort=-conversation"))
    assert page.locator("[data-field=conversation_id]").first.inner_text() == "zz-runaway"
    call(demo_server, "POST", f"/api/v1/sessions/{session['id']}/kill", token=session["token"])
