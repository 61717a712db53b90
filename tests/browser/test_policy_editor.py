"""A security admin edits the demo policy in real Chromium: an error at its line, the fix's
diff, a replay flip, publish (N+1) and rollback (N+2 with the old document)."""

import re

import pytest

from tests.browser.test_first_run import log_in

pytestmark = pytest.mark.browser
MAKE_RULE = "  - id: make-test\n    bin: make\n    allow_args: [test]\n"


def test_a_security_admin_edits_replays_publishes_and_rolls_back(page, demo_server):
    log_in(page, demo_server)
    page.goto(demo_server.url + "/t/demo/policies/default/edit")
    original = page.locator("#policy-source").input_value()
    assert original.startswith("# The demo tenant's policy")
    lines = original.splitlines()
    commands_at = lines.index("commands:")

    broken = "\n".join([*lines[: commands_at + 1], "  - id: make-test", "    bin: [make", *lines[commands_at + 1:]])
    page.fill("#policy-source", broken)
    page.get_by_role("button", name="Check", exact=True).click()
    errors = page.get_by_test_id("policy-errors")
    errors.wait_for()
    error_line = int(re.search(r"line (\d+):", errors.inner_text()).group(1))
    assert error_line in {commands_at + 3, commands_at + 4}  # the unclosed `[` of line commands_at + 3
    assert page.locator(".gutter span.error-line").first.inner_text() == str(error_line)

    fixed = "\n".join([*lines[: commands_at + 1], *MAKE_RULE.rstrip("\n").split("\n"), *lines[commands_at + 1:]])
    page.fill("#policy-source", fixed + "\n")
    page.get_by_role("button", name="Check and replay").click()
    diff = page.get_by_test_id("policy-diff").inner_text()
    assert "+  - id: make-test" in diff and "+    bin: make" in diff
    replay = page.get_by_test_id("policy-replay").inner_text()
    assert "deny → allow" in replay and "make-test" in replay and "make test" in replay

    page.locator("input[name=note]").fill("allow make test")
    page.get_by_role("button", name="Save draft").click()
    page.wait_for_url(re.compile(r"/policies/default/v/2/$"))
    assert page.get_by_test_id("version-state").inner_text() == "draft"
    page.locator("form[action$='/publish'] input[name=note]").fill("CI runs make test")
    page.get_by_role("button", name="Publish v2").click()
    page.wait_for_url(re.compile(r"/policies/default/v/2/$"))
    assert page.get_by_test_id("version-state").inner_text() == "published"

    page.goto(demo_server.url + "/t/demo/policies/default/v/1/")
    page.locator("form[action$='/rollback'] input[name=note]").fill("make test broke the build")
    page.get_by_role("button", name=re.compile("Roll back")).click()
    page.wait_for_url(re.compile(r"/policies/default/v/3/$"))
    assert page.get_by_test_id("version-state").inner_text() == "published"
    source = page.get_by_test_id("version-source").inner_text()
    assert "make-test" not in source and "# The demo tenant's policy" in source
