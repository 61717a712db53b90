"""A server for benchmarks, started the way `make run` starts one (a fresh data directory, the
embedded runner, the demo tenant) with a policy `bench` published; and a keep-alive API client.

Unless `admission=True`, the per-tenant limits (docs/architecture.md, "Admission") are raised
out of the way: a throughput benchmark drives the server with one tenant as hard as it can, which
is what they exist to stop. bench/fairness.py keeps them."""

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
SEED = ("import os; from controlplane.models import Tenant; from policies_app import services as s; "
        "t = Tenant.objects.get(slug='demo'); p = s.policy_create(tenant=t, name='bench', actor=None); "
        "v = s.version_create(policy=p, actor=None, source=os.environ['BENCH_POLICY']); "
        "s.version_publish(version=v, actor=None, note='bench')")


class Api:
    """One keep-alive HTTP connection (one per thread)."""

    def __init__(self, url: str, key: str):
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        self.key = key

    def call(self, method: str, path: str, body=None, *, token: str | None = None, raw: bytes | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        self.connection.request(method, path, body=data, headers={
            "Authorization": f"Bearer {token or self.key}", "Content-Type": "application/json"})
        response = self.connection.getresponse()
        content = response.read()
        return response.status, json.loads(content) if content else None

    def open(self, policy: str) -> dict:
        status, session = self.call("POST", "/api/v1/sessions", {"conversation_id": "bench", "policy": policy})
        assert status == 201, session
        return session

    def run(self, session: dict, bin_name: str, *args: str, wait: bool = True) -> dict:
        status, body = self.call("POST", f"/api/v1/sessions/{session['id']}/commands",
                                 {"bin": bin_name, "args": list(args), "wait": wait}, token=session["token"])
        assert status in {200, 202}, body
        return body

    def end(self, session: dict) -> None:
        self.call("DELETE", f"/api/v1/sessions/{session['id']}", token=session["token"])


UNLIMITED = {"AIRLOCK_API_RATE_PER_TENANT": "1000000", "AIRLOCK_MAX_SESSIONS_PER_TENANT": "1000",
             "AIRLOCK_MAX_COMMANDS_PER_TENANT": "1000", "AIRLOCK_API_WAITING_PER_TENANT": "1000",
             "AIRLOCK_TENANT_MEMORY_SHARE": "1", "AIRLOCK_OUTPUT_BYTES_PER_S": str(2**30)}


def start_server(policy: str, *, admission: bool = False, **extra_env: str) -> tuple[str, str, subprocess.Popen, Path]:
    data = Path(tempfile.mkdtemp(prefix="airlock-bench-"))
    data.chmod(0o711)
    env = {**{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}},
           "AIRLOCK_DATA_DIR": str(data), "SECRET_KEY": "bench-only-" + "x" * 60, "BENCH_POLICY": policy,
           "AIRLOCK_LOG_LEVEL": "WARNING", **({} if admission else UNLIMITED), **extra_env}

    def manage(*args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
                              capture_output=True, text=True).stdout

    manage("migrate", "--no-input", "-v", "0")
    printed = manage("demo_setup")
    (data / "demo_setup.txt").write_text(printed)  # the login too, for benchmarks that drive a browser
    key = re.search(r"alk_\S+", printed).group(0)
    manage("shell", "-c", SEED)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "controlplane.serve", "-b", "127.0.0.1", "-p", str(port),
                               "controlplane.asgi:application"], cwd=ROOT, env={**env, "AIRLOCK_PORT": str(port)},
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return f"http://127.0.0.1:{port}", key, server, data
