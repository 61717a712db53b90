"""ASGI entry point (served by controlplane/serve.py): HTTP (dashboard, API), WebSockets, and
the lifespan of the server's own runner."""

import asyncio
import contextlib
import json
import logging
import os
import sys

from django.core.exceptions import ImproperlyConfigured

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

try:
    from django.core.asgi import get_asgi_application

    # Django must be set up before anything imports models (the routing below does).
    django_asgi_app = get_asgi_application()
except ImproperlyConfigured as exc:
    sys.exit(f"airlock: configuration error: {exc}")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import OriginValidator
from django.conf import settings

from controlplane import security
from controlplane.routing import websocket_urlpatterns
from sessions.runner.core import ensure_embedded_runner, stop_embedded_runner

log = logging.getLogger("airlock.server")
LINGER_S = 2  # after a 413, what the client still sends is read (and dropped) this long before the close


class BrowserOriginValidator(OriginValidator):
    """A browser always sends Origin with a WebSocket handshake: it must be one of
    ALLOWED_HOSTS (a page elsewhere cannot ride the user's cookie). A client without Origin is
    not a browser (an agent's WebSocket library) and carries no ambient cookie to abuse: it is
    let through, and the consumer still demands a session token or a signed-in member."""

    def valid_origin(self, parsed_origin) -> bool:
        return parsed_origin is None or self.validate_origin(parsed_origin)


class EmbeddedRunner:
    """Starts the server's own runner on the server's event loop: at start-up (the ASGI
    lifespan), or else at the first connection (a server without lifespan, a test's
    communicator); every connection waits until it has started. Stopped at shutdown."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] in {"http", "websocket"}:
            await ensure_embedded_runner()
        return await self.app(scope, receive, send)

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await ensure_embedded_runner()
                except Exception:  # served anyway: the first connection tries again, and says why
                    log.exception("the server's runner could not start")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await stop_embedded_runner("the server stopped")
                await send({"type": "lifespan.shutdown.complete"})
                return


class BoundedBodies:
    """A request body longer than AIRLOCK_MAX_REQUEST_BYTES, declared or counted as it arrives,
    is answered 413 before the application reads it, and the connection closes: what the client
    still sends is read and dropped for LINGER_S first, so that it reads the answer rather than
    a reset, and nothing it sends after can be taken for a next request."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = settings.AIRLOCK_MAX_REQUEST_BYTES
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            # A client that waits for `100 Continue` sends nothing more: there is nothing to drop.
            drain = receive if headers.get(b"expect", b"").lower() != b"100-continue" else None
            return await _too_large(scope, send, limit, drain)
        received, refused, started = 0, False, False

        async def counted():
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # the application sees a client that left, and answers nothing
                    refused = True
                    return {"type": "http.disconnect"}
            return message

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, watched)
        if refused and not started:
            await _too_large(scope, send, limit, receive)


async def _too_large(scope, send, limit: int, drain) -> None:
    """The 413, whole; the response ends (and the connection with it) once `drain` (the
    request's receive) has nothing more, or after LINGER_S."""
    body = json.dumps({"error": "request_too_large",
                       "detail": f"a request body may hold at most {limit} bytes"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *security.raw_headers(scope)]})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    if drain is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while (await drain()).get("more_body", False):
                    pass
    await send({"type": "http.response.body", "body": b""})


from controlplane.api.handler import API_PREFIX, ApiHandler  # noqa: E402
from sessions.api.throttle import TenantThrottle  # noqa: E402

api_app = TenantThrottle(ApiHandler())


async def http_app(scope, receive, send):
    app = api_app if scope["path"].startswith(API_PREFIX) else django_asgi_app
    return await app(scope, receive, send)


application = EmbeddedRunner(ProtocolTypeRouter(
    {
        "http": BoundedBodies(http_app),
        "websocket": BrowserOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
                                            settings.ALLOWED_HOSTS),
    }
))
