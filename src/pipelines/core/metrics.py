"""Metrics that more than one method needs, written once: the binned ECE (equal-mass bins whose edges
never split tied scores, ties taken up to a rounding tolerance), a tie-aware argmax, the relative gain
with one argument order and direction, and interleaved timing with a distribution-free interval."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# Scores one or a few rounding steps apart (float32 storage, Q @ indicator sums, renormalisation) are
# the same score: relative 1e-9 and absolute 1e-12 are far above float64 noise and far below any real
# difference between predictions.
TIE_RTOL = 1e-9
TIE_ATOL = 1e-12


# ------------------------------------------------------------------------------------------- ties
def snap_ties(x: np.ndarray, rtol: float = TIE_RTOL, atol: float = TIE_ATOL) -> np.ndarray:
    """``x`` with every run of values that are equal up to the tolerance (chained over sorted
    neighbours) replaced by the run's smallest value, so exact comparisons treat them as ties."""
    x = np.asarray(x, float)
    if x.size == 0:
        return x.copy()
    order = np.argsort(x, kind="stable")
    s = x[order]
    close = np.diff(s) <= atol + rtol * np.abs(s[1:])
    run_start = np.r_[0, np.flatnonzero(~close) + 1]
    run_id = np.cumsum(np.r_[True, ~close]) - 1
    snapped = np.empty_like(s)
    snapped[:] = s[run_start][run_id]
    out = np.empty_like(x)
    out[order] = snapped
    return out


def argmax_ties(a: np.ndarray, axis: int = -1, rtol: float = TIE_RTOL, atol: float = TIE_ATOL) -> np.ndarray:
    """argmax where entries equal to the maximum up to the tolerance are ties, broken to the lowest index."""
    a = np.asarray(a, float)
    top = a.max(axis=axis, keepdims=True)
    return np.argmax(a >= top - (atol + rtol * np.abs(top)), axis=axis)


# -------------------------------------------------------------------------------------------- ECE
def equal_mass_bins(scores: np.ndarray, n_bins: int, rtol: float = TIE_RTOL, atol: float = TIE_ATOL) -> np.ndarray:
    """Bin index of each score: equal-mass bins whose edges are score quantiles; a score equal to an
    edge (up to the tolerance) goes up, so tied scores always share a bin."""
    s = snap_ties(scores, rtol, atol)
    edges = np.unique(np.quantile(s, np.linspace(0, 1, n_bins + 1)[1:-1]))
    return np.searchsorted(edges, s, side="right")


def _onehot(ids: np.ndarray) -> np.ndarray:
    oh = np.zeros((len(ids), int(ids.max()) + 1 if len(ids) else 1))
    oh[np.arange(len(ids)), ids] = 1.0
    return oh


def binned_ece(
    scores: np.ndarray, indicators: np.ndarray, n_bins: int, weights: np.ndarray | None = None
) -> np.ndarray | float:
    """ECE ``Σ_b (n_b/n)|acc_b − conf_b|`` of ``scores`` (n,) with equal-mass, tie-preserving bins.

    ``indicators`` (n,) gives a float; (r, n) gives the r ECEs of each row with the same bins (e.g. the
    observed outcomes and resampled ones). With ``weights`` (B, n) (bootstrap counts) it returns the B
    weighted ECEs of ``indicators[0]`` with the bins fixed from the full sample."""
    scores = np.asarray(scores, float)
    single = np.ndim(indicators) == 1
    ind = np.atleast_2d(np.asarray(indicators, float))
    oh = _onehot(equal_mass_bins(scores, n_bins))
    if weights is None:
        # Σ_b |Σ_{i∈b} (y_i − s_i)| / n  ==  Σ_b (n_b/n) |acc_b − conf_b|
        out = np.abs((ind - scores) @ oh).sum(1) / len(scores)
        return float(out[0]) if single else out
    return np.abs((weights * (ind[0] - scores)) @ oh).sum(1) / weights.sum(1)


# ------------------------------------------------------------------------------------------- gain
def relative_gain(*, method: float, baseline: float, lower_is_better: bool = True) -> float:
    """How much better ``method`` is than ``baseline``, as a fraction of the baseline's magnitude:
    ``(baseline − method)/|baseline|`` for a lower-is-better metric, ``(method − baseline)/|baseline|``
    otherwise. Positive means the method is better. Keyword-only, so the order can never be swapped."""
    if baseline == 0 or not (math.isfinite(baseline) and math.isfinite(method)):
        return float("nan")
    diff = (baseline - method) if lower_is_better else (method - baseline)
    return diff / abs(baseline)


# ----------------------------------------------------------------------------------------- timing
@dataclass
class RatioEstimate:
    """Median of paired per-round ratios a/b with a distribution-free confidence interval."""

    ratio: float
    ci_low: float
    ci_high: float
    rounds: int
    confidence: float

    def as_metrics(self, name: str) -> dict[str, float]:
        """``{name: ratio, name.ci_low: ..., name.ci_high: ...}`` (claims read the interval from these)."""
        return {name: self.ratio, f"{name}.ci_low": self.ci_low, f"{name}.ci_high": self.ci_high}


def median_ci(x: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The median of ``x`` and an exact, distribution-free interval from order statistics: the smallest
    symmetric pair (x_(k), x_(n−k+1)) with P(Bin(n, 1/2) in [k, n−k]) ≥ confidence. With too few
    values for that confidence (even (min, max) misses the median with probability 2^(1−n) > 1 − confidence)
    the interval is (−inf, inf), so a claim on it is inconclusive rather than decided at a lower confidence."""
    from scipy.stats import binom

    s = np.sort(np.asarray(x, float))
    n = len(s)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    med = float(np.median(s))
    k = int(binom.ppf((1 - confidence) / 2, n, 0.5))  # number of values allowed below the interval
    while k > 0 and binom.cdf(n - k, n, 0.5) - binom.cdf(k - 1, n, 0.5) < confidence:
        k -= 1
    if k < 1:
        return med, -math.inf, math.inf
    return med, float(s[k - 1]), float(s[n - k])


def ratio_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> RatioEstimate:
    """a/b from interleaved rounds: per-round ratios a_i/b_i (load that hits a round hits both), their
    median and its order-statistic interval."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("ratio_ci needs two equally long, non-empty series of paired rounds")
    med, lo, hi = median_ci(a / b, confidence)
    return RatioEstimate(med, lo, hi, len(a), confidence)


def interleaved_timing(
    fns: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
    clock: str = "wall",
    inner: int | Mapping[str, int] = 1,
) -> dict[str, np.ndarray]:
    """Time each function ``rounds`` times, interleaved: every round runs every function once, in an
    order rotated each round, so drift and bursts of load fall on all of them alike. ``inner`` calls per
    sample (for very short functions; a mapping name → calls gives each function its own count, for
    groups that mix microsecond and second-long calls); ``clock`` ``wall`` (perf_counter) or ``cpu``
    (process time).
    Returns seconds per call, one array of ``rounds`` values per function."""
    if rounds < 1:
        raise ValueError("interleaved_timing needs rounds >= 1")
    tick = time.perf_counter if clock == "wall" else time.process_time
    sync = sync or (lambda: None)
    names = list(fns)
    reps = {nm: int(inner) if isinstance(inner, int) else int(inner.get(nm, 1)) for nm in names}
    if min(reps.values(), default=1) < 1:
        raise ValueError("interleaved_timing needs inner >= 1")
    for _ in range(warmup):
        for nm in names:
            fns[nm]()
        sync()
    out: dict[str, list[float]] = {nm: [] for nm in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for nm in order:
            sync()
            t0 = tick()
            for _ in range(reps[nm]):
                fns[nm]()
            sync()
            out[nm].append((tick() - t0) / reps[nm])
    return {nm: np.asarray(v) for nm, v in out.items()}


__all__ = [
    "RatioEstimate",
    "TIE_ATOL",
    "TIE_RTOL",
    "argmax_ties",
    "binned_ece",
    "equal_mass_bins",
    "interleaved_timing",
    "median_ci",
    "ratio_ci",
    "relative_gain",
    "snap_ties",
]
