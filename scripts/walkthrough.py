"""The newcomer's smoke test: `make run` on a fresh data directory, then the README's own
walk-through (its shell blocks, read from README.md, not a copy), checking each step's answer.
Exits non-zero, naming the step, when any step breaks. Standard library only: it runs before
`make run` has made .venv.

    python3 scripts/walkthrough.py [--readme README.md] [--fresh-rootfs]

--fresh-rootfs points AIRLOCK_ROOTFS_DIR at an empty directory, so `make run` must build the
sandbox root filesystem itself, as on a machine that never ran Airlock (CI does this)."""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## An agent's session, step by step"
CLI_SECTION = "## Use Airlock from your agent"
README_URL = "http://127.0.0.1:8000"
# Every curl of the walk-through also reports its HTTP status, on stderr, where a step's
# captured output keeps it apart from what the README's commands read.
PRELUDE = """set -eu
curl() { command curl -w '%{stderr}@@status %{http_code}\\n' "$@"; }
"""


class StepFailed(Exception):
    pass


def walkthrough_steps(readme: str) -> list[tuple[str, str]]:
    """(number, shell text) of each `# N.` step in the README's walk-through section, in order;
    lines before the first step (the variables) belong to step 0."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start:end if end != -1 else None]
    shell = "\n".join(re.findall(r"```sh\n(.*?)```", section, flags=re.S))
    steps, number, lines = [], "0", []
    for line in shell.splitlines():
        if match := re.match(r"# (\d+)\. ", line):
            steps.append((number, "\n".join(lines)))
            number, lines = match.group(1), []
        lines.append(line)
    steps.append((number, "\n".join(lines)))
    return steps


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_make_run(env: dict, log: Path) -> subprocess.Popen:
    make = shutil.which("make") or "/usr/bin/make"
    return subprocess.Popen([make, "run"], cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_until_serving(server: subprocess.Popen, log: Path, port: int, limit_s: float) -> str:
    """The API key `make run` printed, once its server answers."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise StepFailed(f"make run exited with {server.returncode} before serving; its output:\n{tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    key = re.search(r"alk_\S+", log.read_text(errors="replace"))
                    if key is None:
                        raise StepFailed(f"make run printed no API key; its output:\n{tail(log)}")
                    return key.group(0)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise StepFailed(f"make run did not serve within {limit_s:.0f} s; its output:\n{tail(log)}")


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_steps(steps: list[tuple[str, str]], key: str, port: int) -> dict[str, dict]:
    """Run the steps in one shell, as a person pastes them: per step, its HTTP statuses, what it
    printed and when it started; also the session's id and token the steps set."""
    script = PRELUDE
    for number, text in steps:
        text = text.replace(README_URL, f"http://127.0.0.1:{port}")
        text = re.sub(r"^KEY=.*$", f"KEY={key}", text, flags=re.M)
        # A newline first: curl's answers do not end with one.
        script += f"printf '\\n@@step {number} %s\\n' \"$(date +%s.%N)\" | tee /dev/stderr\n{text}\n"
    script += 'printf "\\n@@vars %s %s\\n" "${ID:-}" "${TOKEN:-}"\n'
    done = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise StepFailed(f"the walk-through's shell failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    results: dict[str, dict] = {}
    for stream in ("stdout", "stderr"):
        current = None
        for line in getattr(done, stream).splitlines():
            if line.startswith("@@step "):
                _, current, at = line.split()
                results.setdefault(current, {"statuses": [], "output": "", "at": float(at)})
            elif line.startswith("@@vars "):
                results["vars"] = dict(zip(("id", "token"), line.split()[1:], strict=False))
            elif stream == "stderr" and line.startswith("@@status ") and current is not None:
                results[current]["statuses"].append(int(line.split()[1]))
            elif stream == "stdout" and current is not None:
                results[current]["output"] += line + "\n"
    return results


def answer(step: dict, number: str) -> dict:
    """The JSON a step printed (its last JSON line)."""
    for line in reversed(step["output"].splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    raise StepFailed(f"step {number} printed no JSON: {step['output'][-500:]!r}")


def expect(condition: bool, number: str, what: str, step: dict) -> None:
    if not condition:
        raise StepFailed(f"step {number}: {what}; it answered {step['statuses']} {step['output'][-1500:]!r}")


def check(steps: list[tuple[str, str]], key: str, port: int, started: float) -> None:
    results = run_steps(steps, key, port)
    for number in ("1", "2", "3", "4", "5", "7"):
        if number not in results:
            raise StepFailed(f"step {number} is missing from the README's walk-through")
    one, two, three, four, five, seven = (results[n] for n in ("1", "2", "3", "4", "5", "7"))
    session = answer(one, "1")
    expect(one["statuses"] == [201] and session.get("state") == "ready" and session.get("token"), "1",
           "a session should be created (201, state ready, with its token)", one)
    print(f"walkthrough: first session ready {two['at'] - started:.0f} s after make run started")
    expect(two["statuses"] == [204], "2", "the file should be written (204)", two)
    result = answer(three, "3")
    expect(three["statuses"] == [200] and result.get("exit_code") == 0 and "1 passed" in result.get("output", ""),
           "3", "pytest should run and pass (200, exit code 0, 1 passed)", three)
    denial = answer(four, "4")
    decision = denial.get("decision") or {}
    expect(four["statuses"] == [403] and denial.get("error") == "command_denied" and decision.get("hint")
           and decision.get("reason_code"), "4", "the command should be denied (403) with a reason and a hint", four)
    expect("can add `bash`" not in decision["hint"], "4", "the hint must not suggest allowing a shell", four)
    fetched = answer(five, "5")
    expect(five["statuses"] == [204, 200] and fetched.get("exit_code") == 1
           and "HTTP Error 403: Airlock egress_denied: example.org:80 is not on the egress allowlist"
           in fetched.get("output", ""), "5", "the fetch should meet the egress proxy's 403 (egress_denied)", five)
    ended = answer(seven, "7")
    expect(seven["statuses"] == [200] and ended.get("state") == "ended", "7", "the session should end (200, ended)",
           seven)
    token, session_id = results["vars"]["token"], results["vars"]["id"]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/sessions/{session_id}",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310 - an http://127.0.0.1 URL
        raise StepFailed("step 7: the ended session's token still works")
    except urllib.error.HTTPError as refused:
        if refused.code != 401:
            raise StepFailed(f"step 7: the ended session's token got {refused.code}, not 401") from None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:  # step 6: the dashboard
        if page.status != 200 or b'name="password"' not in page.read():
            raise StepFailed("step 6: the dashboard's sign-in page did not load")


def check_cli(readme: str, key: str, port: int) -> None:
    """The README's shell example of the `airlock` CLI, as pasted in a fresh directory: `make run`
    installed the CLI, and each line answers as its comment says."""
    section = readme[readme.index(CLI_SECTION):]
    section = section[:section.find("\n## ", 1)]
    shell = next(block for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S) if "airlock exec" in block)
    shell = shell.replace(".venv/bin/airlock", str(ROOT / ".venv" / "bin" / "airlock"))
    shell = re.sub(r"AIRLOCK_URL=\S+ AIRLOCK_API_KEY=\S+", f"AIRLOCK_URL=http://127.0.0.1:{port} AIRLOCK_API_KEY={key}",
                   shell)
    with tempfile.TemporaryDirectory() as here:
        done = subprocess.run(["/bin/bash", "-c", "set -eu\n" + shell], cwd=here, capture_output=True, text=True,
                              timeout=300, check=False, env={**os.environ, "NO_COLOR": "1"})
    out, err = done.stdout, done.stderr
    for wanted, where, what in (("1 passed", out, "pytest should pass"), ("exit 126", out, "the denial exits 126"),
                                ("denied (bin_not_allowed)", err, "the denial names its reason"),
                                ("hint:", err, "the denial gives a hint"),
                                ("tests/test_add.py", out, "the listing shows the file"),
                                ("bin_not_allowed", out, "the denials table counts it"), (" ended", out, "it ends")):
        if done.returncode != 0 or wanted not in where:
            raise StepFailed(f"the CLI example: {what} (exit {done.returncode}):\n{out[-1500:]}\n{err[-1500:]}")
    print("walkthrough: the README's CLI example answered as it says")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--fresh-rootfs", action="store_true")
    parser.add_argument("--serve-limit-s", type=float, default=900)
    options = parser.parse_args()
    steps = walkthrough_steps(options.readme.read_text())
    data = Path(tempfile.mkdtemp(prefix="airlock-walkthrough-"))
    data.chmod(0o711)  # sandboxes (uid 65534) traverse it to their workspace
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AIRLOCK_", "DATABASE_URL", "REDIS_URL"))},
           "AIRLOCK_DATA_DIR": str(data / "var"), "AIRLOCK_PORT": str(port)}
    if options.fresh_rootfs:
        env["AIRLOCK_ROOTFS_DIR"] = str(data / "rootfs")
    log = data / "make-run.log"
    started = time.time()
    server = start_make_run(env, log)
    try:
        key = wait_until_serving(server, log, port, options.serve_limit_s)
        served = time.time() - started
        print(f"walkthrough: make run served after {served:.0f} s")
        if options.fresh_rootfs:
            shown = log.read_text(errors="replace")
            built = re.search(r"root filesystem built in (\d+) s", shown)
            if "100%" not in shown or built is None:
                raise StepFailed(f"make run did not show the root filesystem's build and its time:\n{tail(log)}")
            print(f"walkthrough: make run built the root filesystem in {built.group(1)} s")
        check(steps, key, port, started)
        check_cli(options.readme.read_text(), key, port)
    except StepFailed as failure:
        print(f"walkthrough: FAILED: {failure}", file=sys.stderr)
        return 1
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)
    print("walkthrough: every step of the README's walk-through answered as it says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
