"""WhiteNoise as an async-capable middleware.

WhiteNoise's own middleware is synchronous only, and a single synchronous middleware makes
Django run every request under ASGI through one shared thread: one API call waiting for a
sandbox would then hold up all the others. This one looks static files up without I/O (the
table is built at start-up), serves them from a worker thread, and awaits everything else.
It reads WhiteNoise's `files` table and `find_file`, which are not documented API. Upstream:
evansd/whitenoise#359 (async middleware; open, and forked as ServeStatic, which would replace
this module)."""

from asgiref.sync import markcoroutinefunction, sync_to_async
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    sync_capable = False
    async_capable = True

    def __init__(self, get_response):
        super().__init__(get_response)
        markcoroutinefunction(self)

    async def __call__(self, request):
        path = request.path_info
        static_file = await sync_to_async(self.find_file)(path) if self.autorefresh else self.files.get(path)
        if static_file is not None:
            return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
        return await self.get_response(request)
