"""Placement algorithms (card: "ECA", "GC-TrSP", "λ-Hybrid", the pair-centred GC ablation and the
baselines k-median local search, random stops and busiest endpoints). All return a sorted list of stop
indices with at most k entries; numpy only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipelines.trsp.instance import Instance, pair_table
from pipelines.trsp.measures import group_size

TOL = 1e-12


@dataclass
class Expansion:
    """What an expanding-threshold run did: the stops, the agents still unsatisfied, the opening levels."""

    stops: list[int]
    unsatisfied: np.ndarray
    levels: list[float] = field(default_factory=list)
    opened: list[tuple[int, int]] = field(default_factory=list)


def _gth_smallest(x: np.ndarray, g: int) -> np.ndarray:
    return np.partition(x, g - 1, axis=0)[g - 1]


def expanding(
    inst: Instance,
    budget: int,
    mode: str = "set",
    group_factor: float = 2.0,
    use_walk: bool = True,
    use_combos: bool = True,
) -> Expansion:
    """The Expanding Cost Algorithm (``use_walk`` and ``use_combos``) or, with both off, Greedy Capture over
    pair-centres. A threshold δ grows from 0 over the unsatisfied set U (all agents at first):

    - an agent leaves U once its cost is ≤ δ (ECA: walking or any combination of opened stops;
      pair-GC: a ride on one opened pair-centre);
    - a pair opens once ≥ g = ⌈f·n/k⌉ agents of U ride it at cost ≤ δ (shared stops paid once).

    Event-driven: the next opening level is the smallest g-th ride cost over U; every agent whose cost is
    ≤ that level leaves first and the level is recomputed, until stable. Stops when |U| < g or no pair fits
    the budget."""
    pairs, rides = pair_table(inst, mode)
    g = group_size(group_factor, inst.n, inst.k)
    U = np.ones(inst.n, bool)
    in_S = np.zeros(inst.m, bool)
    out = Expansion([], U)
    centre_cost = np.full(inst.n, np.inf)  # pair-GC: best ride on one opened pair-centre

    def current() -> np.ndarray:
        c = inst.route_cost(np.flatnonzero(in_S)) if use_combos else centre_cost
        return np.minimum(c, inst.walk) if use_walk else c

    cur = current()
    while U.sum() >= g:
        need = (~in_S[pairs[:, 0]]).astype(int) + (~in_S[pairs[:, 1]])
        ok = need <= budget - in_S.sum()
        if use_combos:
            ok &= need > 0  # a pair inside S changes no ECA cost
        if not ok.any():
            break
        cand = np.flatnonzero(ok)
        lv = _gth_smallest(rides[U][:, cand], g)
        j = int(np.argmin(lv))
        level = float(lv[j])
        leave = U & (cur <= level + TOL)
        if leave.any():
            U &= ~leave
            continue
        p, q = (int(x) for x in pairs[cand[j]])
        in_S[[p, q]] = True
        centre_cost = np.minimum(centre_cost, rides[:, cand[j]])
        out.levels.append(level)
        out.opened.append((p, q))
        cur = current()
        U &= ~(cur <= level + TOL)
    out.stops = sorted(np.flatnonzero(in_S).tolist())
    out.unsatisfied = U
    return out


def greedy_capture(E: np.ndarray, threshold: int, budget: int, open0=()) -> list[int]:
    """Greedy Capture (Chen et al. 2019) on points with distances E (N, m) to the centres: δ grows; a
    centre opens once ≥ ``threshold`` uncaptured points are within δ; open centres capture every point
    within δ. ``open0`` are open from the start (they capture but do not count as new openings);
    at most ``budget`` centres in all."""
    N, m = E.shape
    opened = list(dict.fromkeys(int(x) for x in open0))
    captured = np.zeros(N, bool)
    while (~captured).sum() >= threshold and len(opened) < budget:
        unc = np.flatnonzero(~captured)
        closed = np.setdiff1d(np.arange(m), opened)
        if len(closed) == 0:
            break
        lv = _gth_smallest(E[np.ix_(unc, closed)], threshold)
        j = int(np.argmin(lv))
        level = float(lv[j])
        if opened:
            near = E[np.ix_(unc, opened)].min(1) <= level + TOL
            if near.any():
                captured[unc[near]] = True
                continue
        opened.append(int(closed[j]))
        captured |= E[:, closed[j]] <= level + TOL
    return opened


def _add_one_costs(inst: Instance, base: list[int], cur: np.ndarray) -> np.ndarray:
    """(n, m): each agent's cost after adding candidate b to ``base`` (its current cost ``cur``)."""
    B = np.asarray(base, int)
    diag = inst.ds + np.diag(inst.c)[None] + inst.dt  # ride b → b
    new = np.minimum(cur[:, None], diag)
    if len(B):
        # ride b → x and x → b for x in base
        out_ = (inst.ds[:, :, None] + inst.c[:, B][None] + inst.dt[:, B][:, None, :]).min(2)
        in_ = (inst.ds[:, B][:, :, None] + inst.c[B, :][None] + inst.dt[:, None, :]).min(1)
        new = np.minimum(new, np.minimum(out_, in_))
    return new


def greedy_fill(inst: Instance, S, k: int) -> list[int]:
    """Spend the stops left (up to k) greedily on the social cost Σ cost_i: the best single stop, or the
    best new pair when no single stop helps (a lone stop in an empty set never does)."""
    S = list(dict.fromkeys(int(x) for x in S))
    while len(S) < k:
        cur = inst.cost(S)
        total = cur.sum()
        gain = total - _add_one_costs(inst, S, cur).sum(0)
        gain[S] = -np.inf
        b = int(np.argmax(gain))
        if gain[b] > TOL * max(total, 1.0):
            S.append(b)
            continue
        if len(S) > k - 2:
            break
        pairs, rides = pair_table(inst, "set")
        fresh = ~np.isin(pairs, S).any(1)
        if not fresh.any():
            break
        pc = np.where(fresh, np.minimum(cur[:, None], rides).sum(0), np.inf)
        j = int(np.argmin(pc))
        if pc[j] >= total - TOL * max(total, 1.0):
            break
        S += [int(x) for x in pairs[j]]
    return sorted(S)


def eca(inst: Instance, mode: str = "set", group_factor: float = 2.0) -> list[int]:
    """ECA, then the leftover stops greedily on social cost."""
    return greedy_fill(inst, expanding(inst, inst.k, mode, group_factor).stops, inst.k)


def pair_gc(inst: Instance, mode: str = "set", group_factor: float = 2.0) -> list[int]:
    """Ablation: Greedy Capture over pair-centres (ECA without walking or combinations)."""
    e = expanding(inst, inst.k, mode, group_factor, use_walk=False, use_combos=False)
    return greedy_fill(inst, e.stops, inst.k)


def endpoints(inst: Instance, agents: np.ndarray | None = None) -> np.ndarray:
    """(2n', m) distances of the agents' sources and destinations to the candidates."""
    a = np.arange(inst.n) if agents is None else np.asarray(agents, int)
    return np.vstack([inst.ds[a], inst.dt[a]])


def gc_trsp(inst: Instance) -> list[int]:
    """GC-TrSP: Greedy Capture on the induced clustering instance (the 2n endpoints, k centres,
    threshold ⌈2n/k⌉), then the leftover stops greedily on social cost."""
    stops = greedy_capture(endpoints(inst), math.ceil(2 * inst.n / inst.k), inst.k)
    return greedy_fill(inst, stops, inst.k)


def hybrid(inst: Instance, lam: float, mode: str = "set", group_factor: float = 2.0) -> list[int]:
    """λ-Hybrid (our design): ECA with ⌈λk⌉ stops rounded up to pairs (at most k), then GC-TrSP with the
    remaining k − k_ECA centres on the endpoints of the agents ECA left unsatisfied (ECA's stops already
    open), then the leftover greedily. λ = 1 is ECA, λ = 0 is GC-TrSP."""
    k = inst.k
    k_e = min(k, 2 * math.ceil(lam * k / 2 - 1e-9))
    e = expanding(inst, k_e, mode, group_factor)
    S = e.stops
    k_rest = k - k_e
    left = np.flatnonzero(e.unsatisfied)
    if k_rest > 0 and len(left):
        thr = math.ceil(2 * len(left) / k_rest)
        S = greedy_capture(endpoints(inst, left), thr, len(S) + k_rest, open0=S)
    return greedy_fill(inst, S, k)


def _swap_pass(inst: Instance, S: list[int]) -> tuple[list[int], float]:
    """The best 1-swap of S (or S itself) and its social cost."""
    total = inst.cost(S).sum()
    best, best_S = total, S
    for a in S:
        base = [x for x in S if x != a]
        cur = inst.cost(base)
        tot = _add_one_costs(inst, base, cur).sum(0)
        tot[base] = np.inf
        b = int(np.argmin(tot))
        if tot[b] < best - 1e-9 * max(best, 1.0):
            best, best_S = float(tot[b]), sorted(base + [b])
    return best_S, best


def kmedian(inst: Instance, restarts: int, rng: np.random.Generator, max_passes: int = 100) -> list[int]:
    """Social-cost minimisation: greedy addition (restart 0) or a random k-set (others), then best-improvement
    1-swap local search; the best of the restarts."""
    best, best_cost = None, np.inf
    for r in range(restarts):
        S = greedy_fill(inst, [], inst.k) if r == 0 else sorted(rng.choice(inst.m, inst.k, replace=False).tolist())
        S = greedy_fill(inst, S, inst.k) if len(S) < inst.k else S
        cost = inst.cost(S).sum()
        for _ in range(max_passes):
            S2, c2 = _swap_pass(inst, S)
            if c2 >= cost - 1e-9 * max(cost, 1.0):
                break
            S, cost = S2, c2
        if cost < best_cost - 1e-12:
            best, best_cost = S, cost
    return sorted(best)


def random_stops(inst: Instance, rng: np.random.Generator) -> list[int]:
    return sorted(rng.choice(inst.m, inst.k, replace=False).tolist())


def busiest(inst: Instance) -> list[int]:
    """The k candidates that are the nearest candidate of the most endpoints (ties: lower index)."""
    near = endpoints(inst).argmin(1)
    counts = np.bincount(near, minlength=inst.m)
    return sorted(np.argsort(-counts, kind="stable")[: inst.k].tolist())
