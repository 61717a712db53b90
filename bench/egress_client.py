"""The client bench/egress.py runs twice, with the same code: inside a sandbox through its egress
proxy (`proxy`: the forwarder on 127.0.0.1:3128, then the session's proxy), and on the host
straight to the upstream on loopback (`direct`). Prints one JSON line. Standard library only.

    python3 egress_client.py download proxy|direct HOST PORT PATH   (PATH without its leading /)
    python3 egress_client.py connect  proxy|direct HOST PORT COUNT
    python3 egress_client.py rate     proxy|direct HOST PORT SECONDS THREADS"""

import json
import socket
import sys
import threading
import time

PROXY = ("127.0.0.1", 3128)


def _head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before the head ended: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def download(via: str, host: str, port: str, path: str) -> dict:
    """Plain HTTP GET; through the proxy in absolute form, as an HTTP client with HTTP_PROXY does."""
    path = "/" + path  # given without it: the policy refuses arguments that look like paths outside /workspace
    started = time.perf_counter()
    sock = socket.create_connection(PROXY if via == "proxy" else (host, int(port)))
    target = f"http://{host}:{port}{path}" if via == "proxy" else path
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    head, rest = _head(sock)
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0], head
    size = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    received, buffer = len(rest), bytearray(1 << 20)
    while received < size:
        got = sock.recv_into(buffer)
        if not got:
            break
        received += got
    sock.close()
    seconds = time.perf_counter() - started
    return {"bytes": received, "seconds": seconds, "mb_per_s": received / seconds / 1e6}


def _echo_once(via: str, host: str, port: int) -> None:
    sock = socket.create_connection(PROXY if via == "proxy" else (host, port))
    try:
        if via == "proxy":
            sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            head, _ = _head(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
    finally:
        sock.close()


def connect(via: str, host: str, port: str, count: str) -> dict:
    """One new connection at a time, each through to a one-byte echo: how long each took."""
    samples = []
    for _ in range(int(count)):
        started = time.perf_counter()
        _echo_once(via, host, int(port))
        samples.append((time.perf_counter() - started) * 1000)
    return {"samples_ms": samples}


def rate(via: str, host: str, port: str, seconds: str, threads: str) -> dict:
    """New connections (each a one-byte echo) completed per second by `threads` clients at once."""
    done, failed, stop = [0], [0], time.perf_counter() + float(seconds)
    lock = threading.Lock()

    def client() -> None:
        while time.perf_counter() < stop:
            try:
                _echo_once(via, host, int(port))
                ok = True
            except (OSError, AssertionError):
                ok = False
            with lock:
                (done if ok else failed)[0] += 1

    started = time.perf_counter()
    workers = [threading.Thread(target=client) for _ in range(int(threads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    return {"connections": done[0], "failed": failed[0], "seconds": elapsed, "per_s": done[0] / elapsed}


if __name__ == "__main__":
    name, *args = sys.argv[1:]
    print(json.dumps({"download": download, "connect": connect, "rate": rate}[name](*args)))
