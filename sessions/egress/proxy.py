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
import ipaddress
import json
import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from policies_app import egress
from sessions.egress.tls import NotTLS, client_hello

log = logging.getLogger("airlock.egress")

HEAD_LIMIT = 16384
HEAD_TIMEOUT_S = 10
CONNECT_TIMEOUT_S = 10
TLS_PORTS = {443, 8443}
CONNECT_LINE = re.compile(rb"CONNECT ([A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5}) HTTP/1\.[01]")
ABSOLUTE_LINE = re.compile(rb"([A-Z]{3,10}) http://([A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\])(?::([0-9]{1,5}))?"
                           rb"(/[^ ]*)? (HTTP/1\.[01])")

# decide(host, port) -> the decision as the API shows it ({allowed, reason_code, rule_id, ...})
Decide = Callable[[str, int], Awaitable[dict]]
# report(host, port, reason_code, message): a refusal the proxy made itself after the policy
# allowed (the deny set, fronting, a limit), for the caller to record as a decision.
Report = Callable[[str, int, str, str], Awaitable[None]]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


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
    """A request refused before any upstream byte: the 403 (or 400) the client gets."""

    def __init__(self, status: int, reason_code: str, message: str, hint: str = "", decision: dict | None = None):
        super().__init__(message)
        self.status, self.reason_code, self.message, self.hint = status, reason_code, message, hint
        self.decision = decision or {"allowed": False, "reason_code": reason_code, "rule_id": None,
                                     "message": message, "hint": hint}


class EgressProxy:
    def __init__(self, *, path: str, decide: Decide, report: Report | None = None, resolver: Resolver | None = None,
                 limits: Limits | None = None, unreachable: set[tuple[Address, int]] | None = None):
        self.path, self.decide, self.report = path, decide, report
        self.resolver = resolver or Resolver()
        self.limits = limits or Limits()
        self.unreachable = unreachable or set()  # the control plane's own listeners, whatever the policy says
        self.bytes_moved = 0
        self.open_connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, *, mode: int = 0o600) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._accept, path=self.path, limit=HEAD_LIMIT)
        os.chmod(self.path, mode)

    async def close(self) -> None:
        """Stop listening, cut every connection, remove the socket: nothing of it is left."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except Refused as refusal:
            await _refuse(writer, refusal)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            raise Refused(400, "schema_invalid", f"the request head is over {HEAD_LIMIT} bytes") from None
        line = head.split(b"\r\n", 1)[0]
        if match := CONNECT_LINE.fullmatch(line):
            host, port, forward = match[1].decode().strip("[]").lower(), int(match[2]), None
        elif match := ABSOLUTE_LINE.fullmatch(line):
            host, port = match[2].decode().strip("[]").lower(), int(match[3] or 80)
            origin_line = b" ".join([match[1], match[4] or b"/", match[5]])
            forward = origin_line + head[len(line):]
        else:
            raise Refused(400, "schema_invalid", "send CONNECT host:port, or an absolute http:// URL, to this proxy")
        if not 1 <= port <= 65535:
            raise Refused(400, "schema_invalid", f"port {port} is not 1-65535")
        decision = await self.decide(host, port)
        if not decision.get("allowed"):
            raise Refused(403, decision.get("reason_code") or "egress_denied", decision.get("message", ""),
                          decision.get("hint", ""), decision)
        try:
            upstream_reader, upstream_writer = await self._connect(host, port)
        except Refused as refusal:
            await self._report(host, port, refusal.reason_code, refusal.message)
            raise
        try:
            if forward is None:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                try:
                    first = await self._first_bytes(reader, host, port)
                except _InTunnel as refusal:
                    await self._report(host, port, "egress_denied", str(refusal))
                    raise
                upstream_writer.write(first)
                self._count(len(first))
            else:
                upstream_writer.write(forward)
                self._count(len(forward))
            await self._pipe(reader, writer, upstream_reader, upstream_writer)
        finally:
            self.open_connections -= 1
            upstream_writer.close()

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Resolve once, check every address, connect to exactly a checked one."""
        if self.limits.max_connections is not None and self.open_connections >= self.limits.max_connections:
            raise Refused(403, "limit_exceeded", f"the session already has {self.open_connections} connections open "
                          f"(network.max_connections)", "close a connection first")
        if self.limits.max_bytes is not None and self.bytes_moved >= self.limits.max_bytes:
            raise Refused(403, "limit_exceeded", f"the session moved {self.bytes_moved} bytes, its budget "
                          "(network.max_bytes)", "a security admin can raise network.max_bytes")
        try:
            addresses, trusted = await self.resolver.resolve(host, port)
        except OSError:
            raise Refused(502, "egress_denied", f"`{host}` does not resolve", "check the name") from None
        for address, target_port in addresses:
            if (address, target_port) in self.unreachable:
                raise Refused(403, "egress_denied", f"{host}:{port} is Airlock's own control plane",
                              "the control plane is never reachable from a sandbox")
            if not trusted and (why := egress.denied_address(address)):
                raise Refused(403, "egress_denied", f"{host} resolves to {address}, {why}, which egress never "
                              "reaches", "no policy can allow it")
        address, target_port = addresses[0]
        try:
            connected = await asyncio.wait_for(asyncio.open_connection(str(address), target_port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            raise Refused(502, "egress_denied", f"{host}:{port} ({address}) did not accept the connection",
                          "the upstream is down or slow; try again") from None
        self.open_connections += 1
        return connected

    async def _first_bytes(self, reader: asyncio.StreamReader, host: str, port: int) -> bytes:
        """What the client sends first through a tunnel; to a TLS port it must be a ClientHello
        naming the CONNECT host (domain fronting and non-TLS tunnels are refused)."""
        data = b""
        while True:
            chunk = await asyncio.wait_for(reader.read(4096), HEAD_TIMEOUT_S)
            if not chunk:
                raise ConnectionResetError("the client left")
            data += chunk
            if port not in TLS_PORTS:
                return data
            try:
                hello = client_hello(data)
            except NotTLS as exc:
                raise _InTunnel(f"{host}:{port} is a TLS port and the tunnel did not start with TLS ({exc})") from None
            if hello is not None:
                if egress.ip_literal(host) is None and hello.server_name != host:
                    raise _InTunnel(f"the tunnel to {host} asks TLS for {hello.server_name or 'no name'}: "
                                    "domain fronting is refused")
                return data

    async def _pipe(self, reader, writer, upstream_reader, upstream_writer) -> None:
        async def copy(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
            while chunk := await source.read(65536):
                self._count(len(chunk))
                target.write(chunk)
                await target.drain()
            with contextlib.suppress(OSError):
                target.write_eof()

        # Each way ends on its own (a half-close passes through); a failure of one ends both.
        tasks = [asyncio.create_task(copy(reader, upstream_writer)), asyncio.create_task(copy(upstream_reader, writer))]
        _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _report(self, host: str, port: int, reason_code: str, message: str) -> None:
        if self.report is not None:
            try:
                await self.report(host, port, reason_code, message)
            except Exception:  # recording must not break the answer the client is owed
                log.exception("could not record the egress refusal of %s:%s", host, port)

    def _count(self, size: int) -> None:
        self.bytes_moved += size
        if self.limits.max_bytes is not None and self.bytes_moved > self.limits.max_bytes:
            raise ConnectionAbortedError("the session's byte budget (network.max_bytes) is spent")


class _InTunnel(ConnectionError):
    """Refused after the tunnel was established: the only answer left is to close it."""


async def _refuse(writer: asyncio.StreamWriter, refusal: Refused) -> None:
    """An HTTP answer a person and a program can both read: the reason in the status line (what
    pip and curl print), plain text, then the decision as JSON."""
    phrase = re.sub(r"[^\x20-\x7e]", "?", f"Airlock {refusal.reason_code}: {refusal.message}")[:200]
    body = (f"airlock refused this connection ({refusal.reason_code}): {refusal.message}\n"
            + (f"hint: {refusal.hint}\n" if refusal.hint else "")
            + json.dumps({"error": refusal.reason_code, "decision": refusal.decision}) + "\n").encode()
    writer.write(f"HTTP/1.1 {refusal.status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
