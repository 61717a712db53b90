"""A token bucket, shared by threads: what a tenant's output (bytes) and its API requests are
paced by (docs/architecture.md, "Admission"). This module imports nothing of Airlock."""

import threading
import time


class Rate:
    """`per_s` units a second on average, in bursts of up to `burst`. `take(n)` takes `n` units
    and says how long to wait before using them (0: now); with `max_wait`, it takes nothing and
    answers None when the wait would be longer."""

    def __init__(self, per_s: float, burst: float):
        self.per_s, self.burst = per_s, burst
        self.allowance = float(burst)
        self.last = time.monotonic()
        self._lock = threading.Lock()

    def take(self, size: float = 1, *, max_wait: float | None = None) -> float | None:
        with self._lock:
            now = time.monotonic()
            allowance = min(self.burst, self.allowance + (now - self.last) * self.per_s) - size
            wait = max(0.0, -allowance / self.per_s)
            self.last = now
            if max_wait is not None and wait > max_wait:
                self.allowance = allowance + size  # refused: nothing taken
                return None
            self.allowance = allowance
            return wait
