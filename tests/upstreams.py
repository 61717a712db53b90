"""Upstreams on loopback that egress tests and benchmarks reach through a session's proxy, by
names the test-only resolver setting (AIRLOCK_EGRESS_TEST_HOSTS) maps to them: a package index
with one wheel (`pypi.test`), a git repository over HTTP (`git.test`), a TLS server
(`tls.test`), an echo server (`echo.test`) and a stand-in for the control plane (`cp.test`).
Nothing here listens anywhere but 127.0.0.1."""

import base64
import hashlib
import io
import socketserver
import ssl
import subprocess
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WHEEL_NAME = "airlock_probe-1.0-py3-none-any.whl"
WHEEL_VALUE = 42  # what `import airlock_probe; airlock_probe.VALUE` gives once installed
REPO_FILE = "README.md"
REPO_TEXT = "cloned through the egress proxy\n"


def _wheel() -> bytes:
    files = {
        "airlock_probe/__init__.py": f"VALUE = {WHEEL_VALUE}\n",
        "airlock_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: airlock-probe\nVersion: 1.0\n",
        "airlock_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: airlock-tests\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n",
    }
    record = []
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, text in files.items():
            data = text.encode()
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append("airlock_probe-1.0.dist-info/RECORD,,")
        wheel.writestr("airlock_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return buffer.getvalue()


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"})


def _site(root: Path) -> None:
    """The package index (PEP 503) and a bare repository served over git's dumb HTTP protocol."""
    wheel = _wheel()
    (root / "packages").mkdir(parents=True)
    (root / "packages" / WHEEL_NAME).write_bytes(wheel)
    (root / "simple" / "airlock-probe").mkdir(parents=True)
    (root / "simple" / "airlock-probe" / "index.html").write_text(
        f'<a href="/packages/{WHEEL_NAME}#sha256={hashlib.sha256(wheel).hexdigest()}">{WHEEL_NAME}</a>\n')
    work = root / "work"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    (work / REPO_FILE).write_text(REPO_TEXT)
    _git("add", REPO_FILE, cwd=work)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    _git("update-server-info", cwd=root / "repo.git")


class _Handler(SimpleHTTPRequestHandler):
    """Files, plus /bytes/<n> (n bytes of zeros, streamed)."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/bytes/"):
            size = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = bytes(1 << 20)
            while size:
                sent = min(size, len(block))
                self.wfile.write(block[:sent])
                size -= sent
            return
        super().do_GET()


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.server.connections += 1
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    connections = 0


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / "tls.key", directory / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


class Upstreams:
    def __init__(self, root: Path):
        self.root = root
        _site(root)
        handler = partial(_Handler, directory=str(root))
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.tls = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        key, self.certificate = _certificate(root, "tls.test")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate, key)
        self.tls.socket = context.wrap_socket(self.tls.socket, server_side=True)
        self.echo = _EchoServer(("127.0.0.1", 0), _Echo)
        self.control_plane = _EchoServer(("127.0.0.1", 0), _Echo)  # stands in for the server's port
        self._threads = [threading.Thread(target=server.serve_forever, daemon=True)
                         for server in (self.http, self.tls, self.echo, self.control_plane)]
        for thread in self._threads:
            thread.start()

    def port(self, server) -> int:
        return server.server_address[1]

    def test_hosts(self) -> dict[str, tuple[str, int]]:
        return {"pypi.test": ("127.0.0.1", self.port(self.http)), "git.test": ("127.0.0.1", self.port(self.http)),
                "tls.test": ("127.0.0.1", self.port(self.tls)), "echo.test": ("127.0.0.1", self.port(self.echo)),
                "cp.test": ("127.0.0.1", self.port(self.control_plane))}

    def close(self) -> None:
        for server in (self.http, self.tls, self.echo, self.control_plane):
            server.shutdown()
            server.server_close()

