"""Sessions end to end against a running server on bubblewrap: p50 / p95 of session create,
exec of `true` with `wait` (the API round trip), the delay from a process's write to its
WebSocket receipt, and 20 concurrent sessions x 20 commands. Measured in the same run, the
baselines: a bare driver exec of `true`, one at a time and 20 sandboxes in parallel (the driver
called directly, no server), and Airlock's figures as ratios of them.

    .venv/bin/python bench/sessions.py [--runs N]
        starts its own server like `make run` (fresh data directory, embedded runner)
    .venv/bin/python bench/sessions.py --url http://127.0.0.1:8000 --key alk_… --policy NAME
        an existing server, whose policy NAME allows `true` and `python3`

Then, where Docker runs, session create on Docker and gVisor through the API: from a warm pool
(a server with AIRLOCK_WARM_POOL, given time to refill between creates) and cold (a server
without one), each server of its own.

Targets (2 cores): create p95 <= 50 ms, exec round trip p95 <= 40 ms and <= 2x the bare driver
exec p95, output to WebSocket p95 <= 50 ms, 20 x 20 throughput >= 0.6x the bare driver's at the
same concurrency; Docker and gVisor create from a warm pool p95 <= 50 ms. Traffic goes to
loopback only."""

import argparse
import contextlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 60)

import django  # noqa: E402

django.setup()

from figures import host_notes, percentiles  # noqa: E402 - bench/ is on sys.path when a benchmark runs
from server import Api, start_server  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from sessions.runtimes import get_driver  # noqa: E402
from sessions.runtimes.base import RuntimeUnavailable, SandboxSpec  # noqa: E402

POLICY = """limits: {command_timeout_s: 30, output_tail_chars: 8000}
commands:
  - {id: "true", bin: "true", max_args: 0}
  - {id: python3, bin: python3, deny_args: ["^-"]}
"""
STAMPS = b"import time\nfor _ in range(40):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.02)\n"




def line(name: str, samples: list[float], target: float | None = None) -> str:
    p50, p95 = percentiles(samples)
    verdict = "" if target is None else ("  ok" if p95 <= target else f"  ABOVE target {target:g} ms")
    return f"  {name:<38} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms   (n={len(samples)}){verdict}"


def timed(function, *args) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(*args)
    return (time.perf_counter() - started) * 1000, result


def bench_create(api: Api, policy: str, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        elapsed, session = timed(api.open, policy)
        samples.append(elapsed)
        api.end(session)
    return samples


def bench_pooled_create(driver: str, runs: int) -> None:
    """Session create on `driver` through the API, warm (from a pool of 2) and cold (no pool)."""
    policy = POLICY + f"runtime: {{driver: {driver}}}\n"
    refill_s = {"docker": 1.0, "gvisor": 2.0}[driver]
    for start, env in (("warm pool", {"AIRLOCK_WARM_POOL": f"{driver}:2"}), ("cold", {"AIRLOCK_WARM_POOL": ""})):
        url, key, server, data = start_server(policy, **env)
        try:
            api = Api(url, key)
            api.end(api.open("bench"))  # starts the runner (and its pool), and the pool learns the limits
            samples, warm = [], 0
            for _ in range(runs):
                time.sleep(refill_s)  # an agent's pause: the pool refills meanwhile
                elapsed, session = timed(api.open, "bench")
                samples.append(elapsed)
                warm += bool(session.get("warm"))
                api.end(session)
            print(line(f"{driver} create ({start}), {warm}/{runs} warm", samples, 50 if start == "warm pool" else None))
        finally:
            server.terminate()
            server.wait(30)
            shutil.rmtree(data, ignore_errors=True)


def bench_exec(api: Api, session: dict, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        elapsed, body = timed(api.run, session, "true")
        assert body["exit_code"] == 0, body
        samples.append(elapsed)
    return samples


def bench_stream(api: Api, url: str, session: dict) -> list[float]:
    """Each line the process writes holds its own write time; the delay is receipt - write."""
    status, _ = api.call("PUT", f"/api/v1/sessions/{session['id']}/files/stamps.py", raw=STAMPS,
                         token=session["token"])
    assert status == 204
    ws_url = url.replace("http://", "ws://") + session["stream_url"]
    delays = []
    with connect(ws_url, subprotocols=["airlock.v1", f"airlock.token.{session['token']}"],
                 origin="http://127.0.0.1") as ws:
        json.loads(ws.recv(timeout=10))  # the opening state
        api.run(session, "python3", "stamps.py", wait=False)
        while True:
            event = json.loads(ws.recv(timeout=30))
            received = time.time()
            if event["event"] == "command.output":
                delays += [(received - float(stamp)) * 1000 for stamp in event["data"].split()]
            elif event["event"] == "command.exited":
                return delays


def bench_concurrent(url: str, key: str, policy: str, sessions: int, commands: int) -> tuple[list[float], float, float]:
    """Per-command round trips; the seconds from the first command to the last one's answer (the
    sessions are all open by then, as the bare driver's sandboxes are); and the seconds from the
    first open to the last end."""
    samples: list[float] = []
    lock = threading.Lock()
    failures: list[BaseException] = []
    opened = threading.Barrier(sessions + 1)
    ran: list[float] = []

    def agent() -> None:
        try:
            api = Api(url, key)
            session = api.open(policy)
        except BaseException as exc:  # reported after the run
            failures.append(exc)
            opened.abort()
            return
        try:
            opened.wait()
            mine = bench_exec(api, session, commands)
            with lock:
                samples.extend(mine)
                ran.append(time.perf_counter())
        except BaseException as exc:
            failures.append(exc)
        finally:
            api.end(session)  # an existing server (--url) keeps no session of a failed run

    threads = [threading.Thread(target=agent) for _ in range(sessions)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # an open failed: raised below
        opened.wait()
    first_command = time.perf_counter()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return samples, max(ran) - first_command, time.perf_counter() - started


def bare_exec(driver, sandbox, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        elapsed, events = timed(lambda: list(driver.exec(sandbox, ["true"])))
        assert events[-1].exit_code == 0
        samples.append(elapsed)
    return samples


def bench_bare_driver(runs: int) -> list[float]:
    driver = get_driver("bubblewrap")
    sandbox = driver.create(SandboxSpec(tenant="bench", session_id=str(uuid.uuid4())))
    try:
        return bare_exec(driver, sandbox, runs)
    finally:
        driver.destroy(sandbox)


def bench_bare_concurrent(sandboxes: int, commands: int) -> float:
    """Commands per second of `true` through the driver itself, `sandboxes` in parallel."""
    driver = get_driver("bubblewrap")
    created = [driver.create(SandboxSpec(tenant="bench", session_id=str(uuid.uuid4()))) for _ in range(sandboxes)]
    try:
        threads = [threading.Thread(target=bare_exec, args=(driver, sandbox, commands)) for sandbox in created]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sandboxes * commands / (time.perf_counter() - started)
    finally:
        for sandbox in created:
            driver.destroy(sandbox)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--key")
    parser.add_argument("--policy", default="bench")
    parser.add_argument("--runs", type=int, default=100)
    options = parser.parse_args()
    server = data = None
    if options.url:
        url, key = options.url, options.key
    else:
        url, key, server, data = start_server(POLICY)
    try:
        api = Api(url, key)
        api.open(options.policy)  # the first request starts the embedded runner: not measured
        session = api.open(options.policy)
        bench_exec(api, session, 10)  # warm-up
        print(f"Airlock sessions benchmark against {url} (bubblewrap); {host_notes()}")
        create = bench_create(api, options.policy, max(20, options.runs // 2))
        print(line("session create (POST /sessions)", create, 50))
        exec_round_trip = bench_exec(api, session, options.runs)
        print(line("exec `true` round trip (wait: true)", exec_round_trip, 40))
        stream = bench_stream(api, url, session)
        print(line("process write -> WebSocket receipt", stream, 50))
        concurrent, commands_s, whole_s = bench_concurrent(url, key, options.policy, 20, 20)
        print(line("20 sessions x 20 commands, per command", concurrent))
        airlock_rate = len(concurrent) / commands_s
        print(f"  {'':<38} {len(concurrent)} commands in {commands_s:.2f} s = {airlock_rate:.0f} commands/s "
              f"({len(concurrent) / whole_s:.0f}/s counting the 20 opens and ends)")
        api.end(session)
        bare = bench_bare_driver(options.runs)
        print(line("bare driver exec `true` (same machine)", bare))
        bare_rate = bench_bare_concurrent(20, 20)
        print(f"  {'bare driver, 20 sandboxes x 20 `true`':<38} {bare_rate:.0f} commands/s")
        throughput = airlock_rate / bare_rate
        print(f"  throughput, Airlock 20 x 20 / bare driver 20 in parallel: {throughput:.2f}x"
              f"  {'ok' if throughput >= 0.6 else 'BELOW target 0.60x'}")
        ratio = percentiles(exec_round_trip)[1] / percentiles(bare)[1]
        print(f"  exec round trip / bare driver exec (p95): {ratio:.2f}x"
              f"  {'ok' if ratio <= 2 else 'ABOVE target 2.00x'}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
            shutil.rmtree(data, ignore_errors=True)
    if options.url:
        return
    for driver in ("docker", "gvisor"):
        try:
            get_driver(driver).check()
        except RuntimeUnavailable as exc:
            print(f"  {driver} create: unavailable here ({exc})")
            continue
        bench_pooled_create(driver, max(12, options.runs // 5))


if __name__ == "__main__":
    main()
