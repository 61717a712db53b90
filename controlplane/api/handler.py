"""The agent API's own ASGI handler: Django without the dashboard's middleware.

Bearer-token requests need none of the session, CSRF, authentication or messages middleware,
and under ASGI each synchronous middleware costs two hops to Django's one shared thread. This
handler keeps what the API needs: the Host check against ALLOWED_HOSTS, and the security
headers (nosniff, same-origin referrer, no framing, a policy that loads nothing, and HSTS over
HTTPS: controlplane/security.py). /api/docs and /api/schema stay on the
dashboard's handler.

It sets the handler's private middleware attributes (`_middleware_chain` and the lists beside
it): Django offers no per-handler middleware. Upstream: Django ticket #37177, fewer context
switches per middleware under ASGI (django/django#21523, open); once it lands and the dashboard's
middleware costs no hop, this handler can go."""

from asgiref.sync import markcoroutinefunction
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

from controlplane import security

API_PREFIX = security.API_PREFIX
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
           "Content-Security-Policy": security.API}


class ApiHandler(ASGIHandler):
    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=is_async)
        self._view_middleware, self._template_response_middleware, self._exception_middleware = [], [], []
        async def checked(request):
            request.get_host()  # DisallowedHost becomes a 400, as CommonMiddleware would make it
            return await self._get_response_async(request)

        markcoroutinefunction(checked)
        handled = convert_exception_to_response(checked)

        async def chain(request):
            response = await handled(request)
            for name, value in HEADERS.items():  # on every response, errors included
                response.headers.setdefault(name, value)
            if hsts := security.transport_security(request.is_secure()):
                response.headers.setdefault("Strict-Transport-Security", hsts)
            return response

        markcoroutinefunction(chain)
        self._middleware_chain = chain
