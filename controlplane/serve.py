"""`python -m controlplane.serve [daphne's options] controlplane.asgi:application`: daphne, with
four things it lacks. The first two reach into daphne: `daphne.server.HTTPFactory` is replaced
(Server.run builds its listener with it; daphne has no option for a request factory), and a
connection's transport gets a producer of ours. Upstream: django/daphne#483 (a request body is
held whole in memory) and django/daphne#170 (no backpressure on WebSocket sends), both open.

A bound on request bodies. Daphne holds a whole body in memory before the application sees a
byte of it, so one 300 MB upload, signed in or not, would cost 300 MB. Here a body longer than
AIRLOCK_MAX_REQUEST_BYTES (declared, or counted as it arrives) gets 413 at once and the
connection is closed.

Backpressure on WebSockets. Daphne writes every `websocket.send` into the connection's buffer
at once, so a client that stops reading would make the server's memory grow without bound. Here
a send returns only once the connection has drained below Twisted's write limit (64 KiB). The
session consumer's sender waits meanwhile, while the consumer keeps taking events into a bounded
outbox and drops the output that does not fit; the client gets a `lagged` event when it reads
again (sessions/consumers.py). The runner never waits.

Redacted access logs. A request's path can carry what the deployment must never log (a secret
pasted into a file name); each access-log line is redacted like everything else.

A clean stop. On SIGTERM or SIGINT the server's own runner is stopped before the reactor: its
sessions end `failed` with the reason, and their sandboxes are destroyed, instead of staying
`ready` until the next start finds them."""

import asyncio
import contextlib
import json
import sys
from urllib.parse import unquote

import daphne.server
from daphne.access import AccessLogGenerator
from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from django.conf import settings
from twisted.internet import defer, interfaces, reactor
from zope.interface import implementer

from controlplane.redaction import configured_secrets, redact

LINGER_S = 2


class _BoundedRequest(WebRequest):
    refused = False
    received = 0

    def gotLength(self, length):
        super().gotLength(0 if length and length > settings.AIRLOCK_MAX_REQUEST_BYTES else length)
        if length and length > settings.AIRLOCK_MAX_REQUEST_BYTES:
            self._refuse()

    def handleContentChunk(self, data):
        self.received += len(data)
        if self.refused or self.received > settings.AIRLOCK_MAX_REQUEST_BYTES:
            self._refuse()
            return
        super().handleContentChunk(data)

    def process(self):
        if not self.refused:  # a refused body that arrived whole anyway is never handed on
            super().process()

    def _refuse(self):
        if self.refused:
            return
        self.refused = True
        body = json.dumps({"error": "request_too_large", "detail": "a request body may hold at most "
                           f"{settings.AIRLOCK_MAX_REQUEST_BYTES} bytes"}).encode()
        transport = self.channel.transport
        transport.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        # Reading (and dropping) what the client still sends for a moment before closing lets it
        # read the 413: closing on unread data would reset the connection under it.
        reactor.callLater(LINGER_S, transport.loseConnection)


class _BoundedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = _BoundedRequest
        return protocol


daphne.server.HTTPFactory = _BoundedHTTPFactory  # what Server.run() builds its listener with


@implementer(interfaces.IPushProducer)
class _Drain:
    """Twisted pauses a connection's producer when its write buffer passes the limit, and
    resumes it once the buffer has drained (or stops it when the connection is lost)."""

    def __init__(self):
        self.writable = asyncio.Event()
        self.writable.set()

    def pauseProducing(self):
        self.writable.clear()

    def resumeProducing(self):
        self.writable.set()

    def stopProducing(self):
        self.writable.set()  # the connection is gone: nobody waits for it any more


class _RedactingAccessLog(AccessLogGenerator):
    def write_entry(self, host, date, request, *args, **kwargs):
        secrets = configured_secrets()
        request = redact(request, secrets)
        decoded = unquote(request)
        if redact(decoded, secrets) != decoded:  # a secret percent-encoded in the path or query
            request = f"{request.split(' ')[0]} [a request target that held a secret]"
        super().write_entry(host, date, request, *args, **kwargs)


class AirlockServer(Server):
    def __init__(self, *args, action_logger=None, **kwargs):
        if action_logger is not None:
            action_logger = _RedactingAccessLog(action_logger.stream)
        super().__init__(*args, action_logger=action_logger, **kwargs)

    async def handle_reply(self, protocol, message):
        await super().handle_reply(protocol, message)
        if message.get("type") == "websocket.send":
            drain = _drain_of(protocol)
            # Autobahn unregisters the producer before it drops a connection, so a paused one is
            # not always told it stopped: look at the connection itself now and then.
            while not drain.writable.is_set() and not self._gone(protocol):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(drain.writable.wait(), 1)

    def _gone(self, protocol) -> bool:
        return (protocol not in self.connections or self.connections[protocol].get("disconnected") is not None
                or protocol.transport is None or getattr(protocol.transport, "disconnected", False))

    def run(self):
        reactor.addSystemEventTrigger("before", "shutdown", _stop_embedded_runner)
        super().run()


def _drain_of(protocol) -> _Drain:
    drain = getattr(protocol, "_airlock_drain", None)
    if drain is None:
        drain = protocol._airlock_drain = _Drain()
        transport = protocol.transport
        if transport is not None:
            with contextlib.suppress(AttributeError):
                transport.unregisterProducer()  # the HTTP channel that did the upgrade; it is done
            with contextlib.suppress(RuntimeError):  # a transport that keeps its own (TLS): no backpressure
                transport.registerProducer(drain, True)
    return drain


def _stop_embedded_runner():
    from sessions.runner import local_runner

    runner = local_runner()
    if runner is None:
        return None
    return defer.Deferred.fromFuture(asyncio.ensure_future(runner.stop("the server stopped")))


class AirlockCommandLine(CommandLineInterface):
    server_class = AirlockServer


if __name__ == "__main__":
    AirlockCommandLine().run(sys.argv[1:])
