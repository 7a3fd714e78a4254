"""Metrics table, report and plots of `trsp`: every variant's per-instance rows gathered; per-seed
summaries (city / user grid, gadget family, adversarial search); the derived comparisons (price of
fairness, k-median's social-cost gain, JR-bound violations); the maps, the JR–core trade-off over λ and
the distribution of JR factors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.trsp.params import Params, hybrid_lambda
from pipelines.trsp.train import JR_BOUND

INSTANCE_FAMILIES = ("city", "gadget", "user", "adversarial_step")  # rows that are one solved instance
SUMMARY = ("social_cost_mean", "social_cost_p90", "minority_cost_mean", "frac_using_shuttle", "runtime_s")


def _grid_metrics(d: pd.DataFrame, prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for col in SUMMARY:
        if col in d and d[col].notna().any():
            out[f"{prefix}_{col}"] = float(d[col].mean())
    out[f"{prefix}_jr_beta_hat_mean"] = float(d.jr_beta_hat.mean())
    out[f"{prefix}_jr_beta_hat_max"] = float(d.jr_beta_hat.max())
    for col in sorted(c for c in d.columns if c.startswith("core_t")):
        if d[col].notna().any():
            out[f"{prefix}_{col}_max"] = float(d[col].max())
    for k, dk in d.groupby("k"):
        out[f"{prefix}_k{int(k)}_social_cost_mean"] = float(dk.social_cost_mean.mean())
        if "minority_cost_mean" in dk and dk.minority_cost_mean.notna().any():
            out[f"{prefix}_k{int(k)}_minority_cost_mean"] = float(dk.minority_cost_mean.mean())
    return out


def seed_rows(metrics: pd.DataFrame) -> list[dict]:
    """One row per (variant, seed) with the metrics the report averages over seeds."""
    rows = []
    for (variant, seed), d in metrics.groupby(["variant", "seed"], sort=False):
        row: dict = {"variant": variant, "seed": int(seed)}
        for fam in ("city", "user"):
            df = d[d.family == fam]
            if len(df):
                row.update(_grid_metrics(df, fam))
        for w, dg in d[d.family == "gadget"].groupby("param"):
            tag = f"gadget_w{w:g}"
            row[f"{tag}_jr_beta_hat"] = float(dg.jr_beta_hat.mean())
            row[f"{tag}_social_cost_mean"] = float(dg.social_cost_mean.mean())
            for col in (c for c in dg.columns if c.startswith("core_t")):
                if dg[col].notna().any():
                    row[f"{tag}_{col}"] = float(dg[col].mean())
        adv = d[d.family == "adversarial"]
        if len(adv):
            row["adversarial_jr_max"] = float(adv.jr_beta_hat.max())
            row["adversarial_core_t2_a2_max"] = float(adv.core_t2_a2.max())
            for obj, da in adv.groupby("objective"):
                row[f"adversarial_{obj}_search_proxy_max"] = float(da.proxy.max())
        inst = d[d.family.isin(INSTANCE_FAMILIES)]
        row["jr_beta_hat_max"] = float(inst.jr_beta_hat.max())
        row["jr_bound_violations"] = float((inst.jr_beta_hat > JR_BOUND + 1e-9).sum())
        row["instances_checked"] = float(len(inst))
        # (2, 1 + √2)-core of the clustering route (free shuttle): |T| = 2 exact, |T| = 3 a lower bound
        free = inst[inst.gamma == 0]
        core_cols = [c for c in ("core_t2_a2", "core_t3_a2") if c in free]
        if core_cols:
            worst = free[core_cols].max(axis=1, skipna=True)
            row["core_a2_bound_violations_free_shuttle"] = float((worst > JR_BOUND + 1e-9).sum())
        rows.append(row)
    return rows


def frame(artifacts: dict[str, list[dict]]) -> pd.DataFrame:
    """Every variant's raw rows (the train artifacts) in one table, in variant order."""
    return pd.DataFrame([r for rows in artifacts.values() for r in rows])


def jr_bound(values, p: Params) -> dict[str, float]:
    return {"jr_bound": JR_BOUND}


def best_other(values, p: Params) -> dict[str, float]:
    """The lowest mean city social cost among the variants other than k-median (point value)."""
    others = [v for v in values.variants if v != "kmedian" and values.has(v, "city_social_cost_mean")]
    if not others:
        return {}
    return {"city_best_other_variant_social_cost": min(values.mean(v, "city_social_cost_mean") for v in others)}


def violation_totals(values, p: Params) -> dict[str, float]:
    """Solved instances over the 1 + √2 JR bound, summed over seeds, per variant (point values)."""
    return {
        f"jr_bound_violations_total.{v}": float(sum(values.per_seed(v, "jr_bound_violations").values()))
        for v in values.variants
        if values.has(v, "jr_bound_violations")
    }


def adversarial_histories(metrics: pd.DataFrame, p: Params) -> dict[str, tuple[list[int], list[float]]]:
    """The adversarial search (plot seed) of one variant's rows, accepted steps of all restarts end to end:
    the proxy it climbs and the exact JR factor of each accepted instance, as ``{metric: (steps, values)}``."""
    if "objective" not in metrics:
        return {}
    d = metrics[(metrics.family == "adversarial_step") & (metrics.seed == p.plot_seed) & (metrics.objective == "jr")]
    if d.empty:
        return {}
    restart = d.instance.str.rsplit("_r", n=1).str[1].astype(int)
    x = (restart * (p.adversarial.steps + 1) + d["draw"]).astype(int).tolist()
    return {
        "adversarial_jr_proxy": (x, d.proxy.astype(float).tolist()),
        "adversarial_jr_beta_hat": (x, d.jr_beta_hat.astype(float).tolist()),
    }


def report_extra(p: Params, values, artifacts) -> dict:
    return {
        "definitions": {
            "metric": p.metric,
            "deviation": p.deviation,
            "jr_group_factor": p.jr_group_factor,
            "core_t3": f"lower bound (shortlist of {p.core.shortlist} candidates)",
        }
    }


# --------------------------------------------------------------------------------------------- plots
def lam_of(variant: str) -> float | None:
    return {"gc_trsp": 0.0, "eca": 1.0}.get(variant, hybrid_lambda(variant))


def map_figure(instances: pd.DataFrame, metrics: pd.DataFrame, p: Params):
    """Agents and chosen stops per variant on one city instance (plot seed, plot k, first γ)."""
    import matplotlib.pyplot as plt

    city = instances[instances.family == "city"]
    if city.empty:
        city = instances[instances.family == "user"]
    if city.empty:
        return None
    ks = sorted(city.k.unique())
    k = p.plot_k if p.plot_k in ks else ks[-1]
    sel = city[(city.seed == (p.plot_seed if p.plot_seed in set(city.seed) else city.seed.iloc[0])) & (city.k == k)]
    name = sel.instance.iloc[0]
    d = instances[instances.instance == name]
    agents, cand = d[d.role == "agent"], d[d.role == "candidate"]
    variants = [v for v in dict.fromkeys(metrics.variant)]
    cols = min(3, len(variants))
    rows_ = math.ceil(len(variants) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 4 * rows_), squeeze=False)
    groups = sorted(agents.group.unique())
    for ax, v in zip(axes.ravel(), variants):
        r = metrics[(metrics.variant == v) & (metrics.instance == name)].iloc[0]
        stops = [int(x) for x in str(r.stops).split()]
        for gi, gname in enumerate(groups):
            a = agents[agents.group == gname]
            ax.scatter(a.sx, a.sy, s=4, color=f"C{gi}", alpha=0.5, label=f"{gname} origin")
            ax.scatter(a.tx, a.ty, s=4, marker="x", color=f"C{gi}", alpha=0.3)
        ax.scatter(cand.sx, cand.sy, s=8, color="0.7", marker="s")
        ax.scatter(
            cand.sx.to_numpy()[stops],
            cand.sy.to_numpy()[stops],
            s=120,
            color="red",
            marker="*",
            edgecolor="k",
            zorder=5,
        )
        ax.set_title(f"{v}: cost {r.social_cost_mean:.2f} km, JR {r.jr_beta_hat:.2f}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes.ravel()[len(variants) :]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=5, loc="lower left", markerscale=2)
    fig.suptitle(f"{name}: origins (dots), destinations (x), candidates (grey), chosen stops (red stars)", fontsize=9)
    fig.tight_layout()
    return fig


def tradeoff_figure(rows: list[dict]):
    """JR–core trade-off over λ (GC-TrSP = 0, hybrids, ECA = 1) and the baselines as reference points."""
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows).groupby("variant").mean(numeric_only=True)
    lam = {v: lam_of(v) for v in frame.index if lam_of(v) is not None}
    order = sorted(lam, key=lam.get)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    series = [(c, c.replace("_", " ")) for c in frame.columns if c.endswith("_jr_beta_hat") and c.startswith("gadget_")]
    series += [
        (c, c.replace("_", " "))
        for c in (
            "city_jr_beta_hat_max",
            "city_core_t2_a2_max",
            "city_core_t3_a1_max",
            "city_core_t3_a2_max",
            "adversarial_jr_max",
            "adversarial_core_t2_a2_max",
        )
        if c in frame
    ]
    for c, label in series:
        axes[0].plot([lam[v] for v in order], frame.loc[order, c], "o-", label=label)
    axes[0].axhline(JR_BOUND, color="k", ls="--", lw=0.8, label="1 + √2")
    axes[0].set(xlabel="λ (0: GC-TrSP, 1: ECA)", ylabel="violation factor β̂", title="fairness factors vs λ")
    axes[0].legend(fontsize=6)
    if "city_social_cost_mean" in frame:
        axes[1].plot([lam[v] for v in order], frame.loc[order, "city_social_cost_mean"], "o-", label="λ-family")
        for i, v in enumerate(v for v in frame.index if v not in lam):
            axes[1].axhline(frame.loc[v, "city_social_cost_mean"], color=f"C{i + 1}", ls=":", label=v)
        axes[1].set(xlabel="λ", ylabel="mean cost per agent (km)", title="city: social cost vs λ")
        axes[1].legend(fontsize=6)
    # fairness (worst JR factor the search found) against efficiency (city social cost), every variant
    xcol = next((c for c in ("adversarial_jr_max", "jr_beta_hat_max") if c in frame), None)
    ycol = next((c for c in ("city_social_cost_mean", "user_social_cost_mean") if c in frame), None)
    if xcol and ycol:
        for i, v in enumerate(frame.index):
            if pd.notna(frame.loc[v, xcol]) and pd.notna(frame.loc[v, ycol]):
                axes[2].scatter(frame.loc[v, xcol], frame.loc[v, ycol], color=f"C{i}", s=30)
                axes[2].annotate(v, (frame.loc[v, xcol], frame.loc[v, ycol]), fontsize=7)
        axes[2].set(
            xlabel=xcol.replace("_", " ") + " (β̂)",
            ylabel=ycol.replace("_", " ") + " (km)",
            title="JR (adversarial) vs social cost, means over seeds",
        )
    fig.tight_layout()
    return fig


def jr_distribution_figure(metrics: pd.DataFrame):
    """Exact JR factors of every solved instance (city, gadget, adversarial steps) per variant."""
    import matplotlib.pyplot as plt

    d = metrics[metrics.family.isin(INSTANCE_FAMILIES)]
    variants = list(dict.fromkeys(d.variant))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(variants)), 4.2))
    rng = np.random.default_rng(0)
    for i, v in enumerate(variants):
        for j, (fam, marker) in enumerate((("city", "o"), ("user", "o"), ("gadget", "s"), ("adversarial_step", "."))):
            y = d[(d.variant == v) & (d.family == fam)].jr_beta_hat.to_numpy()
            if len(y):
                ax.scatter(
                    i + 0.18 * (j - 1.5) + rng.uniform(-0.05, 0.05, len(y)),
                    y,
                    s=8,
                    marker=marker,
                    color=f"C{j}",
                    alpha=0.5,
                    label=fam if i == 0 else None,
                )
    ax.axhline(JR_BOUND, color="k", ls="--", lw=0.8, label="1 + √2")
    ax.set_yscale("log")
    ax.set_xticks(range(len(variants)), variants, rotation=30, fontsize=8)
    ax.set(ylabel="exact JR factor β̂ (log)", title="JR factor of every solved instance")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def make_plots(p: Params, values, artifacts: dict, instances: pd.DataFrame) -> dict:
    metrics = frame(artifacts)
    figs = {"jr_core_tradeoff": tradeoff_figure(seed_rows(metrics)), "jr_distribution": jr_distribution_figure(metrics)}
    m = map_figure(instances, metrics, p)
    if m is not None:
        figs["stop_maps"] = m
    return figs
