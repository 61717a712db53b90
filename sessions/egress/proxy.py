"""One session's egress proxy: an asyncio server on a Unix socket that only that session's
sandbox can reach (docs/architecture.md, "Egress").

Each connection carries one request: `CONNECT host:port` (a tunnel) or a plain-HTTP request in
absolute form (`GET http://host/path`). Every one is an `egress {host, port}` decision, taken by
the caller's `decide`; a refusal is an HTTP 403 whose reason phrase and body say the reason
code, rule, message and hint. An allowed name is resolved once, here; every address is checked
against the deny set, and the proxy connects to exactly the checked address (no second lookup,
so DNS rebinding has nothing to race). A tunnel to a TLS port must open with a ClientHello whose
server name is the CONNECT host. The session's byte budget and connection cap hold across all
of its connections."""

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import os
import re
import resource
import socket
from dataclasses import dataclass, field
from typing import Protocol

from policies_app import egress
from sessions.egress.forward import HANDOFF, TAKEN
from sessions.egress.pump import pump, ready
from sessions.egress.tls import NotTLS, client_hello

log = logging.getLogger("airlock.egress")

HEAD_LIMIT = 16384
HEAD_TIMEOUT_S = 10
CONNECT_TIMEOUT_S = 10
TLS_PORTS = {443, 8443}
SOCKET_BUFFER = 4 << 20
# Connections one session's proxy serves at once, judged or not (twice the largest
# network.max_connections a policy may set): past it, one more is closed unanswered.
MAX_CLIENTS = 512
DESCRIPTORS_PER_CLIENT = 8  # at most: its socket, the upstream, two pipes; and room to spare
IDLE_TIMEOUT_S = 600  # a tunnel that moves nothing either way for this long is closed
_OPEN = [0]  # connections every proxy of this process serves now


def _process_cap() -> int:
    """How many connections all proxies of this process may serve at once: what its descriptor
    limit leaves after 256 for everything else."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft - 256) // DESCRIPTORS_PER_CLIENT)
CONNECT_LINE = re.compile(rb"CONNECT ([A-Za-z0-9.-]{1,254}|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5}) HTTP/1\.[01]")
ABSOLUTE_LINE = re.compile(rb"([A-Z]{3,10}) http://([A-Za-z0-9.-]{1,254}|\[[0-9A-Fa-f:.]+\])(?::([0-9]{1,5}))?"
                           rb"(/[^\x00-\x20\x7f]*)? (HTTP/1\.[01])")
HOST_NAME = re.compile(egress.HOST)
# Headers that concern one hop, never passed on; `Connection: close` is added instead, so a
# plain-HTTP connection carries exactly the one request that was judged.
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"proxy-authenticate",
              b"te", b"trailer", b"upgrade"}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Judge(Protocol):
    """Who decides for the proxy, and keeps the record (the runner, for one session)."""

    async def decide(self, host: str, port: int) -> dict:
        """The policy's decision on `host:port`, as the API shows it (no id yet)."""

    def record(self, host: str, port: int, decision: dict, policy: dict) -> dict:
        """Record the attempt's final decision, once (`policy`, or a guard's refusal in its
        place); returns it as recorded (with its id)."""


@dataclass
class Limits:
    max_bytes: int | None = None
    max_connections: int | None = None


@dataclass
class Resolver:
    """Names to addresses, resolved by the proxy alone. `test_hosts` (a setting only tests and
    benchmarks set) maps a name to a loopback upstream, which the deny set then does not apply to."""

    test_hosts: dict[str, tuple[str, int]] = field(default_factory=dict)

    async def resolve(self, host: str, port: int) -> tuple[list[tuple[Address, int]], bool]:
        """(addresses with their ports, whether they bypass the deny set)."""
        if host.lower() in self.test_hosts:
            address, mapped_port = self.test_hosts[host.lower()]
            return [(ipaddress.ip_address(address), mapped_port)], True
        literal = egress.ip_literal(host)
        if literal is not None:
            return [(literal, port)], False
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return [(ipaddress.ip_address(info[4][0]), port) for info in infos], False


class Refused(Exception):
    """A refusal the client gets as an HTTP answer: 400 for what is not a proxy request, 403 for
    a denial (its decision recorded), 502 when an allowed upstream cannot be reached."""

    def __init__(self, status: int, reason_code: str, message: str, hint: str = "", *, rule_id: str | None = None,
                 decision: dict | None = None):
        super().__init__(message)
        self.status, self.reason_code, self.message, self.hint = status, reason_code, message, hint
        self.rule_id, self.decision = rule_id, decision

    def overruling(self, policy: dict) -> dict:
        """This refusal as the decision recorded in place of the policy's allow: a hard deny,
        in whatever mode, against the same version."""
        return {"allowed": False, "effect": "deny", "reason_code": self.reason_code, "rule_id": self.rule_id,
                "message": f"denied: {self.message}", "hint": self.hint, "mode": policy.get("mode"),
                "policy_version": policy.get("policy_version")}


class EgressProxy:
    def __init__(self, *, path: str, judge: Judge, resolver: Resolver | None = None, limits: Limits | None = None,
                 control_ports: set[int] | None = None, control_names: set[str] | None = None):
        self.path, self.judge = path, judge
        self.resolver = resolver or Resolver()
        self.limits = limits or Limits()
        # The control plane's own ports (server, database, Redis), never reached on this host,
        # and the names it serves (`.example.com`: that name and all under it), never reached
        # anywhere: whatever the policy or a test mapping says.
        self.control_ports = control_ports or set()
        self.control_names = control_names or set()
        self.bytes_moved = 0
        self.open_connections = 0
        self._budget_recorded = False
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._sweeping: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._tunnels: dict[asyncio.Task, list[float]] = {}  # open tunnels: when each last moved a byte
        self._accept_failed_at = float("-inf")

    async def start(self, *, mode: int = 0o600, owner: int | None = None) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            if owner is not None:
                os.chown(self.path, owner, owner)
            os.chmod(self.path, mode)
            listener.listen(512)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept())
        self._sweeping = asyncio.create_task(self._sweep())

    async def close(self) -> None:
        """Stop listening, cut every connection, remove the socket: nothing of it is left."""
        for task in (self._accepting, self._sweeping):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # out of descriptors, say: the next one may work
                if loop.time() - self._accept_failed_at > 60:  # said once a minute, not ten times a second
                    log.error("the egress proxy at %s could not accept a connection: %s", self.path, exc)
                    self._accept_failed_at = loop.time()
                await asyncio.sleep(0.1)
                continue
            # A sandbox holding connections open must not exhaust the server's descriptors: a cap
            # per proxy, and one for every proxy of this process, from its descriptor limit.
            if len(self._tasks) >= MAX_CLIENTS or _OPEN[0] >= _process_cap():
                client.close()
                continue
            _OPEN[0] += 1  # counted here, not when the task runs: a burst accepted at once counts too
            task = asyncio.create_task(self._handle(client))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._handled, client))

    def _handled(self, client: socket.socket, task: asyncio.Task) -> None:
        """Whatever became of the task (it may be cancelled before it ran), its count and its
        socket go."""
        _OPEN[0] -= 1
        self._tasks.discard(task)
        client.close()

    async def _handle(self, connection: socket.socket) -> None:
        client = connection
        try:
            client, first = await self._client_of(connection)
            if client is connection:  # room for a burst towards the sandbox (TCP tunes its own)
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            await self._serve(client, first)
        except Refused as refusal:
            with contextlib.suppress(OSError):
                await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(client, _answer(refusal)),
                                       HEAD_TIMEOUT_S)
        except (OSError, TimeoutError):  # the client or the upstream left, or stalled
            pass
        except Exception:  # a bug, or the database: the client gets an answer, the log the details
            log.exception("the egress proxy at %s failed a connection", self.path)
            with contextlib.suppress(OSError):
                client.send(_answer(Refused(502, "proxy_error", "the egress proxy failed on this request",
                                            "try again; the server log has the details")))
        finally:
            client.close()
            connection.close()

    async def _client_of(self, connection: socket.socket) -> tuple[socket.socket, bytes]:
        """Whom to serve, and what it sent first. The forwarder hands over the sandbox's own
        connection (one byte, HANDOFF, with the socket attached): then that socket is served
        directly, its bytes never crossing the forwarder. Anything else is served as it came."""
        while True:
            try:
                data, fds, _flags, _address = socket.recv_fds(connection, 65536, 1)
                break
            except BlockingIOError:
                await asyncio.wait_for(ready(connection.fileno()), HEAD_TIMEOUT_S)
        handed = _stream_socket(fds)
        if not data.startswith(HANDOFF):
            if handed is not None:
                handed.close()  # a descriptor beside a request is not ours to keep
            return connection, data
        if handed is None:  # the marker, but no usable socket with it: carry this connection's bytes
            await asyncio.get_running_loop().sock_sendall(connection, b"N")
            return connection, data[1:]
        with contextlib.suppress(OSError):  # read by the forwarder's first hand-over only
            connection.send(TAKEN)
        connection.close()  # the handed socket is the client now: one descriptor fewer while it lives
        return handed, data[1:]

    async def _serve(self, client: socket.socket, first: bytes = b"") -> None:
        head, rest = await self._head(client, first)
        line = head.split(b"\r\n", 1)[0]
        if match := CONNECT_LINE.fullmatch(line):
            host, port, plain = _host(match[1]), int(match[2]), None
        elif match := ABSOLUTE_LINE.fullmatch(line):
            host, port = _host(match[2]), int(match[3] or 80)
            if port in TLS_PORTS:
                raise Refused(400, "egress_not_tls", f"{host}:{port} is a TLS port: plain HTTP does not go there",
                              "use https:// (a CONNECT tunnel)")
            plain = _plain_request(head, match, host, port)
        else:
            raise Refused(400, "schema_invalid", "send CONNECT host:port, or an absolute http:// URL, to this proxy")
        if not 1 <= port <= 65535:
            raise Refused(400, "schema_invalid", f"port {port} is not 1-65535")
        policy = await self.judge.decide(host, port)
        if not policy.get("allowed"):
            recorded = self.judge.record(host, port, policy, policy)
            raise Refused(403, policy.get("reason_code") or "egress_denied",
                          policy.get("message", "").removeprefix("denied: "),
                          policy.get("hint", ""), rule_id=policy.get("rule_id"), decision=recorded)
        try:
            upstream = await self._connect(host, port)
        except Refused as refusal:
            # A guard's refusal replaces the policy's allow; an upstream that is down does not.
            refusal.decision = self.judge.record(host, port, refusal.overruling(policy) if refusal.status == 403
                                                 else policy, policy)
            raise
        loop = asyncio.get_running_loop()
        recorded = False
        try:
            if plain is None:
                await loop.sock_sendall(client, b"HTTP/1.1 200 Connection established\r\n\r\n")
                try:
                    first = await self._first_bytes(client, rest, host, port)
                except Refused as refusal:  # the tunnel is open: the only answer left is to close it
                    self.judge.record(host, port, refusal.overruling(policy), policy)
                    recorded = True
                    return
                self.judge.record(host, port, policy, policy)
                recorded = True
                if first:
                    self._count(len(first), host, port, policy)
                    await loop.sock_sendall(upstream, first)
                await self._pipe(client, upstream, host, port, policy)
            else:
                self.judge.record(host, port, policy, policy)
                recorded = True
                await self._forward(client, upstream, plain, rest, host, port, policy)
        finally:
            if not recorded:  # the client left (or stalled) before its tunnel began: still an attempt allowed
                self.judge.record(host, port, policy, policy)
            self.open_connections -= 1
            upstream.close()

    async def _forward(self, client: socket.socket, upstream: socket.socket, plain: tuple[bytes, int], rest: bytes,
                       host: str, port: int, policy: dict) -> None:
        """One plain-HTTP request, as judged: its head (rewritten for one hop), exactly its
        body, then the answer back. Whatever else the client sends is not passed on."""
        loop = asyncio.get_running_loop()
        head, length = plain
        body, rest = rest[:length], b""
        self._count(len(head) + len(body), host, port, policy)
        await loop.sock_sendall(upstream, head + body)
        remaining = length - len(body)
        while remaining > 0:
            chunk = await asyncio.wait_for(loop.sock_recv(client, min(remaining, 1 << 20)), HEAD_TIMEOUT_S)
            if not chunk:
                raise ConnectionResetError("the client left in the middle of its request body")
            remaining -= len(chunk)
            self._count(len(chunk), host, port, policy)
            await loop.sock_sendall(upstream, chunk)
        await pump(upstream, client, lambda size: self._count(size, host, port, policy))

    async def _head(self, client: socket.socket, data: bytes) -> tuple[bytes, bytes]:
        """The request head (through its blank line), and what came after it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HEAD_TIMEOUT_S
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > HEAD_LIMIT:
                raise Refused(400, "schema_invalid", f"the request head is over {HEAD_LIMIT} bytes")
            chunk = await asyncio.wait_for(loop.sock_recv(client, 65536), max(0.01, deadline - loop.time()))
            if not chunk:
                raise ConnectionResetError("the client left before its request ended")
            data += chunk
        return data[:end + 4], data[end + 4:]

    async def _connect(self, host: str, port: int) -> socket.socket:
        """Resolve once, check every address, connect to exactly a checked one. A slot of the
        connection cap is taken before the first wait, so connections racing in cannot all pass."""
        if self.limits.max_connections is not None and self.open_connections >= self.limits.max_connections:
            raise Refused(403, "limit_exceeded", f"the session already holds {self.open_connections} connections "
                          "open, its cap (network.max_connections)", "close a connection first; a security admin "
                          "can raise network.max_connections", rule_id="network.max_connections")
        if self.limits.max_bytes is not None and self.bytes_moved >= self.limits.max_bytes:
            raise Refused(403, "limit_exceeded", f"the session moved {self.bytes_moved} bytes, its budget "
                          "(network.max_bytes)", "a security admin can raise network.max_bytes",
                          rule_id="network.max_bytes")
        self.open_connections += 1
        try:
            return await self._connect_checked(host, port)
        except BaseException:
            self.open_connections -= 1
            raise

    async def _connect_checked(self, host: str, port: int) -> socket.socket:
        try:
            addresses, trusted = await asyncio.wait_for(self.resolver.resolve(host, port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, UnicodeError, ValueError):
            raise Refused(502, "upstream_unreachable", f"`{host}` does not resolve", "check the name") from None
        if not addresses:
            raise Refused(502, "upstream_unreachable", f"`{host}` does not resolve", "check the name")
        for address, target_port in addresses:
            if target_port in self.control_ports and (address.is_loopback or address in egress.host_addresses()):
                raise Refused(403, "egress_control_plane", f"{host}:{port} is Airlock's own control plane",
                              "the control plane is never reachable from a sandbox")
            if not trusted and (why := egress.denied_address(address)):
                raise Refused(403, "egress_address_denied", f"{host} resolves to {address}, {why}, which egress "
                              "never reaches", "no policy can allow it")
        if any(host == name.lstrip(".") or (name[:1] == "." and host.endswith(name)) for name in self.control_names):
            raise Refused(403, "egress_control_plane", f"{host} is a name of Airlock's own control plane",
                          "the control plane is never reachable from a sandbox")
        loop = asyncio.get_running_loop()
        for address, target_port in addresses:  # every one checked above; the first that answers
            upstream = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            upstream.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(upstream, (str(address), target_port)), CONNECT_TIMEOUT_S)
                return upstream
            except (OSError, TimeoutError):
                upstream.close()
            except BaseException:
                upstream.close()
                raise
        raise Refused(502, "upstream_unreachable", f"{host}:{port} ({addresses[0][0]}) did not accept the "
                      "connection", "the upstream is down or slow; try again")

    async def _first_bytes(self, client: socket.socket, data: bytes, host: str, port: int) -> bytes:
        """What the client sends first through a tunnel; to a TLS port it must be a ClientHello,
        within HEAD_TIMEOUT_S, naming the CONNECT host (no name at all for an IP literal) and
        hiding none (ECH): domain fronting and non-TLS tunnels are refused."""
        if port not in TLS_PORTS:
            return data
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HEAD_TIMEOUT_S
        while True:
            try:
                hello = client_hello(data) if data else None
            except NotTLS as exc:
                raise Refused(403, "egress_not_tls", f"{host}:{port} is a TLS port and the tunnel did not start "
                              f"with TLS ({exc})", "speak TLS to a TLS port (https://), or use plain http://") from None
            if hello is not None:
                literal = egress.ip_literal(host) is not None
                if hello.encrypted_name:
                    raise Refused(403, "egress_fronting", f"the tunnel to {host} hides the name it asks TLS for "
                                  "(an encrypted ClientHello)", "connect without ECH")
                if hello.server_name != (None if literal else host) and not (literal and hello.server_name == host):
                    shown = _printable(hello.server_name) if hello.server_name else "no name"
                    raise Refused(403, "egress_fronting", f"the tunnel to {host} asks TLS for {shown}: domain "
                                  "fronting is refused", "connect to the host the TLS name is for")
                return data
            chunk = await asyncio.wait_for(loop.sock_recv(client, 16384), max(0.01, deadline - loop.time()))
            if not chunk:
                raise ConnectionResetError("the client left")
            data += chunk

    async def _pipe(self, client: socket.socket, upstream: socket.socket, host: str, port: int, policy: dict) -> None:
        loop = asyncio.get_running_loop()
        last = self._tunnels[asyncio.current_task()] = [loop.time()]  # when it last moved a byte: see _sweep

        def count(size: int) -> int | None:
            if size:
                last[0] = loop.time()
            return self._count(size, host, port, policy)

        # Each way ends on its own (a half-close passes through); a failure of one ends both.
        tasks = [asyncio.create_task(pump(client, upstream, count)), asyncio.create_task(pump(upstream, client, count))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            self._tunnels.pop(asyncio.current_task(), None)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _sweep(self) -> None:
        """Close the tunnels that moved nothing either way for IDLE_TIMEOUT_S."""
        interval = max(0.05, IDLE_TIMEOUT_S / 4)
        while True:
            await asyncio.sleep(interval)
            now = asyncio.get_running_loop().time()
            for task, last in list(self._tunnels.items()):
                if now - last[0] > IDLE_TIMEOUT_S:
                    task.cancel()

    def _count(self, size: int, host: str, port: int, policy: dict) -> int | None:
        """Count bytes moved; how many more the budget allows (None: no budget)."""
        self.bytes_moved += size
        if self.limits.max_bytes is None:
            return None
        if self.bytes_moved > self.limits.max_bytes:
            if not self._budget_recorded:  # the cut is a decision too, recorded once
                self._budget_recorded = True
                cut = Refused(403, "limit_exceeded", f"the session's byte budget ({self.limits.max_bytes} bytes, "
                              "network.max_bytes) is spent; the connection was cut",
                              "a security admin can raise network.max_bytes", rule_id="network.max_bytes")
                self.judge.record(host, port, cut.overruling(policy), policy)
            raise ConnectionAbortedError("the session's byte budget (network.max_bytes) is spent")
        return self.limits.max_bytes - self.bytes_moved


def _printable(text: str, limit: int = 100) -> str:
    """Text a sandbox sent, safe to show and store: printable ASCII, bounded."""
    return re.sub(r"[^\x20-\x7e]", "?", text)[:limit]


def _host(raw: bytes) -> str:
    """A request's host in the one spelling the policy judges: lower case, without the brackets of
    an IPv6 literal or a trailing dot. Anything but a valid name or literal is a 400."""
    host = raw.decode().lower()
    if host.startswith("["):
        if egress.ip_literal(host) is None:
            raise Refused(400, "schema_invalid", f"`{host}` is not an IPv6 address")
        return host.strip("[]")
    host = host[:-1] if host.endswith(".") else host
    if len(host) > 253 or not HOST_NAME.fullmatch(host):
        raise Refused(400, "schema_invalid", f"`{host}` is not a host name")
    return host


def _plain_request(head: bytes, match: re.Match, host: str, port: int) -> tuple[bytes, int]:
    """A plain-HTTP request, rewritten for one hop (origin form, hop-by-hop headers out,
    `Connection: close` in), and the length of its body. Its `Host` must name the host the URL
    names (else it would reach a site the policy did not judge); a chunked body is refused
    (its end is not known before it is read)."""
    lines = head[:-4].split(b"\r\n")[1:]
    kept, length, drop = [], None, set(HOP_BY_HOP)
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or line[:1] in (b" ", b"\t") or not name or name != name.strip():
            raise Refused(400, "schema_invalid", "a request header is malformed")
        key, value = name.lower(), value.strip()
        if key == b"connection":
            drop |= {item.strip().lower() for item in value.split(b",")}
        elif key == b"transfer-encoding":
            raise Refused(400, "schema_invalid", "a chunked request body cannot pass as plain HTTP",
                          "send Content-Length, or use https:// (a CONNECT tunnel)")
        elif key == b"content-length":
            if not value.isdigit() or length is not None:
                raise Refused(400, "schema_invalid", "Content-Length is not one number")
            length = int(value)
        elif key == b"host" and _host_header(value) != host:
            raise Refused(403, "egress_fronting", f"the request to {host} names {value.decode(errors='replace')} in "
                          "its Host header: a request reaches the host its URL names only", f"send Host: {host}")
        kept.append((key, line))
    forwarded = [line for key, line in kept if key not in drop]
    if not any(key == b"host" for key, _ in kept):
        forwarded.insert(0, b"Host: " + (host.encode() if port == 80 else f"{host}:{port}".encode()))
    origin_line = b" ".join([match[1], match[4] or b"/", match[5]])
    return b"\r\n".join([origin_line, *forwarded, b"Connection: close", b"", b""]), length or 0


def _host_header(value: bytes) -> str | None:
    """The host a Host header names (its port left out), or None when it names none."""
    if value.startswith(b"["):
        literal, _, after = value.partition(b"]")
        name = literal + b"]"
    else:
        name, _, after = value.rpartition(b":") if b":" in value else (value, b"", b"")
        after = b":" + after if after else b""
    if after and not (after.startswith(b":") and after[1:].isdigit()):
        return None
    try:
        return _host(name)
    except (Refused, UnicodeDecodeError):
        return None


def _stream_socket(fds: list[int]) -> socket.socket | None:
    """The connected TCP socket a forwarder handed over, non-blocking; None (every descriptor
    closed) for anything else a sandbox might send: a file, a pipe, a listening socket."""
    for extra in fds[1:]:
        os.close(extra)
    if not fds:
        return None
    try:
        handed = socket.socket(fileno=fds[0])
    except OSError:
        os.close(fds[0])
        return None
    try:
        if handed.family not in (socket.AF_INET, socket.AF_INET6) or handed.type != socket.SOCK_STREAM:
            raise OSError("not a TCP socket")
        handed.getpeername()  # connected, or this raises
        handed.setblocking(False)
        handed.set_inheritable(False)
    except OSError:
        handed.close()
        return None
    return handed


def _answer(refusal: Refused) -> bytes:
    """An HTTP answer a person and a program can both read: the reason in the status line (what
    pip and curl print), plain text, then the decision as JSON."""
    phrase = re.sub(r"[^\x20-\x7e]", "?", f"Airlock {refusal.reason_code}: {refusal.message}")[:200]
    body = (f"airlock refused this connection ({refusal.reason_code}): {refusal.message}\n"
            + (f"rule: {refusal.rule_id}\n" if refusal.rule_id else "")
            + (f"hint: {refusal.hint}\n" if refusal.hint else "")
            + json.dumps({"error": refusal.reason_code, "decision": refusal.decision}) + "\n").encode()
    return (f"HTTP/1.1 {refusal.status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
