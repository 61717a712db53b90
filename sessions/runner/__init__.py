"""The runner owns sandboxes and runs the commands of the sessions placed on it.

One runs inside the server by default (started on the server's event loop by its first request:
`core.ensure_embedded_runner`); with Redis, `manage.py runner` processes run beside it or instead
of it. The server reaches each the same way, its own included: messages on the runner's channel
(sessions/runner/client.py). `local_runner()` is this process's runner, if it has one, for the
two things only its process can do: stop it, and know it is the one an in-memory layer reaches."""

from sessions import layer

_local = None


def local_runner():
    return _local


def set_local_runner(runner) -> None:
    """This process's runner (started), or None; the channel layer is used on its loop."""
    global _local
    _local = runner
    layer.serve_on(runner.loop if runner is not None else None)
