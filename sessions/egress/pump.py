"""Moving bytes between two non-blocking sockets on an asyncio loop, in the kernel where it can:
splice(2) through a pipe, so the bytes of a download never cross into Python. Where splice
cannot serve a pair of sockets, a plain receive-and-send takes over."""

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Callable

CHUNK = 1 << 20
DEFAULT_PIPE = 1 << 16
F_SETPIPE_SZ = 1031
FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


async def ready(fd: int, *, writable: bool = False) -> None:
    """Until `fd` can be read (or written) without blocking."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: future.done() or future.set_result(None))
    try:
        await future
    finally:
        remove(fd)


async def pump(source: socket.socket, target: socket.socket, count: Callable[[int], int | None]) -> None:
    """Copy `source` to `target` until its end, then half-close `target`. `count(n)` is told of
    every n bytes before they move on, and returns how many more may move (None: no limit); it
    raises to stop the copy. The first bytes go through a buffer (most connections are small:
    no pipe is made for them); past DEFAULT_PIPE, splice takes over."""
    loop = asyncio.get_running_loop()
    moved = 0
    while moved < DEFAULT_PIPE:
        allowance = count(0)
        wanted = DEFAULT_PIPE if allowance is None else max(1, min(DEFAULT_PIPE, allowance + 1))
        data = await loop.sock_recv(source, wanted)
        if not data:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)
            return
        count(len(data))
        await loop.sock_sendall(target, data)
        moved += len(data)
    try:
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        await _copy(source, target, count)
        return
    try:
        with contextlib.suppress(OSError):  # a bigger pipe moves more per call; the default works too
            fcntl.fcntl(write_end, F_SETPIPE_SZ, CHUNK)
        allowance = count(0)
        while True:
            wanted = CHUNK if allowance is None else max(1, min(CHUNK, allowance + 1))
            try:
                moved = os.splice(source.fileno(), write_end, wanted, flags=FLAGS)
            except BlockingIOError:
                await ready(source.fileno())
                continue
            except OSError as exc:
                if exc.errno in UNSUPPORTED:
                    await _copy(source, target, count)
                    return
                raise
            if moved == 0:
                break
            allowance = count(moved)
            while moved:
                try:
                    moved -= os.splice(read_end, target.fileno(), moved, flags=FLAGS)
                except BlockingIOError:
                    await ready(target.fileno(), writable=True)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)
    finally:
        os.close(read_end)
        os.close(write_end)


async def _copy(source: socket.socket, target: socket.socket, count: Callable[[int], int | None]) -> None:
    loop = asyncio.get_running_loop()
    while data := await loop.sock_recv(source, CHUNK):
        count(len(data))
        await loop.sock_sendall(target, data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
