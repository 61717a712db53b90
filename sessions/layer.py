"""The channel layer from synchronous code in any thread: how this process sends live events
and reaches runners (docs/architecture.md, "Runner").

The in-memory layer (the embedded default) keeps asyncio queues, which belong to one event
loop: every operation on it must run there. A process that serves that loop (the server's, with
its runner on it) says so with `serve_on`; from then on operations started in other threads are
handed to it. Without one (Redis), an operation runs on whatever loop asgiref gives the calling
thread. This module imports nothing of Airlock."""

import asyncio
import threading
from collections.abc import Awaitable, Callable

from asgiref.sync import async_to_sync

_loop: asyncio.AbstractEventLoop | None = None


def serve_on(loop: asyncio.AbstractEventLoop | None) -> None:
    """Run layer operations on `loop` from now on (None: on the caller's)."""
    global _loop
    _loop = loop


def run(operation: Callable[[], Awaitable], timeout_s: float):
    """Run `operation()` (a coroutine function using the layer) and return its result; from
    synchronous code in another thread than the loop's. Past `timeout_s` (the loop did not get
    to it, or the operation overran) it is cancelled and TimeoutError raised: an operation
    reported as not done does not happen later."""
    loop = _loop
    if loop is not None and loop.is_running():
        if _on(loop):
            raise RuntimeError("layer.run would block the loop it waits for; await the operation instead")
        given_up = threading.Event()

        async def unless_given_up():
            if given_up.is_set():  # a cancel sent now would land after the operation's first step
                raise asyncio.CancelledError
            return await operation()

        future = asyncio.run_coroutine_threadsafe(unless_given_up(), loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            given_up.set()
            future.cancel()
            raise
    return async_to_sync(operation)()


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def start(operation: Callable[[], Awaitable]) -> None:
    """Start `operation()` without waiting for it (a live event: nobody waits for its delivery)."""
    loop = _loop
    if loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(operation(), loop)
        return
    async_to_sync(operation)()
