"""The live terminal in real Chromium: how long 100,000 lines of a command's output take to be
drawn, from the command's POST to its last line (and its exit) on the session page, against the
command's own run time measured by the runner in the same run (the baseline: a page can show the
last line no sooner). Target: the last line drawn within 3 s, the tab answering throughout.

    .venv/bin/python bench/terminal.py [--runs N] [--lines N] [--paced]

It starts its own server like `make run` (fresh data directory, embedded runner, bubblewrap), with
the tenant's output pace raised out of the way (a benchmark of the browser, not of the pacing;
`--paced` keeps the deployment's defaults, AIRLOCK_OUTPUT_BYTES_PER_S among them), and
Debian's chromium through Playwright. Traffic goes to loopback only."""

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from bench.figures import percentiles  # noqa: E402
from bench.server import Api, start_server  # noqa: E402

POLICY = "limits: {command_timeout_s: 120}\ncommands:\n  - {id: python3, bin: python3}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--paced", action="store_true", help="keep the default per-tenant limits and output pace")
    options = parser.parse_args()
    url, key, server, data = start_server(POLICY, admission=options.paced)
    password = re.search(r"password: (\S+)", (data / "demo_setup.txt").read_text()).group(1)
    api = Api(url, key)
    script = f"for i in range(1, {options.lines + 1}): print(i)\n".encode()
    drawn, ran, answers = [], [], []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                 args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url + "/")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(password)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(re.compile(r"/sessions/$"))
            for _ in range(options.runs):
                session = api.open("bench")
                api.call("PUT", f"/api/v1/sessions/{session['id']}/files/lines.py", raw=script, token=session["token"])
                page.goto(f"{url}/t/demo/sessions/{session['id']}/")
                page.wait_for_selector("[data-live-status]:text('live')")
                started = time.monotonic()
                command = api.run(session, "python3", "lines.py", wait=False)
                page.wait_for_function("() => (Airlock.terminalLines().at(-1) || '').startsWith('[exit')",
                                       timeout=120_000, polling=20)
                drawn.append((time.monotonic() - started) * 1000)
                shown = page.evaluate("Airlock.terminalLines()")
                assert str(options.lines) in shown[-3:], shown[-3:]
                asked = time.monotonic()
                page.evaluate("1 + 1")
                answers.append((time.monotonic() - asked) * 1000)
                _, stored = api.call("GET", f"/api/v1/sessions/{session['id']}/commands/{command['id']}",
                                          token=session["token"])
                ran.append(stored["duration_ms"])
                api.end(session)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    drawn_p50, drawn_p95 = percentiles(drawn)
    ran_p50, ran_p95 = percentiles(ran)
    pace = "the default output pace" if options.paced else "output unpaced"
    print(f"terminal: {options.lines:,} lines, {options.runs} runs, {pace} (ms, p50 / p95)")
    print(f"  command's own run time (baseline)  {ran_p50:8.0f} / {ran_p95:8.0f}")
    print(f"  POST to last line drawn            {drawn_p50:8.0f} / {drawn_p95:8.0f}"
          f"   {drawn_p50 / ran_p50:.2f}x the run time at p50 (target: last line within 3000 ms)")
    print(f"  the tab answering right after      {percentiles(answers)[1]:8.1f} (p95)")


if __name__ == "__main__":
    main()
