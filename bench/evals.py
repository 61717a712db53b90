"""The containment eval's wall time per driver, against the demo policy, beside a same-run baseline.

Sets up a data directory as `make run` does (migrate, demo_setup), maps the demo policy's egress
hosts (pypi.org, files.pythonhosted.org) to a TLS server on loopback through the test-only
resolver setting (tests/upstreams.py), then per driver:

- the eval: `manage.py containment_eval --driver D --json`, every probe (target: under 60 s);
- the baseline: as many sessions as there are probes, each opened, given one `python3 probe.py`
  that prints a line, and ended, through the same broker and runner: what the eval would cost if
  its probes did nothing hostile.

    .venv/bin/python bench/evals.py [--driver D ...]

Traffic goes to loopback only."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.upstreams import Upstreams  # noqa: E402 - after the repository is on sys.path

BASELINE = """
import json, sys, time
from controlplane.models import Tenant
from sessions.evals.probes import PROBES
from sessions.evals.suite import Context, eval_version
from sessions.runner.thread import runner_in_thread
tenant = Tenant.objects.get(slug="demo")
version = tenant.policies.get(name="default").published_version()
seconds = {}
with runner_in_thread("bench-evals"):
    for driver in sys.argv[1:] or DRIVERS:
        context = Context(tenant, eval_version(tenant, version, driver), driver)
        began = time.monotonic()
        for _ in PROBES:
            context.run(context.open().session, "print('{}')")
            context.close()
        seconds[driver] = time.monotonic() - began
print(json.dumps(seconds))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", action="append", choices=["bubblewrap", "docker", "gvisor"])
    drivers = parser.parse_args().driver or ["bubblewrap", "docker", "gvisor"]
    data = Path(tempfile.mkdtemp(prefix="airlock-bench-"))
    data.chmod(0o711)
    upstreams = Upstreams(data / "upstreams")
    tls = f"127.0.0.1:{upstreams.port(upstreams.tls)}"
    env = {**{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}},
           "AIRLOCK_DATA_DIR": str(data), "SECRET_KEY": "bench-only-" + "x" * 60, "AIRLOCK_LOG_LEVEL": "ERROR",
           "AIRLOCK_EGRESS_TEST_HOSTS": f"pypi.org={tls},files.pythonhosted.org={tls}"}

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)

    try:
        manage("migrate", "--no-input", "-v", "0").check_returncode()
        manage("demo_setup").check_returncode()
        done = manage("containment_eval", *(f"--driver={driver}" for driver in drivers), "--json")
        cards = json.loads(done.stdout)
        baseline = manage("shell", "-c", BASELINE.replace("sys.argv[1:] or DRIVERS", repr(drivers)))
        baseline.check_returncode()
        bare = json.loads(baseline.stdout.strip().splitlines()[-1])
    finally:
        upstreams.close()
    print(f"containment eval of the demo policy, {len(cards[0]['results'])} probes (egress to loopback upstreams):")
    for card in cards:
        failed = [result["probe"] for result in card["results"] if not result["passed"]]
        outcome = f"failed: {failed}" if failed else "every probe passed"
        print(f"  {card['driver']:10} {card['seconds']:6.1f} s, {outcome}; baseline (one bare session and command "
              f"per probe) {bare[card['driver']]:5.1f} s: {card['seconds'] / bare[card['driver']]:.2f}x")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
