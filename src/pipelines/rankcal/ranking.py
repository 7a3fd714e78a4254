"""Permutation algebra and the predictive distributions of the paper's setup (labels [m], rankings
π ∈ S_m, Q(·|x) ∈ Δ(S_m)): explicit tables over all m! orderings (m ≤ 6), Plackett–Luce and Mallows
tables, and the indicator maps that turn a full table into its sub-ranking and top-k marginals.

A ranking is an *ordering*: ``perms[p, r]`` is the label at position r (0 = best) of permutation p;
permutations are enumerated in lexicographic order (itertools), so for m = 3 the order is
abc, acb, bac, bca, cab, cba as in the card.
"""

from __future__ import annotations

import itertools
import math
from functools import cache

import numpy as np

MAX_EXACT_M = 6  # 720 orderings: beyond this no explicit table is built


@cache
def perms(m: int) -> np.ndarray:
    """(m!, m) int array of all orderings in lexicographic order."""
    if not 2 <= m <= MAX_EXACT_M:
        raise ValueError(f"exact ranking tables need 2 <= m <= {MAX_EXACT_M} (got m={m})")
    out = np.array(list(itertools.permutations(range(m))), dtype=np.int64)
    out.setflags(write=False)
    return out


@cache
def positions(m: int) -> np.ndarray:
    """(m!, m): ``positions(m)[p, j]`` is the position of label j in permutation p."""
    P = perms(m)
    pos = np.empty_like(P)
    pos[np.arange(len(P))[:, None], P] = np.arange(m)[None, :]
    pos.setflags(write=False)
    return pos


def perm_index(orderings: np.ndarray) -> np.ndarray:
    """Index (into ``perms(m)``) of each ordering in an (n, m) array (lexicographic rank, Lehmer code)."""
    orderings = np.asarray(orderings, dtype=np.int64)
    n, m = orderings.shape
    idx = np.zeros(n, dtype=np.int64)
    remaining = np.tile(np.arange(m), (n, 1))
    alive = np.ones((n, m), dtype=bool)
    for r in range(m):
        # number of still-unplaced labels smaller than the label placed at position r
        smaller = (alive & (remaining < orderings[:, r : r + 1])).sum(1)
        idx += smaller * math.factorial(m - 1 - r)
        alive[np.arange(n), orderings[:, r]] = False
    return idx


@cache
def kendall_matrix(m: int) -> np.ndarray:
    """(m!, m!) Kendall distances d_K (number of discordant label pairs)."""
    pos = positions(m)
    d = np.zeros((len(pos), len(pos)), dtype=np.int64)
    for i, j in itertools.combinations(range(m), 2):
        a = pos[:, i] < pos[:, j]
        d += a[:, None] != a[None, :]
    d.setflags(write=False)
    return d


def kendall_tau(a_idx: np.ndarray, b_idx: np.ndarray, m: int) -> np.ndarray:
    """Kendall τ between rankings given by permutation indices: 1 − 4 d_K / (m(m−1))."""
    return 1.0 - 4.0 * kendall_matrix(m)[a_idx, b_idx] / (m * (m - 1))


# --------------------------------------------------------------------------- marginal maps
@cache
def pair_lut(m: int) -> tuple[tuple[tuple[int, int], ...], np.ndarray]:
    """Unordered pairs i < j and a (n_pairs, m!) 0/1 map: 0 when i ≻ j in π, 1 when j ≻ i."""
    pairs = tuple(itertools.combinations(range(m), 2))
    pos = positions(m)
    lut = np.stack([(pos[:, i] > pos[:, j]).astype(np.int64) for i, j in pairs])
    lut.setflags(write=False)
    return pairs, lut


@cache
def subset_lut(m: int, size: int) -> tuple[tuple[tuple[int, ...], ...], np.ndarray]:
    """Subsets A (|A| = size) and a (n_subsets, m!) map π ↦ index of the restriction π|A among the
    size! orders of A (lexicographic over A's elements). The restriction of π to A keeps the
    relative order of A's labels."""
    subsets = tuple(itertools.combinations(range(m), size))
    pos = positions(m)
    local = {o: k for k, o in enumerate(itertools.permutations(range(size)))}
    lut = np.empty((len(subsets), len(pos)), dtype=np.int64)
    for s, A in enumerate(subsets):
        order = np.argsort(pos[:, list(A)], axis=1, kind="stable")  # local indices best → worst
        lut[s] = [local[tuple(o)] for o in order]
    lut.setflags(write=False)
    return subsets, lut


@cache
def prefix_lut(m: int, k: int) -> tuple[tuple[tuple[int, ...], ...], np.ndarray]:
    """Ordered top-k prefixes τ and a (m!,) map π ↦ index of prefix_k(π)."""
    prefixes = tuple(itertools.permutations(range(m), k))
    index = {t: i for i, t in enumerate(prefixes)}
    lut = np.array([index[tuple(p[:k])] for p in perms(m)], dtype=np.int64)
    lut.setflags(write=False)
    return prefixes, lut


def marginal(Q: np.ndarray, lut: np.ndarray, n_cat: int) -> np.ndarray:
    """Push a table Q (n, m!) through a map π ↦ category: (n, n_cat) = Q @ indicator matrix."""
    ind = np.zeros((Q.shape[1], n_cat))
    ind[np.arange(Q.shape[1]), lut] = 1.0
    return Q @ ind


def pairwise_marginals(Q: np.ndarray, m: int) -> np.ndarray:
    """(n, n_pairs): p_ij = Q(i ≻ j) for i < j."""
    _, lut = pair_lut(m)
    return Q @ (lut == 0).T.astype(float)


def top1_marginal(Q: np.ndarray, m: int) -> np.ndarray:
    return marginal(Q, perms(m)[:, 0], m)


# --------------------------------------------------------------------------- model tables
def _rev_logcumsumexp(x: np.ndarray) -> np.ndarray:
    """log Σ_{j ≥ r} exp(x_j) along the last axis."""
    return np.logaddexp.accumulate(x[..., ::-1], axis=-1)[..., ::-1]


def pl_log_likelihood(scores: np.ndarray, orderings: np.ndarray) -> np.ndarray:
    """log PL(ordering | v = exp(scores)), (n,), in float64 with logsumexp (scores may be ≫ 1)."""
    s = np.take_along_axis(np.asarray(scores, float), np.asarray(orderings), axis=1)
    return (s - _rev_logcumsumexp(s)).sum(1)


def pl_log_table(scores: np.ndarray) -> np.ndarray:
    """(n, m!) log Q(π) of Plackett–Luce with log-weights ``scores`` (n, m)."""
    scores = np.asarray(scores, dtype=np.float64)
    P = perms(scores.shape[1])
    s = scores[:, P]  # (n, m!, m) scores in the order of each permutation
    return (s - _rev_logcumsumexp(s)).sum(-1)


def pl_table(scores: np.ndarray) -> np.ndarray:
    t = np.exp(pl_log_table(scores))
    return t / t.sum(1, keepdims=True)  # removes float round-off only


def mallows_table(centre_idx: np.ndarray, theta: np.ndarray, m: int) -> np.ndarray:
    """(n, m!) Mallows Q(π) ∝ exp(−θ d_K(π, π0)) with centres given as permutation indices."""
    d = kendall_matrix(m)[np.asarray(centre_idx)]  # (n, m!)
    logits = -np.asarray(theta, float)[:, None] * d
    logits -= logits.max(1, keepdims=True)
    t = np.exp(logits)
    return t / t.sum(1, keepdims=True)


def mallows_expected_distance(theta: np.ndarray | float, m: int) -> np.ndarray:
    """E_θ[d_K] = m e^{−θ}/(1−e^{−θ}) − Σ_{j=1..m} j e^{−jθ}/(1−e^{−jθ}) (θ → 0: m(m−1)/4)."""
    theta = np.maximum(np.asarray(theta, float), 1e-9)
    q = np.exp(-theta)
    out = m * q / (1 - q)
    for j in range(1, m + 1):
        out = out - j * q**j / (1 - q**j)
    return out


def mallows_theta_mle(mean_distance: np.ndarray, m: int, theta_max: float, iters: int = 60) -> np.ndarray:
    """Solve E_θ[d_K] = d̄ by bisection (E is decreasing in θ), θ ∈ [0, theta_max]; d̄ at or above the
    uniform mean gives θ = 0, d̄ at or below E(theta_max) gives the cap (neighbours that agree)."""
    d = np.asarray(mean_distance, float)
    lo, hi = np.zeros_like(d), np.full_like(d, theta_max)
    for _ in range(iters):
        mid = (lo + hi) / 2
        too_spread = mallows_expected_distance(mid, m) > d  # θ must grow
        lo = np.where(too_spread, mid, lo)
        hi = np.where(too_spread, hi, mid)
    theta = (lo + hi) / 2
    theta = np.where(d >= m * (m - 1) / 4, 0.0, theta)
    return np.where(d <= mallows_expected_distance(theta_max, m), theta_max, theta)


def sample_table(Q: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """(size, n) permutation indices drawn row-wise from the categorical tables Q (n, K)."""
    cdf = np.cumsum(Q, axis=1)
    cdf[:, -1] = 1.0
    u = rng.random((size, Q.shape[0]))
    return (u[..., None] > cdf[None]).sum(-1)


def sample_pl(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One PL ordering per row (Gumbel-max: argsort of scores + Gumbel noise, descending)."""
    g = rng.gumbel(size=scores.shape)
    return np.argsort(-(scores + g), axis=1, kind="stable")
