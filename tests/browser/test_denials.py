"""The Denials page in real Chromium: the chart draws, the reason filter narrows, a denial opens
with its explanation."""

import re

import pytest

from tests.browser.test_first_run import log_in

pytestmark = pytest.mark.browser


def api_of(demo_server):
    """Call the demo server's API with its key, or with a session's token."""
    from tests.http import call_api

    def api(method, path, body=None, token=None):
        return call_api(demo_server.url, method, path, bearer=token or demo_server.api_key, body=body)

    return api


def open_a_denial(page, demo_server, request: dict, **session_body):
    """An agent's session whose `request` is denied; the admin, logged in, on that denial's page.
    Returns the API caller, the session and its commands URL."""
    api = api_of(demo_server)
    status, session = api("POST", "/api/v1/sessions", session_body)
    assert status == 201
    commands = f"/api/v1/sessions/{session['id']}/commands"
    status, denied = api("POST", commands, request, token=session["token"])
    assert status == 403
    log_in(page, demo_server)
    page.goto(f"{demo_server.url}/t/demo/denials/{denied['decision']['id']}/")
    return api, session, commands


def publish_shown_version(page, note: str) -> None:
    """Publish the version the page shows, with `note`, and see it published."""
    page.locator("form[action$='/publish'] input[name=note]").fill(note)
    page.locator("form[action$='/publish'] button[type=submit]").click()
    page.wait_for_load_state()
    assert page.get_by_test_id("version-state").inner_text() == "published"


def canvas_drawn(page, canvas_id: str) -> bool:
    page.wait_for_function(f"() => window.Chart && Chart.getChart('{canvas_id}') !== undefined")
    return page.evaluate(f"""() => {{
        const canvas = document.getElementById('{canvas_id}');
        const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        return pixels.some((value, index) => index % 4 === 3 && value > 0);
    }}""")


def test_a_security_admin_reads_the_denials_filters_and_opens_one(page, demo_server):
    log_in(page, demo_server)
    page.get_by_role("link", name="Denials", exact=True).click()
    page.wait_for_url(re.compile(r"/t/demo/denials/$"))
    assert int(page.get_by_test_id("denial-total").inner_text()) >= 3  # the seeded `make test` requests
    assert canvas_drawn(page, "denials-chart"), "the chart canvas is empty"
    assert page.locator("section[data-dimension='subject']").inner_text().count("make") >= 1

    page.locator("select[name=reason]").select_option("arg_denied")
    page.get_by_role("button", name="Filter").click()
    assert page.get_by_test_id("denial-total").inner_text() == "0"
    page.locator("select[name=reason]").select_option("bin_not_allowed")
    page.get_by_role("button", name="Filter").click()
    assert int(page.get_by_test_id("denial-total").inner_text()) >= 3

    page.locator("section[data-dimension='subject']").get_by_role("link", name="make", exact=True).click()
    page.wait_for_url(re.compile(r"subject=make"))  # a breakdown's row filters the page to it
    assert page.get_by_test_id("drill-filters").inner_text().startswith("Only")
    assert set(page.get_by_test_id("latest-denials").locator("td code").all_inner_texts()) >= {"make test"}
    page.get_by_test_id("latest-denials").locator("a").first.click()
    page.wait_for_url(re.compile(r"/t/demo/denials/[0-9a-f-]+/$"))
    body = page.locator("main").inner_text()
    assert "make is not an allowed command" in body and "a security admin can add make" in body
    assert page.locator("main code", has_text="make").count() >= 2  # quoted parts shown as code


def test_allow_this_drafts_the_narrow_rule_shows_its_replay_and_publishes(page, demo_server):
    api, _, _ = open_a_denial(page, demo_server, {"bin": "make", "args": ["test"]}, conversation_id="allow-this",
                              policy="ops")
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("allow-this").click()
    replay = page.get_by_test_id("policy-replay")
    replay.wait_for()
    assert "widened" in replay.inner_text() and "make test" in replay.inner_text()
    assert page.get_by_test_id("version-state").inner_text() == "draft"
    assert "exact_args" in page.get_by_test_id("version-source").inner_text()
    publish_shown_version(page, "agents may run make test")
    status, fresh = api("POST", "/api/v1/sessions", {"conversation_id": "allow-this", "policy": "ops"})
    assert status == 201
    assert api("POST", f"/api/v1/sessions/{fresh['id']}/commands", {"bin": "make", "args": ["test"]},
               token=fresh["token"])[0] == 202
    assert api("POST", f"/api/v1/sessions/{fresh['id']}/commands", {"bin": "make", "args": ["all"]},
               token=fresh["token"])[0] == 403


def test_an_exception_from_a_denial_is_used_counted_and_revoked_and_metrics_chart_it(page, demo_server):
    api, session, commands = open_a_denial(page, demo_server, {"bin": "echo", "args": ["hotfix"]},
                                           conversation_id="exception")
    form = page.get_by_role("form", name="Grant an exception")
    form.locator("select[name=lifetime]").select_option("1h")
    form.locator("input[name=reason]").fill("hotfix during the freeze")
    form.locator("input[name=ticket]").fill("SEC-42")
    page.get_by_test_id("grant-exception").click()
    page.wait_for_url(re.compile(r"/t/demo/exceptions/$"))
    row = page.get_by_test_id("exceptions").locator("tbody tr").first
    assert "echo hotfix" in row.inner_text() and "SEC-42" in row.inner_text() and "active" in row.inner_text()

    status, ran = api("POST", commands, {"bin": "echo", "args": ["hotfix"], "wait": True}, token=session["token"])
    assert status == 200 and ran["output"] == "hotfix\n"
    page.reload()
    assert row.locator("td.num").inner_text() == "1"
    page.on("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    page.wait_for_load_state()
    assert "revoked" in page.get_by_test_id("exceptions").locator("tbody tr").first.inner_text()
    assert api("POST", commands, {"bin": "echo", "args": ["hotfix"]}, token=session["token"])[0] == 403

    page.get_by_role("link", name="Metrics", exact=True).click()
    page.wait_for_url(re.compile(r"/t/demo/metrics/$"))
    assert int(page.get_by_test_id("metric-sessions").inner_text()) >= 1
    assert canvas_drawn(page, "starts-chart"), "the sessions chart is empty"
    assert canvas_drawn(page, "reasons-chart"), "the denials-by-reason chart is empty"


FETCH = "import urllib.request as u; print(u.urlopen('http://files.test/simple/airlock-probe/').status)"


def test_an_egress_denial_is_listed_with_its_host_and_allow_this_lets_a_new_session_reach_it(page, demo_server):
    api = api_of(demo_server)
    status, session = api("POST", "/api/v1/sessions", {"conversation_id": "egress", "policy": "net"})
    assert status == 201
    log_in(page, demo_server)
    page.goto(f"{demo_server.url}/t/demo/sessions/{session['id']}/")  # the operator watches it live
    page.wait_for_selector("[data-live-status]:text('live')")
    status, ran = api("POST", f"/api/v1/sessions/{session['id']}/commands",
                      {"bin": "python3", "args": ["-c", FETCH], "wait": True}, token=session["token"])
    # What the agent's program sees: the proxy's 403, saying it is the policy and why.
    assert status == 200 and ran["exit_code"] == 1, ran
    assert "HTTP Error 403: Airlock egress_denied: files.test:80 is not on the egress allowlist" in ran["output"]
    # What the operator saw meanwhile: the refusal in the terminal and in the Decisions table.
    page.wait_for_function("() => Airlock.terminalLines().some((line) => line.startsWith('✗ egress files.test:80'))")
    row = page.locator("[data-decisions] tr", has_text="files.test:80")
    assert "egress" in row.inner_text() and "egress_denied" in row.inner_text()
    page.reload()  # and the page as the server renders it
    assert "files.test:80" in page.locator("[data-decisions]").inner_text()

    page.get_by_role("link", name="Denials", exact=True).click()
    page.wait_for_url(re.compile(r"/t/demo/denials/$"))
    assert "files.test:80" in page.locator("section[data-dimension='subject']").inner_text()
    latest = page.get_by_test_id("latest-denials").locator("tr", has_text="files.test:80").first
    assert "egress files.test:80" in latest.inner_text() and "a security admin can add files.test:80" in (
        latest.inner_text())
    latest.locator("a").click()
    page.wait_for_url(re.compile(r"/t/demo/denials/[0-9a-f-]+/$"))
    assert page.get_by_test_id("egress-target").inner_text() == "files.test:80"
    assert page.get_by_test_id("denial-command").inner_text() == ran["id"]  # the command that asked for it

    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("allow-this").click()
    page.get_by_test_id("policy-replay").wait_for()
    assert page.get_by_test_id("version-state").inner_text() == "draft"
    source = page.get_by_test_id("version-source").inner_text()
    assert "network.allow gains exactly files.test:80" in source.splitlines()[-2], source  # a comment above it
    assert source.count("files.test:80") == 2 and "pypi.test:80" in source  # that one entry added, nothing lost
    publish_shown_version(page, "agents may fetch from files.test")

    status, fresh = api("POST", "/api/v1/sessions", {"conversation_id": "egress", "policy": "net"})
    assert status == 201
    status, ran = api("POST", f"/api/v1/sessions/{fresh['id']}/commands",
                      {"bin": "python3", "args": ["-c", FETCH], "wait": True}, token=fresh["token"])
    assert status == 200 and ran["exit_code"] == 0 and ran["output"] == "200\n", ran


COMMENTED = """# The team's policy: reviewed by security every Monday.
mode: enforce
commands:
  # Python only; never a shell.
  - id: python3
    bin: python3
    deny_args: ['^-']   # no interpreter options

# Egress: none (ticket SEC-12).
tests:
  - request: {bin: python3, args: ['-c', 'x']}
    expect: {allowed: false, reason_code: arg_denied}
"""


def test_allow_this_on_a_commented_policy_keeps_every_comment_and_the_diff_is_the_rule(page, demo_server):
    seeded = demo_server.manage("shell", "-c", (
        "import os; from controlplane.models import Tenant; from policies_app import services as s; "
        "p = s.policy_create(tenant=Tenant.objects.get(slug='demo'), name='commented', actor=None); "
        "v = s.version_create(policy=p, actor=None, source=os.environ['SOURCE']); "
        "s.version_publish(version=v, actor=None, note='start')"), SOURCE=COMMENTED)
    assert seeded.returncode == 0, seeded.stderr
    version = {"number": 1}
    open_a_denial(page, demo_server, {"bin": "make", "args": ["test"]}, conversation_id="commented",
                  policy="commented")
    page.get_by_test_id("allow-this").click()
    page.get_by_test_id("policy-replay").wait_for()
    source = page.get_by_test_id("version-source").inner_text()
    for line in COMMENTED.splitlines():
        assert line.split("#")[-1].strip() in source, line  # every line, its comments too, still there
    added = page.get_by_test_id("policy-diff").locator(".d-add").all_inner_texts()
    removed = page.get_by_test_id("policy-diff").locator(".d-del").all_inner_texts()
    assert removed == [] and len(added) == 6, added  # a comment, the rule (3 lines) and its test (2)
    assert any("exact_args: [test]" in line for line in added) and not any("null" in line for line in added)
    page.go_back()
    page.reload()
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("allow-this").click()  # twice on one denial: the same draft, opened again
    page.wait_for_url(re.compile(rf"/policies/commented/v/{version['number'] + 1}/$"))
    assert "already this draft" in page.locator(".messages").inner_text()
