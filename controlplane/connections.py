"""What one client may hold of the server: uvicorn's HTTP and WebSocket protocols, subclassed
and handed to `uvicorn.Config` as `http=` and `ws=` (its documented way to supply a protocol),
with the bounds uvicorn leaves out (docs/architecture.md, "Admission").

- **Slow requests.** uvicorn arms no timer before a connection's first response, and any byte
  cancels its keep-alive timer, so a client that sends a request's headers a byte a minute, or
  nothing at all, holds its connection for ever: about a thousand such connections take every
  descriptor of a server with the common limit, and nobody else gets in. Here a request's
  headers must arrive whole within `AIRLOCK_CLIENT_TIMEOUT_S` of the connection's start or of
  the request's first byte; its body may pause no longer than that, and must keep up
  MIN_BODY_RATE on average (each piece buys time in proportion to its size, as Apache's
  mod_reqtimeout MinRate does). Past either the connection is closed.
- **Connections per client.** One client address holds at most
  `AIRLOCK_MAX_CONNECTIONS_PER_CLIENT` connections at once, its WebSockets included; one more is
  answered 429 and closed before a byte of it is read. 0 turns the count off (behind a proxy,
  every client has the proxy's address: the proxy limits them).
- **What a WebSocket's client sends.** uvicorn reads a WebSocket as fast as its client writes and
  answers every ping at once: a client sending empty pings (6 bytes each) kept the event loop
  busy parsing them, and every other request waited (a health check took 6.8 s). A client of
  Airlock's streams sends one small message (its token) and keep-alive pongs, so one client
  address may send its WebSockets READ_RATE bytes a second after a READ_BURST, shared by all
  its WebSockets and kept across reconnections (per connection when the count per address is
  off); past it a WebSocket's reading pauses until the allowance has refilled, and the client
  waits in its own socket (which the kernel keeps small: READ_BUFFER). The opening handshake is
  not counted: it was an HTTP request, bounded above. Reading also stops while the server's
  writes to the client are above their high-water mark. Per-message compression is off
  (controlplane/serve.py): a 1 MiB message compressed to 1 KiB on the wire.
"""

import asyncio
import logging
import socket
import weakref
from collections import Counter

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from controlplane.security import API_HEADERS

log = logging.getLogger(__name__)

READ_RATE = 1024  # bytes a second one address may send its WebSockets, after READ_BURST
READ_BURST = 8 * 1024
MIN_BODY_RATE = 500  # bytes a second a request body must keep up, on average
READ_BUFFER = 16 * 1024  # the kernel's receive buffer of a WebSocket: what one read may bring
_REFUSAL = b"too many open connections from this address (AIRLOCK_MAX_CONNECTIONS_PER_CLIENT); close one\n"
# (Written before a byte of the request is read: whether it came over HTTPS is not known, so no HSTS.)
_API_HEADER_LINES = b"".join(b"%s: %s\r\n" % (name.lower().encode(), value.encode())
                             for name, value in API_HEADERS.items())
REFUSED = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n"
           + _API_HEADER_LINES + b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL))


class Limits:
    """The bounds, set once by `configure` before the server starts (controlplane/serve.py)."""

    timeout_s: float = 20.0
    per_client: int = 256


def configure(*, timeout_s: float, per_client: int) -> None:
    Limits.timeout_s, Limits.per_client = timeout_s, per_client


# Open connections per client address, per server (a process may run more than one, as tests do).
_open: "weakref.WeakKeyDictionary[object, Counter[str]]" = weakref.WeakKeyDictionary()


def _admit(server_state, host: str | None) -> bool:
    if host is None or not Limits.per_client:
        return True
    counts = _open.setdefault(server_state, Counter())
    if counts[host] >= Limits.per_client:
        return False
    counts[host] += 1
    return True


def _release(server_state, host: str | None) -> None:
    counts = _open.get(server_state)
    if host is None or counts is None or not counts[host]:
        return
    counts[host] -= 1
    if not counts[host]:
        del counts[host]


class Allowance:
    """What a client may still send its WebSockets: READ_BURST, refilled at READ_RATE."""

    def __init__(self, now: float):
        self.left, self.at = float(READ_BURST), now

    def take(self, size: int, now: float) -> float:
        """Takes `size` bytes; returns what is left (below 0: in debt)."""
        self.refill(now)
        self.left -= size
        return self.left

    def refill(self, now: float) -> float:
        self.left, self.at = min(READ_BURST, self.left + (now - self.at) * READ_RATE), now
        return self.left


_allowances: "weakref.WeakKeyDictionary[object, dict[str, Allowance]]" = weakref.WeakKeyDictionary()


def _allowance(server_state, host: str | None, now: float) -> Allowance:
    """The address's own, kept after its connections close (a reconnection gets no new burst);
    one per connection when addresses are not counted."""
    if host is None or not Limits.per_client:
        return Allowance(now)
    allowances = _allowances.setdefault(server_state, {})
    if len(allowances) > 10_000:  # forget the addresses whose allowance is whole again
        for name in [name for name, kept in allowances.items() if kept.refill(now) >= READ_BURST]:
            del allowances[name]
    return allowances.setdefault(host, Allowance(now))


_refusals_logged: dict[str, float] = {}


def _log_refusal(host: str, now: float) -> None:
    """One line a minute per address: refusals are what an attacker can make many of."""
    if now - _refusals_logged.get(host, -60.0) >= 60:
        if len(_refusals_logged) > 10_000:
            _refusals_logged.clear()
        _refusals_logged[host] = now
        log.warning("refusing connections from %s: it already holds %d (AIRLOCK_MAX_CONNECTIONS_PER_CLIENT)",
                    host, Limits.per_client)


class BoundedHttp(HttpToolsProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timer: asyncio.TimerHandle | None = None
        self.body_due = 0.0  # (loop time) when the body under way must have come further
        self.counted_host: str | None = None  # the address this connection counts against, until it closes

    # -- the connection --------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        host = self.client[0] if self.client else None
        if not _admit(self.server_state, host):
            _log_refusal(host, self.loop.time())
            transport.write(REFUSED)
            transport.close()
            return
        self.counted_host = host
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        _release(self.server_state, self.counted_host)
        self.counted_host = None
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        """The WebSocket protocol takes the connection over, and its count with it."""
        self._disarm()
        self.counted_host = None
        super().handle_websocket_upgrade()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's own answer to a request it cannot parse (Django never sees it), with the
        API's headers like every answer written before Django. Unparsed, the request tells
        nothing of HTTPS: no HSTS."""
        body = msg.encode("ascii", "replace")
        uvicorns = b"".join(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers)
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\n" + uvicorns + _API_HEADER_LINES
                             + b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()

    # -- a request's pace ------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # a new request's first byte: its headers are due within the timeout
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.timer is None:  # (a request pipelined behind one under way)
            self._arm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # Its body, if any, is due at MIN_BODY_RATE, and may pause no longer than the timeout
        # (on_message_complete ends the count).
        self.body_due = self.loop.time() + Limits.timeout_s
        self._arm()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self.timer is not None:
            now = self.loop.time()
            self.body_due = min(self.body_due + len(body) / MIN_BODY_RATE, now + Limits.timeout_s)
            self._arm(self.body_due - now)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, delay_s: float | None = None) -> None:
        self._disarm()
        self.timer = self.loop.call_later(Limits.timeout_s if delay_s is None else delay_s, self._too_slow)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self) -> None:
        self.timer = None
        if not self.transport.is_closing():
            log.info("closed a connection from %s: no whole request within %g s (AIRLOCK_CLIENT_TIMEOUT_S)",
                     self.counted_host, Limits.timeout_s)
            self.transport.close()


class BoundedWebSocket(WebSocketsSansIOProtocol):
    """Created only by BoundedHttp's upgrade, whose count it carries until the connection ends."""

    def __init__(self, config, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        self.server_state = server_state
        # Every answer but the upgrade itself (a handshake websockets refuses, the application's
        # close before accepting, a 500) is written by the protocol's `send_response`: with the
        # API's headers, like every answer written before Django.
        send_response = self.conn.send_response

        def send_with_headers(response) -> None:
            if response.status_code != 101:
                for name, value in API_HEADERS.items():
                    if name not in response.headers:  # (websockets' Headers add, never replace)
                        response.headers[name] = value
            send_response(response)

        self.conn.send_response = send_with_headers

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.counted_host = self.client[0] if self.client else None
        self.writes_paused = False
        self.allowance = _allowance(self.server_state, self.counted_host, self.loop.time())
        self.handshake_read = False
        self.throttle: asyncio.TimerHandle | None = None
        self.held = bytearray()
        connection = transport.get_extra_info("socket")
        if connection is not None:
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READ_BUFFER)

    def connection_lost(self, exc) -> None:
        if self.throttle is not None:
            self.throttle.cancel()
            self.throttle = None
        self.held.clear()
        super().connection_lost(exc)
        _release(self.server_state, self.counted_host)
        self.counted_host = None

    def pause_writing(self) -> None:
        super().pause_writing()
        self.writes_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.writes_paused = False
        self._resume()

    def data_received(self, data: bytes) -> None:
        if not self.handshake_read:  # uvicorn hands over the upgrade request first: not counted
            self.handshake_read = True
            super().data_received(data)
            return
        if self.throttle is None:
            left = self.allowance.refill(self.loop.time())
            if left < 0:  # the address's other WebSockets have spent it
                self.throttle = self.loop.call_later(-left / READ_RATE, self._unthrottle)
        if self.throttle is not None:  # over the allowance: held, unread, until it has refilled
            self.held += data  # (one read's worth at most: reading is paused)
            self.transport.pause_reading()
            return
        self._take(data)

    def _take(self, data: bytes) -> None:
        left = self.allowance.take(len(data), self.loop.time())
        super().data_received(data)
        if self.transport.is_closing():
            return
        if left < 0:
            self.throttle = self.loop.call_later(-left / READ_RATE, self._unthrottle)
        if self.writes_paused or self.throttle is not None:
            # uvicorn resumes reading by itself when the application waits for a message: paused again
            self.transport.pause_reading()

    def _unthrottle(self) -> None:
        self.throttle = None
        if self.transport.is_closing():
            return
        left = self.allowance.refill(self.loop.time())
        if left < 0:  # the address's other WebSockets took it meanwhile
            self.throttle = self.loop.call_later(-left / READ_RATE, self._unthrottle)
            return
        held, self.held = bytes(self.held), bytearray()
        if held:
            self._take(held)
        self._resume()

    def _resume(self) -> None:
        """Read again, unless something else still holds reading: the writes, the allowance, or
        uvicorn's own pause (the application has not taken the last message yet)."""
        if not (self.writes_paused or self.throttle is not None or self.read_paused or self.transport.is_closing()):
            self.transport.resume_reading()
