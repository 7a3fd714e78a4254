"""The report of `hobit` (variants table, gains of HOBIT over each baseline, false negatives, batching
overhead, the objective checks, claims) and its plots (recall vs epoch, in-batch negative scores, false
negatives, overhead, HOBIT's per-batch objective)."""

from __future__ import annotations

import numpy as np

from pipelines.core.api import bar_plot, line_plot
from pipelines.hobit.params import Params


def _checks_names(p: Params, planned) -> list[str]:
    return list(CHECKS)


CHECKS = (
    "objective.anchors_fixed.monotonicity_violations",
    "objective.anchors_fixed.submodularity_violations",
    "objective.anchors_fixed.inequalities_checked",
    "objective.all_members.submodularity_violations",
    "objective.all_members.submodularity_violation_rate",
    "greedy.min_ratio_to_brute_force",
    "greedy.mean_ratio_to_brute_force",
    "greedy.share_optimal",
)


def checks_metrics(values, p: Params, checks: dict) -> dict[str, float]:
    """The objective checks (data.objective_checks) as point metrics: exhaustive counts, not seed estimates."""
    return {k: checks[k] for k in CHECKS if k in checks}


def best_heuristic(values, p: Params) -> str:
    """The heuristic batcher (k-means / B3-like / BatchSampler-like, without mining) of highest mean recall@1."""
    return max(p.heuristics(), key=lambda v: values.mean(v, "recall_at_1"))


def best_heuristic_names(p: Params, planned) -> list[str]:
    if not p.heuristics():
        return []
    return [f"diff.{m}.{a}_minus_best_heuristic" for a in p.hobit_variants() for m in ("recall_at_1", "mrr_at_10")]


def vs_best_heuristic(values, p: Params) -> dict[str, dict[int, float]]:
    """Every HOBIT-batched variant minus the best heuristic (chosen by mean recall@1; the same one for MRR),
    per seed, paired."""
    from pipelines.core.api import paired

    best = best_heuristic(values, p)
    out = {}
    for a in p.hobit_variants():
        for m in ("recall_at_1", "mrr_at_10"):
            xa, xb = values.per_seed(a, m), values.per_seed(best, m)
            out[f"diff.{m}.{a}_minus_best_heuristic"] = {s: xa[s] - xb[s] for s in paired(xa, xb)}
    return out


def convergence(values, p: Params) -> dict[str, float]:
    """The convergence gate's value: the largest seed-mean ``val_late_rise`` (validation recall@1 still
    gained over the last ``model.flat_window`` of training) over every variant of the run, and which."""
    rises = {v: values.mean(v, "val_late_rise") for v in values.variants}
    worst = max(rises, key=rises.get)
    return {"convergence.max_val_late_rise": float(rises[worst])}


def derived(p: Params) -> list:
    """Differences (recall, MRR, false negatives per batch) between every HOBIT-batched variant and every
    baseline, between ``hobit`` and each ablation, and against the best heuristic batcher; the objective
    checks."""
    from pipelines.core.api import Diff, Fn

    out = [
        Fn(checks_metrics, _checks_names, inputs=["checks"]),
        Fn(convergence, ["convergence.max_val_late_rise"], needs_=list(p.variants)),
    ]
    for a, b in p.diff_pairs():
        out += [Diff("recall_at_1", a, b), Diff("mrr_at_10", a, b), Diff("fn_per_batch", b, a)]
    if p.heuristics():
        out.append(Fn(vs_best_heuristic, best_heuristic_names))
    return out


def report_extra(p: Params, values, artifacts: dict, checks: dict) -> dict:
    return {**({"best_heuristic": best_heuristic(values, p)} if p.heuristics() else {}), "checks": checks}


def _curves(values) -> dict[str, dict[str, list[float]]]:
    """Per-epoch series, mean over a variant's seeds."""
    from pipelines.hobit.train import CURVES

    out = {}
    for v in values.variants:
        seeds = sorted(values.per_seed(v, "recall_at_1"))
        out[v] = {}
        for k in CURVES:  # early stopping: seeds may stop at different epochs (padded with NaN)
            rows = [np.asarray(values.history(v, k, s)["value"], float) for s in seeds]
            n = max(len(r) for r in rows)
            pad = np.stack([np.pad(r, (0, n - len(r)), constant_values=np.nan) for r in rows])
            out[v][k] = list(np.nanmean(pad, axis=0))
    return out


def _style(names: list[str], p: Params) -> dict[str, dict]:
    """One colour per variant (tab20: more than the default 10), solid lines for HOBIT-batched variants."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {
        v: {"color": cmap(i % 20), "ls": "-" if p.variants[v].batcher == "hobit" else "--"} for i, v in enumerate(names)
    }


def _restyle(fig, style: dict[str, dict]) -> None:
    ax = fig.axes[0]
    for line in ax.get_lines():
        st = style.get(line.get_label())
        if st:
            line.set_color(st["color"])
            line.set_linestyle(st["ls"])
    ax.legend(fontsize=7, ncol=2)


def make_plots(p: Params, values, artifacts: dict) -> dict:
    import matplotlib.pyplot as plt

    names = list(values.variants)
    curves = _curves(values)
    figs = {}
    n_ep = max(len(curves[v]["val_recall_at_1"]) for v in names)
    pad = lambda xs: list(xs) + [float("nan")] * (n_ep - len(xs))  # noqa: E731
    epochs = np.arange(n_ep)
    style = _style(names, p)
    figs["recall_vs_epoch"] = line_plot(
        epochs,
        {v: pad(curves[v]["val_recall_at_1"]) for v in names},
        "epoch",
        "validation recall@1",
        "validation recall@1 after each epoch (mean over a variant's seeds)",
    )
    figs["hardness_vs_epoch"] = line_plot(
        epochs,
        {v: pad(curves[v]["hardness"]) for v in names},
        "epoch",
        "top negative cos − positive cos",
        "in-batch hardness (mean over seeds)",
    )
    _restyle(figs["recall_vs_epoch"], style)
    _restyle(figs["hardness_vs_epoch"], style)
    for metric, label in (
        ("recall_at_1", "test recall@1"),
        ("fn_per_batch", "co-batched duplicates per batch"),
        ("overhead_ratio", "batching time / training time per epoch"),
    ):
        vals = {v: list(values.per_seed(v, metric).values()) for v in names}
        figs[metric] = bar_plot(
            names,
            [float(np.mean(vals[v])) for v in names],
            [float(np.std(vals[v])) for v in names],
            ylabel=label,
            title=f"{label} (mean ± std over seeds)",
        )
    fig, ax = plt.subplots(figsize=(7, 4))
    for v in names:
        s = artifacts[v].get("neg_scores") or []
        if s:
            ax.hist(s, bins=60, histtype="step", density=True, label=v, color=style[v]["color"], ls=style[v]["ls"])
    ax.set(
        xlabel="cosine of (query, in-batch negative)",
        ylabel="density",
        title="in-batch negative scores, last epoch, final encoder (first seed)",
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    figs["in_batch_negative_scores"] = fig
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in names:
        fv = artifacts[v].get("batch_f") or []
        if fv:
            ax.hist(fv, bins=40, histtype="step", label=v, color=style[v]["color"])
    ax.set(xlabel="F_A of the batch", ylabel="batches", title="HOBIT per-batch objective, last built epoch")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    figs["hobit_batch_objective"] = fig
    return figs
