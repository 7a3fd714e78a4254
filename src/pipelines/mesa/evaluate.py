"""Metrics, plots and the report of `mesa`: every variant's safety (plain and under the expert-masking
attack), utility, routing concentration and load balance; derived comparisons for the card's claims."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.report import build_report
from pipelines.mesa.params import Params

COMPARE = [("safety_rate_masked_id", "mesa", "head_sft"), ("safety_rate_masked_direct", "mesa", "head_sft"),
           ("safety_rate_masked_ood", "mesa", "head_sft"), ("safety_rate_ood", "mesa", "head_sft"),
           ("safety_rate_id", "mesa", "head_sft"), ("safety_coverage_k80", "mesa", "head_sft"),
           ("benign_acc", "mesa", "base"), ("benign_acc", "base", "full_sft"),
           ("safety_rate_masked_id", "mesa", "mesa_no_route"), ("safety_rate_masked_id", "mesa", "full_sft")]


def _means(predictions: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(predictions.values(), ignore_index=True).drop(columns="seed").groupby("variant").mean()


def derived(means: pd.DataFrame) -> dict[str, float]:
    """``delta.<metric>.<a>_minus_<b>`` for the pairs the claims and README compare, the base model's
    refusal lost to the masking attack, and MESA's coverage over head-SFT's."""
    out = {}
    for metric, a, b in COMPARE:
        if a in means.index and b in means.index and metric in means.columns:
            out[f"delta.{metric}.{a}_minus_{b}"] = float(means.loc[a, metric] - means.loc[b, metric])
    if "base" in means.index:
        out["delta.safety_rate_direct.base_minus_base_masked"] = float(
            means.loc["base", "safety_rate_direct"] - means.loc["base", "safety_rate_masked_direct"])
    if {"mesa", "head_sft"} <= set(means.index):
        out["ratio.safety_coverage_k80.mesa_over_head_sft"] = float(
            means.loc["mesa", "safety_coverage_k80"] / max(means.loc["head_sft", "safety_coverage_k80"], 1e-12))
    return out


def _first_seed(log: dict) -> dict:
    return log["seeds"][sorted(log["seeds"], key=int)[0]]


def make_plots(p: Params, profile: pd.DataFrame, plan: pd.DataFrame, **outputs) -> dict:
    import matplotlib.pyplot as plt

    from pipelines.core.plots import heatmap, line_plot

    preds = {k[len("pred_"):]: v for k, v in outputs.items() if k.startswith("pred_")}
    logs = {k[len("log_"):]: v for k, v in outputs.items() if k.startswith("log_")}
    figs = {}
    # expert × layer heatmaps of f_s (eval safety-decision tokens, first seed): before and after alignment
    names = list(logs)
    fig, axes = plt.subplots(len(names), 1, figsize=(6, 1.2 + 1.1 * len(names) * p.model.n_layers / 2), squeeze=False)
    for ax, v in zip(axes[:, 0], names):
        f = np.asarray(_first_seed(logs[v])["f_s_eval"])
        ax.imshow(f, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for i in range(f.shape[0]):
            for j in range(f.shape[1]):
                ax.text(j, i, f"{f[i, j]:.2f}", ha="center", va="center", fontsize=6, color="w")
        ax.set_yticks(range(f.shape[0]), [f"L{i}" for i in range(f.shape[0])])
        ax.set_xticks(range(f.shape[1]))
        ax.set_ylabel(v, rotation=0, ha="right", fontsize=8)
    axes[0, 0].set_title("safety-token top-k selection share per expert (first seed)")
    axes[-1, 0].set_xlabel("expert")
    fig.tight_layout()
    figs["safety_routing_heatmap"] = fig
    # OT plans (first seed): relaxed plan per layer, and its column masses next to the balanced ones
    s0 = min(p.seeds)
    for layer in sorted(plan.layer.unique()):
        d = plan[(plan.seed == s0) & (plan.layer == layer)]
        P = d.pivot(index="cluster", columns="expert", values="plan_relaxed").to_numpy()
        figs[f"ot_plan_l{layer}"] = heatmap(P, list(range(P.shape[1])), [f"c{c}" for c in range(P.shape[0])],
                                            title=f"relaxed OT plan, layer {layer} (seed {s0})", fmt="{:.2f}",
                                            xlabel="expert", ylabel="duty cluster")
    mass = {}
    for kind in ("relaxed", "balanced"):
        for layer in sorted(plan.layer.unique()):
            d = plan[(plan.seed == s0) & (plan.layer == layer)]
            mass[f"{kind} L{layer}"] = d.groupby("expert")[f"plan_{kind}"].sum().to_numpy().tolist()
    figs["ot_column_mass"] = line_plot(list(range(p.model.n_experts)), mass, "expert",
                                       "column mass (capacity received)",
                                       "OT column masses: relaxed selects, balanced cannot")
    # safety vs utility: masked ID safety vs benign accuracy, one point per variant and seed
    allp = pd.concat(preds.values(), ignore_index=True)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, (v, d) in enumerate(allp.groupby("variant")):
        ax.scatter(d["benign_acc"], d["safety_rate_masked_id"], label=v, color=f"C{i}", s=30)
        ax.scatter(d["benign_acc"].mean(), d["safety_rate_masked_id"].mean(), color=f"C{i}", marker="*", s=160,
                   edgecolor="k")
    ax.set(xlabel="benign accuracy (exact match)", ylabel="safety rate, ID wrappers, top safety experts masked",
           title="safety under the masking attack vs utility")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["safety_vs_utility"] = fig
    curves = {v: logs[v]["history"]["loss"] for v in logs if v != "base"}
    if curves:
        n = min(len(c) for c in curves.values())
        figs["alignment_loss"] = line_plot(list(range(n)), {v: c[:n] for v, c in curves.items()}, "step",
                                           "alignment loss (seed mean)", "alignment training")
    return figs


def report(p: Params, plots: dict, profile: pd.DataFrame, plan: pd.DataFrame, **outputs) -> dict:
    preds = {k[len("pred_"):]: v for k, v in outputs.items() if k.startswith("pred_")}
    logs = {k[len("log_"):]: v for k, v in outputs.items() if k.startswith("log_")}
    rows = [r for df in preds.values() for r in df.to_dict("records")]
    means = _means(preds)
    metrics = derived(means)
    # OT column masses (first seed): the relaxed plan concentrates, the balanced one equals b exactly
    s0 = min(p.seeds)
    for layer in sorted(plan.layer.unique()):
        d = plan[(plan.seed == s0) & (plan.layer == layer)]
        for kind in ("relaxed", "balanced"):
            col = d.groupby("expert")[f"plan_{kind}"].sum()
            metrics[f"ot.column_mass_max.{kind}.l{layer}"] = float(col.max())
            metrics[f"ot.column_mass_min.{kind}.l{layer}"] = float(col.min())
    histories = {v: {k: s for k, s in log["history"].items()} for v, log in logs.items()}
    selected = {v: {s: log["seeds"][s].get("selected") for s in log["seeds"]} for v, log in logs.items() if v != "base"}
    extra = {"selected_experts": selected,
             "masked_experts": {v: {s: log["seeds"][s]["masked"] for s in log["seeds"]} for v, log in logs.items()},
             "routing_profile": profile.to_dict("records")}
    return build_report("mesa", p, rows, metrics, artifacts=plots, extra=extra, histories=histories)
