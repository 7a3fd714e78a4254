"""The hierarchy counterexamples (the paper's "sub-ranking and top-k calibration are incomparable"):
with m = 3, two constant predictors built by linear programming from a PL truth P — Q_sub matches every
pairwise marginal of P but not its top-1 marginal, Q_top the reverse. A constant predictor is calibrated
for a notion iff its marginal equals the label marginal, so the estimators must flag exactly this."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import node_setup
from pipelines.rankcal import calibration as C
from pipelines.rankcal import ranking as R
from pipelines.rankcal.params import Params


def counterexample(P: np.ndarray, kind: str, margin: float, floor: float) -> np.ndarray:
    """min Σ|Q − P| s.t. Q ≥ floor, ΣQ = 1 and the kind's constraints (HiGHS); asserts LP status 0.

    q_sub: all pairwise marginals of P, and Q(a first) ≤ P(a first) − margin.
    q_top: the top-1 marginal of P, and Q(a ≻ c), Q(b ≻ c) each ≤ P's − margin (with the top-1
    marginal fixed only the order below the top moves, so one shifted pair alone gives half the ECE)."""
    from scipy.optimize import linprog

    m, K = 3, 6
    pairs, plut = R.pair_lut(m)
    pair_rows = (plut == 0).astype(float)  # (3, 6): Q(i ≻ j) = row · Q
    top_rows = np.stack([(R.perms(m)[:, 0] == j).astype(float) for j in range(m)])
    # variables: Q (6) and t (6) with t ≥ |Q − P|
    c = np.r_[np.zeros(K), np.ones(K)]
    I = np.eye(K)
    A_ub = [np.c_[I, -I], np.c_[-I, -I]]
    b_ub = [P, -P]
    if kind == "q_sub":
        A_eq, b_eq = pair_rows, pair_rows @ P
        A_ub.append(np.r_[top_rows[0], np.zeros(K)][None])
        b_ub.append([top_rows[0] @ P - margin])
    elif kind == "q_top":
        A_eq, b_eq = top_rows, top_rows @ P
        for pr in (pairs.index((0, 2)), pairs.index((1, 2))):
            A_ub.append(np.r_[pair_rows[pr], np.zeros(K)][None])
            b_ub.append([pair_rows[pr] @ P - margin])
    else:
        raise ValueError(kind)
    A_eq = np.vstack([np.c_[A_eq, np.zeros((len(A_eq), K))], np.r_[np.ones(K), np.zeros(K)][None]])
    b_eq = np.r_[b_eq, 1.0]
    res = linprog(
        c,
        A_ub=np.vstack(A_ub),
        b_ub=np.concatenate([np.ravel(b) for b in b_ub]),
        A_eq=A_eq,
        b_eq=b_eq,
        bounds=[(floor, 1)] * K + [(0, None)] * K,
        method="highs",
    )
    if res.status != 0:
        raise ValueError(
            f"parameter rankcal.demo.margin: the {kind} LP is infeasible at margin {margin} "
            f"(status {res.status}: {res.message}); lower the margin or flatten truth_weights"
        )
    return res.x[:K]


def population_calibration_error(Q: np.ndarray, P: np.ndarray) -> dict[str, float]:
    """Exact ECEs of a constant predictor Q under truth P (one bin: the gap of its marginals)."""
    pairs, plut = R.pair_lut(3)
    rows = (plut == 0).astype(float)
    top = np.stack([(R.perms(3)[:, 0] == j).astype(float) for j in range(3)])
    return {
        "pop_ece_pair": float(np.abs(rows @ (Q - P)).mean()),
        "pop_ece_top1_cw": float(np.abs(top @ (Q - P)).mean()),
    }


def hierarchy_demo(p: Params) -> pd.DataFrame:
    """Rows (variant, seed, metrics) for the truth, Q_sub and Q_top on n draws from P, per seed."""
    node_setup(p)
    d = p.demo
    P = R.pl_table(np.log(np.asarray(d.truth_weights))[None])[0]
    preds = {"truth": P}
    for kind in ("q_sub", "q_top"):
        preds[kind] = counterexample(P, kind, d.margin, d.q_floor)
    rows = []
    for seed in p.seeds:
        rng = np.random.default_rng([seed, 3])
        y = R.sample_table(P[None], rng, d.n)[:, 0]
        for name, q in preds.items():
            Q = np.tile(q, (d.n, 1))
            ece, _ = C.calibration_metrics(
                Q, y, 3, n_bins=p.ece.n_bins, n_debias=p.ece.n_debias, full_cw_max_m=p.ece.full_cw_max_m, rng=rng
            )
            rows.append(
                {
                    "variant": f"demo.{name}",
                    "seed": seed,
                    **ece,
                    "max_ece_db": max(v for k, v in ece.items() if k.endswith("_db")),
                    **C.proper_scores(Q, y, 3),
                    **population_calibration_error(q, P),
                    **{f"q_{i}": float(v) for i, v in enumerate(q)},
                }
            )
    return pd.DataFrame(rows)
