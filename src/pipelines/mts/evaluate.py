"""Metrics, plots and the report of `mts`: accuracy gains over the baselines, how well the learned weights
separate good from bad synthetic data, and the GSNR-vs-batch curves."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import Diff, Fn, SeedValues, paired
from pipelines.mts.params import QUALITIES, Params

PAIRS = [
    ("mts", "uniform"),
    ("mts", "mwnet"),
    ("mts", "real_only"),
    ("mts", "classifier_filter"),
    ("oracle", "mts"),
    ("mts", "mts_feat_64"),
    ("mts", "mts_noflag"),
    ("mts_loss_512", "mwnet"),
    ("mts_equal_steps", "mts"),
    ("mts_equal_steps", "mts_feat_64"),
]


def delta_pts(a: str, b: str):
    """``delta_pts.test_acc.<a>_vs_<b>``: (a − b) in accuracy points, per seed (paired)."""
    name = f"delta_pts.test_acc.{a}_vs_{b}"

    def f(values: SeedValues, p: Params) -> dict:
        xa, xb = values.per_seed(a, "test_acc"), values.per_seed(b, "test_acc")
        return {name: {s: (xa[s] - xb[s]) * 100.0 for s in paired(xa, xb)}}

    f.__name__ = f"delta_pts_{a}_vs_{b}"
    return Fn(f, [name], needs_=[a, b])


def gsnr_names(p: Params, planned) -> list[str]:
    """The GSNR metrics the report has (seed ``gsnr.seed``, point values) when the study is enabled."""
    if not p.gsnr.enabled:
        return []
    out = []
    for name in p.gsnr.selectors:
        for stat in ("median", "aggregate"):
            out += [f"gsnr_{stat}.{name}.b{b}" for b in p.gsnr.batch_sizes]
            out += [f"gsnr_ratio_{stat}.{name}", f"gsnr_spearman_{stat}.{name}"]
        out.append(f"meta_grad_fd_cosine_min.{name}")
    return out


def gsnr_fn(values: SeedValues, p: Params, gsnr: pd.DataFrame) -> dict[str, float]:
    return gsnr_metrics(p, gsnr)


def derived(p: Params) -> list:
    out = []
    for a, b in PAIRS:
        out.append(delta_pts(a, b))
        out.append(Diff("weight_quality_auc", a, b, name=f"delta.weight_quality_auc.{a}_vs_{b}"))
    out.append(Fn(gsnr_fn, gsnr_names, inputs=["gsnr"]))
    return out


def gsnr_metrics(p: Params, gsnr: pd.DataFrame) -> dict[str, float]:
    from scipy.stats import spearmanr

    out = {}
    lo, hi = p.gsnr.ratio_pair
    for name, d in gsnr.groupby("selector"):
        d = d.set_index("batch_size")
        for stat in ("median", "aggregate"):
            col = f"gsnr_{stat}"
            for b, v in d[col].items():
                out[f"gsnr_{stat}.{name}.b{b}"] = float(v)
            out[f"gsnr_ratio_{stat}.{name}"] = (
                float(d.loc[hi, col] / d.loc[lo, col]) if d.loc[lo, col] > 0 else float("nan")
            )
            rho = (
                spearmanr(d.index.to_numpy(), d[col].to_numpy()).statistic
                if len(d) > 2
                else float(np.sign(d[col].iloc[-1] - d[col].iloc[0]))
            )
            out[f"gsnr_spearman_{stat}.{name}"] = float(rho)
        # agreement of the finite-difference Hessian-vector product with the exact unroll
        out[f"meta_grad_fd_cosine_min.{name}"] = float(d["fd_cosine"].min())
    return out


def make_plots(p: Params, values: SeedValues, artifacts: dict, gsnr: pd.DataFrame) -> dict:
    import matplotlib.pyplot as plt

    from pipelines.core.api import bar_plot, line_plot

    figs = {}
    if len(gsnr):
        for stat in ("median", "aggregate"):
            piv = gsnr.pivot(index="batch_size", columns="selector", values=f"gsnr_{stat}")
            figs[f"gsnr_{stat}_vs_batch"] = line_plot(
                list(piv.index),
                {c: list(piv[c]) for c in piv.columns},
                xlabel="batch size",
                ylabel=f"{stat} GSNR of the meta-gradient",
                logy=True,
                title=f"meta-gradient GSNR ({stat}) at a fixed early point",
            )
            figs[f"gsnr_{stat}_vs_batch"].axes[0].set_xscale("log", base=2)
    acc = {v: list(values.per_seed(v, "test_acc").values()) for v in values.variants if values.has(v, "test_acc")}
    names = list(acc)
    figs["test_acc"] = bar_plot(
        names, [100 * np.mean(acc[v]) for v in names], [100 * np.std(acc[v]) for v in names], ylabel="test accuracy (%)"
    )
    weights = {v: pd.DataFrame(a["weights"]) for v, a in artifacts.items()}
    learned = [v for v in weights if v in p.selectors]
    if learned:
        fig, axes = plt.subplots(1, len(learned), figsize=(3.2 * len(learned), 3), squeeze=False)
        for ax, v in zip(axes[0], learned):
            w = weights[v]
            w = w[w["seed"] == w["seed"].min()]
            for q in ("real", *QUALITIES):
                vals = w.loc[w["quality"] == q, "weight"].dropna()
                if len(vals):
                    ax.hist(vals, bins=30, alpha=0.5, density=True, label=q)
            ax.set(title=v, xlabel="raw weight w (last visit)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        figs["weight_hist_by_quality"] = fig
    return figs
