"""Sandbox driver latency: p50 / p95 of create, create + first exec, exec of `true`, exec of
`python3 -c pass` and destroy, per driver, with the ratio of exec to a bare subprocess spawn
of the same command measured in the same run; for Docker, also `docker exec … true` (Docker's
own CLI) into the same containers, the floor the daemon sets.

    .venv/bin/python bench/runtimes.py [--runs N] [bubblewrap docker gvisor]

Targets (2 cores): bubblewrap create + first exec p95 <= 30 ms, exec p95 <= 15 ms; docker
create p95 <= 400 ms, exec p95 <= 80 ms; gVisor create p95 <= 700 ms."""

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 60)

import django

django.setup()

from figures import host_notes, percentiles  # noqa: E402 - bench/ is on sys.path when a benchmark runs

from sessions.runtimes import DRIVERS, get_driver  # noqa: E402
from sessions.runtimes.base import ExitStatus, RuntimeUnavailable, SandboxSpec  # noqa: E402

DEFAULT_RUNS = {"bubblewrap": 60, "docker": 25, "gvisor": 12}
DOCKER_CLI = shutil.which("docker") or "/usr/bin/docker"


def ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000




def run_exec(driver, sandbox, argv) -> float:
    started = time.perf_counter()
    events = list(driver.exec(sandbox, argv))
    elapsed = ms(started)
    status = events[-1]
    assert isinstance(status, ExitStatus) and status.exit_code == 0, status
    return elapsed


def bare(argv, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True)
        samples.append(ms(started))
    return samples


def measure(name: str, runs: int) -> dict[str, list[float]]:
    driver = get_driver(name)
    driver.check()
    results = {key: [] for key in ("create", "create + first exec", "exec true", "exec python3 -c pass", "destroy")}
    for _ in range(runs):
        spec = SandboxSpec(tenant="bench", session_id=str(uuid.uuid4()))
        started = time.perf_counter()
        sandbox = driver.create(spec)
        results["create"].append(ms(started))
        run_exec(driver, sandbox, ["true"])
        results["create + first exec"].append(ms(started))
        results["exec true"].append(run_exec(driver, sandbox, ["true"]))
        results["exec python3 -c pass"].append(run_exec(driver, sandbox, ["python3", "-c", "pass"]))
        if "container" in sandbox.handle:  # Docker's own CLI into the same container: the daemon's floor
            started = time.perf_counter()
            subprocess.run([DOCKER_CLI, "exec", "-u", "65534:65534", sandbox.handle["container"], "true"], check=True)
            results.setdefault("docker exec CLI true", []).append(ms(started))
        started = time.perf_counter()
        driver.destroy(sandbox)
        results["destroy"].append(ms(started))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drivers", nargs="*", default=list(DRIVERS))
    parser.add_argument("--runs", type=int, help="sandboxes per driver (default: 60 / 25 / 12)")
    options = parser.parse_args()
    print(f"# sandbox driver latency, {os.cpu_count()} cores, milliseconds\n\n{host_notes()}")
    for name in options.drivers:
        runs = options.runs or DEFAULT_RUNS.get(name, 20)
        try:
            results = measure(name, runs)
        except RuntimeUnavailable as exc:
            print(f"\n## {name}: unavailable: {exc}")
            continue
        # The same programs the sandbox runs: Debian's, not a version manager's shim on PATH.
        baseline = {
            "exec true": percentiles(bare(["/bin/true"], runs))[0],
            "exec python3 -c pass": percentiles(bare(["/usr/bin/python3", "-c", "pass"], runs))[0],
        }

        print(f"\n## {name} ({runs} sandboxes)\n")
        print(f"| {'operation':<22} | {'p50':>8} | {'p95':>8} | {'bare spawn p50':>14} | {'ratio p50':>9} |")
        print(f"|{'-' * 24}|{'-' * 10}|{'-' * 10}|{'-' * 16}|{'-' * 11}|")
        for operation, samples in results.items():
            p50, p95 = percentiles(samples)
            base = baseline.get(operation)
            extra = f"{base:>14.1f} | {p50 / base:>8.1f}x" if base else f"{'':>14} | {'':>9}"
            print(f"| {operation:<22} | {p50:>8.1f} | {p95:>8.1f} | {extra} |")
        if "docker exec CLI true" in results:
            ours, cli = percentiles(results["exec true"])[0], percentiles(results["docker exec CLI true"])[0]
            print(f"\n`exec true` / Docker's own `docker exec` CLI, p50: {ours / cli:.2f}x")


if __name__ == "__main__":
    main()
