"""Fit every label-ranking model of the study on every dataset × seed and keep the predictive tables
Q(π | x_test) over all orderings (the object whose calibration is measured)."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import torch

from pipelines.core.params import parse
from pipelines.core.runtime import seed_everything, set_threads
from pipelines.rankcal import models as M
from pipelines.rankcal import ranking as R
from pipelines.rankcal.data import unpack

log = logging.getLogger(__name__)


def predict_tables(x_tr: np.ndarray, o_tr: np.ndarray, x_te: np.ndarray, m: int, p, seed: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Tables Q (n_test, m!) of every requested model, and scalars worth keeping (T, mean θ)."""
    mp = p.models
    mu, sd = x_tr.mean(0), x_tr.std(0)
    sd[sd == 0] = 1.0  # constant pixels in digits
    xtr, xte = (x_tr - mu) / sd, (x_te - mu) / sd
    y_tr = R.perm_index(o_tr)
    tables: dict[str, np.ndarray] = {}
    info: dict[str, float] = {}
    want = set(mp.variants)
    if "pl_lin" in want:
        W, b = M.fit_pl_lin(xtr, o_tr, m, mp.l2)
        tables["pl_lin"] = R.pl_table(xte @ W + b)
    if want & {"ib_pl", "ib_mallows"}:
        neigh = M.knn_orderings(xtr, o_tr, xte, mp.knn_k)
        if "ib_pl" in want:
            tables["ib_pl"] = M.ib_pl_table(neigh, mp.ib_pl_alpha, mp.mm_iters)
        if "ib_mallows" in want:
            tables["ib_mallows"], theta = M.ib_mallows_table(neigh, m, mp.mallows_theta_max)
            info["ib_mallows_theta_mean"] = float(theta.mean())
    if "rpc_bt" in want:
        pij = M.rpc_pairwise(xtr, o_tr, xte, m)
        tables["rpc_bt"] = R.pl_table(M.bt_from_pairwise(pij, m))
    if "rankings_as_classes" in want and m <= mp.rac_max_m:
        tables["rankings_as_classes"] = M.rankings_as_classes(xtr, y_tr, xte, m, mp.rac_epsilon)
    if "neural_pl" in want:
        nn = mp.neural
        res = M.fit_neural_pl(xtr, o_tr, xte, m, nn.hidden, nn.steps, nn.lr, nn.holdout_fraction,
                              nn.min_holdout, nn.t_min, nn.t_max, seed)
        tables["neural_pl"] = R.pl_table(res.scores_query)
        info["neural_pl_temperature"] = res.temperature
        if "neural_pl_ts" in want:
            tables["neural_pl_ts"] = R.pl_table(res.scores_query / res.temperature)
    if "uniform" in want:
        tables["uniform"] = np.full((len(xte), len(R.perms(m))), 1.0 / len(R.perms(m)))
    return tables, info


def train_label_rankers(datasets: pd.DataFrame, raw: dict) -> dict:
    """``{dataset: {seed: {"y": test permutation indices, "m": m, <model>: Q table, "info.*": …}}}``."""
    p = parse("rankcal", raw)
    set_threads(p.threads)
    out: dict = {}
    for (name, seed), d in datasets.groupby(["dataset", "seed"], sort=False):
        seed_everything(int(seed))
        x_tr, o_tr, m = unpack(d[d.split == "train"])
        x_te, o_te, _ = unpack(d[d.split == "test"])
        tables, info = predict_tables(x_tr, o_tr, x_te, m, p, int(seed))
        entry = {"y": torch.as_tensor(R.perm_index(o_te)), "m": torch.tensor(m)}
        entry.update({k: torch.as_tensor(v, dtype=torch.float32) for k, v in tables.items()})
        entry.update({f"info.{k}": torch.tensor(v) for k, v in info.items()})
        out.setdefault(str(name), {})[str(seed)] = entry
        log.info("rankcal: %s seed %s fitted %d models (n_test=%d, m=%d)", name, seed, len(tables), len(x_te), m)
    return out
