"""One tenant's load against another's latency. Tenant A's session create and exec round trip
(p50 / p95) alone, then while tenant B attacks: a FIFO read by 64 parallel callers (and reads
queued behind a long command), an output flood (lines full of `password=` to redact), empty
WebSocket pings sent as fast as 8 session streams take them, and 50 sessions opened at once,
each running commands. Same server, same run; the ratio of A's p95 under each attack to A's p95
alone is printed with its verdict (target <= 2x).

Last, the floor below Airlock: the same contest as the 50 sessions, on the bubblewrap driver
itself. A's `true` through the driver directly, alone and while as many sandboxes as B was
admitted run loop.py at the pace B ran it through Airlock (from another process: no server, no
API, no database).

    .venv/bin/python bench/fairness.py [--runs N] [--seconds S]

Starts its own server like `make run` (fresh data directory, embedded runner, bubblewrap).
Traffic goes to loopback only."""

import argparse
import contextlib
import os
import re
import shutil
import socket
import subprocess
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

from django.conf import settings  # noqa: E402 - the server's defaults are this host's too
from figures import host_notes, percentiles  # noqa: E402 - bench/ is on sys.path when a benchmark runs
from server import Api, start_server  # noqa: E402

from sessions.runtimes import get_driver  # noqa: E402
from sessions.runtimes.base import SandboxSpec  # noqa: E402

POLICY = """limits: {command_timeout_s: 60, output_tail_chars: 4000}
commands:
  - {id: "true", bin: "true", max_args: 0}
  - {id: python3, bin: python3, deny_args: ["^-"]}
  - {id: sleep, bin: sleep, allow_args: ["^[0-9]+$"]}
"""
SEED_B = ("import os; from controlplane import services as c; from controlplane.models import ApiKeyScope; "
          "from policies_app import services as s; t = c.tenant_create(slug='tenant-b', name='Tenant B'); "
          "p = s.policy_create(tenant=t, name='bench', actor=None); "
          "v = s.version_create(policy=p, actor=None, source=os.environ['BENCH_POLICY']); "
          "s.version_publish(version=v, actor=None, note='bench'); "
          "print(c.api_key_create(tenant=t, name='b', scopes=[ApiKeyScope.SESSIONS], actor=None).key)")
MKFIFO = b"import os\nos.mkfifo('pipe')\n"
FLOOD = (b"import sys\nline = 'password=hunter2hunter2 token=abcdefabcdef ' * 40 + '\\n'\n"
         b"while True:\n    sys.stdout.write(line)\n")
LOOP = b"import time\nfor _ in range(20):\n    time.sleep(0.01)\n"


def tenant_a(url: str, key: str, runs: int) -> tuple[list[float], list[float]]:
    """A's figures: `runs` / 2 session creates (each ended), and `runs` exec round trips of `true`.
    A keeps to four fifths of its tenant's API rate, as an agent that is not refused would: at
    full speed its own requests would wait for their turn, and A alone would measure its pacing."""
    api = Api(url, key)
    interval = 1 / (0.8 * settings.AIRLOCK_API_RATE_PER_TENANT)  # between two requests' starts
    turn = time.perf_counter()

    def paced(requests: int) -> None:
        nonlocal turn
        time.sleep(max(0.0, turn - time.perf_counter()))
        turn = max(turn, time.perf_counter()) + requests * interval

    creates = []
    for _ in range(max(5, runs // 2)):
        paced(2)
        started = time.perf_counter()
        session = api.open("bench")
        creates.append((time.perf_counter() - started) * 1000)
        api.end(session)
    paced(1)
    session = api.open("bench")
    execs = []
    for _ in range(runs):
        paced(1)
        started = time.perf_counter()
        body = api.run(session, "true")
        execs.append((time.perf_counter() - started) * 1000)
        assert body["exit_code"] == 0, body
    paced(1)
    api.end(session)
    return creates, execs


class Attack:
    """Tenant B's load on threads of its own, from start() until stop()."""

    def __init__(self, url: str, key: str):
        self.url, self.key = url, key
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.answers: dict[int, int] = {}
        self.sessions: list[dict] = []  # B's, ended after the attack
        self.lock = threading.Lock()

    def count(self, status: int) -> None:
        with self.lock:
            self.answers[status] = self.answers.get(status, 0) + 1

    def spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self) -> str:
        self.stopping.set()
        for thread in self.threads:
            thread.join(120)
        return ", ".join(f"{count} x {status}" for status, count in sorted(self.answers.items()))


def fifo_attack(attack: Attack) -> None:
    api = Api(attack.url, attack.key)
    fifo, busy = api.open("bench"), api.open("bench")
    assert api.call("PUT", f"/api/v1/sessions/{fifo['id']}/files/mkfifo.py", raw=MKFIFO, token=fifo["token"])[0] == 204
    api.run(fifo, "python3", "mkfifo.py")
    api.run(busy, "sleep", "50", wait=False)  # reads of this session queue behind it

    def reader(session: dict, path: str) -> None:
        mine = Api(attack.url, attack.key)
        while not attack.stopping.is_set():
            status, _ = mine.call("GET", f"/api/v1/sessions/{session['id']}/files/{path}", token=session["token"])
            attack.count(status)
            if status == 429:
                time.sleep(0.05)

    for index in range(64):
        attack.spawn(reader, *((fifo, "pipe") if index % 2 else (busy, "anything")))
    attack.sessions = [fifo, busy]


def flood_attack(attack: Attack) -> None:
    api = Api(attack.url, attack.key)
    attack.sessions = [api.open("bench") for _ in range(4)]
    for session in attack.sessions:
        api.call("PUT", f"/api/v1/sessions/{session['id']}/files/flood.py", raw=FLOOD, token=session["token"])

        def flood(session=session) -> None:
            mine = Api(attack.url, attack.key)
            while not attack.stopping.is_set():
                attack.count(mine.call("POST", f"/api/v1/sessions/{session['id']}/commands",
                                       {"bin": "python3", "args": ["flood.py"], "wait": True, "timeout_s": 5},
                                       token=session["token"])[0])

        attack.spawn(flood)


def ping_attack(attack: Attack) -> None:
    """8 of B's session streams, each sent empty pings as fast as it takes them (pongs read)."""
    api = Api(attack.url, attack.key)
    attack.sessions = [api.open("bench") for _ in range(2)]
    port = int(attack.url.rsplit(":", 1)[1])
    for index in range(8):
        session = attack.sessions[index % 2]
        stream = socket.create_connection(("127.0.0.1", port), timeout=10)
        stream.sendall(f"GET {session['stream_url']} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                       "Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1\r\n"
                       f"Sec-WebSocket-Protocol: airlock.v1, airlock.token.{session['token']}\r\n\r\n".encode())
        attack.count(int(stream.recv(65536).split()[1]))

        def read(stream=stream) -> None:
            with contextlib.suppress(OSError):
                while stream.recv(65536):
                    pass

        def ping(stream=stream) -> None:
            burst = (b"\x89\x80" + b"\x00" * 4) * 10_000  # masked, empty: 6 bytes each
            with contextlib.suppress(OSError):
                while not attack.stopping.is_set():
                    stream.sendall(burst)
            stream.close()

        attack.spawn(read)
        attack.spawn(ping)


def sessions_attack(attack: Attack) -> None:
    def agent() -> None:
        mine = Api(attack.url, attack.key)
        status, session = mine.call("POST", "/api/v1/sessions", {"conversation_id": "b", "policy": "bench"})
        attack.count(status)
        if status != 201:
            return
        with attack.lock:
            attack.sessions.append(session)
        mine.call("PUT", f"/api/v1/sessions/{session['id']}/files/loop.py", raw=LOOP, token=session["token"])
        while not attack.stopping.is_set():
            attack.count(mine.call("POST", f"/api/v1/sessions/{session['id']}/commands",
                                   {"bin": "python3", "args": ["loop.py"], "wait": True}, token=session["token"])[0])

    for _ in range(50):
        attack.spawn(agent)


def end_all(url: str, key: str, sessions: list[dict]) -> None:
    api = Api(url, key)
    for session in sessions:
        with contextlib.suppress(Exception):
            api.end(session)


def driver_true(driver, sandbox, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        events = list(driver.exec(sandbox, ["true"]))
        samples.append((time.perf_counter() - started) * 1000)
        assert events[-1].exit_code == 0, events[-1]
    return samples


def floor(sandboxes: int, per_s: float, runs: int, seconds: float) -> tuple[list[float], list[float], str]:
    """A's `true` through the driver, alone and while `sandboxes` of B's loop (see churn()),
    and B's commands a second."""
    driver = get_driver("bubblewrap")
    sandbox = driver.create(SandboxSpec(tenant="bench-a", session_id=str(uuid.uuid4())))
    try:
        driver_true(driver, sandbox, 10)  # warm-up
        alone = driver_true(driver, sandbox, runs)
        load = subprocess.Popen([sys.executable, __file__, "--churn", str(sandboxes), "--pace", str(per_s)], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert load.stdout.readline() == b"running\n", "the load did not start"
            time.sleep(seconds)
            under = driver_true(driver, sandbox, runs)
        finally:
            rate = load.communicate(b"", timeout=120)[0].decode().strip()
        return alone, under, rate
    finally:
        driver.destroy(sandbox)


def churn(sandboxes: int, per_s: float) -> None:
    """B below Airlock: `sandboxes` sandboxes run loop.py, `per_s` a second in all (at most one
    at a time in each), until stdin closes."""
    driver = get_driver("bubblewrap")
    created = [driver.create(SandboxSpec(tenant="bench-b", session_id=str(uuid.uuid4()))) for _ in range(sandboxes)]
    stopping = threading.Event()
    ran = []

    def loop(sandbox) -> None:
        while not stopping.is_set():
            started = time.perf_counter()
            list(driver.exec(sandbox, ["python3", "loop.py"]))
            ran.append(1)
            stopping.wait(sandboxes / per_s - (time.perf_counter() - started))

    try:
        for sandbox in created:
            (Path(sandbox.handle["workspace"]) / "loop.py").write_bytes(LOOP)
        threads = [threading.Thread(target=loop, args=(sandbox,)) for sandbox in created]
        for thread in threads:
            thread.start()
        print("running", flush=True)
        started = time.perf_counter()
        sys.stdin.read()
        stopping.set()
        print(f"{len(ran) / (time.perf_counter() - started):.0f}", flush=True)
        for thread in threads:
            thread.join()
    finally:
        for sandbox in created:
            driver.destroy(sandbox)


def line(name: str, samples: list[float], alone: list[float] | None = None) -> str:
    p50, p95 = percentiles(samples)
    text = f"  {name:<44} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms   (n={len(samples)})"
    if alone is not None:
        ratio = p95 / percentiles(alone)[1]
        text += f"   {ratio:.2f}x alone  {'ok' if ratio <= 2 else 'ABOVE target 2.00x'}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=3, help="of each attack before A is measured")
    parser.add_argument("--churn", type=int, help=argparse.SUPPRESS)  # the floor's load, in a process of its own
    parser.add_argument("--pace", type=float, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.churn:
        return churn(options.churn, options.pace)
    url, key_a, server, data = start_server(POLICY, admission=True)  # the deployment's own limits
    env = {**{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}},
           "AIRLOCK_DATA_DIR": str(data), "SECRET_KEY": "bench-only-" + "x" * 60, "BENCH_POLICY": POLICY}
    seeded = subprocess.run([sys.executable, "manage.py", "shell", "-c", SEED_B], cwd=ROOT, env=env, check=True,
                            capture_output=True, text=True)
    key_b = re.search(r"alk_\S+", seeded.stdout).group(0)
    try:
        Api(url, key_a).open("bench")  # the first request starts the embedded runner: not measured
        tenant_a(url, key_a, 10)  # warm-up
        print(f"Fairness benchmark against {url} (bubblewrap); {host_notes()}")
        alone_create, alone_exec = tenant_a(url, key_a, options.runs)
        print(line("A alone: session create", alone_create))
        print(line("A alone: exec `true` round trip", alone_exec))
        attacks = (("B's FIFO reads (64 callers)", fifo_attack), ("B's output flood (4 sessions)", flood_attack),
                   ("B's WebSocket pings (8 streams)", ping_attack), ("B's 50 sessions at once", sessions_attack))
        load = (0, 0.0)  # B's sessions and commands a second in the 50 sessions: the floor's load
        for name, start in attacks:
            attack = Attack(url, key_b)
            started = time.perf_counter()
            start(attack)
            time.sleep(options.seconds)
            create, execs = tenant_a(url, key_a, options.runs)
            answers = attack.stop()
            rate = attack.answers.get(200, 0) / (time.perf_counter() - started)
            end_all(url, key_b, attack.sessions)
            if start is sessions_attack:
                load = (len(attack.sessions), rate)
            print(f"  while {name}: B's answers {answers}" + (f"; {rate:.0f} a second ran" if rate else ""))
            print(line("    A: session create", create, alone_create))
            print(line("    A: exec `true` round trip", execs, alone_exec))
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(data, ignore_errors=True)
    sandboxes, per_s = load
    if not per_s:
        sys.exit("no floor: B's 50 sessions ran no command")
    alone, under, ran = floor(sandboxes, per_s, options.runs, options.seconds)
    print(f"  the floor, on the driver itself (no server): {sandboxes} sandboxes of B run loop.py, {ran} a second")
    print(line("    A alone: driver exec `true`", alone))
    print(line(f"    A while B's {sandboxes} sandboxes loop", under, alone))


if __name__ == "__main__":
    main()
