"""Derived metrics over the raw rows of every solved setting (the grids: costs at each ε of the Huber
blow-up, orders against their cap; solve-time summaries) and the figures: newsvendor cost vs test
contamination, robustness–accuracy frontiers over each variant's hyper-parameter grid, the Huber blow-up
against the finite credal objective, and solve times. The per-seed gains and ratios against ERM are
declarations in spec.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.credal_dro.params import Params, tasks_of
from pipelines.credal_dro.train import PREFIX

CLEAN = {"newsvendor": "cost_clean", "regression": "mae_shifted_clean", "classification": "acc"}
WORST = {"newsvendor": "worst_env_cost", "regression": "mae_shifted_contam", "classification": "worst_group_acc"}


def gather(artifacts: dict[str, list[dict]]) -> pd.DataFrame:
    """Every variant's raw rows (one per task × seed × setting) as one frame, in the variants' order."""
    frames = [pd.DataFrame(rows) for rows in artifacts.values() if rows]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _finite(x) -> bool:
    return isinstance(x, int | float | np.floating | np.integer) and math.isfinite(float(x))


def _tag(e: float) -> str:
    return f"eps{round(100 * e):02d}"


def huber_variants(p: Params) -> list[str]:
    """The Huber variants, by support inflation κ."""
    return [v for _, v in sorted((s.kappa, v) for v, s in p.variants.items() if s.kind == "huber")]


def grid_names(p: Params, planned) -> list[str]:
    method, hub = list(p.variants)[0], [v for v in huber_variants(p) if v in planned]
    if not hub:
        return []
    out = []
    for e in p.newsvendor.grids.eps:
        out += [f"ratio.nv_cost_clean_{_tag(e)}.{v}_vs_{method}" for v in hub]
        out += [f"nv_order_{k}_{_tag(e)}.{v}" for v in [method, *hub] for k in ("over_cap", "qty")]
    return out


def grid_metrics(values, p: Params, artifacts: dict) -> dict:
    """Per seed, over the ε grid of the newsvendor: Huber-κ's clean cost over bulk-credal's (at the headline
    α), and each one's order quantity and order over its cap b/(h + b)·sup(support) (1: the cap binds)."""
    allr = gather(artifacts)
    nv, method = p.newsvendor, list(p.variants)[0]
    hub = [v for v in huber_variants(p) if v in artifacts]
    d = allr[allr.task == "newsvendor"] if len(allr) else allr
    m: dict[str, dict[int, float]] = {}
    for e in nv.grids.eps:
        tag = _tag(e)
        at = {}
        for v in [method, *hub]:
            g = d[(d.variant == v) & np.isclose(d.eps, e)]
            if v == method:
                g = g[np.isclose(g.alpha, nv.alpha)]
            at[v] = g
            if len(g):  # order / (b/(h + b) · sup of the support): 1 when the cap x_c binds
                cap = nv.b / (nv.h + nv.b) * g.support_hi
                m[f"nv_order_over_cap_{tag}.{v}"] = dict(zip(g.seed.astype(int), g.order_qty / cap, strict=True))
                m[f"nv_order_qty_{tag}.{v}"] = dict(zip(g.seed.astype(int), g.order_qty, strict=True))
        c = at[method].groupby("seed").cost_clean.mean()
        for v in hub:
            h_ = at[v].groupby("seed").cost_clean.mean()
            ratio = {
                int(s): float(h_[s] / c[s])
                for s in sorted(set(c.index) & set(h_.index))
                if _finite(c[s]) and _finite(h_[s])
            }
            if ratio:
                m[f"ratio.nv_cost_clean_{tag}.{v}_vs_{method}"] = ratio
    return m


def solve_names(p: Params, planned) -> list[str]:
    out = ["n_solves", "n_inaccurate_solves"]
    if any(p.variants[v].kind == "credal" for v in planned):
        out += [
            f"credal.{k}"
            for k in (
                "max_wall_s",
                "median_wall_s",
                "max_solver_s",
                "max_cpu_s",
                "all_finite",
                "n_solves",
                "n_inaccurate",
            )
        ]
    out += [
        f"{pre}.mean_wall_s.{v}" for task, pre in PREFIX.items() for v in planned if task in tasks_of(p.variants[v])
    ]
    return out


def solve_summary(values, p: Params, artifacts: dict) -> dict[str, float]:
    """Over every solve (all seeds, tasks, settings): the credal solves' wall / solver / CPU times, finiteness
    and inaccurate count, every variant's mean wall time per task."""
    allr = gather(artifacts)
    m: dict[str, float] = {}
    cr = allr[allr.kind == "credal"] if len(allr) else allr
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
    for task, pre in PREFIX.items():
        for v in artifacts:
            t = allr[(allr.task == task) & (allr.variant == v)]
            if len(t):
                m[f"{pre}.mean_wall_s.{v}"] = float(t.wall_s.mean())
    return m


def report_extra(p: Params, values, artifacts: dict) -> dict:
    return {"n_settings_solved": int(sum(len(rows) for rows in artifacts.values()))}


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
        ax.set(
            xlabel="test contamination share ε_t",
            ylabel="expected cost (seed mean)",
            title=f"newsvendor: {kind.replace('_', '-')} contamination",
        )
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
    labels = {
        "newsvendor": ("clean expected cost", "worst-environment expected cost"),
        "regression": ("shifted-test MAE (clean targets)", "shifted-test MAE (10% contaminated)"),
        "classification": ("average test accuracy", "worst group×class accuracy"),
    }[task]
    fig, axes = plt.subplots(1, len(ys), figsize=(6.5 * len(ys), 5), squeeze=False)
    for ax, ycol in zip(axes[0], ys, strict=True):
        agg = (
            d.groupby(["variant", "config"], sort=False)
            .agg(x=(CLEAN[task], "mean"), y=(ycol, "mean"), main=("main", "max"))
            .reset_index()
        )
        for v, g in agg.groupby("variant", sort=False):
            ax.scatter(
                g.x,
                g.y,
                s=np.where(g.main, 80, 20),
                color=col[v],
                label=v,
                alpha=0.85,
                edgecolor=np.where(g.main, "k", "none"),
            )
        ylabel = labels[1] if ycol == WORST[task] else f"expected cost, {ycol[5:].replace('_', ' ')}%"
        ax.set(xlabel=labels[0], ylabel=ylabel)
        if task == "newsvendor":
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{task}: robustness–accuracy frontier (every solved setting, seed means; large = headline)", fontsize=10
    )
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
    series.append(
        (f"{method} (α={p.newsvendor.alpha:g})", d[(d.variant == method) & np.isclose(d.alpha, p.newsvendor.alpha)])
    )
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
    fig.suptitle(
        "Huber contamination needs a support bound κ·max(train) and grows with it; the bulk-credal "
        "objective is finite without one",
        fontsize=9,
    )
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


def make_plots(p: Params, values, artifacts: dict[str, list[dict]]) -> dict:
    allr = gather(artifacts)
    figs = {
        "nv_cost_vs_eps_t": cost_vs_eps_t(allr, p),
        "huber_vacuity": huber_vacuity(allr, p),
        "solve_times": solve_times(allr, p),
    }
    for task in PREFIX:
        figs[f"frontier_{task}"] = frontier(allr, p, task)
    return figs
