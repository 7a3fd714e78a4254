"""Report and plots of `softtorch`: the derived metrics over every variant's long table and the speed
benchmark (declarations for core.spec)."""

import numpy as np
import pandas as pd

from pipelines.core.api import Estimate, Fn, bar_plot, line_plot, ratio_ci
from pipelines.softtorch import softops as so
from pipelines.softtorch.params import Params

TOYS = ("toy_median", "toy_topk", "toy_threshold", "toy_rule")
RATIOS = (("ot", "ratio_n_ot"), ("neuralsort", "ratio_n_quadratic"), ("softsort", "ratio_n_quadratic"))


def _soft(planned) -> list[str]:
    return [v for v in planned if v != "hard"]


def toy_min_success(values, p: Params) -> dict:
    """The worst of the four toys' success rates (the share of seeds that solved it), per variant: a count
    over seeds, so a point value."""
    return {f"toy_min_success.{v}": min(values.mean(v, k) for k in TOYS) for v in values.variants}


def _sort_names(p: Params, planned) -> list[str]:
    return ["sort.best_exact_match", "sort.exact_match_spread"] if p.digits.enabled and _soft(planned) else []


def soft_summaries(values, p: Params) -> dict:
    """Over the soft variants (seed means): the approx_err monotonicity of the worst one, and the digit
    sorters' best exact match and spread (on the digit seeds)."""
    soft = _soft(values.variants)
    out = {}
    if soft:
        out["approx_err_monotone.all_soft"] = min(values.mean(v, "approx_err_monotone") for v in soft)
    em = {v: values.mean(v, "sort_exact_match") for v in soft if values.has(v, "sort_exact_match")}
    if em:
        out["sort.best_exact_match"] = max(em.values())
        out["sort.exact_match_spread"] = max(em.values()) - min(em.values())
    return out


def _speed_grid(p: Params) -> list[tuple[int, str]]:
    cap = {"ot": p.speed.max_n_ot, "sorting_network": p.speed.max_n_network}
    return [
        (n, m)
        for n in sorted(set(p.speed.ns) | {p.speed.ratio_n_ot, p.speed.ratio_n_quadratic})
        for m in so.SORT_METHODS
        if n <= cap.get(m, n)
    ]


def _speed_names(p: Params, planned) -> list[str]:
    return [f"fwdbwd_ms.{m}.n{n}" for n, m in _speed_grid(p)] + [
        f"speedup.fast_soft_sort_vs_{slow}" for slow, _ in RATIOS
    ]


def speed_metrics(values, p: Params, speed: pd.DataFrame) -> dict:
    """Median fwd+bwd ms per (method, n), and the speed-ups of fast_soft_sort from paired per-round ratios
    of the interleaved timing (median with its order-statistic interval, core.metrics.ratio_ci)."""
    out = {}
    for (n, m), d in speed.groupby(["n", "method"]):
        out[f"fwdbwd_ms.{m}.n{n}"] = float(np.median(d["seconds"]) * 1e3)
    for slow, key in RATIOS:
        n = getattr(p.speed, key)
        a = speed[(speed.n == n) & (speed.method == slow)].sort_values("round")["seconds"].to_numpy()
        b = speed[(speed.n == n) & (speed.method == "fast_soft_sort")].sort_values("round")["seconds"].to_numpy()
        if len(a) == 0 or len(b) == 0:
            raise ValueError(f"softtorch.data.speed: no timings of {slow} / fast_soft_sort at n = {n}")
        r = ratio_ci(a, b)
        out[f"speedup.fast_soft_sort_vs_{slow}"] = Estimate(r.ratio, r.ci_low, r.ci_high, r.rounds)
    return out


DERIVED = [
    Fn(toy_min_success, lambda p, planned: [f"toy_min_success.{v}" for v in planned]),
    Fn(
        soft_summaries,
        lambda p, planned: (["approx_err_monotone.all_soft"] if _soft(planned) else []) + _sort_names(p, planned),
    ),
    Fn(speed_metrics, _speed_names, inputs=["speed"]),
]


def make_plots(p: Params, values, results: dict, speed: pd.DataFrame) -> dict:
    figs = {}
    variants = values.variants
    soft = _soft(variants)
    ss = p.accuracy.softness
    floor = 1e-6  # exact-up-to-rounding errors (fast_soft_sort) are drawn at this floor
    fig = line_plot(
        ss,
        {v: [max(values.mean(v, f"approx_err.s{s:g}"), floor) for s in ss] for v in soft},
        "softness",
        "mean |soft sort − hard sort| (squashed scale)",
        logy=True,
    )
    fig.axes[0].set_xscale("log")
    figs["approx_err_vs_softness"] = fig
    med = speed.groupby(["method", "n"])["seconds"].median().unstack(0) * 1e3
    fig = line_plot(
        list(med.index), {m: list(med[m].values) for m in med.columns}, "n", "fwd+bwd ms (median)", logy=True
    )
    fig.axes[0].set_xscale("log")
    figs["runtime_vs_n"] = fig
    figs["toy_success"] = bar_plot(
        list(variants),
        [float(np.mean([values.mean(v, k) for k in TOYS])) for v in variants],
        ylabel="mean toy success rate",
    )
    em = {v: values.mean(v, "sort_exact_match") for v in variants if values.has(v, "sort_exact_match")}
    if em:
        figs["digit_sort_exact_match"] = bar_plot(list(em), list(em.values()), ylabel="exact match (n seq)")
    return figs
