"""One ``train.<model>`` node per label-ranking model: it fits that model on every dataset × seed and keeps
its predictive tables Q(π | x_test) over all orderings (the object whose calibration is measured).

``neural_pl_ts`` is the temperature-scaled copy of ``neural_pl``: its node reads ``neural_pl``'s output
(query and held-out scores) and fits only the temperature, so the network is trained once."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import torch

from pipelines.core.runtime import node_setup
from pipelines.rankcal import models as M
from pipelines.rankcal import ranking as R
from pipelines.rankcal.data import unpack
from pipelines.rankcal.params import Params

log = logging.getLogger(__name__)


def standardise(x_tr: np.ndarray, x_te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, sd = x_tr.mean(0), x_tr.std(0)
    sd[sd == 0] = 1.0  # constant pixels in digits
    return (x_tr - mu) / sd, (x_te - mu) / sd


def fit_model(model: str, x_tr: np.ndarray, o_tr: np.ndarray, x_te: np.ndarray, m: int, p: Params,
              seed: int) -> dict[str, np.ndarray | float] | None:
    """``{"Q": table (n_test, m!), <scalars worth keeping>}`` of one model on one split (None: the model
    does not apply, e.g. rankings-as-classes beyond ``rac_max_m`` labels)."""
    mp = p.models
    xtr, xte = standardise(x_tr, x_te)
    if model == "pl_lin":
        W, b = M.fit_pl_lin(xtr, o_tr, m, mp.l2)
        return {"Q": R.pl_table(xte @ W + b)}
    if model == "ib_pl":
        neigh = M.knn_orderings(xtr, o_tr, xte, mp.knn_k)
        return {"Q": M.ib_pl_table(neigh, mp.ib_pl_alpha, mp.mm_iters)}
    if model == "ib_mallows":
        neigh = M.knn_orderings(xtr, o_tr, xte, mp.knn_k)
        Q, theta = M.ib_mallows_table(neigh, m, mp.mallows_theta_max)
        return {"Q": Q, "theta_mean": float(theta.mean())}
    if model == "rpc_bt":
        return {"Q": R.pl_table(M.bt_from_pairwise(M.rpc_pairwise(xtr, o_tr, xte, m), m))}
    if model == "rankings_as_classes":
        if m > mp.rac_max_m:
            return None
        return {"Q": M.rankings_as_classes(xtr, R.perm_index(o_tr), xte, m, mp.rac_epsilon)}
    if model == "neural_pl":
        nn = mp.neural
        res = M.fit_neural_pl(xtr, o_tr, xte, m, nn.hidden, nn.steps, nn.lr, nn.holdout_fraction,
                              nn.min_holdout, seed)
        return {"Q": R.pl_table(res.scores_query), "scores": res.scores_query, "scores_hold": res.scores_hold,
                "orderings_hold": res.orderings_hold}
    if model == "uniform":
        K = len(R.perms(m))
        return {"Q": np.full((len(xte), K), 1.0 / K)}
    raise ValueError(f"unknown model {model!r}")


def _tensors(out: dict) -> dict[str, torch.Tensor]:
    # float64: float32 storage would put tied probabilities one float32 step apart
    return {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else torch.tensor(float(v), dtype=torch.float64)
            for k, v in out.items()}


def train_variant(datasets: pd.DataFrame, p: Params, variant: str) -> dict:
    """``{dataset: {seed: {"Q": table, <extras>}}}`` of one model over every dataset × seed."""
    out: dict = {}
    for (name, seed), d in datasets.groupby(["dataset", "seed"], sort=False):
        node_setup(p, int(seed))   # threads, seed; tiny models: computed on the CPU whatever the device
        x_tr, o_tr, m = unpack(d[d.split == "train"])
        x_te, _, _ = unpack(d[d.split == "test"])
        res = fit_model(variant, x_tr, o_tr, x_te, m, p, int(seed))
        if res is None:
            log.info("rankcal.%s: skipped on %s (m = %d)", variant, name, m)
            continue
        out.setdefault(str(name), {})[str(seed)] = _tensors(res)
    return out


def temperature_scale(neural_pl: dict, p: Params, variant: str = "neural_pl_ts") -> dict:
    """Temperature scaling of ``neural_pl``: T minimises the held-out PL NLL (T = 1 where the hold-out
    was too small), and the tables are PL(exp(scores / T))."""
    nn = p.models.neural
    out: dict = {}
    for name, seeds in neural_pl.items():
        for seed, e in seeds.items():
            node_setup(p, int(seed))
            held = e["scores_hold"].double().numpy()
            T = M.fit_temperature(held, e["orderings_hold"].numpy(), nn.t_min, nn.t_max) if len(held) else 1.0
            Q = R.pl_table(e["scores"].double().numpy() / T)
            out.setdefault(name, {})[seed] = _tensors({"Q": Q, "temperature": T})
    return out
