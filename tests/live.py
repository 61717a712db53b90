"""A real server started the way `make run` starts it (fresh data directory, migrate,
demo_setup, controlplane.serve), for the tests that drive it from outside: a browser, the SDK,
the CLI, an MCP client. Its sandboxes reach loopback upstreams only, through their egress proxy."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.upstreams import Upstreams

ROOT = Path(__file__).resolve().parents[1]


# Recorded traffic for replay: an agent asked three times for `make test`, which is denied.
SEED_DECISIONS = (
    "from controlplane.models import Tenant; from policies_app.decisions import decide; "
    "t = Tenant.objects.get(slug='demo'); p = t.policies.get(name='default'); "
    "[decide(tenant=t, policy=p, request={'bin': 'make', 'args': ['test']}) for _ in range(3)]"
)

# A second policy for operator tests: `sleep` runs long enough to be killed by hand.
OPS_POLICY = """limits: {command_timeout_s: 900}
commands:
  - {id: sleep, bin: sleep, allow_args: ["^[0-9]+$"]}
  - {id: python3, bin: python3, deny_args: ["^-"]}
"""
# A third for egress tests: the sandbox may reach pypi.test, and nothing else yet.
NET_POLICY = """commands:
  - {id: python3, bin: python3}
network: {egress: allowlist, allow: ["pypi.test:80"]}
"""
SEED_POLICIES = (
    "import os; from controlplane.models import Tenant; from policies_app import services as s; "
    "t = Tenant.objects.get(slug='demo')\n"
    "for name in ('ops', 'net'):\n"
    "    p = s.policy_create(tenant=t, name=name, actor=None)\n"
    "    v = s.version_create(policy=p, actor=None, source=os.environ[name.upper() + '_POLICY'])\n"
    "    s.version_publish(version=v, actor=None, note=name)"
)


@dataclass
class DemoServer:
    url: str
    password: str
    api_key: str
    env: dict

    def manage(self, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**self.env, **extra_env},
                              capture_output=True, text=True, timeout=60, check=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_listening(port: int, process: subprocess.Popen, timeout_s: float = 30, *,
                          log: Path | None = None) -> None:
    """`log`: where the process writes (a file: a pipe nobody reads fills, and then the server
    blocks on its next log line)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = log.read_text(errors="replace")[-3000:] if log else (process.stdout.read() if process.stdout else "")
            raise RuntimeError(f"the server exited: {said}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start listening")


def stop_server(process: subprocess.Popen) -> None:
    """As an operator stops it: SIGTERM, so its sessions end and their sandboxes go with them (a
    kill would leave their workspace mounts and cgroups behind); a kill past 30 s."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="session")
def upstreams(tmp_path_factory):
    """Loopback upstreams the demo server's sandboxes reach through their egress proxy."""
    servers = Upstreams(tmp_path_factory.mktemp("upstreams"))
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory, upstreams, built_rootfs):  # its sessions need the tree
    data_dir = tmp_path_factory.mktemp("airlock-data")
    port = _free_port()
    hosts = {**upstreams.test_hosts(), "files.test": ("127.0.0.1", upstreams.port(upstreams.http))}
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}},
        "AIRLOCK_DATA_DIR": str(data_dir),
        "SECRET_KEY": "browser-test-secret-key-" + "x" * 40,
        "AIRLOCK_EGRESS_TEST_HOSTS": ",".join(f"{name}={address}:{to}" for name, (address, to) in hosts.items()),
        "AIRLOCK_PORT": str(port),
    }
    server = DemoServer(url=f"http://127.0.0.1:{port}", password="", api_key="", env=env)
    assert server.manage("migrate", "--no-input").returncode == 0
    printed = server.manage("demo_setup").stdout
    server.password = re.search(r"password: (\S+)", printed).group(1)
    server.api_key = re.search(r"API key\s+(alk_\S+)", printed).group(1)
    for seed in (SEED_DECISIONS, SEED_POLICIES):
        seeded = server.manage("shell", "-c", seed, OPS_POLICY=OPS_POLICY, NET_POLICY=NET_POLICY)
        assert seeded.returncode == 0, seeded.stderr
    log = data_dir / "server.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "controlplane.serve", "-b", "127.0.0.1", "-p", str(port),
         "controlplane.asgi:application"],
        cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_listening(port, process, log=log)
        yield server
    finally:
        stop_server(process)
