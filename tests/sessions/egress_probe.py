"""Runs inside a sandbox (uploaded to its workspace): tries one way out and prints what happened
as one JSON line. The egress tests read it. Standard library only: it runs on the sandbox's
Python."""

import contextlib
import errno
import http.client
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request

PROXY = ("127.0.0.1", 3128)


def outcome(function, *args) -> dict:
    try:
        return {"ok": True, **(function(*args) or {})}
    except OSError as exc:
        return {"ok": False, "errno": errno.errorcode.get(exc.errno, str(exc.errno)), "error": str(exc)}


def direct(host: str, port: str) -> dict:
    with socket.create_connection((host, int(port)), timeout=3):
        return {}


def udp(host: str, port: str) -> dict:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(b"\0" * 12, (host, int(port)))
        sock.recvfrom(512)
        return {}


def raw() -> dict:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP):
        return {}


def dns(name: str) -> dict:
    return {"addresses": sorted({info[4][0] for info in socket.getaddrinfo(name, 80)})}


def interfaces() -> dict:
    return {"interfaces": sorted(name for _, name in socket.if_nameindex())}


def unix(path: str) -> dict:
    """Connect to a Unix socket: `own` is this sandbox's proxy; any other path is taken from /
    (given without its leading slash, as the policy refuses arguments outside the workspace)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect("/run/airlock/proxy.sock" if path == "own" else "/" + path)
        return {}


def fetch(url: str, cafile: str = "") -> dict:
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=20, context=context) as response:
            body = response.read()
            return {"status": response.status, "bytes": len(body), "body": body[:2000].decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "reason": exc.reason, "body": exc.read().decode(errors="replace")}
    except urllib.error.URLError as exc:
        return {"status": None, "error": str(exc.reason)}
    except http.client.HTTPException as exc:  # cut mid-way
        return {"status": None, "error": repr(exc)}


def _client_hello(server_name: str) -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def _connect(target: str) -> tuple[socket.socket, str, bytes]:
    sock = socket.create_connection(PROXY, timeout=10)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    head, _, rest = head.partition(b"\r\n\r\n")
    return sock, head.split(b"\r\n")[0].decode(errors="replace"), rest


def tunnel(target: str, send: str = "", server_name: str = "") -> dict:
    """CONNECT, then send a ClientHello naming `server_name`, or plain HTTP (`send` = plain);
    what comes back."""
    sock, status, rest = _connect(target)
    with sock:
        if not status.startswith("HTTP/1.1 200"):
            while chunk := sock.recv(65536):
                rest += chunk
            return {"status": status, "body": rest.decode(errors="replace")}
        plain = f"GET / HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
        sock.sendall(_client_hello(server_name) if server_name else plain if send == "plain" else send.encode())
        sock.settimeout(5)
        answer = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            while chunk := sock.recv(65536):
                answer += chunk
                if len(answer) > 4:
                    break
        return {"status": status, "answered": len(answer)}


def hold(count: str, target: str) -> dict:
    """Open `count` tunnels at once and keep them; the status line of each."""
    held, statuses = [], []
    for _ in range(int(count)):
        sock, status, _ = _connect(target)
        held.append(sock)
        statuses.append(status)
    for sock in held:
        sock.close()
    return {"statuses": statuses}


def flood(count: str, target: str) -> dict:
    """`count` CONNECTs one after another, as fast as they are answered: how many got which
    answer, and how long they took."""
    answers = {}
    started = time.monotonic()
    for _ in range(int(count)):
        sock, status, _ = _connect(target)
        sock.close()
        reason = status.split(":")[0]
        answers[reason] = answers.get(reason, 0) + 1
    return {"answers": answers, "seconds": time.monotonic() - started}


CHECKS = {"direct": direct, "udp": udp, "raw": raw, "dns": dns, "interfaces": interfaces, "unix": unix,
          "fetch": fetch, "tunnel": tunnel, "hold": hold,
          "flood": flood}

if __name__ == "__main__":
    name, *args = sys.argv[1:]
    print(json.dumps({"check": name, "uid": os.getuid(), **outcome(CHECKS[name], *args)}))
