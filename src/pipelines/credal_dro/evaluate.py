"""The report (variants table of every variant's headline setting, derived gains and ratios, claims) and
the figures: newsvendor cost vs test contamination, robustness–accuracy frontiers over each variant's
hyper-parameter grid, the Huber blow-up against the finite credal objective, and solve times."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.metrics import relative_gain
from pipelines.core.report import build_report
from pipelines.credal_dro.params import Params

PREFIX = {"newsvendor": "nv", "regression": "reg", "classification": "cls"}
COMMON = ("objective", "wall_s", "solve_s", "cpu_s", "finite_flag", "finite_full_support", "inaccurate", "bulk_coverage_test")
TASK_METRICS = {
    "newsvendor": ("order_qty", "worst_env_cost"),   # + every cost_<env>
    "regression": ("mae_shifted_clean", "mae_shifted_contam", "worst_env_mae", "w_norm"),
    "classification": ("acc", "worst_group_acc", "acc_majority", "acc_minority", "w_norm",
                       "bulk_coverage_majority", "bulk_coverage_minority"),
}
CLEAN = {"newsvendor": "cost_clean", "regression": "mae_shifted_clean", "classification": "acc"}
WORST = {"newsvendor": "worst_env_cost", "regression": "mae_shifted_contam", "classification": "worst_group_acc"}


def gather(metrics: dict[str, pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in metrics.values() if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _finite(x) -> bool:
    return isinstance(x, int | float | np.floating | np.integer) and math.isfinite(float(x))


def variant_rows(allr: pd.DataFrame) -> list[dict]:
    """One row per variant × seed: the headline setting's metrics, prefixed by experiment, plus the
    clean-cost gap to ERM of the same seed (newsvendor)."""
    main = allr[allr["main"]]
    erm = main[(main.variant == "erm") & (main.task == "newsvendor")].set_index("seed")["cost_clean"]
    rows: dict[tuple[str, int], dict] = {}
    for r in main.to_dict("records"):
        task, pre = r["task"], PREFIX[r["task"]]
        keys = list(COMMON) + list(TASK_METRICS[task])
        if task == "newsvendor":
            keys += [k for k in r if k.startswith("cost_") and k != "cost_calib"]
        row = rows.setdefault((r["variant"], r["seed"]), {"variant": r["variant"], "seed": r["seed"]})
        for k in keys:
            if _finite(r.get(k)):
                row[f"{pre}_{k}"] = float(r[k])
        if task == "newsvendor" and r["seed"] in erm.index:
            row["nv_clean_gap_vs_erm"] = (r["cost_clean"] - erm[r["seed"]]) / erm[r["seed"]]
    return list(rows.values())


def _mean(allr: pd.DataFrame, task: str, variant: str, col: str, **where) -> float:
    d = allr[(allr.task == task) & (allr.variant == variant)]
    for k, v in where.items():
        d = d[np.isclose(d[k], v)] if isinstance(v, float) else d[d[k] == v]
    return float(d[col].mean()) if len(d) and col in d else float("nan")


def derived(allr: pd.DataFrame, p: Params) -> dict[str, float]:
    variants = list(p.variants)
    method = variants[0]
    m: dict[str, float] = {}
    main = allr[allr["main"]]
    nv_envs = sorted(c[5:] for c in allr.columns if c.startswith("cost_") and c != "cost_calib")
    # (a) gains over ERM (positive: better), method on every environment, every variant on clean / worst
    for v in variants:
        if v == "erm":
            continue
        envs = nv_envs if v == method else ["clean"]
        for e in envs + ["worst_env"]:
            col = "worst_env_cost" if e == "worst_env" else f"cost_{e}"
            a = _mean(main, "newsvendor", v, col)
            b = _mean(main, "newsvendor", "erm", col)
            if _finite(a) and _finite(b):
                m[f"relative_gain.nv_{col}.{v}_vs_erm"] = relative_gain(method=a, baseline=b)
        a, b = _mean(main, "newsvendor", v, "cost_clean"), _mean(main, "newsvendor", "erm", "cost_clean")
        if _finite(a) and _finite(b):
            m[f"clean_gap.nv_cost_clean.{v}_vs_erm"] = (a - b) / b
    # (a) vacuity: the Huber objective against its support, and the ε beyond h/(h + b)
    hub = sorted((s.kappa, v) for v, s in p.variants.items() if s.kind == "huber")
    for (k0, v0), (k1, v1) in zip(hub, hub[1:], strict=False):
        m[f"ratio.nv_objective.{v1}_vs_{v0}"] = (_mean(main, "newsvendor", v1, "objective")
                                                 / _mean(main, "newsvendor", v0, "objective"))
    if hub:
        for e in p.newsvendor.grids.eps:
            tag = f"eps{round(100 * e):02d}"
            c = _mean(allr, "newsvendor", method, "cost_clean", eps=e, alpha=p.newsvendor.alpha)
            for _, v in hub:
                h_ = _mean(allr, "newsvendor", v, "cost_clean", eps=e)
                if _finite(c) and _finite(h_):
                    m[f"ratio.nv_cost_clean_{tag}.{v}_vs_{method}"] = h_ / c
            for v in [method] + [v for _, v in hub]:
                d = allr[(allr.task == "newsvendor") & (allr.variant == v) & np.isclose(allr.eps, e)]
                if v == method:
                    d = d[np.isclose(d.alpha, p.newsvendor.alpha)]
                if len(d):   # order / (b/(h + b) · sup of the support): 1 when the cap x_c binds
                    cap = p.newsvendor.b / (p.newsvendor.h + p.newsvendor.b) * d.support_hi
                    m[f"nv_order_over_cap_{tag}.{v}"] = float((d.order_qty / cap).mean())
                    m[f"nv_order_qty_{tag}.{v}"] = float(d.order_qty.mean())
    # every credal solve (all credal-kind variants, all tasks, grids included)
    cr = allr[allr.kind == "credal"]
    if len(cr):
        m["credal.max_wall_s"] = float(cr.wall_s.max())
        m["credal.median_wall_s"] = float(cr.wall_s.median())
        m["credal.max_solver_s"] = float(cr.solve_s.max())
        m["credal.max_cpu_s"] = float(cr.cpu_s.max())
        m["credal.all_finite"] = float(cr.finite_flag.min())
        m["credal.n_solves"] = float(len(cr))
        m["credal.n_inaccurate"] = float(cr.inaccurate.sum())
    m["n_solves"] = float(len(allr))
    m["n_inaccurate_solves"] = float(allr.inaccurate.sum()) if len(allr) else 0.0
    # (b) and (c): competitiveness against ERM
    for v in variants:
        if v == "erm":
            continue
        for col in ("mae_shifted_contam", "mae_shifted_clean"):
            a, b = _mean(main, "regression", v, col), _mean(main, "regression", "erm", col)
            if _finite(a) and _finite(b):
                m[f"ratio.reg_{col}.{v}_vs_erm"] = a / b
        for col in ("worst_group_acc", "acc"):
            a, b = _mean(main, "classification", v, col), _mean(main, "classification", "erm", col)
            if _finite(a) and _finite(b):
                m[f"diff.cls_{col}.{v}_minus_erm"] = a - b
    for task, pre in PREFIX.items():
        for v in variants:
            t = allr[(allr.task == task) & (allr.variant == v)]
            if len(t):
                m[f"{pre}.mean_wall_s.{v}"] = float(t.wall_s.mean())
    return m


def report(p: Params, plots: dict, **metrics: pd.DataFrame) -> dict:
    allr = gather(metrics)
    return build_report("credal_dro", p, variant_rows(allr), derived(allr, p), artifacts=list(plots),
                        extra={"n_settings_solved": int(len(allr))})


# ------------------------------------------------------------------------------------------------ plots
def _colors(variants: list[str]) -> dict[str, tuple]:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {v: cmap((2 * i) % 20 + (i // 10) % 2) for i, v in enumerate(variants)}


def cost_vs_eps_t(allr: pd.DataFrame, p: Params):
    """Seed-mean newsvendor cost of each variant's headline decision vs the test contamination share."""
    import matplotlib.pyplot as plt

    main = allr[allr["main"] & (allr.task == "newsvendor")]
    col = _colors(list(p.variants))
    kinds = ("bulk_edge", "tail", "spike")
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    xs = [0.0, *p.newsvendor.eps_t]
    for ax, kind in zip(axes, kinds, strict=True):
        for v, d in main.groupby("variant", sort=False):
            ys = [d["cost_clean"].mean()] + [d[f"cost_{kind}_{round(100 * e):02d}"].mean() for e in p.newsvendor.eps_t]
            ax.plot(xs, ys, "o-", color=col[v], label=v, lw=2 if v == list(p.variants)[0] else 1)
        ax.set(xlabel="test contamination share ε_t", ylabel="expected cost (seed mean)",
               title=f"newsvendor: {kind.replace('_', '-')} contamination")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def frontier(allr: pd.DataFrame, p: Params, task: str):
    """Clean metric vs worst-environment metric of every solved setting (seed means); large markers are
    the headline settings. Newsvendor: a second panel against the strongest bulk-edge contamination (the
    worst environment is the spike at 3·q0.999, which no decision hedges)."""
    import matplotlib.pyplot as plt

    d = allr[allr.task == task]
    col = _colors(list(p.variants))
    ys = [WORST[task]]
    if task == "newsvendor":
        ys.append(f"cost_bulk_edge_{round(100 * max(p.newsvendor.eps_t)):02d}")
    labels = {"newsvendor": ("clean expected cost", "worst-environment expected cost"),
              "regression": ("shifted-test MAE (clean targets)", "shifted-test MAE (10% contaminated)"),
              "classification": ("average test accuracy", "worst group×class accuracy")}[task]
    fig, axes = plt.subplots(1, len(ys), figsize=(6.5 * len(ys), 5), squeeze=False)
    for ax, ycol in zip(axes[0], ys, strict=True):
        agg = d.groupby(["variant", "config"], sort=False).agg(x=(CLEAN[task], "mean"), y=(ycol, "mean"),
                                                               main=("main", "max")).reset_index()
        for v, g in agg.groupby("variant", sort=False):
            ax.scatter(g.x, g.y, s=np.where(g.main, 80, 20), color=col[v], label=v, alpha=0.85,
                       edgecolor=np.where(g.main, "k", "none"))
        ylabel = labels[1] if ycol == WORST[task] else f"expected cost, {ycol[5:].replace('_', ' ')}%"
        ax.set(xlabel=labels[0], ylabel=ylabel)
        if task == "newsvendor":
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"{task}: robustness–accuracy frontier (every solved setting, seed means; large = headline)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def huber_vacuity(allr: pd.DataFrame, p: Params):
    """Newsvendor objective and order vs ε: Huber's grow with its support κ; the credal ones stay finite
    and independent of κ."""
    import matplotlib.pyplot as plt

    method = list(p.variants)[0]
    d = allr[(allr.task == "newsvendor")]
    col = _colors(list(p.variants))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = [(v, d[d.variant == v]) for v, s in p.variants.items() if s.kind == "huber"]
    series.append((f"{method} (α={p.newsvendor.alpha:g})",
                   d[(d.variant == method) & np.isclose(d.alpha, p.newsvendor.alpha)]))
    for name, g in series:
        a = g.groupby("eps")[["objective", "order_qty"]].mean()
        c = col.get(name, col[method])
        axes[0].plot(a.index, a.objective, "o-", color=c, label=name)
        axes[1].plot(a.index, a.order_qty, "o-", color=c, label=name)
    crit = p.newsvendor.h / (p.newsvendor.h + p.newsvendor.b)
    for ax, yl in zip(axes, ("robust objective value", "order quantity"), strict=True):
        ax.axvline(crit, color="grey", ls="--", lw=0.8)
        ax.set(xlabel="contamination share ε (dashed: h/(h+b))", ylabel=yl)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("Huber contamination needs a support bound κ·max(train) and grows with it; the bulk-credal "
                 "objective is finite without one", fontsize=9)
    fig.tight_layout()
    return fig


def solve_times(allr: pd.DataFrame, p: Params):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    for ax, task in zip(axes, PREFIX, strict=True):
        d = allr[allr.task == task]
        vs = [v for v in p.variants if v in set(d.variant)]
        ax.boxplot([d[d.variant == v].wall_s.to_numpy() for v in vs], showfliers=True)
        ax.set_xticks(range(1, len(vs) + 1), vs, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"{task}: wall s per solve (compile + solve)")
        ax.axhline(1.0, color="r", lw=0.8, ls="--")
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def make_plots(p: Params, **metrics: pd.DataFrame) -> dict:
    allr = gather(metrics)
    figs = {"nv_cost_vs_eps_t": cost_vs_eps_t(allr, p), "huber_vacuity": huber_vacuity(allr, p),
            "solve_times": solve_times(allr, p)}
    for task in PREFIX:
        figs[f"frontier_{task}"] = frontier(allr, p, task)
    return figs
