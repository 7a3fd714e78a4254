"""The train nodes of `rankcal`: ``train.<dataset>`` fits every label-ranking model on one dataset × every
seed, keeps its predictive tables Q(π | x_test) over all orderings (the object whose calibration is
measured) and measures their calibration; its rows are the variants ``<dataset>.<model>``.
``train.demo`` is the hierarchy demo (variants ``demo.<predictor>``), ``train.rm_<name>`` one reward model
of the RLHF study (rlhf.py).

``neural_pl_ts`` is the temperature-scaled copy of ``neural_pl``: fitted in the same node from
``neural_pl``'s query and held-out scores (only the temperature), so the network is trained once."""

from __future__ import annotations

import logging
import math
import zlib

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import Results, node_setup
from pipelines.rankcal import calibration as C
from pipelines.rankcal import models as M
from pipelines.rankcal import ranking as R
from pipelines.rankcal.data import unpack
from pipelines.rankcal.params import Params, node_variant

log = logging.getLogger(__name__)


def standardise(x_tr: np.ndarray, x_te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, sd = x_tr.mean(0), x_tr.std(0)
    sd[sd == 0] = 1.0  # constant pixels in digits
    return (x_tr - mu) / sd, (x_te - mu) / sd


def fit_model(
    model: str, x_tr: np.ndarray, o_tr: np.ndarray, x_te: np.ndarray, m: int, p: Params, seed: int
) -> dict[str, np.ndarray | float] | None:
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
        res = M.fit_neural_pl(xtr, o_tr, xte, m, nn.hidden, nn.steps, nn.lr, nn.holdout_fraction, nn.min_holdout, seed)
        return {
            "Q": R.pl_table(res.scores_query),
            "scores": res.scores_query,
            "scores_hold": res.scores_hold,
            "orderings_hold": res.orderings_hold,
        }
    if model == "uniform":
        K = len(R.perms(m))
        return {"Q": np.full((len(xte), K), 1.0 / K)}
    raise ValueError(f"unknown model {model!r}")


def _tensors(out: dict) -> dict[str, torch.Tensor]:
    # float64: float32 storage would put tied probabilities one float32 step apart
    return {
        k: torch.as_tensor(v) if isinstance(v, np.ndarray) else torch.tensor(float(v), dtype=torch.float64)
        for k, v in out.items()
    }


def temperature_scale(e: dict[str, torch.Tensor], p: Params, seed: int) -> dict[str, torch.Tensor]:
    """Temperature scaling of one ``neural_pl`` entry: T minimises the held-out PL NLL (T = 1 where the
    hold-out was too small), and the table is PL(exp(scores / T))."""
    nn = p.models.neural
    node_setup(p, int(seed))
    held = e["scores_hold"].double().numpy()
    T = M.fit_temperature(held, e["orderings_hold"].numpy(), nn.t_min, nn.t_max) if len(held) else 1.0
    Q = R.pl_table(e["scores"].double().numpy() / T)
    return _tensors({"Q": Q, "temperature": T})


def fit_dataset(d: pd.DataFrame, p: Params, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """``{model: {"Q": table, <extras>}}`` of every planned model on one dataset × seed slice, each fit
    seeded by the node preamble of its seed (models that do not apply are left out)."""
    x_tr, o_tr, m = unpack(d[d.split == "train"])
    x_te, _, _ = unpack(d[d.split == "test"])
    out: dict[str, dict[str, torch.Tensor]] = {}
    for model in p.models.variants:
        if model == "neural_pl_ts":
            out[model] = temperature_scale(out["neural_pl"], p, seed)
            continue
        node_setup(p, int(seed))  # threads, seed; tiny models: computed on the CPU whatever the device
        res = fit_model(model, x_tr, o_tr, x_te, m, p, int(seed))
        if res is None:
            log.info("rankcal.%s: skipped on %s (m = %d)", model, d["dataset"].iloc[0], m)
            continue
        out[model] = _tensors(res)
    return out


def calibration_row(
    Q: np.ndarray, y: np.ndarray, m: int, entry: dict, p: Params, ds: str, model: str, seed: int
) -> tuple[dict[str, float], dict]:
    """Every ECE (plain and ``_db``), ``max_ece_db`` and the proper scores of one model's table; bootstrap
    95% CIs for the plot seed."""
    e = p.ece
    n_boot = e.n_bootstrap if int(seed) == p.plot_seed else 0
    # one stream per (seed, dataset, model) for the redraws and the bootstrap
    rng = np.random.default_rng([int(seed), zlib.crc32(f"{ds}.{model}".encode())])
    ece, ci = C.calibration_metrics(
        Q, y, m, n_bins=e.n_bins, n_debias=e.n_debias, n_bootstrap=n_boot, full_cw_max_m=e.full_cw_max_m, rng=rng
    )
    row = {
        **ece,
        "max_ece_db": max(v for k, v in ece.items() if k.endswith("_db")),
        **C.proper_scores(Q, y, m),
        "n_test": len(y),
    }
    for k in ("temperature", "theta_mean"):
        if k in entry:
            row[k] = float(entry[k])
    return row, {k: [lo, hi] for k, (lo, hi) in ci.items()}


def _finite(row: dict) -> dict[str, float]:
    return {k: v for k, v in row.items() if isinstance(v, int | float) and not math.isnan(v)}


def dataset_results(datasets: pd.DataFrame, p: Params, ds: str):
    """One dataset: the rows of every ``<ds>.<model>`` variant, and for the plot seed the tables, the test
    rankings and the bootstrap CIs (the reliability diagrams and the report's ``bootstrap_ci``)."""
    res = {model: Results(f"{ds}.{model}") for model in p.models.variants}
    arts: dict = {"Q": {}, "bootstrap": {}}
    for seed, d in datasets[datasets.dataset == ds].groupby("seed", sort=False):
        fits = fit_dataset(d, p, int(seed))
        _, o_te, m = unpack(d[d.split == "test"])
        y = R.perm_index(o_te)
        for model, entry in fits.items():
            Q = entry["Q"].double().numpy()
            row, ci = calibration_row(Q, y, m, entry, p, ds, model, int(seed))
            res[model].add(int(seed), **_finite(row))
            if int(seed) == p.plot_seed:
                arts["Q"][model] = entry["Q"]
                if ci:
                    arts["bootstrap"][f"{ds}.{model}"] = ci
        if int(seed) == p.plot_seed:
            arts.update(y=torch.as_tensor(y), m=int(m))
    return pd.concat([r.table() for r in res.values()], ignore_index=True), arts


def demo_results(p: Params):
    """The hierarchy demo's rows (variants ``demo.truth``, ``demo.q_sub``, ``demo.q_top``)."""
    from pipelines.rankcal.demo import hierarchy_demo

    demo = hierarchy_demo(p)
    res = {v: Results(v) for v in dict.fromkeys(demo["variant"])}
    for rec in demo.to_dict("records"):
        res[rec["variant"]].add(rec["seed"], **_finite({k: v for k, v in rec.items() if k not in ("variant", "seed")}))
    return pd.concat([r.table() for r in res.values()], ignore_index=True), {}


RM_METRICS = ("temperature", "pair_accuracy", "oracle_accuracy", "nll")


def reward_model_results(p: Params, variant: str):
    """One reward-model configuration (``rm_<name>``): per seed, ``n<size>[_ts].<metric>`` of every
    training size, raw and temperature-scaled."""
    from pipelines.rankcal.rlhf import train_reward_model

    res = Results(variant)
    for rec in train_reward_model(p, variant).to_dict("records"):
        tag = f"n{rec['n_pairs']}" + ("_ts" if rec["ts"] else "")
        res.add(rec["seed"], **{f"{tag}.{k}": v for k, v in rec.items() if k in RM_METRICS or k.startswith("ece_")})
    return res.table(), {}


def train_variant(datasets: pd.DataFrame, p: Params, variant: str):
    """``train.<dataset>``, ``train.demo`` or ``train.rm_<name>``: the long results table and the plots'
    artifacts."""
    if variant == "demo":
        return demo_results(p)
    if variant.startswith("rm_"):
        return reward_model_results(p, variant)
    ds = next(d for d in p.data.datasets if node_variant(d) == variant)
    return dataset_results(datasets, p, ds)
