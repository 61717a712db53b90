"""Commands' deadlines, kept by one thread for the whole process.

A `threading.Timer` per command started a thread per command, and `Thread.start()` waits until
the new thread has run: under load, one more turn for the GIL on every command's way. Here one
daemon thread sleeps until the nearest deadline; scheduling and cancelling are a heap push and a
flag. A deadline that passes gets a thread of its own for its callback (a driver's stop may wait
for a cgroup to empty), so one slow stop never delays another command's deadline; that thread is
started only for the few commands that run out of time."""

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Deadline:
    __slots__ = ("_keeper", "at", "callback", "cancelled")

    def __init__(self, at: float, callback: Callable[[], None], keeper: "_Keeper"):
        self.at, self.callback, self.cancelled, self._keeper = at, callback, False, keeper

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._keeper.cancelled()


class _Keeper:
    def __init__(self):
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # ties keep their order; Deadlines are never compared
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._cancelled = 0  # in the heap still: dropped all at once when they are most of it

    def after(self, seconds: float, callback: Callable[[], None]) -> Deadline:
        deadline = Deadline(time.monotonic() + seconds, callback, self)
        with self._changed:
            heapq.heappush(self._heap, (deadline.at, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():  # first use, or a forked child
                thread = threading.Thread(target=self._run, name="airlock-deadlines", daemon=True)
                thread.start()  # raises (no thread can start) before it is counted on
                self._thread = thread
            elif self._heap[0][2] is deadline:  # the nearest now: the thread sleeps too long otherwise
                self._changed.notify()
        return deadline

    def cancelled(self) -> None:
        """Commands end long before their deadline: without this, an hour's timeout would keep an
        hour of ended commands in the heap."""
        with self._changed:
            self._cancelled += 1
            if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._heap and self._heap[0][2].cancelled:  # cancelled ones leave as they come up
                    heapq.heappop(self._heap)
                    self._cancelled -= 1
                if not self._heap:
                    self._changed.wait()
                    continue
                at, _, deadline = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                heapq.heappop(self._heap)
            if deadline.cancelled:
                continue
            try:
                threading.Thread(target=_keep, args=(deadline,), name="airlock-deadline", daemon=True).start()
            except RuntimeError:  # no thread could start (a pids limit): keep it here, late rather than never
                _keep(deadline)


def _keep(deadline: Deadline) -> None:
    if deadline.cancelled:  # the command ended while this thread started: not a timeout
        return
    try:
        deadline.callback()
    except Exception:
        log.exception("a command's deadline could not be kept")


_keeper = _Keeper()


def after(seconds: float, callback: Callable[[], None]) -> Deadline:
    """Call `callback` once `seconds` have passed, unless the returned deadline is cancelled first."""
    return _keeper.after(seconds, callback)
