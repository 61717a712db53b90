"""The runner's end of a sandbox's supervisor (supervisor.c): requests out, frames in.

The channel is the container's attach stream: Docker multiplexes the container's stdout and
stderr on it (8-byte headers: stream, 0, 0, 0, big-endian size), and the supervisor's own frames
ride on its stdout. One reader thread per sandbox takes them apart: a command's output and exit
go to `events` (bounded: a consumer that stops reading stops the sandbox's output, not the
runner's memory), other replies to `replies`. When the stream ends (the container died, or was
destroyed), both get CLOSED."""

import contextlib
import json
import logging
import math
import queue
import socket
import struct
import threading

log = logging.getLogger("airlock.runtimes")
CLOSED = ("closed", b"")
EVENTS_MAX = 64  # frames of at most 64 KiB waiting for the command's consumer
DOCKER_STDOUT, DOCKER_STDERR = 1, 2


class ChannelClosed(Exception):
    """The supervisor is gone: its sandbox died or was destroyed."""


def exec_request(id: int, argv: list[str], cwd: str, env: dict[str, str], timeout_s: float, max_output: int,
                 stdin: bytes | None) -> bytes:
    """An exec, as supervisor.c reads it. Strings are encoded as the sandbox's locale (C.UTF-8)
    decodes file names, whatever the runner's own: UTF-8, undecodable bytes kept
    (surrogateescape). ValueError, saying why, for what exec cannot take: a lone surrogate, a
    variable's name that is empty or holds "=", a request of 4 GiB or more."""
    if any(not name or "=" in name for name in env):
        raise ValueError("an environment variable's name is empty or holds '='")
    if not math.isfinite(timeout_s):
        raise ValueError("the timeout is not a number of seconds")
    try:
        texts = (cwd, *argv, *(f"{name}={value}" for name, value in env.items()))
        strings = [text.encode("utf-8", "surrogateescape") for text in texts]
    except UnicodeEncodeError:
        raise ValueError("an argument, the environment or the cwd cannot be encoded") from None
    strings += [] if stdin is None else [stdin]
    timeout_ms = min(max(1, round(timeout_s * 1000)), 2**32 - 1)
    head = b"e" + struct.pack(">IIQIIB", id, timeout_ms, max_output, len(argv), len(env), stdin is not None)
    if len(head) + sum(4 + len(string) for string in strings) >= 2**32:
        raise ValueError("the request, its stdin included, is 4 GiB or more")
    return head + b"".join(struct.pack(">I", len(string)) + string for string in strings)


def kill_request(id: int) -> bytes:
    return b"k" + struct.pack(">I", id)


DISK_REQUEST = b"d"


class SupervisorChannel:
    def __init__(self, sock: socket.socket, name: str):
        self.sock = sock
        self.events: queue.Queue = queue.Queue(EVENTS_MAX)
        self.replies: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        self._send_lock = threading.Lock()
        self._ask_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"supervisor-{name}", daemon=True)
        self._reader.start()

    def send(self, request: bytes) -> None:
        """A request (exec_request, kill_request, DISK_REQUEST), after its length."""
        with self._send_lock:
            try:
                self.sock.sendall(struct.pack(">I", len(request)) + request)
            except OSError:
                raise ChannelClosed("the sandbox's supervisor is gone") from None

    def reply(self, timeout_s: float) -> dict:
        try:
            kind, payload = self.replies.get(timeout=timeout_s)
        except queue.Empty:
            raise ChannelClosed("the sandbox's supervisor did not answer in time") from None
        if (kind, payload) == CLOSED:
            raise ChannelClosed("the sandbox's supervisor is gone")
        return json.loads(payload)

    def ask(self, request: bytes, timeout_s: float) -> dict:
        """One question, one answer; questions take turns, and an answer that came after its
        asker gave up is dropped, not taken for the next one's."""
        with self._ask_lock:
            while True:
                try:
                    stale = self.replies.get_nowait()
                except queue.Empty:
                    break
                if stale == CLOSED:
                    self.replies.put(CLOSED)
                    raise ChannelClosed("the sandbox's supervisor is gone")
            self.send(request)
            return self.reply(timeout_s)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    def _read(self) -> None:
        # bytearrays: appending to one and deleting from its front cost no copy of the rest.
        docker = bytearray()  # Docker's frames
        ours = bytearray()  # the supervisor's, inside Docker's stdout frames
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return
                docker += data
                while len(docker) >= 8:
                    stream, size = docker[0], struct.unpack(">I", docker[4:8])[0]
                    if len(docker) < 8 + size:
                        break
                    payload = docker[8:8 + size]
                    del docker[:8 + size]
                    if stream == DOCKER_STDERR:
                        log.warning("a sandbox's supervisor said: %s", payload.decode(errors="replace").strip())
                    elif stream == DOCKER_STDOUT:
                        ours += payload
                        self._dispatch(ours)
        except OSError:
            return
        finally:
            self.closed.set()
            self.replies.put(CLOSED)
            # Never blocks for long: a consumer reading events takes this in turn, and one
            # that left has drained its command (the driver drains what it stops reading).
            with contextlib.suppress(queue.Full):
                self.events.put(CLOSED, timeout=30)

    def _dispatch(self, buffer: bytearray) -> None:
        """Hand on each whole frame in `buffer`, and remove it from there."""
        while len(buffer) >= 5:
            size = struct.unpack(">I", buffer[1:5])[0]
            if len(buffer) < 5 + size:
                break
            kind, payload = bytes(buffer[:1]), bytes(buffer[5:5 + size])
            del buffer[:5 + size]
            if kind == b"j":
                self.replies.put((kind, payload))
            else:
                self.events.put((kind, payload))
