"""ASGI entry point for daphne: HTTP (dashboard, API) and WebSockets."""

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

from controlplane.routing import websocket_urlpatterns
from sessions.runner.core import ensure_embedded_runner


class BrowserOriginValidator(OriginValidator):
    """A browser always sends Origin with a WebSocket handshake: it must be one of
    ALLOWED_HOSTS (a page elsewhere cannot ride the user's cookie). A client without Origin is
    not a browser (an agent's WebSocket library) and carries no ambient cookie to abuse: it is
    let through, and the consumer still demands a session token or a signed-in member."""

    def valid_origin(self, parsed_origin) -> bool:
        return parsed_origin is None or self.validate_origin(parsed_origin)


class EmbeddedRunner:
    """Starts the server's own runner on the server's event loop, at the first connection
    (daphne has no start-up hook); every connection waits until it has started."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] in {"http", "websocket"}:
            await ensure_embedded_runner()
        return await self.app(scope, receive, send)


from controlplane.api.handler import API_PREFIX, ApiHandler  # noqa: E402
from sessions.api.throttle import TenantThrottle  # noqa: E402

api_app = TenantThrottle(ApiHandler())


async def http_app(scope, receive, send):
    app = api_app if scope["path"].startswith(API_PREFIX) else django_asgi_app
    return await app(scope, receive, send)


application = EmbeddedRunner(ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": BrowserOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
                                            settings.ALLOWED_HOSTS),
    }
))
