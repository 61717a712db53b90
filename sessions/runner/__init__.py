"""The runner owns sandboxes and runs the commands of the sessions placed on it.

One runs inside the server by default (started on the server's event loop by the first request,
see controlplane/asgi.py); with Redis, `manage.py runner` processes run beside it or instead of
it. `local_runner()` is this process's runner, if it has one: the server talks to it directly,
and to any other through the channel layer (sessions/runner/client.py)."""

import asyncio

from django.conf import settings

from sessions import events

_local = None
_starting: asyncio.Lock | None = None


def local_runner():
    return _local


def set_local_runner(runner) -> None:
    """This process's runner (started), or None; live events are sent on its loop."""
    global _local
    _local = runner
    events.deliver_on(runner.loop if runner is not None else None)


async def ensure_embedded_runner() -> None:
    """Start the embedded runner on the running loop once (the server's first request)."""
    global _starting
    if _local is not None or not settings.AIRLOCK_EMBEDDED_RUNNER:
        return
    if _starting is None:
        _starting = asyncio.Lock()
    async with _starting:
        if _local is None:
            from sessions.runner.core import Runner

            runner = Runner(embedded=True)
            await runner.start()
            set_local_runner(runner)
