"""Metrics, plots and the report of `mts`: accuracy gains over the baselines, how well the learned weights
separate good from bad synthetic data, and the GSNR-vs-batch curves."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.report import build_report
from pipelines.mts.params import QUALITIES, Params

PAIRS = [("mts", "uniform"), ("mts", "mwnet"), ("mts", "real_only"), ("mts", "classifier_filter"),
         ("oracle", "mts"), ("mts", "mts_feat_64"), ("mts", "mts_noflag"), ("mts_loss_512", "mwnet"),
         ("mts_equal_steps", "mts"), ("mts_equal_steps", "mts_feat_64")]


def _split(outputs: dict) -> tuple[dict, dict]:
    """{variant: weights table}, {variant: metrics json} from the node's keyword inputs."""
    weights = {k[len("w__"):]: v for k, v in outputs.items() if k.startswith("w__")}
    mets = {k[len("m__"):]: v for k, v in outputs.items() if k.startswith("m__")}
    return weights, mets


def _paired(per_seed: dict, a: str, b: str, key: str, scale: float = 1.0) -> float:
    """Mean over the seeds both variants ran of (a − b)·scale."""
    if a not in per_seed or b not in per_seed:
        return float("nan")
    common = sorted(set(per_seed[a]) & set(per_seed[b]))
    vals = [(per_seed[a][sd][key] - per_seed[b][sd][key]) * scale for sd in common]
    vals = [v for v in vals if not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(vals)) if vals else float("nan")


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
            out[f"gsnr_ratio_{stat}.{name}"] = float(d.loc[hi, col] / d.loc[lo, col]) if d.loc[lo, col] > 0 \
                else float("nan")
            rho = spearmanr(d.index.to_numpy(), d[col].to_numpy()).statistic if len(d) > 2 else \
                float(np.sign(d[col].iloc[-1] - d[col].iloc[0]))
            out[f"gsnr_spearman_{stat}.{name}"] = float(rho)
        # agreement of the finite-difference Hessian-vector product with the exact unroll
        out[f"meta_grad_fd_cosine_min.{name}"] = float(d["fd_cosine"].min())
    return out


def report(p: Params, gsnr: pd.DataFrame, plots: dict, **outputs) -> dict:
    weights, mets = _split(outputs)
    rows, histories, per_seed = [], {}, {}
    for v, m in mets.items():
        for r in m["rows"]:
            rows.append({"variant": v, **r})
            per_seed.setdefault(v, {})[r["seed"]] = r
        if m.get("history"):
            histories[v] = m["history"]
    metrics: dict[str, float] = {}
    for a, b in PAIRS:
        if a in per_seed and b in per_seed:
            metrics[f"delta_pts.test_acc.{a}_vs_{b}"] = _paired(per_seed, a, b, "test_acc", 100.0)
            metrics[f"delta.weight_quality_auc.{a}_vs_{b}"] = _paired(per_seed, a, b, "weight_quality_auc")
    metrics.update(gsnr_metrics(p, gsnr))
    return build_report("mts", p, rows, metrics, artifacts=plots, histories=histories)


def make_plots(p: Params, gsnr: pd.DataFrame, **outputs) -> dict:
    import matplotlib.pyplot as plt

    from pipelines.core.plots import bar_plot, line_plot

    weights, mets = _split(outputs)
    figs = {}
    if len(gsnr):
        for stat in ("median", "aggregate"):
            piv = gsnr.pivot(index="batch_size", columns="selector", values=f"gsnr_{stat}")
            figs[f"gsnr_{stat}_vs_batch"] = line_plot(
                list(piv.index), {c: list(piv[c]) for c in piv.columns}, xlabel="batch size",
                ylabel=f"{stat} GSNR of the meta-gradient", logy=True,
                title=f"meta-gradient GSNR ({stat}) at a fixed early point")
            figs[f"gsnr_{stat}_vs_batch"].axes[0].set_xscale("log", base=2)
    acc = {v: [r["test_acc"] for r in m["rows"]] for v, m in mets.items()}
    names = list(acc)
    figs["test_acc"] = bar_plot(names, [100 * np.mean(acc[v]) for v in names],
                                [100 * np.std(acc[v]) for v in names], ylabel="test accuracy (%)")
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
