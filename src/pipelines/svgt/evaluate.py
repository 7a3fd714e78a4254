"""Metrics, plots and the report of `svgt`: harmful rates (ID wrappers, held-out wrappers, held-out verbs),
over-refusal and fluency of every variant, the CAA / ITI coefficient trade-off, the value-space
diagnostics (dz firing rate, stability across wrappers) and the claims."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.metrics import relative_gain
from pipelines.core.report import build_report
from pipelines.svgt.params import Params

SETS = {"id": "eval_harm_id", "ood": "eval_harm_ood", "newverb": "eval_harm_newverb"}


def _per_seed(pred: pd.DataFrame) -> list[dict]:
    rows = []
    for (variant, seed), d in pred.groupby(["variant", "seed"], sort=False):
        row = {"variant": variant, "seed": int(seed)}
        for k, split in SETS.items():
            part = d[d["split"] == split]
            if len(part):
                row[f"harmful_rate_{k}"] = float(part["harmful_out"].mean())
        ben = d[d["split"] == "eval_benign"]
        row["over_refusal_benign"] = float(ben["refused_out"].mean())
        row["benign_em"] = float(ben["em"].mean())
        row["benign_nll"] = float(ben["nll"].mean())
        look = d[d["split"] == "eval_lookalike"]
        if len(look):
            row["over_refusal_lookalike"] = float(look["refused_out"].mean())
            row["lookalike_em"] = float(look["em"].mean())
        rows.append(row)
    return rows


def variant_rows(p: Params, predictions: dict[str, pd.DataFrame], fitlogs: dict[str, dict],
                 value_log: dict | None) -> list[dict]:
    """One row per (variant, seed); reductions and NLL increases are relative to `no_intervention`."""
    rows = [r for pred in predictions.values() for r in _per_seed(pred)]
    base = pd.DataFrame([r for r in rows if r["variant"] == "no_intervention"]).mean(numeric_only=True)
    for r in rows:
        for k in SETS:
            if f"harmful_rate_{k}" in r:
                r[f"harm_reduction_rel_{k}"] = relative_gain(method=r[f"harmful_rate_{k}"],
                                                             baseline=float(base[f"harmful_rate_{k}"]))
        r["benign_nll_increase"] = r["benign_nll"] - float(base["benign_nll"])
        group = r["variant"].split("_c")[0] if r["variant"].startswith(("caa_c", "iti_c")) else r["variant"]
        r.update((fitlogs.get(group) or {}).get(str(r["seed"]), {}).get("metrics", {}))
        if r["variant"] in ("svgt", "svgt_dz0") and value_log:
            r.update(value_log.get(str(r["seed"]), {}).get("metrics", {}))
    return rows


def _mean(rows: list[dict], variant: str, key: str) -> float:
    vals = [r[key] for r in rows if r["variant"] == variant and key in r]
    return float(np.mean(vals)) if vals else float("nan")


def derived_metrics(p: Params, rows: list[dict]) -> dict[str, float]:
    m: dict[str, float] = {}
    for fam in ("caa", "iti"):
        coefs = sorted({r["variant"] for r in rows if r["variant"].startswith(f"{fam}_c")})
        if not coefs:
            continue
        red = {v: _mean(rows, v, "harm_reduction_rel_id") for v in coefs}
        inc = {v: _mean(rows, v, "benign_nll_increase") for v in coefs}
        fluent = [red[v] for v in coefs if inc[v] < p.eval.wrecked_nll_increase]
        # coefficient 0 (no intervention) is always available: reduction 0 at no fluency cost
        m[f"{fam}_best_harm_reduction_id_while_fluent"] = max([0.0, *fluent])
        comparable = [inc[v] for v in coefs if red[v] >= p.eval.comparable_reduction]
        m[f"{fam}_min_nll_increase_at_comparable_reduction"] = min(comparable) if comparable else float("nan")
    held = lambda v: np.nanmean([_mean(rows, v, "harmful_rate_ood"), _mean(rows, v, "harmful_rate_newverb")])  # noqa: E731
    m["gap.harmful_rate_ood.soft_prompt_minus_svgt"] = (_mean(rows, "soft_prompt", "harmful_rate_ood")
                                                       - _mean(rows, "svgt", "harmful_rate_ood"))
    m["gap.harmful_rate_heldout.svgt_dz0_minus_svgt"] = float(held("svgt_dz0") - held("svgt"))
    m["stability_gap.value_minus_residual"] = (_mean(rows, "svgt", "value_stability")
                                               - _mean(rows, "svgt", "residual_stability"))
    return {k: v for k, v in m.items() if not (isinstance(v, float) and math.isnan(v))}


def _gather(kw: dict) -> tuple[dict, dict]:
    preds = {k: v for k, v in kw.items() if isinstance(v, pd.DataFrame)}
    logs = {k[:-len("__fitlog")]: v for k, v in kw.items() if k.endswith("__fitlog")}
    return preds, logs


def report(p: Params, plots: dict, backbone_fitlog: dict, value_fitlog: dict, **kw) -> dict:
    preds, logs = _gather(kw)
    rows = variant_rows(p, preds, logs, value_fitlog)
    metrics = derived_metrics(p, rows)
    histories: dict[str, dict] = {"run": {"backbone_loss": backbone_fitlog["loss"]}}
    for seed, entry in (value_fitlog or {}).items():
        for name, series in entry["histories"].items():
            histories.setdefault("svgt", {})[f"value_{name}_seed{seed}"] = series
    for v, log in logs.items():
        for seed, entry in log.items():
            for name, series in (entry.get("histories") or {}).items():
                histories.setdefault(v, {})[f"{name}_seed{seed}"] = series
    variants = {r["variant"] for r in rows}
    histories = {k: h for k, h in histories.items() if k == "run" or k in variants}
    return build_report("svgt", p, rows, metrics, artifacts=plots, histories=histories)


# ------------------------------------------------------------------------------------------ plots
def make_plots(p: Params, value_fitlog: dict, **kw) -> dict:
    import matplotlib.pyplot as plt

    preds, logs = _gather(kw)
    rows = variant_rows(p, preds, logs, value_fitlog)
    df = pd.DataFrame(rows).groupby("variant", sort=False).mean(numeric_only=True)
    figs = {}

    # harm vs fluency over methods and steering coefficients
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, (v, r) in enumerate(df.iterrows()):
        held = np.nanmean([r.get("harmful_rate_ood", np.nan), r.get("harmful_rate_newverb", np.nan)])
        ax.scatter(max(r["benign_nll"], 1e-4), held, color=f"C{i % 10}", s=50, edgecolor="k", label=v)
        ax.annotate(v, (max(r["benign_nll"], 1e-4), held), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set(xlabel="benign NLL (nats/token, reference answers)", ylabel="harmful rate (held-out wrappers + verbs)",
           title="Harm vs fluency")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    figs["harm_vs_fluency"] = fig

    # per-wrapper harmful rate
    allp = pd.concat(preds.values(), ignore_index=True)
    harm = allp[allp["harmful_prompt"] & allp["split"].isin(list(SETS.values()))]
    tab = harm.groupby(["wrapper", "variant"], sort=False)["harmful_out"].mean().unstack("variant")
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(tab)), 4.5))
    w = 0.8 / max(1, tab.shape[1])
    for j, v in enumerate(tab.columns):
        ax.bar(np.arange(len(tab)) + j * w, tab[v].to_numpy(), w, label=v)
    held = set(p.data.ood_wrappers)
    ax.set_xticks(np.arange(len(tab)) + 0.4 - w / 2,
                  [f"{x}*" if x in held else x for x in tab.index], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="harmful rate", title="Harmful rate per wrapper (* held out of value/bridge training)")
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    figs["harmful_rate_per_wrapper"] = fig

    # value space vs residual space (the first SVGT seed)
    pca = next((e["pca"] for e in (logs.get("svgt") or {}).values() if "pca" in e), None)
    if pca is not None:
        d = pd.DataFrame(pca)
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
        for ax, space, title in ((axes[0], "value", "value space z (stage-3 path)"),
                                 (axes[1], "resid", "residual trigger h (layer l)")):
            for harmful, col in ((False, "C0"), (True, "C3")):
                for ood, mk in ((False, "o"), (True, "^")):
                    s = d[(d["harmful_prompt"] == harmful) & (d["wrapper"].isin(held) == ood)]
                    ax.scatter(s[f"pca_{space}_0"], s[f"pca_{space}_1"], c=col, marker=mk, s=12, alpha=0.6,
                               label=f"{'harmful' if harmful else 'benign'}, {'held-out' if ood else 'ID'} wrapper")
            ax.set(title=title, xlabel="PC1", ylabel="PC2")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        figs["value_vs_residual_pca"] = fig

    # stage-3 training curves
    curves = {}
    for v in ("svgt", "svgt_dz0", "soft_prompt"):
        for seed, entry in (logs.get(v) or {}).items():
            ce = (entry.get("histories") or {}).get("stage3_ce")
            if ce:
                curves[f"{v} seed {seed}"] = ce
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, ys in curves.items():
            ax.plot(ys, label=name, lw=1)
        ax.set(xlabel="step", ylabel="CE of the safe response", yscale="log", title="Stage-3 training")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        figs["stage3_ce"] = fig
    return figs
