"""A TrSP instance in a general metric space and the agents' costs (card: "Instance", "Agent cost").

Everything is held as distances, so the algorithms and the violation measures never see coordinates:
``ds[i, l] = d(s_i, l)``, ``dt[i, l] = d(l, t_i)``, ``walk[i] = d(s_i, t_i)`` and the shuttle cost
``c[p, q]`` between candidate stops. An agent's cost under a stop set S is
``min(walk_i, min_{p, q in S} ds[i, p] + c[p, q] + dt[i, q])`` (p = q allowed; it never beats walking in a
metric space, by the triangle inequality)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


class InstanceError(ValueError):
    """An instance whose distances cannot be used (NaN, negative, wrong shapes); names the instance."""


@dataclass
class Instance:
    ds: np.ndarray  # (n, m) d(s_i, l)
    dt: np.ndarray  # (n, m) d(l, t_i)
    walk: np.ndarray  # (n,)  d(s_i, t_i)
    c: np.ndarray  # (m, m) shuttle cost between stops, c[p, p] = 0
    k: int
    name: str = "instance"
    groups: np.ndarray | None = None  # (n,) group label per agent (reporting only)
    coords: dict = field(default_factory=dict)  # optional coordinates for plots: s, t (n, 2), cand (m, 2)

    def __post_init__(self) -> None:
        self.ds = np.asarray(self.ds, float)
        self.dt = np.asarray(self.dt, float)
        self.walk = np.asarray(self.walk, float)
        self.c = np.asarray(self.c, float)
        n, m = self.ds.shape
        bad = None
        if self.dt.shape != (n, m) or self.walk.shape != (n,) or self.c.shape != (m, m):
            bad = (
                f"shapes ds {self.ds.shape}, dt {self.dt.shape}, walk {self.walk.shape}, c {self.c.shape} do not agree"
            )
        elif n < 1 or m < 2:
            bad = f"{n} agents and {m} candidate stops (need >= 1 and >= 2)"
        elif not all(np.isfinite(a).all() for a in (self.ds, self.dt, self.walk, self.c)):
            bad = "non-finite distance (NaN or inf)"
        elif min(self.ds.min(), self.dt.min(), self.walk.min(), self.c.min()) < 0:
            bad = "negative distance or shuttle cost"
        elif not isinstance(self.k, int | np.integer) or self.k < 2:
            bad = f"budget k = {self.k!r} (need an integer >= 2: a route takes two stops)"
        elif self.k > m:
            bad = f"budget k = {self.k} exceeds the {m} candidate stops"
        if bad:
            raise InstanceError(f"instance '{self.name}': {bad}")

    @property
    def n(self) -> int:
        return self.ds.shape[0]

    @property
    def m(self) -> int:
        return self.ds.shape[1]

    @cached_property
    def routes(self) -> np.ndarray:
        """(n, m, m): D_i(p, q) = d(s_i, p) + c(p, q) + d(q, t_i), the cost of riding from p to q (small
        instances only: the pipeline works pair by pair)."""
        return self.sub_routes(np.arange(self.m))

    def sub_routes(self, idx) -> np.ndarray:
        """(n, s, s): the rides between the candidates ``idx``."""
        idx = np.asarray(idx, int)
        return self.ds[:, idx][:, :, None] + self.c[np.ix_(idx, idx)][None] + self.dt[:, idx][:, None, :]

    def route_cost(self, S) -> np.ndarray:
        """(n,) the best ride using stops of S only (inf for an empty S): no walking alternative."""
        S = np.asarray(list(S), int)
        if len(S) == 0:
            return np.full(self.n, np.inf)
        return self.sub_routes(S).reshape(self.n, -1).min(1)

    def cost(self, S) -> np.ndarray:
        """(n,) cost_i(S) = min(walk, best ride within S)."""
        return np.minimum(self.walk, self.route_cost(S))


def pair_table(inst: Instance, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The deviations a group may propose, as (pairs (P, 2), route costs (n, P)) without walking.

    ``ordered``: a directed line p → q (p != q), cost D_i(p, q).
    ``set``: the stop set {p, q} (p < q), cost min(D_i(p, q), D_i(q, p), D_i(p, p), D_i(q, q)): the
    agent uses either direction, which is what cost_i({p, q}) means; JR is then the |T| = 2 core.
    Cached on the instance (the algorithms and every measure use the same table)."""
    cache = inst.__dict__.setdefault("_pair_tables", {})
    if mode not in cache:
        cache[mode] = _pair_table(inst, mode)
    return cache[mode]


def _pair_table(inst: Instance, mode: str) -> tuple[np.ndarray, np.ndarray]:
    # built pair by pair, never through the (n, m, m) ride tensor (full scale: m = 200+)
    m = inst.m
    if mode == "ordered":
        p, q = np.nonzero(~np.eye(m, dtype=bool))
        return np.stack([p, q], 1), inst.ds[:, p] + inst.c[p, q] + inst.dt[:, q]
    if mode == "set":
        p, q = np.triu_indices(m, 1)
        single = inst.ds + np.diag(inst.c)[None] + inst.dt
        cost = np.minimum(inst.ds[:, p] + inst.c[p, q] + inst.dt[:, q], inst.ds[:, q] + inst.c[q, p] + inst.dt[:, p])
        cost = np.minimum(cost, np.minimum(single[:, p], single[:, q]))
        return np.stack([p, q], 1), cost
    raise ValueError(f"deviation mode {mode!r}: use 'set' or 'ordered'")


def minkowski(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    """Pairwise distances (len(a), len(b)) between points of the plane, L1 or L2."""
    diff = np.abs(a[:, None, :] - b[None, :, :])
    if metric == "l1":
        return diff.sum(-1)
    if metric == "l2":
        return np.sqrt((diff**2).sum(-1))
    raise ValueError(f"metric {metric!r}: use 'l1' or 'l2'")


def from_points(
    s: np.ndarray,
    t: np.ndarray,
    cand: np.ndarray,
    k: int,
    gamma: float,
    metric: str,
    name: str = "instance",
    groups: np.ndarray | None = None,
) -> Instance:
    """An instance in the plane: shuttle cost γ·d(p, q) (γ = 0: a free shuttle)."""
    s, t, cand = (np.asarray(a, float) for a in (s, t, cand))
    walk = np.diag(minkowski(s, t, metric)) if len(s) else np.zeros(0)
    return Instance(
        ds=minkowski(s, cand, metric),
        dt=minkowski(t, cand, metric),
        walk=walk,
        c=gamma * minkowski(cand, cand, metric),
        k=int(k),
        name=name,
        groups=groups,
        coords={"s": s, "t": t, "cand": cand},
    )


def from_metric(
    D: np.ndarray,
    s_idx,
    t_idx,
    cand_idx,
    k: int,
    gamma: float = 0.0,
    c: np.ndarray | None = None,
    name: str = "instance",
    groups: np.ndarray | None = None,
    coords: dict | None = None,
) -> Instance:
    """An instance on the points of a general metric ``D`` (e.g. shortest paths in a road graph): agents
    travel s_idx[i] → t_idx[i], stops are cand_idx; shuttle cost ``c`` or γ·D between stops."""
    D = np.asarray(D, float)
    s_idx, t_idx, cand_idx = (np.asarray(a, int) for a in (s_idx, t_idx, cand_idx))
    cc = gamma * D[np.ix_(cand_idx, cand_idx)] if c is None else np.asarray(c, float)
    return Instance(
        ds=D[np.ix_(s_idx, cand_idx)],
        dt=D[np.ix_(cand_idx, t_idx)].T,
        walk=D[s_idx, t_idx],
        c=cc,
        k=int(k),
        name=name,
        groups=groups,
        coords=coords or {},
    )
