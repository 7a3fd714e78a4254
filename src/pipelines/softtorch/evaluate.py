"""Report and plots of `softtorch`: gathers every variant's long table and the speed benchmark."""
import numpy as np
import pandas as pd

from pipelines.core.plots import bar_plot, line_plot
from pipelines.core.report import build_report
from pipelines.softtorch.params import Params
from pipelines.softtorch.speed import speed_metrics

TOYS = ("toy_median", "toy_topk", "toy_threshold", "toy_rule")


def _rows(results: dict[str, pd.DataFrame]) -> list[dict]:
    rows = []
    for variant, df in results.items():
        for seed, d in df[df.step < 0].groupby("seed"):
            rows.append({"variant": variant, "seed": int(seed), **dict(zip(d.metric, d.value))})
    return rows


def _derived(rows: list[dict], p: Params) -> dict:
    means = pd.DataFrame(rows).groupby("variant").mean(numeric_only=True)
    out = {}
    soft = [v for v in means.index if v != "hard"]
    for v in means.index:  # the worst of the four toys' success rates (over seeds), per variant
        out[f"toy_min_success.{v}"] = float(means.loc[v, list(TOYS)].min())
    if soft:
        out["approx_err_monotone.all_soft"] = float(means.loc[soft, "approx_err_monotone"].min())
    if "sort_exact_match" in means:
        em = means["sort_exact_match"].dropna()
        em = em[[v for v in em.index if v != "hard"]]
        if len(em):
            out["sort.best_exact_match"] = float(em.max())
            out["sort.exact_match_spread"] = float(em.max() - em.min())
    return out


def make_plots(p: Params, speed: pd.DataFrame, **results: pd.DataFrame) -> dict:
    rows = pd.DataFrame(_rows(results)).groupby("variant").mean(numeric_only=True)
    figs = {}
    soft = [v for v in rows.index if v != "hard"]
    ss = p.accuracy.softness
    floor = 1e-6  # exact-up-to-rounding errors (fast_soft_sort) are drawn at this floor
    fig = line_plot(ss, {v: [max(rows.loc[v, f"approx_err.s{s:g}"], floor) for s in ss] for v in soft},
                    "softness", "mean |soft sort − hard sort| (squashed scale)", logy=True)
    fig.axes[0].set_xscale("log")
    figs["approx_err_vs_softness"] = fig
    med = speed.groupby(["method", "n"])["seconds"].median().unstack(0) * 1e3
    fig = line_plot(list(med.index), {m: list(med[m].values) for m in med.columns}, "n",
                    "fwd+bwd ms (median)", logy=True)
    fig.axes[0].set_xscale("log")
    figs["runtime_vs_n"] = fig
    figs["toy_success"] = bar_plot(list(rows.index), list(rows[list(TOYS)].mean(axis=1).values),
                                   ylabel="mean toy success rate")
    if "sort_exact_match" in rows:
        em = rows["sort_exact_match"].dropna()
        figs["digit_sort_exact_match"] = bar_plot(list(em.index), list(em.values), ylabel="exact match (n seq)")
    return figs


def report(p: Params, plots: dict, speed: pd.DataFrame, **results: pd.DataFrame) -> dict:
    rows = _rows(results)
    metrics = {**_derived(rows, p), **speed_metrics(speed, p)}
    histories = {}
    for v, df in results.items():
        h = df[(df.metric == "history.sort_loss") & (df.seed == min(df.seed))]
        if len(h):
            histories[v] = {"sort_loss": list(zip(h.step.astype(int), h.value.astype(float)))}
    return build_report("softtorch", p, rows, metrics, artifacts=plots, histories=histories or None)
