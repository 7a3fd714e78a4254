"""The objective checks the report carries (card §Batch objective): on random small ground sets, F_A
(anchors fixed) is monotone and submodular (checked exhaustively over every S ⊆ T and x ∉ T), the
all-members ablation is not, and greedy reaches ≥ (1 − 1/e) of the brute-force optimum."""

from __future__ import annotations

import itertools

import numpy as np

from pipelines.hobit.batching import all_members_objective, anchor_objective, greedy_members
from pipelines.hobit.params import Params

TOL = 1e-9


def random_weights(rng: np.random.Generator, rows: int, cols: int, density: float = 0.7) -> np.ndarray:
    """Pair weights like HOBIT's: exp(s_ij − s_ii) for scores around the positive, some pairs outside the
    top-M graph or filtered (0)."""
    a = np.exp(rng.normal(-1.0, 1.5, size=(rows, cols)))
    return a * (rng.random((rows, cols)) < density)


def subset_values(f, n: int) -> np.ndarray:
    """f(S) for every subset S of range(n), indexed by bitmask."""
    return np.array([f([i for i in range(n) if mask >> i & 1]) for mask in range(1 << n)])


def violations(values: np.ndarray, n: int) -> tuple[int, int, int]:
    """(monotonicity violations, submodularity violations, submodularity inequalities checked) over all
    S ⊆ T ⊆ V, x ∉ T: F(S ∪ x) − F(S) ≥ F(T ∪ x) − F(T)."""
    mono = sub = total = 0
    for T in range(1 << n):
        S = T
        while True:  # every subset S of T
            for x in range(n):
                bit = 1 << x
                if T & bit:
                    continue
                gs = values[S | bit] - values[S]
                gt = values[T | bit] - values[T]
                if S == T and gs < -TOL:
                    mono += 1
                if S != T:
                    total += 1
                    sub += gs < gt - TOL
            if S == 0:
                break
            S = (S - 1) & T
    return mono, sub, total


def to_entries(W: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r, c = np.nonzero(W)
    return r, c, W[r, c]


def objective_checks(p: Params) -> dict:
    c = p.checks
    rng = np.random.default_rng([2026, 11])
    anchor_mono = anchor_sub = anchor_total = 0
    all_sub = all_total = 0
    for _ in range(c.n_instances):
        W = random_weights(rng, c.n_anchors, c.ground)
        v = random_weights(rng, c.n_anchors, c.ground).sum(0)
        mono, sub, total = violations(subset_values(lambda S: anchor_objective(W, v, S), c.ground), c.ground)
        anchor_mono, anchor_sub, anchor_total = anchor_mono + mono, anchor_sub + sub, anchor_total + total
        w = random_weights(rng, c.ground, c.ground)
        _, sub, total = violations(subset_values(lambda S: all_members_objective(w, S), c.ground), c.ground)
        all_sub, all_total = all_sub + sub, all_total + total
    ratios = []
    for _ in range(c.n_instances):
        W = random_weights(rng, c.n_anchors, c.greedy_ground)
        v = random_weights(rng, c.n_anchors, c.greedy_ground).sum(0)
        chosen, value = greedy_members(*to_entries(W), v, c.n_anchors, c.greedy_budget)
        best = max(
            anchor_objective(W, v, S)
            for S in itertools.combinations(range(c.greedy_ground), min(c.greedy_budget, c.greedy_ground))
        )
        ratios.append(value / best if best > 0 else 1.0)
    ratios = np.asarray(ratios)
    return {
        "objective.anchors_fixed.monotonicity_violations": int(anchor_mono),
        "objective.anchors_fixed.submodularity_violations": int(anchor_sub),
        "objective.anchors_fixed.inequalities_checked": int(anchor_total),
        "objective.all_members.submodularity_violations": int(all_sub),
        "objective.all_members.submodularity_violation_rate": float(all_sub / max(all_total, 1)),
        "greedy.min_ratio_to_brute_force": float(ratios.min()),
        "greedy.mean_ratio_to_brute_force": float(ratios.mean()),
        "greedy.share_optimal": float((ratios >= 1 - 1e-9).mean()),
    }
