"""The channel layer from any thread: the one way this process sends live events and reaches
runners (docs/architecture.md, "Runner").

The in-memory layer (the embedded default) keeps asyncio queues, which belong to one event
loop: every operation on it must run there. A process that serves that loop (the server's, with
its runner on it) says so with `serve_on`; from then on operations started in other threads are
handed to it. Without one (Redis), an operation runs on whatever loop asgiref gives the calling
thread. This module imports nothing of Airlock."""

import asyncio
from collections.abc import Awaitable, Callable

from asgiref.sync import async_to_sync

_loop: asyncio.AbstractEventLoop | None = None


def serve_on(loop: asyncio.AbstractEventLoop | None) -> None:
    """Run layer operations on `loop` from now on (None: on the caller's)."""
    global _loop
    _loop = loop


def run(operation: Callable[[], Awaitable], timeout_s: float):
    """Run `operation()` (a coroutine function using the layer) and return its result; from
    synchronous code only. `timeout_s` bounds only the hand-over: the operation bounds itself."""
    loop = _loop
    if loop is not None and loop.is_running():
        return asyncio.run_coroutine_threadsafe(operation(), loop).result(timeout_s)
    return async_to_sync(operation)()


def start(operation: Callable[[], Awaitable]) -> None:
    """Start `operation()` without waiting for it (a live event: nobody waits for its delivery)."""
    loop = _loop
    if loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(operation(), loop)
        return
    async_to_sync(operation)()
