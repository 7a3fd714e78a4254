"""core.metrics against independent references: the ECE against a loop-written brute force (near-equal
scores are ties), the tie-aware argmax, the order-statistic interval against enumerated binomial
coverage, and interleaved timing."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from pipelines.core.metrics import (
    argmax_ties,
    binned_ece,
    equal_mass_bins,
    interleaved_timing,
    median_ci,
    ratio_ci,
    snap_ties,
)


def bf_ece(scores, hits, n_bins, tol=1e-9):
    """Loops: scores equal up to tol are one value; edges at quantiles; bins [e_k, e_k+1)."""
    scores = [float(s) for s in scores]
    rep = {}
    for s in sorted(scores):
        rep[s] = next((r for r in rep.values() if abs(r - s) <= tol * max(abs(s), 1e-3)), s)
    snapped = [rep[s] for s in scores]
    inner = sorted(set(np.quantile(snapped, np.linspace(0, 1, n_bins + 1)[1:-1]).tolist()))
    bounds = [-math.inf, *inner, math.inf]
    total = 0.0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        members = [i for i, s in enumerate(snapped) if lo <= s < hi]
        if members:
            conf = sum(scores[i] for i in members) / len(members)
            acc = sum(hits[i] for i in members) / len(members)
            total += len(members) / len(scores) * abs(acc - conf)
    return total


@pytest.mark.parametrize("seed", range(5))
def test_ece_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    s = rng.choice([0.1, 0.25, 0.4, 0.7, 0.9], size=200) + rng.uniform(0, 0.05, 200) * (rng.random(200) < 0.5)
    y = (rng.random(200) < s).astype(float)
    assert binned_ece(s, y, 10) == pytest.approx(bf_ece(s, y, 10), abs=1e-12)


def test_near_equal_scores_share_a_bin():
    # one rounding step apart: 0.05 vs 0.049999999999999996, 1/3 vs float32(1/3) renormalised
    base = np.array([0.05] * 50 + [0.2] * 50 + [0.6] * 100)
    jitter = base.copy()
    jitter[::2] = np.nextafter(jitter[::2], 0)
    y = np.r_[np.zeros(45), np.ones(5), np.zeros(40), np.ones(10), np.zeros(30), np.ones(70)]
    assert binned_ece(jitter, y, 15) == pytest.approx(binned_ece(base, y, 15), abs=1e-12)
    ids = equal_mass_bins(jitter, 15)
    for v in (0.05, 0.2, 0.6):
        assert len(set(ids[np.isclose(base, v)])) == 1


def test_ece_rows_and_bootstrap_weights():
    rng = np.random.default_rng(0)
    s = rng.random(100)
    rows = (rng.random((3, 100)) < s).astype(float)
    out = binned_ece(s, rows, 8)
    assert out.shape == (3,) and all(out[i] == pytest.approx(bf_ece(s, rows[i], 8)) for i in range(3))
    w = np.ones((2, 100))
    assert np.allclose(binned_ece(s, rows, 8, weights=w), out[0])


def test_snap_ties_and_argmax_ties():
    x = np.array([0.3, 0.3 + 1e-17, 0.1, 0.3 * (1 + 1e-12), 0.5])
    assert (snap_ties(x)[[0, 1, 3]] == snap_ties(x)[0]).all() and snap_ties(x)[4] == 0.5
    a = np.array([[0.049999999999999996, 0.05, 0.01], [0.1, 0.3, 0.3 + 1e-16]])
    assert argmax_ties(a).tolist() == [0, 1]
    assert np.argmax(a, 1).tolist() == [1, 2]  # plain argmax splits the tie


def test_median_ci_coverage_is_exact_for_the_chosen_order_statistics():
    for n in (5, 9, 20, 41):
        x = np.arange(n, dtype=float)
        med, lo, hi = median_ci(x, 0.95)
        assert med == np.median(x)
        if n < 6:  # too few values for 95%: no interval at all (a claim on it is inconclusive)
            assert (lo, hi) == (-math.inf, math.inf)
            continue
        k = int(lo) + 1  # interval = (x_(k), x_(n-k+1))
        cover = sum(binom.pmf(j, n, 0.5) for j in range(k, n - k + 1))
        assert cover >= 0.95
        cover_narrower = sum(binom.pmf(j, n, 0.5) for j in range(k + 1, n - k))
        assert cover_narrower < 0.95 and hi == n - k


def test_ratio_ci_of_paired_rounds():
    a = np.array([2.0, 2.2, 1.8, 2.1, 1.9, 2.0, 2.05, 1.95, 2.0, 2.02, 1.98, 2.01])
    r = ratio_ci(a, np.ones_like(a))
    assert r.ratio == pytest.approx(np.median(a)) and r.ci_low <= r.ratio <= r.ci_high and r.rounds == 12
    m = r.as_metrics("speedup")
    assert set(m) == {"speedup", "speedup.ci_low", "speedup.ci_high"}
    with pytest.raises(ValueError):
        ratio_ci([1.0], [1.0, 2.0])


def test_interleaved_timing_inner_counts_per_function():
    calls = []
    out = interleaved_timing(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, warmup=0, inner={"a": 3}
    )
    assert calls.count("a") == 6 and calls.count("b") == 2 and len(out["a"]) == 2
    with pytest.raises(ValueError):
        interleaved_timing({"a": lambda: None}, rounds=1, inner=0)


def test_interleaved_timing_rotates_order_and_counts_rounds():
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    out = interleaved_timing(fns, rounds=3, warmup=1)
    assert {k: len(v) for k, v in out.items()} == {"a": 3, "b": 3, "c": 3}
    assert calls[3:] == list("abc") + list("bca") + list("cab")
    assert all((v >= 0).all() for v in out.values())
    assert list(itertools.chain(calls[:3])) == list("abc")
