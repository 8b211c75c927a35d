"""Confidence intervals of accuracies over seeds: Student's t interval of a mean, and of a paired
gap (two mechanisms trained from the same seeds see the same data, so their gap is paired by seed).

    mean_interval([0.91, 0.95, 0.93])            # the mean accuracy, 95% interval
    paired_gap({0: 0.9, 1: 0.8, 2: 0.85}, {0: 0.5, 1: 0.4, 2: 0.45})  # a - b over common seeds
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # every interval the reproductions print
PERCENT = (0.0, 100.0)  # an accuracy in percent: where its printed interval is clipped


@dataclass(frozen=True)
class Interval:
    """A mean over `n` values and its two-sided confidence interval [low, high]."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. a fraction as percentage points)."""
        return Interval(self.mean * factor, self.low * factor, self.high * factor, self.n,
                        self.confidence)  # fmt: skip

    def text(
        self, digits: int = 1, sign: bool = False, within: tuple[float, float] | None = None
    ) -> str:
        """'+2.1 [-0.4, +4.6]' (sign: show + on positive numbers); within: the range the
        quantity cannot leave (an accuracy's 0-100), the printed bounds clipped to it (clipping
        keeps the interval's coverage)."""
        low, high = self.low, self.high
        if within is not None:
            low, high = max(low, within[0]), min(high, within[1])
        f = f"{{:{'+' if sign else ''}.{digits}f}}"
        return f"{f.format(self.mean)} [{f.format(low)}, {f.format(high)}]"


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student's t interval of the mean of `values` (at least 2): mean +- t * s / sqrt(n). When
    every value is the same the interval is that point."""
    n = len(values)
    if n < 2:
        raise ValueError(f"an interval needs at least 2 values, got {n}")
    mean = statistics.fmean(values)
    half = t_quantile((1 + confidence) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, confidence)


def paired_gap(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE
) -> Interval:
    """The interval of a - b over the seeds both have (a paired t interval)."""
    seeds = sorted(set(a) & set(b))
    return mean_interval([a[s] - b[s] for s in seeds], confidence)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t distribution with `df` degrees of freedom (bisection on
    its distribution function)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"need 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz's method)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point
        return 1 - _incomplete_beta(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * f / a


__all__ = [
    "CONFIDENCE",
    "PERCENT",
    "Interval",
    "mean_interval",
    "paired_gap",
    "t_cdf",
    "t_quantile",
]
