"""A runner of this process on a thread of its own, for what runs sessions outside the server
(the containment eval's command, the tests): started, made this process's runner, and stopped
with its sandboxes at the end."""

import asyncio
import contextlib
import threading

from sessions.runner import set_local_runner
from sessions.runner.core import RunnerService


@contextlib.contextmanager
def runner_in_thread(name: str = "runner-loop"):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
    thread.start()
    instance = RunnerService(embedded=True)
    try:
        asyncio.run_coroutine_threadsafe(instance.start(), loop).result(60)
        set_local_runner(instance)
        try:
            yield instance
        finally:  # whatever failed, its sandboxes and pools go with it
            asyncio.run_coroutine_threadsafe(instance.stop("finished"), loop).result(60)
    finally:
        set_local_runner(None)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
