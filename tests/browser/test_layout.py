"""The dashboard on a phone (390 px) and in dark mode, in real Chromium."""

import re

import pytest

from tests.browser.test_first_run import log_in

pytestmark = pytest.mark.browser
PAGES = ["sessions/", "policies/", "policies/default/", "policies/default/edit", "policies/default/v/1/",
         "denials/", "exceptions/", "metrics/", "audit/", "settings/"]


def test_every_page_fits_a_390_px_screen_and_the_sections_fold_under_menu(page, demo_server):
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, demo_server)
    for path in PAGES:
        page.goto(f"{demo_server.url}/t/demo/{path}")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
    sections = page.get_by_role("navigation", name="Sections")
    assert not sections.is_visible()
    page.get_by_role("button", name="Menu").click()
    assert sections.is_visible() and page.evaluate("document.documentElement.scrollWidth") <= 390
    sections.get_by_role("link", name="Denials").click()
    page.wait_for_url(re.compile(r"/t/demo/denials/$"))


def rgb(css: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", css)[:3])


def test_dark_mode_follows_the_system(browser, demo_server):
    for scheme, dark in (("dark", True), ("light", False)):
        context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
        page = context.new_page()
        log_in(page, demo_server)
        background = rgb(page.evaluate("getComputedStyle(document.body).backgroundColor"))
        panel = rgb(page.locator("table.grid").first.evaluate("(table) => getComputedStyle(table).backgroundColor"))
        assert (max(background) < 60 and max(panel) < 60) if dark else (min(background) > 200 and min(panel) > 200)
        page.goto(f"{demo_server.url}/t/demo/policies/default/edit")
        page.locator(".cm-editor").wait_for()
        editor = rgb(page.locator(".cm-content").evaluate(  # the first painted background behind the text
            "(node) => { const paint = (n) => getComputedStyle(n).backgroundColor;"
            " while (paint(node) === 'rgba(0, 0, 0, 0)') node = node.parentElement; return paint(node); }"))
        assert max(editor) < 60 if dark else min(editor) > 200
        context.close()
