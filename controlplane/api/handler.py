"""The agent API's own ASGI handler: each request runs whole on one thread of the API's pools, as
a threaded WSGI server runs Django (docs/architecture.md, "A command's way").

Django's ASGIHandler gives every request its own thread for thread-sensitive work, started and
joined per request, and hops to it and back for each step (the `request_started` signal, the
view, the response's close). Here the event loop reads the body, watches for the client leaving
(a request no thread has taken yet is then dropped, as Django drops it) and writes the response,
and one hop to a pool thread does everything between: `request_started`, the view,
`request_finished`. So each request's database connection is its thread's, opened and closed by
CONN_MAX_AGE as in a WSGI server, and the views are plain synchronous ones: a view that waits for
a runner holds its thread, not the loop.

Bearer-token requests need none of the dashboard's middleware (sessions, CSRF, authentication,
messages). This handler keeps what the API needs: the Host check against ALLOWED_HOSTS, and the
security headers (nosniff, same-origin referrer, no framing, a policy that loads nothing, and
HSTS over HTTPS: controlplane/security.py). /api/docs and /api/schema stay on the dashboard's
handler.

Django offers no per-handler middleware, so this sets the handler's middleware attributes
(`_middleware_chain` and the lists beside it) itself, as `BaseHandler.load_middleware` would.
Upstream: Django ticket #37177, fewer context switches per middleware under ASGI
(django/django#21523, open)."""

import asyncio
import collections
import contextlib
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.urls import Resolver404, get_resolver, set_script_prefix

from controlplane import security

API_PREFIX = security.API_PREFIX
# The API's threads, AIRLOCK_API_THREADS of each kind. A view that waits for a runner (a command
# with `wait`, a sandbox made or destroyed, a workspace file) holds one of `waiting` for as long as
# it waits; every other view answers without a runner, on one of `prompt`, so a full `waiting`
# pool never holds those up. (Some of those take a while too: a replay of 20,000 decisions.)
waiting = ThreadPoolExecutor(max_workers=settings.AIRLOCK_API_THREADS, thread_name_prefix="airlock-api")
prompt = ThreadPoolExecutor(max_workers=settings.AIRLOCK_API_THREADS, thread_name_prefix="airlock-api-prompt")


TENANT = "airlock.tenant"  # the scope's key for the request's tenant, set by what stands in front of the API


class Shares:
    """At most `size` of one tenant's calls on a pool at once; the rest wait on the loop, in
    order, holding no thread, so another tenant's calls always find one. (The rate a tenant may
    send requests at counts them, not what each costs: a replay of 20,000 decisions takes ~0.5 s
    of CPU.) Calls whose tenant is not known (None) share one count."""

    def __init__(self):
        self.held: collections.Counter = collections.Counter()
        self.waiting: dict[object, collections.deque] = {}

    @contextlib.asynccontextmanager
    async def turn(self, tenant, size: int):
        if self.held[tenant] < size:
            self.held[tenant] += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self.waiting.setdefault(tenant, collections.deque()).append(waiter)
            try:
                await waiter  # handed a turn by a call that ended: `held` already counts it
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # handed over as it was cancelled: pass it on
                    self._release(tenant)
                elif (queue := self.waiting.get(tenant)) is not None:
                    with contextlib.suppress(ValueError):
                        queue.remove(waiter)
                raise
        try:
            yield
        finally:
            self._release(tenant)

    def _release(self, tenant) -> None:
        queue = self.waiting.get(tenant)
        while queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.waiting.pop(tenant, None)
        self.held[tenant] -= 1
        if self.held[tenant] <= 0:
            del self.held[tenant]


shares = Shares()  # of the prompt pool (a waiting call's share is sessions/admission.py's)


def waits_for_runner(view):
    """Marks a view that waits for a runner: it runs on a thread of the `waiting` pool."""
    view.waits_for_runner = True
    return view


class ApiHandler(ASGIHandler):
    def __init__(self):
        BaseHandler.__init__(self)  # not ASGIHandler's: its middleware is the dashboard's, asynchronous
        self._view_middleware, self._template_response_middleware, self._exception_middleware = [], [], []
        handled = convert_exception_to_response(self._checked)

        def chain(request):
            response = handled(request)
            for name, value in security.API_HEADERS.items():  # on every response, errors included
                response.headers.setdefault(name, value)
            if hsts := security.transport_security(request.is_secure()):
                response.headers.setdefault("Strict-Transport-Security", hsts)
            return response

        self._middleware_chain = chain

    def _checked(self, request):
        request.get_host()  # DisallowedHost becomes a 400, as CommonMiddleware would make it
        return self._get_response(request)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"the API serves HTTP, not {scope['type']}")
        try:
            body = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            request, response = self.create_request(scope, body)
            pool = prompt if request is None else self._pool(request)
            share = max(1, settings.AIRLOCK_API_THREADS // 4)
            async with shares.turn(scope.get(TENANT), share) if pool is prompt else contextlib.nullcontext():
                response = await self._run(pool, receive, scope, request, response)
            if response is None:  # the client left before a thread took its request: it never ran
                return
            try:
                await self.send_response(response, send)
            finally:
                if response.streaming:
                    await sync_to_async(response.close, thread_sensitive=False, executor=pool)()
        finally:
            body.close()

    async def _run(self, pool, receive, scope, request, response):
        """The request on a thread of `pool`; None when its client leaves before a thread takes
        it (as under Django's handler: a command nobody waits for any more is never proposed).
        One already under way finishes, and its answer goes nowhere."""
        # asgiref's bridge, not a bare executor: the layer's operations a view starts
        # (async_to_sync) run on this loop, as they would under Django's own handler.
        work = asyncio.ensure_future(sync_to_async(self._respond, thread_sensitive=False, executor=pool)(
            scope, request, response))
        gone = asyncio.ensure_future(receive())  # after the whole body, the next message says the client left
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            gone.cancel()
        if work.done() or gone.result()["type"] != "http.disconnect":
            return await work
        work.cancel()  # asgiref drops a job no thread has taken yet; one under way finishes
        try:
            return await work
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # this request itself is being cancelled
                raise
            return None

    @staticmethod
    def _pool(request) -> ThreadPoolExecutor:
        try:
            request.resolver_match = get_resolver().resolve(request.path_info)
        except Resolver404:
            return prompt
        return waiting if getattr(request.resolver_match.func, "waits_for_runner", False) else prompt

    def resolve_request(self, request):
        """Resolved once: on the loop, where the view's pool is chosen."""
        return request.resolver_match or super().resolve_request(request)

    def _respond(self, scope, request, response):
        """On a thread of a pool: the request whole, from `request_started` to
        `request_finished` (the response's close) where its content is already whole."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        if request is not None:
            response = self.get_response(request)
        if not response.streaming:
            response.close()  # request_finished: this thread's connections, by CONN_MAX_AGE
        return response
