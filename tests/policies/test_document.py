import pytest

from policies_app.document import DocumentError, json_schema, parse_yaml
from policies_app.lint import lint


def errors_of(source: str) -> list[dict]:
    with pytest.raises(DocumentError) as failure:
        parse_yaml(source)
    return failure.value.errors


def test_invalid_yaml_is_reported_at_its_line():
    assert errors_of("mode: enforce\ncommands: [\n")[0]["line"] == 3


def test_schema_errors_name_the_field_path_and_line():
    source = "mode: enforce\ncommands:\n  - id: pytest\n    bin: /usr/bin/pytest\nlimits:\n  cpus: 0\n"
    errors = {error["path"]: error for error in errors_of(source)}
    assert errors["commands.0.bin"]["line"] == 4
    assert "bare program name" in errors["commands.0.bin"]["message"]
    assert errors["limits.cpus"]["line"] == 6


@pytest.mark.parametrize(("source", "path"), [
    ("limits: {command_timeout_s: true}", "limits.command_timeout_s"),  # YAML's true is not 1 second
    ("limits: {memory_mb: '512'}", "limits.memory_mb"),
    ("limits: {cpus: '1'}", "limits.cpus"),
    ("persistence: {enabled: 'yes'}", "persistence.enabled"),  # quoted: a string, not YAML's boolean
    ("commands: [{id: a, bin: a, max_args: 2.0}]", "commands.0.max_args"),
])
def test_numbers_and_booleans_are_taken_only_as_their_own_type(source, path):
    assert path in {error["path"] for error in errors_of(source + "\n")}


def test_a_whole_number_is_a_number_of_cpus():
    assert parse_yaml("limits: {cpus: 2}\n").limits.cpus == 2.0


def test_unknown_fields_and_bad_regexes_are_refused():
    errors = errors_of("mode: enforce\nshell: true\ncommands:\n  - {id: a, bin: a, deny_args: ['(']}\n")
    paths = {error["path"] for error in errors}
    assert {"shell", "commands.0.deny_args"} <= paths


def test_duplicate_rule_ids_are_refused():
    errors = errors_of("commands:\n  - {id: a, bin: a}\n  - {id: a, bin: b}\n")
    assert "used twice" in errors[0]["message"]


def test_the_canonical_form_ignores_formatting_and_comments():
    first = parse_yaml("# team policy\nmode: enforce\ncommands: [{id: a, bin: a}]\n")
    second = parse_yaml("commands:\n  - bin: a\n    id: a\n")
    assert first.sha256() == second.sha256()
    assert parse_yaml("mode: audit\n").sha256() != first.sha256()


def test_the_json_schema_is_served_for_the_editor():
    schema = json_schema()
    assert set(schema["properties"]) >= {"mode", "limits", "commands", "network", "tests"}


@pytest.mark.parametrize(
    ("rule", "flagged"),
    [
        ("{id: sh, bin: bash}", True),
        ("{id: env, bin: env}", True),
        ("{id: py, bin: python3}", True),
        ("{id: py, bin: python3, deny_args: ['^-c$']}", True),  # -cCODE and -Ic stay open
        ("{id: py, bin: python3, deny_args: ['^-']}", False),
        ("{id: node, bin: node, deny_args: ['^-e$']}", True),  # --eval and -p stay open
        ("{id: find, bin: find}", True),
        ("{id: git, bin: git}", True),
        ("{id: git, bin: git, allow_args: ['status']}", False),
        ("{id: npx, bin: npx}", True),
        ("{id: npm, bin: npm}", True),
        ("{id: npm, bin: npm, prepend_args: [test, '--']}", False),
        ("{id: xargs, bin: xargs}", True),
        ("{id: pytest, bin: pytest}", False),
        ("{id: py, bin: python3, exact_args: [scripts/check.py]}", False),  # one exact argv
        ("{id: sh, bin: bash, exact_args: [-c, id]}", True),  # a shell is flagged whatever its arguments
    ],
)
def test_lint_flags_rules_that_can_run_arbitrary_code(rule, flagged):
    warnings = lint(parse_yaml(f"commands:\n  - {rule}\n"))
    assert bool(warnings) == flagged, warnings


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "A=B", "1X"])
def test_environment_names_that_steer_loading_or_are_malformed_are_refused(name):
    errors = errors_of(f"env:\n  set: {{'{name}': x}}\n")
    assert errors[0]["path"].startswith("env.set")


def test_a_deeply_nested_document_is_an_error_not_a_crash():
    assert "nested too deeply" in errors_of("[" * 5000)[0]["message"]
