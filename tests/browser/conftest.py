"""Real Chromium (Debian's /usr/bin/chromium) driven by Playwright, against the real server of
tests/live.py (`demo_server`)."""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


def _require_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    message = "Chromium is not installed (apt-get install chromium)"
    if os.environ.get("AIRLOCK_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")  # sync_playwright runs an event loop on this thread: not past the module
def browser():
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A page that fails its test if anything it loaded broke the Content-Security-Policy (a
    script, style or connection the policy refused is a feature that silently does not work)."""
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    refused = []
    page.on("console", lambda message: refused.append(message.text)
            if message.type == "error" and "Content Security Policy" in message.text else None)
    yield page
    context.close()
    assert not refused, f"the Content-Security-Policy refused: {refused}"
