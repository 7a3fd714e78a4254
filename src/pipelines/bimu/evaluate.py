"""The report and plots of `bimu`: per-seed final metrics of every variant, the comparisons the claims
name (BiMU vs learning-speed-matched BayesBiNN; VR querying vs random and query-all at equal budget), and
the quantities over stream time (per task; per stream step for active querying) as MLflow histories."""
from __future__ import annotations

import numpy as np

from pipelines.bimu.params import Params
from pipelines.core.plots import line_plot
from pipelines.core.report import build_report

def _rows(results: dict[str, dict]) -> list[dict]:
    return [{"variant": v, **f} for v, res in results.items() for f in res["final"]]


def _mean(results, v, metric) -> float:
    return float(np.mean([f[metric] for f in results[v]["final"]]))


def labels_to_reach(curve: dict, target: float, metric: str = "bal_acc") -> float:
    """Labels (mean over seeds) the first checkpoint at or above ``target`` had used; the final count when
    the target is never reached (so savings against it are a lower bound)."""
    acc = np.asarray(curve[metric]).mean(1)
    labels = np.asarray(curve["n_labels"]).mean(1)
    hit = np.flatnonzero(acc >= target - 1e-12)
    return float(labels[hit[0]] if len(hit) else labels[-1])


def derived_metrics(results: dict[str, dict]) -> dict[str, float]:
    m, have = {}, set(results)
    if {"bimu", "bayesbinn"} <= have:
        ratio = lambda k: _mean(results, "bimu", k) / max(_mean(results, "bayesbinn", k), 1e-12)  # noqa: E731
        diff = lambda k: _mean(results, "bimu", k) - _mean(results, "bayesbinn", k)               # noqa: E731
        m["ratio.frac_saturated.bimu_vs_bayesbinn"] = ratio("frac_saturated")
        m["ratio.mean_bernoulli_var.bimu_vs_bayesbinn"] = ratio("mean_bernoulli_var")
        m["diff.acc_mean_last5.bimu_vs_bayesbinn"] = diff("acc_mean_last5")
        m["diff.acc_mean_seen.bimu_vs_bayesbinn"] = diff("acc_mean_seen")
        m["diff.ood_auc_epistemic_min.bimu_vs_bayesbinn"] = diff("ood_auc_epistemic_min")
    if {"al_vr", "al_random"} <= have:
        m["diff.bal_acc.al_vr_vs_al_random"] = _mean(results, "al_vr", "bal_acc") - _mean(results, "al_random",
                                                                                            "bal_acc")
        target = float(np.asarray(results["al_vr"]["curve"]["bal_acc"][-1]).mean())
        m["label_savings_x.bal_acc.al_vr_vs_al_random"] = (
            labels_to_reach(results["al_random"]["curve"], target) / max(_mean(results, "al_vr", "n_labels"), 1))
    for v in ("al_entropy", "al_epistemic"):
        if {v, "al_random"} <= have:
            m[f"diff.bal_acc.{v}_vs_al_random"] = _mean(results, v, "bal_acc") - _mean(results, "al_random", "bal_acc")
    if {"al_vr", "al_all"} <= have:
        m["diff.bal_acc.al_all_vs_al_vr"] = _mean(results, "al_all", "bal_acc") - _mean(results, "al_vr", "bal_acc")
    return m


def histories(results: dict[str, dict]) -> dict[str, dict]:
    """Seed-mean quantities over stream time: per task (step = task index) or per checkpoint (stream step)."""
    out = {}
    for v, res in results.items():
        if res["family"] == "continual":
            out[v] = {k: [(t + 1, float(np.mean(row))) for t, row in enumerate(series)]
                      for k, series in res["per_task"].items()}
        else:
            c = res["curve"]
            out[v] = {k: [(s, float(np.mean(row))) for s, row in zip(c["step"], c[k])]
                      for k in ("bal_acc", "acc_mix", "n_labels")}
    return out


def make_plots(p: Params, **results: dict) -> dict:
    cont = {v: r for v, r in results.items() if r["family"] == "continual"}
    act = {v: r for v, r in results.items() if r["family"] == "active"}
    figs = {}
    if cont:
        tasks = np.arange(1, p.continual.n_tasks + 1)
        for k, label, name in (("acc_current_task", "newest-task accuracy", "plasticity"),
                               ("acc_mean_seen", "mean accuracy over seen tasks", "retention"),
                               ("mean_bernoulli_var", "mean Bernoulli variance 1 − tanh²λ", "variance"),
                               ("frac_saturated", "share of weights with |tanh λ| > 0.99", "saturation")):
            has = {v: np.asarray(r["per_task"][k]) for v, r in cont.items() if k in r["per_task"]}
            ys, es = {v: a.mean(1) for v, a in has.items()}, {v: a.std(1) for v, a in has.items()}
            figs[name] = line_plot(tasks, ys, xlabel="task", ylabel=label, errors=es,
                                   title=f"{label} over the stream (mean ± std over seeds)")
    if act:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for v, r in act.items():
            c = r["curve"]
            ax.plot(np.asarray(c["n_labels"]).mean(1), np.asarray(c["bal_acc"]).mean(1), marker="o", label=v)
        ax.set(xlabel="labels queried (= backprop updates)", ylabel="balanced test accuracy",
               title=f"active querying, budget {p.active.budget:.0%}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        figs["labels_to_accuracy"] = fig
    return figs


def report(p: Params, plots: dict, **results: dict) -> dict:
    extra = {"acc_matrix": {v: r["acc_matrix"] for v, r in results.items() if r["family"] == "continual"}}
    return build_report("bimu", p, _rows(results), derived_metrics(results), artifacts=plots,
                        histories=histories(results), extra=extra)
