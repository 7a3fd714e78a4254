"""Metrics, plots and the report of `llds`: per (variant, seed) summaries of the GRPO runs (greedy test EM,
probe likelihoods of correct / incorrect trajectories, pre-clip gradient norms, entropy, collapse), paired
comparisons on the seeds two variants share, curves over training as MLflow histories."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.metrics import relative_gain
from pipelines.core.report import build_report
from pipelines.llds.params import Params
from pipelines.llds.train import collapse_iteration

WINDOW = 10   # iterations averaged for the first / last values of noisy per-iteration diagnostics
CURVES = ("train_reward", "onpolicy_logp_correct", "entropy", "grad_norm_max", "lld_active_frac",
          "llds_active_frac", "searches_per_answer", "test_em", "logp_correct_mean", "logp_incorrect_mean")


def _nanmean(x) -> float:
    x = np.asarray(x, float)
    return float(np.nanmean(x)) if np.isfinite(x).any() else math.nan


def summarise(run: pd.DataFrame, p: Params) -> dict:
    """One (variant, seed) run → its metrics."""
    ev = run.dropna(subset=["test_em"]).sort_values("iteration")
    it = run.dropna(subset=["train_reward"]).sort_values("iteration")
    first, last = ev.iloc[0], ev.iloc[-1]
    em_cols = [c for c in run.columns if c.startswith("test_em_") and c != "test_em_"]
    row = {"test_em": float(last["test_em"]), "test_em_init": float(first["test_em"]),
           "test_em_max": float(ev["test_em"].max()), "test_em_min": float(ev["test_em"].min())}
    for c in em_cols:
        row[c] = float(last[c])
    two = [c for c in em_cols if "2hop" in c]
    if two:
        row["test_em_2hop"] = _nanmean([last[c] for c in two])
    for k in ("correct", "incorrect"):
        s = ev[f"logp_{k}_mean"]
        row[f"logp_{k}_init"], row[f"logp_{k}_final"] = float(s.iloc[0]), float(s.iloc[-1])
        row[f"logp_{k}_drop"] = float(s.iloc[0] - s.iloc[-1])           # > 0: the likelihood fell
        row[f"logp_{k}_max_drop"] = float(s.iloc[0] - s.min())
    row["train_reward_first"] = _nanmean(it["train_reward"].head(WINDOW))
    row["train_reward_last"] = _nanmean(it["train_reward"].tail(WINDOW))
    row["onpolicy_logp_correct_last"] = _nanmean(it["onpolicy_logp_correct"].tail(WINDOW))
    row["entropy_first"] = _nanmean(it["entropy"].head(WINDOW))
    row["entropy_final"] = _nanmean(it["entropy"].tail(WINDOW))
    row["grad_norm_max"] = float(it["grad_norm_max"].max())            # pre-clip
    row["grad_norm_mean"] = _nanmean(it["grad_norm"])
    row["searches_per_answer_last"] = _nanmean(it["searches_per_answer"].tail(WINDOW))
    row["lld_active_frac"] = _nanmean(it["lld_active_frac"])
    if "llds_active_frac" in it:
        row["llds_active_frac"] = _nanmean(it["llds_active_frac"])
    c = collapse_iteration(list(zip(ev["iteration"], ev["test_em"])), p.collapse.drop, p.collapse.min_max)
    row["collapsed"] = float(c is not None)
    return row


def _rows(runs: dict[str, pd.DataFrame], p: Params) -> tuple[list[dict], dict]:
    rows, collapse = [], {}
    for variant, df in runs.items():
        for seed, run in df.groupby("seed"):
            rows.append({"variant": variant, "seed": int(seed), **summarise(run, p)})
            ev = run.dropna(subset=["test_em"])
            c = collapse_iteration(list(zip(ev["iteration"], ev["test_em"])), p.collapse.drop, p.collapse.min_max)
            collapse[f"{variant}/{int(seed)}"] = c
    return rows, collapse


def _shared(rows: list[dict], a: str, b: str, metric: str) -> tuple[list[float], list[float]]:
    """a's and b's values of ``metric`` on the seeds both ran, in seed order."""
    va = {r["seed"]: r[metric] for r in rows if r["variant"] == a and metric in r}
    vb = {r["seed"]: r[metric] for r in rows if r["variant"] == b and metric in r}
    shared = sorted(set(va) & set(vb))
    return [va[s] for s in shared], [vb[s] for s in shared]


def _paired(rows: list[dict], a: str, b: str, metric: str) -> float:
    """Mean over the seeds both variants ran of a's metric minus b's (NaN when they share none)."""
    xa, xb = _shared(rows, a, b, metric)
    return _nanmean([x - y for x, y in zip(xa, xb)]) if xa else math.nan


def derived(rows: list[dict], base: dict, variants: list[str]) -> dict[str, float]:
    m: dict[str, float] = {"sft_sampled_reward": base["sft_sampled_reward"], "sft_test_em": base["test_em"],
                           "sft_probe_reward": base["sft_probe_reward"]}
    have = set(variants)
    pairs = [("llds", b) for b in ("grpo", "llds_rgate", "llds_ma", "nll_pos", "grpo_kl")]
    pairs += [(a, "grpo") for a in ("llds_rgate", "llds_ma", "nll_pos", "grpo_kl")]
    pairs += [("llds_hilr", "grpo_hilr"), ("grpo_hilr", "llds_hilr")]
    pairs = [(a, b) for a, b in pairs if a in have and b in have]
    for a, b in pairs:
        for metric in ("test_em", "logp_correct_final", "logp_correct_drop", "logp_incorrect_final", "entropy_final",
                       "train_reward_last", "grad_norm_max"):
            # NaN (a claim on it fails) when the two variants share no seed
            m[f"delta.{metric}.{a}_minus_{b}"] = _paired(rows, a, b, metric)
        ea, eb = map(_nanmean, _shared(rows, a, b, "test_em"))
        m[f"relative_gain.test_em.{a}_vs_{b}"] = (relative_gain(method=ea, baseline=eb, lower_is_better=False)
                                                  if eb > 0 else math.nan)
        ga, gb = map(_nanmean, _shared(rows, a, b, "grad_norm_max"))
        m[f"ratio.grad_norm_max.{b}_over_{a}"] = gb / ga if ga > 0 else math.nan
    return m


def histories(runs: dict[str, pd.DataFrame], base: dict) -> dict[str, dict]:
    out: dict[str, dict] = {"run": {"sft_loss": base["sft_loss"]}}
    for variant, df in runs.items():
        h = {}
        for seed, run in df.groupby("seed"):
            for c in CURVES:
                if c in run:
                    s = run[["iteration", c]].dropna()
                    h[f"{c}.seed{int(seed)}"] = [(int(i), float(v)) for i, v in zip(s["iteration"], s[c])]
        out[variant] = h
    return out


# ------------------------------------------------------------------------------------------ plots
def _curves(ax, runs: dict[str, pd.DataFrame], col: str, smooth: int = 1):
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (variant, df) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        for j, (seed, run) in enumerate(df.groupby("seed")):
            s = run[["iteration", col]].dropna()
            if s.empty:
                continue
            y = s[col].rolling(smooth, min_periods=1).mean() if smooth > 1 else s[col]
            ax.plot(s["iteration"], y, color=color, alpha=0.9 if j == 0 else 0.45, lw=1.4,
                    ls="-" if j == 0 else "--", label=variant if j == 0 else None)
    ax.grid(alpha=0.3)


def _legend(ax):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def make_plots(p: Params, base: dict, **runs: pd.DataFrame) -> dict:
    """Likelihood trajectories (the three-phase LLD picture), greedy test EM, pre-clip gradient norm,
    train reward, entropy; solid = first seed, dashed = the others."""
    import matplotlib.pyplot as plt

    main = {v: d for v, d in runs.items() if not v.endswith("_hilr")}
    hi = {v: d for v, d in runs.items() if v.endswith("_hilr")}
    figs = {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    _curves(axes[0], main, "logp_correct_mean")
    _curves(axes[1], main, "logp_incorrect_mean")
    axes[0].set(title="probe: correct trajectories", xlabel="GRPO iteration", ylabel="mean token log-likelihood")
    axes[1].set(title="probe: incorrect trajectories", xlabel="GRPO iteration")
    _legend(axes[0])
    fig.suptitle(f"Likelihood displacement (SFT init sampled reward {base['sft_sampled_reward']:.3f})")
    fig.tight_layout()
    figs["likelihood_trajectories"] = fig
    for name, col, ylabel, smooth in (("test_em_curves", "test_em", "greedy test EM", 1),
                                      ("grad_norm", "grad_norm_max", "pre-clip grad norm (max per iteration)", 1),
                                      ("train_reward", "train_reward", "train reward (5-iteration mean)", 5),
                                      ("onpolicy_logp_correct", "onpolicy_logp_correct",
                                       "on-policy log-prob of correct rollouts (5-it mean)", 5)):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        _curves(ax, main, col, smooth)
        ax.set(xlabel="GRPO iteration", ylabel=ylabel)
        _legend(ax)
        fig.tight_layout()
        figs[name] = fig
    if hi:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        _curves(axes[0], hi, "entropy")
        _curves(axes[1], hi, "train_reward", 3)
        axes[0].set(title=f"lr {p.rl.high_lr:g}: token entropy", xlabel="GRPO iteration", ylabel="entropy (nats)")
        axes[1].set(title=f"lr {p.rl.high_lr:g}: train reward", xlabel="GRPO iteration", ylabel="reward")
        _legend(axes[0])
        fig.tight_layout()
        figs["high_lr_collapse"] = fig
    return figs


def report(p: Params, plots: dict, base: dict, **runs: pd.DataFrame) -> dict:
    rows, collapse = _rows(runs, p)
    metrics = derived(rows, base, list(runs))
    extra = {"collapse_iteration": collapse,
             "sft": {k: v for k, v in base.items() if k != "sft_loss"}}
    return build_report("llds", p, rows, metrics, artifacts=plots, histories=histories(runs, base), extra=extra)
