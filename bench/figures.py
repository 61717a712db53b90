"""What every benchmark here prints: the median and the 95th percentile of its samples."""

import statistics
from pathlib import Path


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]


def host_notes() -> str:
    """The host settings that move these figures (sessions/runtimes/cgroups.py says why)."""
    try:
        expedited = Path("/sys/kernel/rcu_expedited").read_text().strip()
    except OSError:
        expedited = "unknown"
    return f"host: /sys/kernel/rcu_expedited = {expedited} (1 spares a cgroup move its ~11 ms grace-period wait)"
