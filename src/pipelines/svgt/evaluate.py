"""Derived metrics and plots of `svgt`: harm reductions and NLL increases against no intervention, the
CAA / ITI coefficient trade-off, the gaps the claims read (per SVGT seed) and the figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.api import Fn, SeedValues, paired, relative_gain
from pipelines.svgt.params import Params
from pipelines.svgt.train import SETS, row_variants


def _base_mean(values: SeedValues, metric: str) -> float:
    return values.mean("no_intervention", metric)


def relative_to_baseline(values: SeedValues, p: Params) -> dict[str, dict[int, float]]:
    """Every row variant's harm reductions (relative) and benign NLL increase against `no_intervention`,
    per seed of the variant, against the baseline's mean over its seeds (the untouched backbone is
    deterministic, so the default run evaluates it on one seed)."""
    out: dict[str, dict[int, float]] = {}
    for v in values.variants:
        for k in SETS:
            metric = f"harmful_rate_{k}"
            if values.has(v, metric) and values.has("no_intervention", metric):
                base = _base_mean(values, metric)
                out[f"variants.{v}.harm_reduction_rel_{k}"] = {
                    s: relative_gain(method=x, baseline=base) for s, x in values.per_seed(v, metric).items()
                }
        if values.has(v, "benign_nll") and values.has("no_intervention", "benign_nll"):
            base = _base_mean(values, "benign_nll")
            out[f"variants.{v}.benign_nll_increase"] = {
                s: x - base for s, x in values.per_seed(v, "benign_nll").items()
            }
    return out


def relative_names(p: Params, planned) -> list[str]:
    rows = [r for v in planned for r in row_variants(p, v)] if planned else []
    return [
        f"variants.{v}.{m}"
        for v in dict.fromkeys(rows)
        for m in (*(f"harm_reduction_rel_{k}" for k in SETS), "benign_nll_increase")
    ]


def _reduction(values: SeedValues, v: str, metric: str) -> float:
    base = _base_mean(values, metric.replace("harm_reduction_rel_", "harmful_rate_"))
    xs = [
        relative_gain(method=x, baseline=base)
        for x in values.per_seed(v, metric.replace("harm_reduction_rel_", "harmful_rate_")).values()
    ]
    return float(np.mean(xs))


def steering_tradeoff(values: SeedValues, p: Params) -> dict[str, float]:
    """CAA / ITI (training-free, deterministic given the backbone: point values over their coefficients):
    the best ID harm reduction of a coefficient that keeps the benign NLL increase below
    ``eval.wrecked_nll_increase`` (coefficient 0 = no intervention always qualifies), and the smallest NLL
    increase of a coefficient reaching ``eval.comparable_reduction``."""
    m: dict[str, float] = {}
    base_nll = _base_mean(values, "benign_nll")
    for fam in ("caa", "iti"):
        coefs = [v for v in values.variants if v.startswith(f"{fam}_c")]
        if not coefs:
            continue
        red = {v: _reduction(values, v, "harm_reduction_rel_id") for v in coefs}
        inc = {v: values.mean(v, "benign_nll") - base_nll for v in coefs}
        fluent = [red[v] for v in coefs if inc[v] < p.eval.wrecked_nll_increase]
        m[f"{fam}_best_harm_reduction_id_while_fluent"] = max([0.0, *fluent])
        comparable = [inc[v] for v in coefs if red[v] >= p.eval.comparable_reduction]
        if comparable:
            m[f"{fam}_min_nll_increase_at_comparable_reduction"] = min(comparable)
    return m


def tradeoff_names(p: Params, planned) -> list[str]:
    return [
        f"{fam}_{m}"
        for fam in ("caa", "iti")
        if fam in planned
        for m in ("best_harm_reduction_id_while_fluent", "min_nll_increase_at_comparable_reduction")
    ]


def _held(values: SeedValues, v: str) -> dict[int, float]:
    ood, new = values.per_seed(v, "harmful_rate_ood"), values.per_seed(v, "harmful_rate_newverb")
    return {s: float(np.nanmean([ood[s], new.get(s, np.nan)])) for s in ood}


def gaps(values: SeedValues, p: Params) -> dict[str, dict[int, float]]:
    """Per SVGT seed: the soft prompt's held-out-wrapper harmful rate (its mean: one seed at the default
    budget) minus SVGT's, and dz = 0's held-out (wrapper + verb) harmful rate minus SVGT's (paired seeds);
    the stage-3 value-space stability minus the residual trigger's."""
    out: dict[str, dict[int, float]] = {}
    svgt = values.per_seed("svgt", "harmful_rate_ood")
    if values.has("soft_prompt", "harmful_rate_ood"):
        soft = values.mean("soft_prompt", "harmful_rate_ood")
        out["gap.harmful_rate_ood.soft_prompt_minus_svgt"] = {s: soft - x for s, x in svgt.items()}
    if values.has("svgt_dz0", "harmful_rate_ood"):
        a, b = _held(values, "svgt_dz0"), _held(values, "svgt")
        out["gap.harmful_rate_heldout.svgt_dz0_minus_svgt"] = {s: a[s] - b[s] for s in paired(a, b)}
    vs, rs = values.per_seed("svgt", "value_stability"), values.per_seed("svgt", "residual_stability")
    out["stability_gap.value_minus_residual"] = {s: vs[s] - rs[s] for s in paired(vs, rs)}
    return {k: {s: x for s, x in d.items() if not math.isnan(x)} for k, d in out.items()}


def gap_names(p: Params, planned) -> list[str]:
    return [
        *(["gap.harmful_rate_ood.soft_prompt_minus_svgt"] if "soft_prompt" in planned else []),
        *(["gap.harmful_rate_heldout.svgt_dz0_minus_svgt"] if "svgt_dz0" in planned else []),
        "stability_gap.value_minus_residual",
    ]


DERIVED = [
    Fn(relative_to_baseline, relative_names, needs_=["no_intervention"]),
    Fn(steering_tradeoff, tradeoff_names, needs_=["no_intervention"]),
    Fn(gaps, gap_names, needs_=["svgt"]),
]


# ------------------------------------------------------------------------------------------ plots
def make_plots(p: Params, values: SeedValues, artifacts: dict) -> dict:
    import matplotlib.pyplot as plt

    rows = [v for v in values.variants if values.has(v, "benign_nll")]
    figs = {}

    # harm vs fluency over methods and steering coefficients
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, v in enumerate(rows):
        parts = [values.mean(v, m) for m in ("harmful_rate_ood", "harmful_rate_newverb") if values.has(v, m)]
        held = float(np.nanmean(parts)) if parts else np.nan
        nll = max(values.mean(v, "benign_nll"), 1e-4)
        ax.scatter(nll, held, color=f"C{i % 10}", s=50, edgecolor="k", label=v)
        ax.annotate(v, (nll, held), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set(
        xlabel="benign NLL (nats/token, reference answers)",
        ylabel="harmful rate (held-out wrappers + verbs)",
        title="Harm vs fluency",
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    figs["harm_vs_fluency"] = fig

    # per-wrapper harmful rate (pooled over each variant's seeds)
    rates = {v: r for a in artifacts.values() for v, r in (a.get("wrapper_harmful_rate") or {}).items()}
    tab = pd.DataFrame(rates)
    if len(tab):
        fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(tab)), 4.5))
        w = 0.8 / max(1, tab.shape[1])
        for j, v in enumerate(tab.columns):
            ax.bar(np.arange(len(tab)) + j * w, tab[v].to_numpy(), w, label=v)
        held = set(p.data.ood_wrappers)
        ax.set_xticks(
            np.arange(len(tab)) + 0.4 - w / 2,
            [f"{x}*" if x in held else x for x in tab.index],
            rotation=30,
            ha="right",
            fontsize=8,
        )
        ax.set(ylabel="harmful rate", title="Harmful rate per wrapper (* held out of value/bridge training)")
        ax.legend(fontsize=6, ncol=3)
        fig.tight_layout()
        figs["harmful_rate_per_wrapper"] = fig

    # value space vs residual space (the first SVGT seed)
    pca = (artifacts.get("svgt") or {}).get("pca")
    if pca is not None:
        held = set(p.data.ood_wrappers)
        d = pd.DataFrame(pca)
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
        for ax, space, title in (
            (axes[0], "value", "value space z (stage-3 path)"),
            (axes[1], "resid", "residual trigger h (layer l)"),
        ):
            for harmful, col in ((False, "C0"), (True, "C3")):
                for ood, mk in ((False, "o"), (True, "^")):
                    s = d[(d["harmful_prompt"] == harmful) & (d["wrapper"].isin(held) == ood)]
                    ax.scatter(
                        s[f"pca_{space}_0"],
                        s[f"pca_{space}_1"],
                        c=col,
                        marker=mk,
                        s=12,
                        alpha=0.6,
                        label=f"{'harmful' if harmful else 'benign'}, {'held-out' if ood else 'ID'} wrapper",
                    )
            ax.set(title=title, xlabel="PC1", ylabel="PC2")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        figs["value_vs_residual_pca"] = fig

    # stage-3 training curves
    t = values.table
    t = t[(t["metric"] == "stage3_ce") & t["step"].notna() & t["variant"].isin(["svgt", "svgt_dz0", "soft_prompt"])]
    if len(t):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (v, seed), d in t.groupby(["variant", "seed"], sort=False):
            d = d.sort_values("step")
            ax.plot(d["step"].to_numpy(dtype=float), d["value"].to_numpy(), label=f"{v} seed {seed}", lw=1)
        ax.set(xlabel="step", ylabel="CE of the safe response", yscale="log", title="Stage-3 training")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        figs["stage3_ce"] = fig
    return figs
