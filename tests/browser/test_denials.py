"""The Denials page in real Chromium: the chart draws, the reason filter narrows, a denial opens
with its explanation."""

import re

import pytest

from tests.browser.test_first_run import log_in

pytestmark = pytest.mark.browser


def test_a_security_admin_reads_the_denials_filters_and_opens_one(page, demo_server):
    log_in(page, demo_server)
    page.get_by_role("link", name="Denials", exact=True).click()
    page.wait_for_url(re.compile(r"/t/demo/denials/$"))
    assert int(page.get_by_test_id("denial-total").inner_text()) >= 3  # the seeded `make test` requests
    page.wait_for_function("() => window.Chart && Chart.getChart('denials-chart') !== undefined")
    drawn = page.evaluate("""() => {
        const canvas = document.getElementById('denials-chart');
        const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        return pixels.some((value, index) => index % 4 === 3 && value > 0);
    }""")
    assert drawn, "the chart canvas is empty"
    assert page.locator("section[data-dimension='subject']").inner_text().count("make") >= 1

    page.locator("select[name=reason]").select_option("arg_denied")
    page.get_by_role("button", name="Filter").click()
    assert page.get_by_test_id("denial-total").inner_text() == "0"
    page.locator("select[name=reason]").select_option("bin_not_allowed")
    page.get_by_role("button", name="Filter").click()
    assert int(page.get_by_test_id("denial-total").inner_text()) >= 3

    page.locator("table.grid tbody tr td a").first.click()
    page.wait_for_url(re.compile(r"/t/demo/denials/[0-9a-f-]+/$"))
    body = page.locator("main").inner_text()
    assert "`make` is not an allowed command" in body and "a security admin can add `make`" in body
