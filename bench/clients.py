"""The SDK's per-command overhead against raw HTTP, in the same run on the same server: p50 and
p95 of one command (`true`) run to its end

  raw     one keep-alive http.client POST …/commands with `wait: true` (the baseline)
  sdk     Airlock's Session.run() without a callback: the same single waiting call
  stream  Session.run(on_output=…): queued (202), its output and end followed on the session's
          WebSocket (connected once per session); read back only when the stream missed
          something or the tail was cut
  async   AsyncSession.run() without a callback

Samples are taken round-robin (raw, sdk, stream, async, raw, …) so the machine's noise falls on
all of them alike. Target: sdk p50 <= 1.15x raw p50.

    .venv/bin/python bench/clients.py [--runs N]

It starts its own server like `make run` (fresh data directory, embedded runner, bubblewrap).
Traffic goes to loopback only."""

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airlock import Airlock, AsyncAirlock  # noqa: E402
from bench.figures import percentiles  # noqa: E402
from bench.server import Api, start_server  # noqa: E402

POLICY = "commands:\n  - {id: run-true, bin: 'true'}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="commands per way (default 200)")
    options = parser.parse_args()
    url, key, server, _ = start_server(POLICY)
    loop = asyncio.new_event_loop()
    try:
        raw = Api(url, key)
        raw_session = raw.open("bench")
        client = Airlock(url, key)
        plain, streamed = client.sessions.create("bench-sdk", "bench"), client.sessions.create("bench-stream", "bench")
        aclient = AsyncAirlock(url, key)
        asession = loop.run_until_complete(aclient.sessions.create("bench-async", "bench"))

        ways = {
            "raw": lambda: raw.run(raw_session, "true"),
            "sdk": lambda: plain.run("true"),
            "stream": lambda: streamed.run("true", on_output=lambda piece: None),
            "async": lambda: loop.run_until_complete(asession.run("true")),
        }
        for run in ways.values():  # warm: connections open, the stream subscribed, code paths compiled
            for _ in range(5):
                run()
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(options.runs):
            for name, run in ways.items():
                started = time.perf_counter()
                run()
                samples[name].append((time.perf_counter() - started) * 1000)
        base_p50, base_p95 = percentiles(samples["raw"])
        print(f"per command, {options.runs} runs each, `true` on bubblewrap through a local server:")
        for name, values in samples.items():
            p50, p95 = percentiles(values)
            print(f"  {name:<7} p50 {p50:6.1f} ms  p95 {p95:6.1f} ms   x raw: p50 {p50 / base_p50:.2f}  "
                  f"p95 {p95 / base_p95:.2f}")
        p50 = percentiles(samples["sdk"])[0]
        print(f"target: sdk p50 <= 1.15x raw p50: {'met' if p50 <= 1.15 * base_p50 else 'MISSED'} "
              f"({p50 / base_p50:.2f}x)")
        plain.end()
        streamed.end()
        loop.run_until_complete(asession.end())
        loop.run_until_complete(aclient.aclose())
        client.close()
    finally:
        loop.close()
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
