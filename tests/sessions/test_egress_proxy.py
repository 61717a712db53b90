"""The egress proxy on its own, through its real Unix socket, against upstreams on loopback
(names mapped to them through the test-only resolver setting, as the issue allows): what the
policy refuses, what the proxy refuses whatever the policy says, and what it lets through."""

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import ssl
import tempfile
from pathlib import Path

import pytest

from sessions.egress import proxy as proxy_module
from sessions.egress.forward import HANDOFF, TAKEN
from sessions.egress.proxy import EgressProxy, Limits, Resolver


def hello(server_name: str) -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


class Upstream:
    """A loopback server that echoes what it gets, and keeps it."""

    def __init__(self):
        self.received = b""
        self.connections = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer):
        self.connections += 1
        while data := await reader.read(65536):
            self.received += data
            writer.write(data)
            await writer.drain()
        writer.close()


class Judge:
    """A policy that allows exactly `allowed`; keeps what was decided and what was recorded."""

    def __init__(self, allowed: set[tuple[str, int]]):
        self.allowed, self.decisions, self.records = allowed, [], []

    async def decide(self, host, port):
        allowed_now = (host, port) in self.allowed
        self.decisions.append((host, port, allowed_now))
        return {"allowed": allowed_now, "effect": "allow" if allowed_now else "deny",
                "reason_code": None if allowed_now else "egress_denied", "rule_id": "network.allow" if allowed_now
                else None, "message": f"denied: {host}:{port} is not on the egress allowlist",
                "hint": f"a security admin can add {host}:{port}", "mode": "enforce", "policy_version": None}

    def record(self, host, port, decision, policy):
        self.records.append((host, port, decision["reason_code"], decision["message"]))
        return {**decision, "id": f"decision-{len(self.records)}"}


@contextlib.asynccontextmanager
async def proxy_for(allowed: set[tuple[str, int]], **kwargs):
    """A proxy whose policy allows exactly `allowed`, with `pypi.test` and `pypi.test:443` on
    an echo upstream; yields (proxy, upstream, decisions taken, decisions recorded)."""
    upstream = Upstream()
    port = await upstream.start()
    judge = Judge(allowed)
    directory = Path(tempfile.mkdtemp(prefix="airlock-egress-"))
    resolver = Resolver(test_hosts={"pypi.test": ("127.0.0.1", port)})
    proxy = EgressProxy(path=str(directory / "egress.sock"), judge=judge, resolver=resolver, **kwargs)
    await proxy.start()
    try:
        yield proxy, upstream, judge.decisions, judge.records
    finally:
        await proxy.close()
        upstream.server.close()
        directory.rmdir()


async def ask(proxy, request: bytes, then: bytes = b"") -> tuple[bytes, bytes]:
    """(the proxy's answer head, what came back after it) for one request and the bytes after it."""
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    rest = b""
    if head.startswith(b"HTTP/1.1 200") and then:
        writer.write(then)
        await writer.drain()
        writer.write_eof()
    try:
        rest = await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:  # cut with bytes unread (the byte budget): what came is what there is
        rest = b""
    writer.close()
    return head, rest


async def test_an_allowed_tunnel_reaches_its_upstream_and_every_attempt_is_a_decision():
    async with proxy_for({("pypi.test", 8080)}) as (proxy, upstream, decisions, records):
        head, echoed = await ask(proxy, b"CONNECT pypi.test:8080 HTTP/1.1\r\nHost: pypi.test\r\n\r\n", b"ping")
        assert head.startswith(b"HTTP/1.1 200") and echoed == b"ping"
        head, _body = await ask(proxy, b"CONNECT other.test:8080 HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403")
        assert decisions == [("pypi.test", 8080, True), ("other.test", 8080, False)]
        assert upstream.connections == 1
        assert [record[:3] for record in records] == [("pypi.test", 8080, None), ("other.test", 8080, "egress_denied")]


async def test_a_denial_is_a_403_that_says_it_is_the_policy_with_the_decision_as_json():
    async with proxy_for(set()) as (proxy, upstream, _, _):
        head, body = await ask(proxy, b"CONNECT pypi.test:443 HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 Airlock egress_denied: pypi.test:443 is not on the egress allowlist")
        text, json_line = body.decode().strip().rsplit("\n", 1)
        assert "airlock refused this connection (egress_denied)" in text and "hint: a security admin" in text
        assert json.loads(json_line)["decision"] == {
            "allowed": False, "effect": "deny", "reason_code": "egress_denied", "rule_id": None,
            "message": "denied: pypi.test:443 is not on the egress allowlist", "hint": "a security admin can add "
            "pypi.test:443", "mode": "enforce", "policy_version": None, "id": "decision-1"}
        assert upstream.connections == 0


class HttpUpstream(Upstream):
    """Answers each request head it reads with a short 200 and closes, as a server told
    `Connection: close` does; keeps what it read."""

    async def _serve(self, reader, writer):
        self.connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, TimeoutError):
            self.received += await reader.readuntil(b"\r\n\r\n")
            # Whatever else the client sent (a body, a pipelined request) would arrive by now.
            self.received += await asyncio.wait_for(reader.read(65536), 0.1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()


async def plain(proxy, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_plain_http_is_judged_and_carries_exactly_one_request_rewritten_for_one_hop():
    async with proxy_for({("pypi.test", 80)}) as (proxy, _, decisions, _):
        upstream = HttpUpstream()
        proxy.resolver.test_hosts["pypi.test"] = ("127.0.0.1", await upstream.start())
        answer = await plain(proxy, b"GET http://pypi.test/simple/ HTTP/1.1\r\nHost: pypi.test\r\n"
                                    b"Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive, X-Hop\r\n"
                                    b"X-Hop: 1\r\nAccept: */*\r\n\r\n"
                                    b"GET http://other.test/secret HTTP/1.1\r\nHost: other.test\r\n\r\n")
        assert answer.endswith(b"\r\n\r\nok")
        # Origin form, hop-by-hop headers (and those Connection names) out, Connection: close in;
        # the pipelined request for another host never left.
        assert upstream.received == (b"GET /simple/ HTTP/1.1\r\nHost: pypi.test\r\nAccept: */*\r\n"
                                     b"Connection: close\r\n\r\n")
        assert decisions == [("pypi.test", 80, True)]
        body = await plain(proxy, b"POST http://pypi.test/upload HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        assert body.endswith(b"ok") and upstream.received.endswith(b"Host: pypi.test\r\nContent-Length: 5\r\n"
                                                                   b"Connection: close\r\n\r\nhello")
        upstream.server.close()


@pytest.mark.parametrize(("request_head", "answer"), [
    (b"GET http://pypi.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", b"HTTP/1.1 403 Airlock egress_fronting"),
    (b"GET http://pypi.test/ HTTP/1.1\r\nHost: pypi.test.evil.test\r\n\r\n", b"HTTP/1.1 403 Airlock egress_fronting"),
    (b"POST http://pypi.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"HTTP/1.1 400 Airlock schema_invalid"),
    (b"POST http://pypi.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
     b"HTTP/1.1 400 Airlock schema_invalid"),
    (b"GET http://pypi.test/ HTTP/1.1\r\n Host: x\r\n\r\n", b"HTTP/1.1 400 Airlock schema_invalid"),
    (b"CONNECT a..b.test:443 HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 Airlock schema_invalid"),
    (b"CONNECT -a.test:443 HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 Airlock schema_invalid"),
    (b"CONNECT [::1:443 HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 Airlock schema_invalid"),
])
async def test_a_request_that_would_reach_more_than_was_judged_is_refused(request_head, answer):
    async with proxy_for({("pypi.test", 80), ("pypi.test", 443)}) as (proxy, upstream, _, _):
        assert (await plain(proxy, request_head)).startswith(answer)
        assert upstream.connections == 0


async def test_connections_racing_in_cannot_pass_the_cap_together():
    async with proxy_for({("pypi.test", 8080)}, limits=Limits(max_connections=2)) as (proxy, _, _, _):
        async def attempt():
            reader, writer = await asyncio.open_unix_connection(proxy.path)
            writer.write(b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
            return (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0], writer

        results = await asyncio.gather(*(attempt() for _ in range(10)))
        statuses = sorted(status for status, _ in results)
        assert statuses.count(b"HTTP/1.1 200 Connection established") == 2, statuses
        assert all(status.startswith(b"HTTP/1.1 403 Airlock limit_exceeded") for status in statuses[2:])
        for _, writer in results:
            writer.close()


async def test_a_failing_judge_gets_the_client_an_answer_not_silence():
    async with proxy_for({("pypi.test", 8080)}) as (proxy, _, _, _):
        async def broken(host, port):
            raise RuntimeError("the database went away")

        proxy.judge.decide = broken
        assert (await plain(proxy, b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")).startswith(
            b"HTTP/1.1 502 Airlock proxy_error")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "169.254.169.254", "[::1]", "10.0.0.1"])
async def test_a_name_or_literal_in_the_deny_set_is_refused_even_when_the_policy_allows_it(host):
    bare = host.strip("[]")
    async with proxy_for({(bare, 8080)}) as (proxy, upstream, _, reports):
        head, body = await ask(proxy, f"CONNECT {host}:8080 HTTP/1.1\r\n\r\n".encode())
        assert head.startswith(b"HTTP/1.1 403 Airlock egress_address_denied"), head
        assert b"egress never reaches" in body and upstream.connections == 0
        assert reports == [(bare, 8080, "egress_address_denied", reports[0][3])]


async def test_a_tls_tunnel_must_name_its_connect_host_and_must_be_tls():
    async with proxy_for({("pypi.test", 443)}) as (proxy, upstream, _, reports):
        head, rest = await ask(proxy, b"CONNECT pypi.test:443 HTTP/1.1\r\n\r\n", hello("evil.example"))
        assert head.startswith(b"HTTP/1.1 200") and rest == b"" and upstream.received == b""  # fronting: cut
        head, rest = await ask(proxy, b"CONNECT pypi.test:443 HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n")
        assert rest == b"" and upstream.received == b""  # not TLS on a TLS port: cut
        assert [report[2] for report in reports] == ["egress_fronting", "egress_not_tls"]
        assert "the tunnel to pypi.test asks TLS for evil.example" in reports[0][3]
        real = hello("pypi.test")
        head, rest = await ask(proxy, b"CONNECT pypi.test:443 HTTP/1.1\r\n\r\n", real)
        assert rest == real and upstream.received == real  # the right name passes, byte for byte


async def test_the_byte_budget_cuts_the_session_and_then_refuses_it():
    async with proxy_for({("pypi.test", 8080)}, limits=Limits(max_bytes=10_000)) as (proxy, _, _, _):
        head, echoed = await ask(proxy, b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n", b"x" * 50_000)
        assert len(echoed) < 50_000 and proxy.bytes_moved > 10_000
        head, body = await ask(proxy, b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 Airlock limit_exceeded") and b"network.max_bytes" in body


async def test_the_connection_cap_refuses_one_more_while_the_others_stay_open():
    async with proxy_for({("pypi.test", 8080)}, limits=Limits(max_connections=2)) as (proxy, _, _, _):
        held = []
        for _ in range(2):
            reader, writer = await asyncio.open_unix_connection(proxy.path)
            writer.write(b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            held.append(writer)
        head, body = await ask(proxy, b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 Airlock limit_exceeded") and b"max_connections" in body
        for writer in held:
            writer.close()


async def test_the_control_plane_is_never_reachable_whatever_the_policy_says():
    upstream = Upstream()
    port = await upstream.start()
    async with proxy_for({("pypi.test", 8080)}, control_ports={port}) as (proxy, _, _, records):
        proxy.resolver.test_hosts["pypi.test"] = ("127.0.0.1", port)  # the name now points at the control plane
        head, _ = await ask(proxy, b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 Airlock egress_control_plane") and upstream.connections == 0
        assert [record[2] for record in records] == ["egress_control_plane"]
    upstream.server.close()


async def test_closing_the_proxy_cuts_its_tunnels_and_removes_its_socket():
    async with proxy_for({("pypi.test", 8080)}) as (proxy, _, _, _):
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        writer.write(b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await proxy.close()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert not Path(proxy.path).exists()
        with pytest.raises((FileNotFoundError, ConnectionRefusedError)):
            await asyncio.open_unix_connection(proxy.path)


@pytest.mark.parametrize("request_line", [b"GET / HTTP/1.1", b"CONNECT pypi.test HTTP/1.1", b"\x16\x03\x01\x00\x10",
                                          b"CONNECT pypi.test:99999 HTTP/1.1"])
async def test_what_is_not_a_proxy_request_gets_a_400(request_line):
    async with proxy_for(set()) as (proxy, _, decisions, _):
        head, _body = await ask(proxy, request_line + b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 Airlock schema_invalid") and decisions == []


class Rebinding(Resolver):
    """Answers a loopback upstream the first time it is asked, the metadata address after: a
    proxy that looked a name up twice would connect to what it never checked."""

    def __init__(self, port: int):
        super().__init__()
        self.port, self.calls = port, 0

    async def resolve(self, host, port):
        self.calls += 1
        if self.calls == 1:
            return [(ipaddress.ip_address("127.0.0.1"), self.port)], True
        return [(ipaddress.ip_address("169.254.169.254"), port)], False


async def test_a_name_is_resolved_once_and_exactly_the_checked_address_is_connected():
    async with proxy_for({("rebind.test", 8080)}) as (proxy, upstream, _, _):
        proxy.resolver = Rebinding(upstream.server.sockets[0].getsockname()[1])
        head, echoed = await ask(proxy, b"CONNECT rebind.test:8080 HTTP/1.1\r\n\r\n", b"ping")
        assert head.startswith(b"HTTP/1.1 200") and echoed == b"ping" and proxy.resolver.calls == 1


class Metadata(Resolver):
    async def resolve(self, host, port):  # what a hostile DNS answer would say, without asking any
        return [(ipaddress.ip_address("169.254.169.254"), port)], False


async def test_a_name_that_resolves_to_the_metadata_address_is_refused_before_any_packet():
    async with proxy_for({("meta.test", 80)}) as (proxy, _, _, records):
        proxy.resolver = Metadata()
        head, body = await ask(proxy, b"CONNECT meta.test:80 HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 Airlock egress_address_denied") and b"metadata" in body
        assert [record[2] for record in records] == ["egress_address_denied"]


async def test_a_connection_handed_over_is_served_directly_and_anything_else_handed_over_is_not_kept():
    async with proxy_for({("pypi.test", 8080)}) as (proxy, upstream, _, _):
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        program = socket.create_connection(listener.getsockname())  # the sandboxed program's end
        accepted, _ = listener.accept()  # the forwarder's end, handed over
        forwarder = socket.socket(socket.AF_UNIX)
        forwarder.connect(proxy.path)
        socket.send_fds(forwarder, [HANDOFF], [accepted.fileno()])
        assert await loop.run_in_executor(None, forwarder.recv, 1) == TAKEN
        accepted.close()
        forwarder.close()
        program.setblocking(False)
        await loop.sock_sendall(program, b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\nping")
        answer = b""
        while not answer.endswith(b"ping"):
            answer += await asyncio.wait_for(loop.sock_recv(program, 4096), 10)
        assert answer == b"HTTP/1.1 200 Connection established\r\n\r\nping" and upstream.received == b"ping"
        program.close()
        listener.close()

        descriptors = len(os.listdir(f"/proc/{os.getpid()}/fd"))
        read_end, write_end = os.pipe()  # not a socket: refused, and the connection is carried as it is
        forwarder = socket.socket(socket.AF_UNIX)
        forwarder.connect(proxy.path)
        socket.send_fds(forwarder, [HANDOFF + b"CONNECT other.test:8080 HTTP/1.1\r\n\r\n"], [read_end])
        os.close(read_end)
        forwarder.settimeout(10)

        def read_all() -> bytes:  # off the loop, which the proxy serves on
            reply = b""
            while chunk := forwarder.recv(65536):
                reply += chunk
            return reply

        reply = await loop.run_in_executor(None, read_all)
        assert reply.startswith(b"NHTTP/1.1 403 Airlock egress_denied: other.test:8080"), reply
        os.close(write_end)
        forwarder.close()
        await asyncio.sleep(0.05)
        assert len(os.listdir(f"/proc/{os.getpid()}/fd")) <= descriptors  # the pipe end handed over was closed


def hello_with_ech(server_name: str) -> bytes:
    """A ClientHello naming `server_name` in the clear, with an encrypted_client_hello extension
    (0xfe0d) beside it, as a client hiding its real destination would send."""
    record = bytearray(hello(server_name))
    body_start = 5 + 4
    at = body_start + 2 + 32
    at += 1 + record[at]  # session id
    at += 2 + int.from_bytes(record[at:at + 2], "big")  # cipher suites
    at += 1 + record[at]  # compression methods
    extra = (0xFE0D).to_bytes(2, "big") + (4).to_bytes(2, "big") + b"\x00\x01\x02\x03"
    record[at:at + 2] = (int.from_bytes(record[at:at + 2], "big") + len(extra)).to_bytes(2, "big")
    record += extra
    record[3:5] = (int.from_bytes(record[3:5], "big") + len(extra)).to_bytes(2, "big")
    record[6:9] = (int.from_bytes(record[6:9], "big") + len(extra)).to_bytes(3, "big")
    return bytes(record)


async def test_tls_must_not_hide_its_name_and_an_ip_literal_tunnel_names_none():
    async with proxy_for({("pypi.test", 443), ("127.0.0.1", 443)}) as (proxy, upstream, _, records):
        head, rest = await ask(proxy, b"CONNECT pypi.test:443 HTTP/1.1\r\n\r\n", hello_with_ech("pypi.test"))
        assert head.startswith(b"HTTP/1.1 200") and rest == b"" and upstream.received == b""
        assert records[-1][2] == "egress_fronting" and "encrypted ClientHello" in records[-1][3]
        proxy.resolver.test_hosts["127.0.0.1"] = proxy.resolver.test_hosts["pypi.test"]  # the literal, on loopback
        head, rest = await ask(proxy, b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", hello("other.example"))
        assert rest == b"" and upstream.received == b"" and records[-1][2] == "egress_fronting"


async def test_plain_http_to_a_tls_port_is_refused():
    async with proxy_for({("pypi.test", 443)}) as (proxy, upstream, _, _):
        answer = await plain(proxy, b"GET http://pypi.test:443/ HTTP/1.1\r\nHost: pypi.test\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 Airlock egress_not_tls") and upstream.connections == 0


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the proxy closed the connection without answering anything more."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionError:  # reset, or a broken pipe: closed with bytes of ours unread
        return True


async def test_a_hello_dribbled_out_or_a_tunnel_left_idle_is_closed(monkeypatch):
    monkeypatch.setattr(proxy_module, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(proxy_module, "IDLE_TIMEOUT_S", 0.5)
    async with proxy_for({("pypi.test", 443), ("pypi.test", 8080)}) as (proxy, _, _, records):
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        writer.write(b"CONNECT pypi.test:443 HTTP/1.1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        with contextlib.suppress(ConnectionError):  # one byte every 0.2 s: each read is quick, the whole is not
            for byte in hello("pypi.test")[:8]:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)
        assert await closed(reader)
        assert records[-1][:2] == ("pypi.test", 443)  # the attempt is recorded all the same
        writer.close()
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        writer.write(b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        assert await closed(reader)  # nothing either way: closed
        writer.close()


async def test_past_the_process_wide_cap_a_connection_is_closed_unserved(monkeypatch):
    monkeypatch.setattr(proxy_module, "_process_cap", lambda: 1)
    async with proxy_for({("pypi.test", 8080)}) as (proxy, _, decisions, _):
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        writer.write(b"CONNECT pypi.test:8080 HTTP/1.1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")  # held open: the one the cap allows
        second, _ = await asyncio.open_unix_connection(proxy.path)
        assert await closed(second) and len(decisions) == 1
        writer.close()
