"""Ending a pool of threads that use the database: Django's connections are per thread, so each
worker must close its own before the pool goes (a PostgreSQL server otherwise keeps their
sessions until the process exits)."""

import concurrent.futures
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import connections


def close_connections_and_shutdown(executor: ThreadPoolExecutor) -> None:
    """Each worker thread closes its own database connections, then the pool ends. The barrier
    makes every worker take exactly one of the closing tasks."""
    workers = len(executor._threads)  # the pool's own count: it offers no public one
    if workers:
        barrier = threading.Barrier(workers)

        def close() -> None:
            connections.close_all()
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)

        concurrent.futures.wait([executor.submit(close) for _ in range(workers)], timeout=10)
    executor.shutdown(wait=True, cancel_futures=True)
