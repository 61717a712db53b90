"""A security admin edits the demo policy in real Chromium, in the CodeMirror editor: completion
from the policy's schema, marks at their lines as one types (no reload), the diff side by side, a
request judged by the draft, a replay flip, publish (N+1) and rollback (N+2 with the old document)."""

import re
import time

import pytest

from tests.browser.test_first_run import log_in

pytestmark = pytest.mark.browser
MAKE_RULE = "  - id: make-test\n    bin: make\n    allow_args: [test]\n"


def set_document(page, text: str) -> None:
    page.evaluate("(text) => Airlock.editor.dispatch({changes: {from: 0, to: Airlock.editor.state.doc.length, "
                  "insert: text}, selection: {anchor: text.length}})", text)


def document(page) -> str:
    return page.evaluate("Airlock.editor.state.doc.toString()")


def open_editor(page, server):
    log_in(page, server)
    page.goto(server.url + "/t/demo/policies/default/edit")
    page.locator(".cm-editor").wait_for()
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads


def test_completion_under_limits_offers_the_schemas_keys_with_their_docs(page, demo_server):
    open_editor(page, demo_server)
    set_document(page, "mode: enforce\n")
    page.locator(".cm-content").click()
    page.keyboard.press("Control+End")
    page.keyboard.type("limits:")
    page.keyboard.press("Enter")  # the editor indents the line under the key
    page.keyboard.type("comm")
    options = page.locator(".cm-tooltip-autocomplete li")
    options.first.wait_for()
    assert options.all_inner_texts()[0].startswith("command_timeout_s")
    page.wait_for_timeout(200)  # CodeMirror ignores an Enter within 75 ms of the list opening
    page.keyboard.press("Enter")
    page.keyboard.type("30")
    assert document(page) == "mode: enforce\nlimits:\n  command_timeout_s: 30"
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")  # Tab indents, it does not leave the editor
    assert page.evaluate("document.activeElement.classList.contains('cm-content')")
    page.keyboard.press("Backspace")
    page.keyboard.press("Backspace")
    page.keyboard.type("mode: ")
    page.keyboard.press("Control+Space")
    options.first.wait_for()
    assert set(options.all_inner_texts()) == {"audit", "enforce"}
    page.keyboard.press("Escape")
    page.locator(".cm-line", has_text="command_timeout_s").locator("text=command_timeout_s").hover()
    hover = page.locator(".cm-tooltip-hover")
    hover.wait_for()
    assert "seconds a command may run" in hover.inner_text()  # the schema's own words


def test_a_schema_error_is_marked_at_its_line_as_one_types_without_a_reload(page, demo_server):
    open_editor(page, demo_server)
    original = document(page)
    lines = original.splitlines()
    at = lines.index("commands:")
    set_document(page, "\n".join([*lines[: at + 1], "  - id: make-test", "    bin: /usr/bin/make", *lines[at + 1:]]))
    page.wait_for_function("() => Airlock.editorMarks.some((mark) => mark.severity === 'error')")
    marks = page.evaluate("Airlock.editorMarks")
    assert [(mark["line"], "must be a bare program name" in mark["message"]) for mark in marks] == [(at + 3, True)]
    page.locator(".cm-lint-marker-error").wait_for()
    assert "must be a bare program name" in page.get_by_test_id("policy-errors").inner_text()
    set_document(page, original)
    page.wait_for_function("() => Airlock.editorMarks.length === 0")
    assert page.locator(".cm-lint-marker-error").count() == 0
    assert page.evaluate("window.__sameDocument") is True


def with_make_rule(source: str) -> str:
    lines = source.splitlines()
    at = lines.index("commands:")
    return "\n".join([*lines[: at + 1], *MAKE_RULE.rstrip("\n").split("\n"), *lines[at + 1:]]) + "\n"


def test_a_replay_asked_for_right_after_typing_survives_the_check_that_typing_starts(page, demo_server):
    open_editor(page, demo_server)
    checks = []
    page.on("requestfinished", lambda request: checks.append(request) if request.url.endswith("/check") else None)

    def slow_replay(route):
        if 'name="replay"' in (route.request.post_data or ""):
            time.sleep(1.5)  # the check of the edit (400 ms after it) starts while the replay runs
        route.continue_()

    page.route("**/check", slow_replay)
    set_document(page, with_make_rule(document(page)))
    page.get_by_role("button", name="Check and replay").click()
    page.wait_for_function("() => document.querySelector('[data-testid=policy-replay]') !== null")
    deadline = time.monotonic() + 10
    while len(checks) < 2 and time.monotonic() < deadline:  # the check of the edit waits its turn in the route
        page.wait_for_timeout(50)
    assert len(checks) == 2  # the replay and the check of the same document, both answered
    replay = page.get_by_test_id("policy-replay")
    assert "deny → allow" in replay.inner_text()  # the later check did not draw over it


def test_a_security_admin_edits_replays_publishes_and_rolls_back(page, demo_server):
    open_editor(page, demo_server)
    original = document(page)
    assert original.startswith("# The demo tenant's policy")
    set_document(page, with_make_rule(original))

    page.get_by_label("Program").fill("make")
    page.get_by_label("Arguments").fill("test")
    page.get_by_role("button", name="Judge").click()
    assert page.get_by_test_id("try-effect").inner_text() == "allow"
    page.get_by_label("Arguments").fill("install")
    page.get_by_role("button", name="Judge").click()
    page.get_by_test_id("policy-try").locator("text=arg_denied").wait_for()

    page.get_by_role("tab", name=re.compile("Side by side")).click()
    merge = page.locator(".cm-mergeView")
    merge.wait_for()
    assert merge.locator(".cm-changedLine", has_text="make-test").count() == 1  # the added rule, on the right
    page.get_by_role("tab", name="Document").click()

    page.get_by_role("button", name="Check and replay").click()
    replay = page.get_by_test_id("policy-replay")
    replay.wait_for()
    assert "deny → allow" in replay.inner_text() and "make-test" in replay.inner_text()
    assert page.evaluate("window.__sameDocument") is True
    diff = page.get_by_test_id("policy-diff").inner_text()
    assert "+  - id: make-test" in diff and "\n\n" not in diff  # one line a line

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
