"""`python -m controlplane.serve [-b HOST] [-p PORT] [--access-log -] controlplane.asgi:application`:
uvicorn (httptools for HTTP, the websockets library for WebSockets), as Airlock wants it served.

What the server must do, and where it is done (no library's internals are touched):
- Bounded request bodies: a body longer than AIRLOCK_MAX_REQUEST_BYTES gets 413 before it is
  read (`controlplane/asgi.py`, `BoundedBodies`); uvicorn hands a body to the application as it
  arrives, never whole, and drops what a client still sends after the answer.
- Backpressure on WebSockets: uvicorn's `websocket.send` waits while the connection's buffer is
  above its high-water mark, so a client that stops reading holds up only its own consumer's
  sender, which drops output into `lagged` (sessions/consumers.py). The runner never waits.
- Logs: uvicorn's records go through Django's logging (LOGGING in settings.py), whose handler
  redacts every record; an access-log line whose target held a secret only percent-encoded
  does not show the target at all.
- The server's own runner starts with the server (ASGI lifespan), and a SIGTERM or SIGINT stops
  it before the server waits for its connections: its sessions end `failed` with the reason and
  their sandboxes are destroyed, and calls waiting for them are answered at once.
- Slow clients and floods (`controlplane/connections.py`: uvicorn's protocols, subclassed): a
  request's headers are due whole within AIRLOCK_CLIENT_TIMEOUT_S and its body at a minimum
  rate, a client address holds at most AIRLOCK_MAX_CONNECTIONS_PER_CLIENT connections, and its
  WebSockets may send a small allowance a second (a stream's client sends a token and pongs).
- One CPU for every thread of the process, every CPU for its sandboxes (`controlplane/cpus.py`):
  its threads take turns on one interpreter lock, and on one CPU they do so without waking another.
- No `Server` header, and proxy headers are left to Django (SECURE_PROXY_SSL_HEADER, set only
  behind a TLS proxy): uvicorn would otherwise believe X-Forwarded-* from loopback."""

import argparse
import logging
import os
import signal
import sys
from urllib.parse import unquote

import uvicorn
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from controlplane import connections, cpus
from controlplane.redaction import configured_secrets, redact

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

GRACE_S = 5  # for requests still open after the runner stopped (a WebSocket's client that does not close)
# An idle keep-alive connection stays open this long (nginx's default; uvicorn's own 5 s would
# close an agent's connection between two commands that far apart, under its next request).
KEEP_ALIVE_S = 75
WEBSOCKET_MESSAGE_BYTES = 2**20  # a client sends small JSON commands (sessions/consumers.py)


class EncodedSecretFilter(logging.Filter):
    """uvicorn logs a request's target as its client sent it: an access line is
    '%s - "%s %s HTTP/%s" %d' and a WebSocket handshake's '%s - "WebSocket %s" [accepted]', the
    target an argument. One that decodes to a secret is not shown at all (the handler redacts the
    plain ones, but not a secret written with percent escapes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(arg, str) and "%" in arg for arg in record.args):
            secrets = configured_secrets()  # only for a line with escapes: most lines have none
            record.args = tuple("[a request target that held a secret]" if _decodes_to_secret(arg, secrets) else arg
                                for arg in record.args)
        return True


def _decodes_to_secret(arg, secrets: tuple[str, ...]) -> bool:
    if not isinstance(arg, str) or "%" not in arg:
        return False
    decoded = unquote(arg)
    return redact(decoded, secrets) != decoded


class AirlockServer(uvicorn.Server):
    async def shutdown(self, sockets=None) -> None:
        from sessions.runner.core import stop_embedded_runner  # models: only once the application set Django up

        await stop_embedded_runner("the server stopped")
        await super().shutdown(sockets=sockets)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m controlplane.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--bind", default="127.0.0.1", help="address to listen on")
    parser.add_argument("-p", "--port", type=int, default=8000)
    parser.add_argument("--access-log", default="-", help="'-' (standard output, the default) or 'off'")
    parser.add_argument("application", help="the ASGI application, module:attribute")
    options = parser.parse_args(argv)
    if options.access_log not in {"-", "off"}:
        parser.error("--access-log takes '-' (standard output) or 'off'")
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(EncodedSecretFilter())
    try:  # settings are read here, not set up: the application sets Django up
        connections.configure(timeout_s=settings.AIRLOCK_CLIENT_TIMEOUT_S,
                              per_client=settings.AIRLOCK_MAX_CONNECTIONS_PER_CLIENT)
        cpus.pin(settings.AIRLOCK_SERVER_CPU)  # before any thread: each one it starts inherits the CPU
    except ImproperlyConfigured as exc:
        sys.exit(f"airlock: configuration error: {exc}")
    config = uvicorn.Config(
        options.application, host=options.bind, port=options.port, http=connections.BoundedHttp,
        ws=connections.BoundedWebSocket, ws_per_message_deflate=False,
        lifespan="on", log_config=None, access_log=options.access_log == "-", proxy_headers=False,
        server_header=False,
        ws_max_size=WEBSOCKET_MESSAGE_BYTES, timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACE_S,
    )
    for stop in (signal.SIGINT, signal.SIGTERM):
        # Until uvicorn takes the signal, and again when it hands it back after its clean stop
        # (it re-sends the signal it stopped on): the stop is done, exit 0.
        signal.signal(stop, _exit)
    AirlockServer(config).run()


def _exit(signum, frame) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
