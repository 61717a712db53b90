"""The API docs in real Chromium: Authorize with the printed API key, then Try it out."""

import pytest

pytestmark = pytest.mark.browser


def test_authorize_with_an_api_key_then_try_whoami(page, demo_server):
    page.goto(demo_server.url + "/api/docs/")
    page.get_by_role("button", name="Authorize").first.click()
    dialog = page.locator(".auth-container", has_text="apiKey")
    dialog.locator("input").fill(demo_server.api_key)
    dialog.locator("button.authorize").click()
    dialog.get_by_text("Authorized").wait_for()  # Swagger UI took the key
    page.locator("button.btn-done").first.click()
    operation = page.locator(".opblock", has_text="/api/v1/whoami").first
    operation.locator(".opblock-summary").click()
    operation.get_by_role("button", name="Try it out").click()
    operation.get_by_role("button", name="Execute").click()
    response = operation.locator(".live-responses-table .response .response-col_status").first
    response.wait_for()
    assert response.inner_text().strip() == "200"
    assert '"demo"' in operation.locator(".live-responses-table .microlight").first.inner_text()
