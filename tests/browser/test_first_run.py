"""The README's first run, as a new user does it: the printed login works in a real browser and
the printed API key answers the API."""

import re

import pytest

from tests.http import call_api

pytestmark = pytest.mark.browser


def get_json(url: str, key: str) -> tuple[int, dict]:
    return call_api(url, "GET", "", bearer=key)


def log_in(page, server) -> None:
    page.goto(server.url + "/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(server.password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"/t/demo/sessions/$"))


def test_the_printed_credentials_log_in_and_the_printed_key_answers_whoami(page, demo_server):
    log_in(page, demo_server)
    assert page.get_by_test_id("current-tenant").inner_text() == "demo"
    for section in ["Sessions", "Policies", "Denials", "Audit", "Settings"]:
        assert page.get_by_role("link", name=section, exact=True).is_visible()

    status, body = get_json(demo_server.url + "/api/v1/whoami", demo_server.api_key)
    assert status == 200
    assert body["tenant"]["slug"] == "demo"


def test_a_tenant_admin_creates_and_revokes_a_key_in_the_browser(page, demo_server):
    log_in(page, demo_server)
    page.get_by_role("link", name="Settings", exact=True).click()
    page.locator("input[name=name]").fill("browser-made")
    page.get_by_label("sessions: create and drive").check()
    page.get_by_role("button", name="Create key").click()
    key = page.get_by_test_id("new-key").locator("code").inner_text()
    assert get_json(demo_server.url + "/api/v1/whoami", key)[0] == 200

    page.on("dialog", lambda dialog: dialog.accept())
    row = page.locator("tr", has_text="browser-made")
    row.get_by_role("button", name="Revoke").click()
    page.wait_for_load_state()
    assert page.locator("tr", has_text="browser-made").locator(".badge").inner_text() == "revoked"
    status, body = get_json(demo_server.url + "/api/v1/whoami", key)
    assert (status, body["error"]) == (401, "revoked_key")

    page.get_by_role("link", name="Audit", exact=True).click()
    actions = page.locator("tbody td code:not(.hash)").all_inner_texts()
    assert actions.index("api_key.revoked") < actions.index("api_key.created")


def test_the_api_docs_render_from_vendored_files(page, demo_server):
    page.goto(demo_server.url + "/api/docs/")
    page.get_by_text("/api/v1/whoami").first.wait_for()
    assert "Airlock API" in page.content()
