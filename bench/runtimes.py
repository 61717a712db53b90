"""Sandbox driver latency: p50 / p95 of create, create + first exec, exec of `true` (five in each
sandbox, after its first), exec of `python3 -c pass` and destroy, per driver, with the ratio of
exec to a bare subprocess spawn of the same command measured in the same run. For Docker and
gVisor also: `docker exec … true` (Docker's own CLI) into the same containers, the reference;
`create (warm pool)`, a claim from a warm pool (sessions/runtimes/pool.py) refilled between
claims; `create (cold)`; and a bare `docker run -d` of the same image (started, not waited
for), the floor of a cold start.

    .venv/bin/python bench/runtimes.py [--runs N] [bubblewrap docker gvisor]

Targets (2 cores), against figures of the same run: Docker exec `true` p95 <= 1.5x bubblewrap's,
gVisor's <= 2x; create from a warm pool p95 <= 50 ms; create (cold) p95 <= 1.2x the bare
`docker run`; bubblewrap create + first exec p95 <= 30 ms, exec p95 <= 15 ms."""

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

from sessions.runtimes import DRIVERS, get_driver, rootfs  # noqa: E402
from sessions.runtimes.base import ExitStatus, Limits, RuntimeUnavailable, SandboxSpec  # noqa: E402
from sessions.runtimes.pool import WarmPool  # noqa: E402

DEFAULT_RUNS = {"bubblewrap": 60, "docker": 25, "gvisor": 12}
# `exec true` samples in each sandbox after its first exec: one each made gVisor's p95 (of 12) a single sample.
EXECS_PER_SANDBOX = 5
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
    create = "create (cold)" if driver.supports_pool else "create"
    results = {key: [] for key in (create, "create + first exec", "exec true", "exec python3 -c pass", "destroy")}
    for _ in range(runs):
        spec = SandboxSpec(tenant="bench", session_id=str(uuid.uuid4()))
        started = time.perf_counter()
        sandbox = driver.create(spec)
        results[create].append(ms(started))
        run_exec(driver, sandbox, ["true"])
        results["create + first exec"].append(ms(started))
        results["exec true"] += [run_exec(driver, sandbox, ["true"]) for _ in range(EXECS_PER_SANDBOX)]
        results["exec python3 -c pass"].append(run_exec(driver, sandbox, ["python3", "-c", "pass"]))
        if "container" in sandbox.handle:  # Docker's own CLI into the same container: the daemon's floor
            started = time.perf_counter()
            subprocess.run([DOCKER_CLI, "exec", "-u", "65534:65534", sandbox.handle["container"], "true"], check=True)
            results.setdefault("docker exec CLI true", []).append(ms(started))
        started = time.perf_counter()
        driver.destroy(sandbox)
        results["destroy"].append(ms(started))
    if driver.supports_pool:
        results["create (warm pool)"] = warm_claims(driver, runs)
        results["bare docker run -d"] = docker_runs(name, runs)
    return results


def warm_claims(driver, runs: int) -> list[float]:
    """A session's create from a pool of two, refilled (untimed) before each claim."""
    pool, samples = WarmPool(driver, 2, Limits()), []
    try:
        for _ in range(runs):
            while pool.wanted():
                pool.fill_once()
            started = time.perf_counter()
            sandbox = pool.claim(SandboxSpec(tenant="bench", session_id=str(uuid.uuid4())))
            samples.append(ms(started))
            assert sandbox is not None and sandbox.warm
            driver.destroy(sandbox)
    finally:
        pool.drain()
    return samples


def docker_runs(name: str, runs: int) -> list[float]:
    """Docker's own CLI starting a container of the same image (no network, detached: it
    returns once the container runs), removed untimed: the floor of a cold create."""
    samples = []
    runtime = ["--runtime", "runsc"] if name == "gvisor" else []
    for _ in range(runs):
        started = time.perf_counter()
        container = subprocess.run([DOCKER_CLI, "run", "-d", "--pull", "never", "--network", "none", *runtime,
                                    rootfs.IMAGE, "sleep", "infinity"], check=True, capture_output=True, text=True)
        samples.append(ms(started))
        subprocess.run([DOCKER_CLI, "rm", "-f", container.stdout.strip()], check=True, capture_output=True)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drivers", nargs="*", default=list(DRIVERS))
    parser.add_argument("--runs", type=int, help="sandboxes per driver (default: 60 / 25 / 12)")
    options = parser.parse_args()
    print(f"# sandbox driver latency, {os.cpu_count()} cores, milliseconds\n\n{host_notes()}")
    exec_p95: dict[str, float] = {}
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
        exec_p95[name] = percentiles(results["exec true"])[1]
        if "docker exec CLI true" in results:
            ours, cli = percentiles(results["exec true"])[0], percentiles(results["docker exec CLI true"])[0]
            print(f"\n`exec true` / Docker's own `docker exec` CLI, p50: {ours / cli:.2f}x")
        if "bubblewrap" in exec_p95 and name != "bubblewrap":
            target = 1.5 if name == "docker" else 2.0
            print(f"`exec true` p95 / bubblewrap's in this run: {exec_p95[name] / exec_p95['bubblewrap']:.2f}x "
                  f"(target <= {target}x)")
        if "create (warm pool)" in results:
            warm, cold = percentiles(results["create (warm pool)"])[1], percentiles(results["create (cold)"])[1]
            bare_run = percentiles(results["bare docker run -d"])[1]
            print(f"`create (warm pool)` p95: {warm:.1f} ms (target <= 50 ms); `create (cold)` p95 / bare "
                  f"`docker run -d` p95: {cold / bare_run:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
