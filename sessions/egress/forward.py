"""The forwarder: runs inside a sandbox, ahead of each command of a session whose policy allows
egress (docs/architecture.md, "Egress").

    python3 -I -S forward.py PORT SOCKET -- ARGV...

It listens on the sandbox's own loopback (127.0.0.1:PORT, what HTTP_PROXY names), starts the
command as its child, and hands every connection it accepts to the session's egress proxy
through the Unix socket bind-mounted at SOCKET: the accepted socket itself (SCM_RIGHTS), so the
proxy serves it directly; where the sandbox's kernel cannot pass a socket to the host (gVisor),
it carries the connection's bytes over a connection of its own instead. It exits as the command
exits (with its status, or by its signal), so it lives exactly as long as the command. It
decides nothing: the proxy on the host is the only judge, and a command that talks to SOCKET
itself meets the same proxy.

Standard library only (it runs on the sandbox's own Python, not Airlock's), and it never
imports from the working directory (`-I -S`)."""

import contextlib
import os
import signal
import socket
import sys
import threading

CHUNK = 1 << 20
SOCKET_BUFFER = 4 << 20
# The hand-over: one byte with the accepted socket attached; the proxy answers TAKEN (read the
# first time only), or anything else (then the bytes are carried instead). The byte never starts
# an HTTP request.
HANDOFF, TAKEN = b"\0", b"T"


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: forward.py PORT SOCKET -- ARGV...", file=sys.stderr)
        return 2
    port, path, command = int(argv[0]), argv[1], argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as exc:
        print(f"airlock: the egress forwarder cannot listen on 127.0.0.1:{port} ({exc.strerror})", file=sys.stderr)
        return 125
    listener.listen(512)
    pid = os.fork()
    if pid == 0:
        listener.close()
        try:
            os.execvp(command[0], command)  # noqa: S606 - argv as given, never a shell
        except OSError as exc:
            print(f"airlock: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
            os._exit(127)
    # The command's output streams end when the command (and what it left) close them, not us.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    threading.Thread(target=_accept, args=(listener, path), daemon=True).start()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: die by the same one, so the caller sees what the command saw
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _accept(listener: socket.socket, path: str) -> None:
    hands_over = None  # learnt from the first connection: whether this sandbox can pass a socket
    while True:
        client, _ = listener.accept()
        if hands_over is not False:
            taken = _hand_over(client, path, confirm=hands_over is None)
            if hands_over is None:
                hands_over = taken
            if taken:
                continue
        threading.Thread(target=_carry, args=(client, path), daemon=True).start()


def _hand_over(client: socket.socket, path: str, *, confirm: bool) -> bool:
    """Pass the accepted connection itself to the proxy (SCM_RIGHTS): from then on the proxy
    reads and writes it directly, and no byte of it crosses this process. The first time, wait
    for the proxy to say it took it (a sandbox kernel that cannot pass a socket to the host,
    gVisor's, does not deliver it); after that, do not wait: accepting stays as fast as the
    kernel."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        socket.send_fds(upstream, [HANDOFF], [client.fileno()])
        taken = upstream.recv(1) == TAKEN if confirm else True
    except OSError:
        taken = False
    upstream.close()
    if taken:
        client.close()  # the proxy holds it now; ours would keep the connection open after it closes
    return taken


def _carry(client: socket.socket, path: str) -> None:
    """Carry the connection's bytes to the proxy and back over a connection of our own."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for end in (client, upstream):  # room for a burst each way: fewer wake-ups on a large transfer
        with contextlib.suppress(OSError):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """One direction until its end, which is passed on as a half-close."""
    buffer = memoryview(bytearray(CHUNK))
    try:
        while received := source.recv_into(buffer):
            target.sendall(buffer[:received])
        target.shutdown(socket.SHUT_WR)
    except OSError:
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
