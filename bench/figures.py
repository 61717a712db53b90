"""What every benchmark here prints: the median and the 95th percentile of its samples."""

import statistics


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]
