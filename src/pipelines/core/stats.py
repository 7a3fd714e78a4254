"""Intervals over seeds: every claim and gate is decided by one.

The estimator is Student's t over the per-seed values (for a derived metric, over the per-seed *paired*
values, e.g. the differences method − baseline on the same seed): ``mean ± t_{0.975, n−1} · s/√n`` with
``s`` the sample standard deviation (ddof = 1). With one seed there is no interval (a point verdict).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
ESTIMATOR = "student-t 95% over seeds (paired per seed for derived metrics)"


@dataclass(frozen=True)
class Estimate:
    """A value with an optional interval; ``n`` is the number of seeds (or rounds) behind it."""

    value: float
    lo: float | None = None
    hi: float | None = None
    n: int = 1

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean of ``values`` and its t-interval (NaN entries make the whole estimate NaN: a diverged seed is
    never silently dropped)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return Estimate(float("nan"), n=0)
    mean = sum(xs) / n
    if n < 2 or not all(math.isfinite(x) for x in xs):
        return Estimate(mean, n=n) if n < 2 else Estimate(float("nan"), n=n)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1, confidence) * sd / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)


__all__ = ["CONFIDENCE", "ESTIMATOR", "Estimate", "t_interval", "t_quantile"]
