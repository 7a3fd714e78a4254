"""The report and plots of `bimu`: per-seed final metrics of every variant, the comparisons the claims
name (BiMU vs learning-speed-matched BayesBiNN; VR querying vs random and query-all at equal budget), and
the quantities over stream time (per task; per stream step for active querying) as MLflow histories."""

from __future__ import annotations

import numpy as np

from pipelines.bimu.params import Params
from pipelines.core.api import Diff, Fn, finish, line_plot, paired


def labels_to_reach(curve: dict, target: float, metric: str = "bal_acc") -> float:
    """Labels the first checkpoint at or above ``target`` had used (``curve[metric]`` and
    ``curve["n_labels"]`` per checkpoint, one seed; a (checkpoint, seed) array is averaged over seeds); the
    final count when the target is never reached (so savings against it are a lower bound)."""
    acc, labels = np.asarray(curve[metric], dtype=float), np.asarray(curve["n_labels"], dtype=float)
    acc, labels = (acc.mean(1), labels.mean(1)) if acc.ndim == 2 else (acc, labels)
    hit = np.flatnonzero(acc >= target - 1e-12)
    return float(labels[hit[0]] if len(hit) else labels[-1])


def guarded_ratio(metric: str, a: str = "bimu", b: str = "bayesbinn"):
    """``ratio.<metric>.<a>_vs_<b>`` per seed, a / max(b, 1e-12) (a share of saturated weights may be 0)."""
    name = f"ratio.{metric}.{a}_vs_{b}"

    def ratio(values, p: Params) -> dict:
        xa, xb = values.per_seed(a, metric), values.per_seed(b, metric)
        return {name: {s: xa[s] / max(xb[s], 1e-12) for s in paired(xa, xb)}}

    ratio.__name__ = f"ratio_{metric}"
    return Fn(ratio, [name], needs_=[a, b])


def label_savings(values, p: Params) -> dict:
    """Per seed: the labels random querying needed to first reach VR's final balanced accuracy (its total
    when never reached), over VR's labels, from the labels-to-accuracy checkpoints."""
    vr_acc, vr_labels = values.per_seed("al_vr", "bal_acc"), values.per_seed("al_vr", "n_labels")
    out = {}
    for s in paired(vr_acc, values.per_seed("al_random", "bal_acc")):
        curve = {k: values.history("al_random", k, seed=s)["value"] for k in ("bal_acc", "n_labels")}
        out[s] = labels_to_reach(curve, vr_acc[s]) / max(vr_labels[s], 1)
    return {"label_savings_x.bal_acc.al_vr_vs_al_random": out}


def derived() -> list:
    """The comparisons the claims name, per seed and paired: BiMU vs learning-speed-matched BayesBiNN; the
    query rules vs random and query-all at equal budget."""
    out = [guarded_ratio("frac_saturated"), guarded_ratio("mean_bernoulli_var")]
    out += [
        Diff(k, "bimu", "bayesbinn", name=f"diff.{k}.bimu_vs_bayesbinn")
        for k in ("acc_mean_last5", "acc_mean_seen", "ood_auc_epistemic_min")
    ]
    out += [
        Diff("bal_acc", v, "al_random", name=f"diff.bal_acc.{v}_vs_al_random")
        for v in ("al_vr", "al_entropy", "al_epistemic")
    ]
    out += [
        Fn(label_savings, ["label_savings_x.bal_acc.al_vr_vs_al_random"], needs_=["al_vr", "al_random"]),
        Diff("bal_acc", "al_all", "al_vr", name="diff.bal_acc.al_all_vs_al_vr"),
    ]
    return out


def make_plots(p: Params, values, results: dict[str, dict]) -> dict:
    cont = {v: r for v, r in results.items() if r["family"] == "continual"}
    act = {v: r for v, r in results.items() if r["family"] == "active"}
    figs = {}
    if cont:
        tasks = np.arange(1, p.continual.n_tasks + 1)
        for k, label, name in (
            ("acc_current_task", "newest-task accuracy", "plasticity"),
            ("acc_mean_seen", "mean accuracy over seen tasks", "retention"),
            ("mean_bernoulli_var", "mean Bernoulli variance 1 − tanh²λ", "variance"),
            ("frac_saturated", "share of weights with |tanh λ| > 0.99", "saturation"),
        ):
            has = {v: np.asarray(r["per_task"][k]) for v, r in cont.items() if k in r["per_task"]}
            ys, es = {v: a.mean(1) for v, a in has.items()}, {v: a.std(1) for v, a in has.items()}
            figs[name] = line_plot(
                tasks,
                ys,
                xlabel="task",
                ylabel=label,
                errors=es,
                title=f"{label} over the stream (mean ± std over seeds)",
            )
    if act:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for v, r in act.items():
            c = r["curve"]
            ax.plot(np.asarray(c["n_labels"]).mean(1), np.asarray(c["bal_acc"]).mean(1), marker="o", label=v)
        figs["labels_to_accuracy"] = finish(
            fig,
            ax,
            xlabel="labels queried (= backprop updates)",
            ylabel="balanced test accuracy",
            title=f"active querying, budget {p.active.budget:.0%}",
        )
    return figs


def report_extra(p: Params, values, results: dict[str, dict]) -> dict:
    return {"acc_matrix": {v: r["acc_matrix"] for v, r in results.items() if r["family"] == "continual"}}
