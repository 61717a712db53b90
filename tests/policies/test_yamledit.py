"""Edits of a policy's YAML that keep what a person wrote: the diff of an edit is the change alone."""

import difflib

import pytest
import yaml

from policies_app.yamledit import Unsupported, append_item, set_scalar

COMMENTED = """# The team's policy: reviewed by security every Monday.
mode: enforce
limits: {cpus: 1, memory_mb: 512}   # small on purpose

commands:
  # Tests only; never a shell.
  - id: pytest
    bin: pytest          # the runner
    deny_args: ["^-c"]   # no other config

# Egress: nothing yet (ticket SEC-12).
network:
  egress: none
tests:
  - request: {bin: pytest, args: ["-c", "x"]}
    expect: {allowed: false}
"""


def added_lines(before: str, after: str) -> list[str]:
    """The lines the edit added; fails if it removed or changed any."""
    diff = [line for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line[:1] in "+-?"]
    assert not [line for line in diff if line[:1] in "-?"], diff
    return [line[2:] for line in diff]


def test_an_appended_rule_keeps_every_comment_and_goes_before_the_next_sections_comment():
    rule = {"id": "make-test", "bin": "make", "exact_args": ["test"]}
    edited = append_item(COMMENTED, ("commands",), rule, comment="Allow this: denial 42")
    assert added_lines(COMMENTED, edited) == [
        "  # Allow this: denial 42", "  - id: make-test", "    bin: make", "    exact_args: [test]"]
    assert edited.index("exact_args: [test]") < edited.index("# Egress: nothing yet")
    assert yaml.safe_load(edited)["commands"][-1] == rule


def test_an_item_follows_the_style_of_the_list_it_joins():
    flow_items = "commands:\n  - {id: ls, bin: ls}   # listing\n"
    assert append_item(flow_items, ("commands",), {"id": "pwd", "bin": "pwd"}) == (
        flow_items + "  - {id: pwd, bin: pwd}\n")
    assert append_item("commands: []  # none yet\n", ("commands",), {"id": "a", "bin": "a"}) == (
        "commands: [{id: a, bin: a}]  # none yet\n")
    flow_section = "mode: audit\nnetwork: {egress: allowlist, allow: [pypi.org:443]}  # PyPI only\n"
    assert append_item(flow_section, ("network", "allow"), "files.test:80", comment="why") == (
        "mode: audit\n# why\nnetwork: {egress: allowlist, allow: [pypi.org:443, files.test:80]}  # PyPI only\n")
    unindented = "commands:\n- id: a\n  bin: a\nmode: audit\n"
    assert added_lines(unindented, append_item(unindented, ("commands",), {"id": "b", "bin": "b"})) == [
        "- id: b", "  bin: b"]


def test_a_missing_list_or_section_is_added_and_nothing_else_moves():
    assert added_lines(COMMENTED, append_item(COMMENTED, ("env", "pass"), "CI")) == ["env:", "  pass: [CI]"]
    edited = set_scalar(COMMENTED, ("network", "egress"), "allowlist")
    edited = append_item(edited, ("network", "allow"), "pypi.org:443")
    assert yaml.safe_load(edited)["network"] == {"egress": "allowlist", "allow": ["pypi.org:443"]}
    assert "# Egress: nothing yet (ticket SEC-12)." in edited and "# small on purpose" in edited
    assert append_item("", ("commands",), {"id": "a", "bin": "a"}) == "commands:\n- id: a\n  bin: a\n"
    assert append_item("commands:\nmode: audit\n", ("commands",), {"id": "a", "bin": "a"}) == (
        "commands:\n  - id: a\n    bin: a\nmode: audit\n")


def test_a_block_scalar_and_a_file_without_a_final_newline_keep_their_text():
    literal = "commands:\n  - id: x\n    bin: x\n    exact_args:\n      - |\n        two\n        lines\nmode: audit\n"
    edited = append_item(literal, ("commands",), {"id": "y", "bin": "y"})
    assert yaml.safe_load(edited)["commands"][0]["exact_args"] == ["two\nlines\n"]
    assert yaml.safe_load(edited)["commands"][1] == {"id": "y", "bin": "y"}
    assert append_item("commands:\n  - {id: x, bin: x}", ("commands",), {"id": "y", "bin": "y"}) == (
        "commands:\n  - {id: x, bin: x}\n  - {id: y, bin: y}\n")


@pytest.mark.parametrize("source", [
    "{commands: []}\n",                              # the document itself in flow style
    "- a\n",                                          # not a mapping
    "commands: {id: x}\n",                            # not a list
    "network: {egress: none}\n",                      # a key to add inside a flow mapping
    "base: &b {id: x, bin: x}\ncommands:\n  - *b\n",  # an alias ends the list
    "commands: [\n",                                  # not YAML
])
def test_what_it_cannot_edit_in_place_it_refuses(source):
    with pytest.raises(Unsupported):
        append_item(append_item(source, ("commands",), {"id": "y", "bin": "y"}), ("network", "allow"), "a:1")


def test_an_alias_whose_anchor_sits_on_a_line_with_a_dash_is_refused_too():
    source = "x: [- &b {id: x, bin: x}]\ncommands:\n  - *b\n".replace("[- ", "['-', ")
    with pytest.raises(Unsupported):
        append_item(source, ("commands",), {"id": "y", "bin": "y"})


def test_a_flow_list_with_a_comment_or_an_alias_inside_is_refused_and_a_trailing_comma_dropped():
    commented = "tests: [\n  {request: {bin: pytest}, expect: {allowed: true}},  # first\n]\n"
    with pytest.raises(Unsupported):
        append_item(commented, ("tests",), {"request": {"bin": "make"}, "expect": {"allowed": False}})
    assert append_item("commands: [{id: a, bin: a},]\n", ("commands",), {"id": "b", "bin": "b"}) == (
        "commands: [{id: a, bin: a}, {id: b, bin: b}]\n")
    tail_alias = "x: &end [1]\ncommands:\n  - id: a\n    exact_args: *end\n"
    with pytest.raises(Unsupported):  # the item's last value is an alias: its text is the anchor's
        append_item(tail_alias, ("commands",), {"id": "b", "bin": "b"})
