"""What every benchmark here prints: the median and the 95th percentile of its samples."""

import statistics
from pathlib import Path


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]


def host_notes() -> str:
    """The host settings that move these figures (sessions/runtimes/cgroups.py and enter.c say
    why): whether a bubblewrap command that follows a pause waits for the kernel to move it into
    its cgroups."""
    try:
        expedited = Path("/sys/kernel/rcu_expedited").read_text().strip()
    except OSError:
        expedited = "unknown"
    from django.apps import apps

    if not apps.ready:  # a benchmark of a server alone (bench/egress.py) does not set Django up
        return f"host: /sys/kernel/rcu_expedited = {expedited}"
    from sessions.runtimes import get_driver
    from sessions.runtimes.base import RuntimeUnavailable

    try:
        driver = get_driver("bubblewrap")
        driver.check()
        slower = driver.slower_here()
    except RuntimeUnavailable as exc:
        return f"host: bubblewrap unavailable ({exc})"
    wait = "a command after a pause waits ~11 ms to join its cgroups" if slower else "no cgroup wait after a pause"
    return f"host: /sys/kernel/rcu_expedited = {expedited}; bubblewrap: {wait}"
