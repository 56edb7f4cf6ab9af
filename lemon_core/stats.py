"""Intervals for the figures lemon reports: every accuracy carries n and a 95% interval."""

from __future__ import annotations

import math
from collections.abc import Sequence


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (successes out of n); (0, 1) when n is 0.

    Wilson rather than the normal approximation because lemon's n is small (tens of examples) and
    accuracies sit near 0 or 1, where p ± z·sqrt(p(1-p)/n) leaves [0, 1] or collapses to a point.
    """
    if n <= 0:
        return 0.0, 1.0
    p = min(max(successes / n, 0.0), 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def standard_error(values: Sequence[float]) -> float:
    """Standard error of a mean, s/√n with the sample standard deviation (n - 1); 0 for n < 2."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def mean_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Normal-approximation interval of a mean (mean ± z·s/√n); the mean itself for n < 2."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    mean = sum(values) / n
    se = standard_error(values)
    return mean - z * se, mean + z * se
