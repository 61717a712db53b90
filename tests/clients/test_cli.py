"""The `airlock` CLI, as a user runs it (the executable `make run` installs), against a real
server: what it prints and the exit codes a script can rely on."""

import json
import os
import re
import subprocess

import pytest

from tests.clients.conftest import AIRLOCK

PASSING = "def test_ok():\n    assert True\n"
FAILING = "def test_bad():\n    assert 1 == 2\n"


@pytest.fixture
def cli(demo_server):
    def run(*args: str, key: str | None = None, url: str | None = None, stdin: bytes | None = None,
            cwd=None) -> subprocess.CompletedProcess:
        env = {**os.environ, "AIRLOCK_URL": url or demo_server.url, "AIRLOCK_API_KEY": key or demo_server.api_key,
               "NO_COLOR": "1"}
        return subprocess.run([AIRLOCK, *args], env=env, input=stdin, capture_output=True, timeout=120, check=False,
                              cwd=cwd)

    return run


def text(result: subprocess.CompletedProcess) -> tuple[str, str]:
    return result.stdout.decode(), result.stderr.decode()


def test_a_session_is_created_listed_fed_run_and_ended_from_the_shell(cli, tmp_path):
    created = cli("session", "create", "--conversation", "cli-1", "--json")
    assert created.returncode == 0, created.stderr
    session = json.loads(created.stdout)
    assert session["token"].startswith("ast_") and session["state"] == "ready"
    listed = cli("session", "list", "--state", "active")
    assert session["id"] in text(listed)[0] and "cli-1" in text(listed)[0]
    (tmp_path / "test_ok.py").write_text(PASSING)
    assert cli("files", "put", session["id"], str(tmp_path / "test_ok.py"), "tests/test_ok.py").returncode == 0
    assert cli("files", "put", session["id"], "-", "tests/test_bad.py", stdin=FAILING.encode()).returncode == 0
    listing = cli("files", "list", session["id"], "--json")
    assert {entry["path"] for entry in json.loads(listing.stdout)} == {"tests", "tests/test_ok.py",
                                                                        "tests/test_bad.py"}
    passed = cli("exec", session["id"], "--", "pytest", "tests/test_ok.py")
    assert passed.returncode == 0 and "1 passed" in text(passed)[0]
    failed = cli("exec", session["id"], "--", "pytest", "tests/test_bad.py")
    assert failed.returncode == 1 and "1 failed" in text(failed)[0]  # the command's own exit code
    script = "import sys\nprint('to stderr', file=sys.stderr)\nsys.exit(7)\n"
    cli("files", "put", session["id"], "-", "exit7.py", stdin=script.encode())
    seven = cli("exec", session["id"], "--", "python3", "exit7.py")
    assert seven.returncode == 7 and "to stderr" in text(seven)[1] and "to stderr" not in text(seven)[0]
    as_json = cli("exec", session["id"], "--json", "--", "python3", "exit7.py")
    assert as_json.returncode == 7 and json.loads(as_json.stdout)["exit_code"] == 7
    assert cli("files", "get", session["id"], "tests/test_ok.py").stdout.decode() == PASSING
    assert cli("files", "get", session["id"], "tests/test_ok.py", str(tmp_path / "back.py")).returncode == 0
    assert (tmp_path / "back.py").read_text() == PASSING
    ended = cli("session", "end", session["id"])
    assert ended.returncode == 0 and text(ended)[0].strip() == f"{session['id']} ended"


def test_a_denial_prints_its_reason_and_hint_and_exits_126(cli):
    session = json.loads(cli("session", "create", "--conversation", "cli-denied", "--json").stdout)
    denied = cli("exec", session["id"], "--", "echo", "hello")
    out, err = text(denied)
    assert denied.returncode == 126 and out == ""
    assert "denied (bin_not_allowed)" in err and "hint:" in err
    denials = cli("denials", "--period", "24h")
    assert denials.returncode == 0 and "bin_not_allowed" in text(denials)[0] and "echo" in text(denials)[0]
    assert json.loads(cli("denials", "--json").stdout)["total"] >= 1
    killed = cli("session", "kill", session["id"], "--json")
    assert killed.returncode == 0 and json.loads(killed.stdout)["state"] == "killed"
    again = cli("session", "end", session["id"])
    assert again.returncode == 3 and "session_not_active: the session is already killed" in text(again)[1]


def test_policy_lint_test_diff_and_publish_have_distinct_exit_codes(cli, writer_key, tmp_path):
    valid = tmp_path / "ci.yaml"
    valid.write_text("commands:\n  - {id: pytest, bin: pytest}\ntests:\n"
                     "  - request: {bin: pytest, args: []}\n    expect: {allowed: true}\n")
    invalid = tmp_path / "broken.yaml"
    invalid.write_text("commands:\n  - {id: x, bin: /bin/sh}\n")
    failing = tmp_path / "failing.yaml"
    failing.write_text("commands: []\ntests:\n  - request: {bin: pytest, args: []}\n    expect: {allowed: true}\n")
    lint = cli("policy", "lint", str(valid), "--policy", "default")
    assert lint.returncode == 0 and "valid" in text(lint)[0]
    broken = cli("policy", "lint", str(invalid), "--policy", "default")
    assert broken.returncode == 65 and f"{invalid}:2: commands.0.bin" in text(broken)[1]
    assert cli("policy", "test", str(valid), "--policy", "default").returncode == 0
    tests_fail = cli("policy", "test", str(failing), "--policy", "default")
    assert tests_fail.returncode == 1 and "FAIL  test 0 pytest" in text(tests_fail)[0]
    diff = cli("policy", "diff", str(valid), "--policy", "default")
    assert diff.returncode == 1 and "+  - {id: pytest, bin: pytest}" in text(diff)[0]
    assert re.search(r"^--- default v\d+$", text(diff)[0], flags=re.M)  # against what is published now
    # The demo key may read policies, not write them: a refusal, not a crash.
    refused = cli("policy", "publish", str(valid), "--note", "try")
    assert refused.returncode == 3 and "permission" in text(refused)[1].lower()
    assert cli("policy", "publish", str(failing), "--note", "x", key=writer_key).returncode == 1
    published = cli("policy", "publish", str(valid), "--note", "the CI policy", "--json", key=writer_key)
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["state"] == "published"  # a new policy, named after its file
    assert cli("policy", "diff", str(valid), key=writer_key).returncode == 0  # nothing differs now
    assert cli("policy", "lint", str(tmp_path / "missing.yaml")).returncode == 2


def test_bad_configuration_and_an_unreachable_server_get_a_message_and_an_exit_code(cli, demo_server):
    unconfigured = subprocess.run([AIRLOCK, "session", "list"], capture_output=True, timeout=30, check=False,
                                  env={key: value for key, value in os.environ.items()
                                       if not key.startswith("AIRLOCK_")})
    assert unconfigured.returncode == 2 and "AIRLOCK_URL" in unconfigured.stderr.decode()
    unreachable = cli("session", "list", url="http://127.0.0.1:9")
    assert unreachable.returncode == 69 and "cannot reach" in text(unreachable)[1]
    bad_key = cli("session", "list", key="alk_nothing_nothing")
    assert bad_key.returncode == 3 and "invalid_key" in text(bad_key)[1]
    no_command = cli("exec", "00000000-0000-0000-0000-000000000000")
    assert no_command.returncode == 2
    unknown = cli("exec", "00000000-0000-0000-0000-000000000000", "--", "pytest")
    assert unknown.returncode == 125 and "not_found" in text(unknown)[1]  # above any code of the command's
    not_an_id = cli("files", "get", "../policies", "x", "--json")
    assert not_an_id.returncode == 3 and json.loads(not_an_id.stdout)["error"] == "invalid_request"
    gone = cli("session", "list", "--json", url="http://127.0.0.1:9")
    assert gone.returncode == 69 and json.loads(gone.stdout)["error"] == "connection_failed"
    assert "Traceback" not in text(unknown)[1]
