"""One CPU for an Airlock process's own threads, every CPU for the sandboxes it starts
(docs/architecture.md, "One CPU for the server's threads").

The threads of a server (its event loop, the API's, the runner's and their database threads)
take turns on one interpreter lock, and hand it over at every system call and SQLite statement.
Spread over several CPUs, a thread that takes the lock on another CPU must first be woken there,
and a wake-up across CPUs is the costliest thing the scheduler does (an interrupt between CPUs;
in a virtual machine, an exit to the hypervisor). On the 2-CPU machine of bench/sessions.py the
server spent ~30% of its CPU on those wake-ups (`perf`); kept on one CPU it spent 4.9 ms of CPU
per command instead of 7.3, and served 20 x 20 commands ~20% faster. The lock lets one thread
run Python at a time anyway: the process gives up only the part of SQLite and of its system
calls that ran beside it.

What it starts for a sandbox must not inherit that one CPU: around a start, `spawning()` gives
the calling thread the process's CPUs back (a child created by vfork takes its thread's), and
takes them away again after.

AIRLOCK_SERVER_CPU: `auto` (the default: one of the CPUs the process may use, chosen by its pid;
nothing when it may use only one), `off`, or a CPU's number. Processes on one host spread only as
their pids do (in containers each may be pid 1): give each its own number, or `off`."""

import contextlib
import logging
import os
from collections.abc import Iterator

from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)

_every: frozenset[int] | None = None  # the process's CPUs before pin(); None while it is not pinned
_one: frozenset[int] = frozenset()
_unwidened = False  # a sandbox started on the one CPU (said once)


def pin(setting: str) -> int | None:
    """Keep every thread of this process, and every thread they start, on one CPU; returns that
    CPU, or None (`off`, or a process that may use one CPU only). Once per process: a second call
    keeps the first one's CPU."""
    global _every, _one
    if _every is not None:
        return next(iter(_one))
    if setting == "off":
        return None
    every = frozenset(os.sched_getaffinity(0))
    if setting == "auto":
        if len(every) < 2:
            return None
        cpu = sorted(every)[os.getpid() % len(every)]
    else:
        cpu = int(setting)
        if cpu not in every:
            raise ImproperlyConfigured(f"AIRLOCK_SERVER_CPU={setting}: this process may run on CPUs "
                                       f"{', '.join(map(str, sorted(every)))} only")
    one = frozenset({cpu})
    # Every thread there is (a thread inherits its creator's CPUs, so one started meanwhile by a
    # thread not yet moved is found by the next pass).
    moved: set[int] = set()
    try:
        while pending := {int(tid) for tid in os.listdir("/proc/self/task")} - moved:
            for tid in pending:
                with contextlib.suppress(ProcessLookupError):  # it ended
                    os.sched_setaffinity(tid, one)
                moved.add(tid)  # (as it goes: a failure below puts back exactly those moved)
    except OSError as exc:  # no /proc, or a CPU taken away meanwhile: the process runs as it was
        for tid in moved:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, every)
        log.warning("the server's threads could not be kept to CPU %d (%s); they run on every CPU", cpu, exc)
        return None
    _every, _one = every, one
    return cpu


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Around the start of a process: it gets every CPU the server had, not the server's one."""
    if _every is None:
        yield
        return
    global _unwidened
    try:
        os.sched_setaffinity(0, _every)
    except OSError as exc:  # those CPUs are gone (out of the process's cpuset): it starts on the server's one
        if not _unwidened:  # once: it would say so for every command
            log.warning("sandboxes start on the server's CPU only: its CPUs %s could not be given back (%s)",
                        sorted(_every), exc)
        _unwidened = True
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, _one)
