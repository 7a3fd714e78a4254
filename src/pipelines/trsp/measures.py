"""Exact JR and core violation factors of a stop set (card: "β-JR", "(α, β)-core").

A group N' blocks S through a deviation T when β·cost_i(T) < cost_i(S) for every i in N'. For a fixed T
such a group of size g exists exactly when β is below the g-th largest ratio cost_i(S) / cost_i(T), so the
smallest β for which S is β-fair is max(1, max_T g-th largest ratio). JR: T a pair, g = ⌈f·n/k⌉ (f = 2 by
default: a pair costs two of the k stops). Core: g = ⌈α·|T|·n/k⌉; |T| = 2 over all pairs (exact) and
|T| = 3 over the triples of a shortlist of candidates (a lower bound)."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np

from pipelines.trsp.instance import Instance, pair_table

RTOL = 1e-9  # ratios within this of 1 are "no improvement" (ties are not violations)
CHUNK = 4_000_000  # ratio entries held at once (full scale: m²·n ≈ 1e9 does not fit)


def group_size(factor: float, n: int, k: int) -> int:
    return max(1, math.ceil(factor * n / k - 1e-9))


def ratios(cost_S: np.ndarray, cost_T: np.ndarray) -> np.ndarray:
    """cost_i(S) / cost_i(T) with 0/0 = 0 (an agent at zero cost cannot improve) and x/0 = inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = cost_S[:, None] / cost_T
    r[(cost_T <= 0) & (cost_S[:, None] <= 0)] = 0.0
    return r


def kth_largest(r: np.ndarray, g: int) -> np.ndarray:
    """Column-wise g-th largest value of (n, P)."""
    n = r.shape[0]
    return np.partition(r, n - g, axis=0)[n - g]


def _blocking(cost_S: np.ndarray, cost_T: np.ndarray, g: int) -> np.ndarray:
    """Per deviation: the g-th largest ratio (the factor by which a group of g can improve)."""
    return kth_largest(ratios(cost_S, cost_T), g)


def factor(cost_S: np.ndarray, devs: np.ndarray, walk: np.ndarray, g: int) -> tuple[float, int]:
    """(β̂, index of the worst deviation or -1) over deviations with ride costs ``devs`` (n, P)."""
    n, P = devs.shape
    if g > n or P == 0:
        return 1.0, -1
    best, arg = -np.inf, -1
    step = max(1, CHUNK // max(n, 1))
    for a in range(0, P, step):
        cost_T = np.minimum(walk[:, None], devs[:, a : a + step])
        b = _blocking(cost_S, cost_T, g)
        j = int(np.argmax(b))
        if b[j] > best:
            best, arg = float(b[j]), a + j
    if best <= 1 + RTOL:
        return 1.0, -1
    return best, arg


def jr_factor(inst: Instance, S, mode: str = "set", group_factor: float = 2.0) -> float:
    """β̂_JR: the smallest β for which S is β-JR (pairs as ``mode`` deviations, groups of ⌈f·n/k⌉)."""
    pairs, devs = pair_table(inst, mode)
    return factor(inst.cost(S), devs, inst.walk, group_size(group_factor, inst.n, inst.k))[0]


def core_t2(inst: Instance, S, alpha: float) -> float:
    """β̂ of the (α, β)-core restricted to |T| = 2 (exact)."""
    _, devs = pair_table(inst, "set")
    return factor(inst.cost(S), devs, inst.walk, group_size(2 * alpha, inst.n, inst.k))[0]


def shortlist(inst: Instance, S, size: int, alpha: float = 1.0) -> np.ndarray:
    """The ``size`` candidates whose best pair blocks S the most (α-core groups): where a blocking triple
    is most likely to be found."""
    if inst.m <= size:
        return np.arange(inst.m)
    pairs, devs = pair_table(inst, "set")
    g = group_size(2 * alpha, inst.n, inst.k)
    if g > inst.n:
        return np.arange(size)
    b = _blocking(inst.cost(S), np.minimum(inst.walk[:, None], devs), g)
    score = np.full(inst.m, -np.inf)
    np.maximum.at(score, pairs[:, 0], b)
    np.maximum.at(score, pairs[:, 1], b)
    return np.sort(np.argsort(-score, kind="stable")[:size])


def core_t3(inst: Instance, S, alpha: float, short: np.ndarray) -> float:
    """A lower bound on β̂ of the (α, β)-core from the triples T of the shortlist (exact over them)."""
    g = group_size(3 * alpha, inst.n, inst.k)
    if g > inst.n or len(short) < 3:
        return 1.0
    sub = inst.sub_routes(short)  # (n, s, s)
    triples = np.array(list(combinations(range(len(short)), 3)))
    cost_S = inst.cost(S)
    best = 1.0
    step = max(1, CHUNK // (9 * inst.n))
    for a in range(0, len(triples), step):
        tr = triples[a : a + step]
        # every ordered pair (incl. p = q) within the triple: 9 rides
        rides = np.stack([sub[:, tr[:, x], tr[:, y]] for x in range(3) for y in range(3)], 0).min(0)
        b = _blocking(cost_S, np.minimum(inst.walk[:, None], rides), g)
        best = max(best, float(b.max()))
    return 1.0 if best <= 1 + RTOL else best


def jr_proxy(inst: Instance, S, mode: str = "set", group_factor: float = 2.0) -> float:
    """The smooth proxy the adversarial search climbs: max over the pairs not inside S of the g-th largest
    cost_i(S) / ride_i(p, q), with the two-stop ride only (no walking, no single stop) in the denominator.
    Card: the true β̂ is a plateau at 1 that random search never leaves. Pairs inside S (ratio ≤ 1 for
    every agent) and single-stop rides (= walking along an L1 geodesic) would pin the proxy at 1 too."""
    pairs, _ = pair_table(inst, mode)
    inside = np.isin(pairs, list(S)).all(1)
    g = group_size(group_factor, inst.n, inst.k)
    if g > inst.n or inside.all():
        return 0.0
    p, q = pairs[~inside, 0], pairs[~inside, 1]
    rides = inst.ds[:, p] + inst.c[p, q] + inst.dt[:, q]
    if mode == "set":
        rides = np.minimum(rides, inst.ds[:, q] + inst.c[q, p] + inst.dt[:, p])
    return float(_blocking(inst.cost(S), rides, g).max())
