"""Metrics, plots and the report of `mesa`: every variant's safety (plain and under the expert-masking
attack), utility, routing concentration and load balance; derived comparisons for the card's claims."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.mesa.params import Params

COMPARE = [
    ("safety_rate_masked_id", "mesa", "head_sft"),
    ("safety_rate_masked_direct", "mesa", "head_sft"),
    ("safety_rate_masked_ood", "mesa", "head_sft"),
    ("safety_rate_ood", "mesa", "head_sft"),
    ("safety_rate_id", "mesa", "head_sft"),
    ("safety_coverage_k80", "mesa", "head_sft"),
    ("benign_acc", "mesa", "base"),
    ("benign_acc", "base", "full_sft"),
    ("safety_rate_masked_id", "mesa", "mesa_no_route"),
    ("safety_rate_masked_id", "mesa", "full_sft"),
    # the OT choice of experts against random / greedy lowest-cost experts (same count, same refinement)
    ("safety_rate_masked_id", "mesa", "random_experts"),
    ("safety_rate_masked_id", "mesa", "greedy"),
    ("safety_rate_ood", "mesa", "random_experts"),
    ("safety_rate_ood", "mesa", "greedy"),
]


def base_masking_loss(values, p: Params) -> dict:
    """The base model's refusal lost to the masking attack, per seed."""
    d, m = values.per_seed("base", "safety_rate_direct"), values.per_seed("base", "safety_rate_masked_direct")
    return {"delta.safety_rate_direct.base_minus_base_masked": {s: d[s] - m[s] for s in d}}


def ot_masses(values, p: Params, plan: pd.DataFrame) -> dict:
    """OT column masses (first seed): the relaxed plan concentrates, the balanced one equals b exactly."""
    out = {}
    s0 = min(p.seeds)
    for layer in sorted(plan.layer.unique()):
        d = plan[(plan.seed == s0) & (plan.layer == layer)]
        for kind in ("relaxed", "balanced"):
            col = d.groupby("expert")[f"plan_{kind}"].sum()
            out[f"ot.column_mass_max.{kind}.l{layer}"] = float(col.max())
            out[f"ot.column_mass_min.{kind}.l{layer}"] = float(col.min())
    return out


def ot_mass_names(p: Params, planned) -> list[str]:
    return [
        f"ot.column_mass_{m}.{k}.l{layer}"
        for layer in range(p.model.n_layers)
        for k in ("relaxed", "balanced")
        for m in ("max", "min")
    ]


def _first_seed(log: dict) -> dict:
    return log["seeds"][sorted(log["seeds"], key=int)[0]]


def make_plots(p: Params, values, artifacts: dict, plan: pd.DataFrame, base_log: dict) -> dict:
    import matplotlib.pyplot as plt

    from pipelines.core.api import heatmap, line_plot

    logs = {"base": base_log, **{v: a["log"] for v, a in artifacts.items()}}
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
        figs[f"ot_plan_l{layer}"] = heatmap(
            P,
            list(range(P.shape[1])),
            [f"c{c}" for c in range(P.shape[0])],
            title=f"relaxed OT plan, layer {layer} (seed {s0})",
            fmt="{:.2f}",
            xlabel="expert",
            ylabel="duty cluster",
        )
    mass = {}
    for kind in ("relaxed", "balanced"):
        for layer in sorted(plan.layer.unique()):
            d = plan[(plan.seed == s0) & (plan.layer == layer)]
            mass[f"{kind} L{layer}"] = d.groupby("expert")[f"plan_{kind}"].sum().to_numpy().tolist()
    figs["ot_column_mass"] = line_plot(
        list(range(p.model.n_experts)),
        mass,
        "expert",
        "column mass (capacity received)",
        "OT column masses: relaxed selects, balanced cannot",
    )
    # safety vs utility: masked ID safety vs benign accuracy, one point per variant and seed
    allp = pd.DataFrame(values.rows())
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, (v, d) in enumerate(allp.groupby("variant")):
        ax.scatter(d["benign_acc"], d["safety_rate_masked_id"], label=v, color=f"C{i}", s=30)
        ax.scatter(
            d["benign_acc"].mean(), d["safety_rate_masked_id"].mean(), color=f"C{i}", marker="*", s=160, edgecolor="k"
        )
    ax.set(
        xlabel="benign accuracy (exact match)",
        ylabel="safety rate, ID wrappers, top safety experts masked",
        title="safety under the masking attack vs utility",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["safety_vs_utility"] = fig
    curves = {v: logs[v]["history"]["loss"] for v in logs if v != "base"}
    if curves:
        n = min(len(c) for c in curves.values())
        figs["alignment_loss"] = line_plot(
            list(range(n)),
            {v: c[:n] for v, c in curves.items()},
            "step",
            "alignment loss (seed mean)",
            "alignment training",
        )
    return figs


def report_extra(p: Params, values, artifacts: dict, profile: pd.DataFrame, base_log: dict) -> dict:
    logs = {"base": base_log, **{v: a["log"] for v, a in artifacts.items()}}
    selected = {v: {s: log["seeds"][s].get("selected") for s in log["seeds"]} for v, log in logs.items() if v != "base"}
    return {
        "selected_experts": selected,
        "masked_experts": {v: {s: log["seeds"][s]["masked"] for s in log["seeds"]} for v, log in logs.items()},
        "routing_profile": profile.to_dict("records"),
    }
