"""The report of `hobit` (variants table, gains of HOBIT over each baseline, false negatives, batching
overhead, the objective checks, claims) and its plots (recall vs epoch, in-batch negative scores, false
negatives, overhead, HOBIT's per-batch objective)."""
from __future__ import annotations

import numpy as np

from pipelines.core.plots import bar_plot, line_plot
from pipelines.core.report import build_report
from pipelines.hobit.params import Params

CURVES = ("test_recall_at_1", "train_loss", "hardness", "fn_per_batch", "batching_s", "train_s")


def _rows(fits: dict[str, dict]) -> list[dict]:
    return [{"variant": v, "seed": r["seed"], **r["row"]} for v, f in fits.items() for r in f["runs"]]


def _means(rows: list[dict], metric: str) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["variant"], []).append(r[metric])
    return {v: float(np.mean(x)) for v, x in out.items()}


def derived_metrics(p: Params, rows: list[dict]) -> tuple[dict[str, float], dict]:
    """Differences (recall, MRR, false negatives per batch) between every HOBIT-batched variant and every
    baseline, between ``hobit`` and each ablation, and against the best heuristic batcher (k-means /
    B3-like / BatchSampler-like, without mining)."""
    rec, mrr, fn = _means(rows, "recall_at_1"), _means(rows, "mrr_at_10"), _means(rows, "fn_per_batch")
    metrics: dict[str, float] = {}
    extra: dict = {}
    for a, b in p.diff_pairs():
        metrics[f"diff.recall_at_1.{a}_minus_{b}"] = rec[a] - rec[b]
        metrics[f"diff.mrr_at_10.{a}_minus_{b}"] = mrr[a] - mrr[b]
        metrics[f"diff.fn_per_batch.{b}_minus_{a}"] = fn[b] - fn[a]
    heur = p.heuristics()
    if heur:
        best = max(heur, key=lambda v: rec[v])
        extra["best_heuristic"] = best
        for a in p.hobit_variants():
            metrics[f"diff.recall_at_1.{a}_minus_best_heuristic"] = rec[a] - rec[best]
            metrics[f"diff.mrr_at_10.{a}_minus_best_heuristic"] = mrr[a] - mrr[best]
    return metrics, extra


def _curves(fits: dict[str, dict]) -> dict[str, dict[str, list[float]]]:
    """Per-epoch series, mean over a variant's seeds."""
    out = {}
    for v, f in fits.items():
        out[v] = {k: list(np.mean([r["history"][k] for r in f["runs"]], axis=0)) for k in CURVES}
    return out


def report(p: Params, checks: dict, plots: dict, **fits: dict) -> dict:
    rows = _rows(fits)
    metrics, extra = derived_metrics(p, rows)
    metrics.update(checks)
    return build_report("hobit", p, rows, metrics, artifacts=plots, histories=_curves(fits),
                        extra={**extra, "checks": checks})


def _style(names: list[str], p: Params) -> dict[str, dict]:
    """One colour per variant (tab20: more than the default 10), solid lines for HOBIT-batched variants."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {v: {"color": cmap(i % 20), "ls": "-" if p.variants[v].batcher == "hobit" else "--"}
            for i, v in enumerate(names)}


def _restyle(fig, style: dict[str, dict]) -> None:
    ax = fig.axes[0]
    for line in ax.get_lines():
        st = style.get(line.get_label())
        if st:
            line.set_color(st["color"])
            line.set_linestyle(st["ls"])
    ax.legend(fontsize=7, ncol=2)


def make_plots(p: Params, **fits: dict) -> dict:
    import matplotlib.pyplot as plt

    rows = _rows(fits)
    names = list(fits)
    curves = _curves(fits)
    figs = {}
    epochs = np.arange(p.model.epochs)
    style = _style(names, p)
    figs["recall_vs_epoch"] = line_plot(epochs, {v: curves[v]["test_recall_at_1"] for v in names}, "epoch",
                                        "test recall@1", "recall@1 after each epoch (mean over a variant's seeds)")
    figs["hardness_vs_epoch"] = line_plot(epochs, {v: curves[v]["hardness"] for v in names}, "epoch",
                                          "top negative cos − positive cos", "in-batch hardness (mean over seeds)")
    _restyle(figs["recall_vs_epoch"], style)
    _restyle(figs["hardness_vs_epoch"], style)
    for metric, label in (("recall_at_1", "test recall@1"), ("fn_per_batch", "co-batched duplicates per batch"),
                          ("overhead_ratio", "batching time / training time per epoch")):
        vals = {v: [r[metric] for r in rows if r["variant"] == v] for v in names}
        figs[metric] = bar_plot(names, [float(np.mean(vals[v])) for v in names],
                                [float(np.std(vals[v])) for v in names], ylabel=label,
                                title=f"{label} (mean ± std over seeds)")
    fig, ax = plt.subplots(figsize=(7, 4))
    for v in names:
        s = fits[v]["runs"][0].get("neg_scores") or []
        if s:
            ax.hist(s, bins=60, histtype="step", density=True, label=v, color=style[v]["color"],
                    ls=style[v]["ls"])
    ax.set(xlabel="cosine of (query, in-batch negative)", ylabel="density",
           title="in-batch negative scores, last epoch, final encoder (first seed)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    figs["in_batch_negative_scores"] = fig
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in names:
        fv = fits[v]["runs"][0].get("batch_f") or []
        if fv:
            ax.hist(fv, bins=40, histtype="step", label=v, color=style[v]["color"])
    ax.set(xlabel="F_A of the batch", ylabel="batches", title="HOBIT per-batch objective, last built epoch")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    figs["hobit_batch_objective"] = fig
    return figs
