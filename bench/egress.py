"""Egress through a session's proxy, against the same traffic straight to loopback, in one run.

Starts a server like `make run` (bubblewrap) whose test-only resolver setting maps `files.test`
and `echo.test` to upstreams on loopback (tests/upstreams.py), opens a session whose policy
allows both, and runs bench/egress_client.py inside its sandbox (through the forwarder and the
proxy, each connection judged and recorded) and on the host (direct), printing:

- a download of --megabytes (100) MB, --downloads (5) times each way, interleaved: median MB/s
  through the proxy / direct (target >= 0.8x);
- new connections one at a time, each through to a one-byte echo: p50 / p95 through the proxy
  and direct, and what the proxy adds (target p95 <= 5 ms);
- new connections per second through one session's proxy, 8 clients at once (target >= 500/s),
  beside the same clients direct.

    .venv/bin/python bench/egress.py [--megabytes N] [--downloads N] [--connections N] [--seconds S]

Traffic goes to loopback only."""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from figures import host_notes, percentiles  # noqa: E402 - bench/ is on sys.path when a benchmark runs
from server import Api, start_server  # noqa: E402

from tests.upstreams import Upstreams  # noqa: E402

CLIENT = Path(__file__).with_name("egress_client.py")
POLICY = """limits: {command_timeout_s: 300, cpus: 2, pids: 512, memory_mb: 512, output_tail_chars: 200000}
commands:
  - {id: python3, bin: python3}
network: {egress: allowlist, allow: ["files.test:80", "echo.test:8080"]}
"""


def in_sandbox(api: Api, session: dict, *args: str) -> dict:
    body = api.run(session, "python3", "egress_client.py", *args)
    assert body["exit_code"] == 0, body["output"]
    return json.loads(body["output"].strip().splitlines()[-1])


def on_host(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(CLIENT), *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--downloads", type=int, default=5)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=5)
    options = parser.parse_args()
    upstreams = Upstreams(Path(tempfile.mkdtemp(prefix="airlock-bench-upstreams-")))
    http_port, echo_port = upstreams.port(upstreams.http), upstreams.port(upstreams.echo)
    url, key, server, data = start_server(POLICY, AIRLOCK_EGRESS_TEST_HOSTS=(
        f"files.test=127.0.0.1:{http_port},echo.test=127.0.0.1:{echo_port}"))
    try:
        api = Api(url, key)
        session = api.open("bench")
        status, _ = api.call("PUT", f"/api/v1/sessions/{session['id']}/files/egress_client.py",
                             raw=CLIENT.read_bytes(), token=session["token"])
        assert status == 204
        size = options.megabytes * 10**6
        print(f"Airlock egress benchmark against {url} (bubblewrap, one session's proxy); {host_notes()}")

        in_sandbox(api, session, "download", "proxy", "files.test", "80", "bytes/1000000")  # warm-up
        proxied, direct = [], []
        for _ in range(options.downloads):  # interleaved, so both see the same moments of a noisy machine
            proxied.append(in_sandbox(api, session, "download", "proxy", "files.test", "80", f"bytes/{size}"))
            direct.append(on_host("download", "direct", "127.0.0.1", str(http_port), f"bytes/{size}"))
        assert all(run["bytes"] == size for run in proxied + direct)
        through = statistics.median(run["mb_per_s"] for run in proxied)
        straight = statistics.median(run["mb_per_s"] for run in direct)
        ratio = through / straight
        print(f"  download {options.megabytes} MB, median of {options.downloads}  through the proxy {through:7.0f} MB/s"
              f"   direct {straight:7.0f} MB/s   ratio {ratio:.2f}x"
              + ("  ok" if ratio >= 0.8 else "  BELOW target 0.8x"))

        count = str(options.connections)
        through = in_sandbox(api, session, "connect", "proxy", "echo.test", "8080", count)["samples_ms"]
        straight = on_host("connect", "direct", "127.0.0.1", str(echo_port), count)["samples_ms"]
        (p50, p95), (d50, d95) = percentiles(through), percentiles(straight)
        print(f"  new connection + 1-byte echo     through the proxy p50 {p50:5.2f} ms p95 {p95:5.2f} ms   "
              f"direct p50 {d50:5.2f} ms p95 {d95:5.2f} ms")
        print(f"  added by the proxy               p50 {p50 - d50:5.2f} ms p95 {p95 - d95:5.2f} ms"
              + ("  ok" if p95 - d95 <= 5 else "  ABOVE target 5 ms") + f"   (n={len(through)})")

        seconds = str(options.seconds)
        rate = in_sandbox(api, session, "rate", "proxy", "echo.test", "8080", seconds, "8")
        base = on_host("rate", "direct", "127.0.0.1", str(echo_port), seconds, "8")
        print(f"  connections/s, 8 clients         through the proxy {rate['per_s']:6.0f}/s   "
              f"direct {base['per_s']:6.0f}/s   ratio {rate['per_s'] / base['per_s']:.2f}x   "
              f"(failed: {rate['failed']})" + ("  ok" if rate["per_s"] >= 500 else "  BELOW target 500/s"))
        api.end(session)
    finally:
        server.terminate()
        server.wait(30)
        upstreams.close()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(upstreams.root, ignore_errors=True)


if __name__ == "__main__":
    main()
