"""Metrics, plots and the report's extras of `llds`: per (variant, seed) summaries of the GRPO runs (greedy
test EM, probe likelihoods of correct / incorrect trajectories, pre-clip gradient norms, entropy, collapse),
paired comparisons on the seeds two variants share (declared in spec.py), curves over training as histories."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.api import Diff, Fn, Gain, Ratio, SeedValues
from pipelines.llds.params import Params
from pipelines.llds.train import collapse_iteration

WINDOW = 10  # iterations averaged for the first / last values of noisy per-iteration diagnostics
CURVES = (
    "train_reward",
    "onpolicy_logp_correct",
    "entropy",
    "grad_norm_max",
    "lld_active_frac",
    "llds_active_frac",
    "searches_per_answer",
    "test_em",
    "logp_correct_mean",
    "logp_incorrect_mean",
)
DELTA_METRICS = (
    "test_em",
    "logp_correct_final",
    "logp_correct_drop",
    "logp_incorrect_final",
    "entropy_final",
    "train_reward_last",
    "grad_norm_max",
)
SFT_METRICS = {
    "sft_sampled_reward": "sft_sampled_reward",
    "sft_test_em": "test_em",
    "sft_probe_reward": "sft_probe_reward",
}


def _nanmean(x) -> float:
    x = np.asarray(x, float)
    return float(np.nanmean(x)) if np.isfinite(x).any() else math.nan


def summarise(run: pd.DataFrame, p: Params) -> dict:
    """One (variant, seed) run → its metrics."""
    ev = run.dropna(subset=["test_em"]).sort_values("iteration")
    it = run.dropna(subset=["train_reward"]).sort_values("iteration")
    first, last = ev.iloc[0], ev.iloc[-1]
    em_cols = [c for c in run.columns if c.startswith("test_em_") and c != "test_em_"]
    row = {
        "test_em": float(last["test_em"]),
        "test_em_init": float(first["test_em"]),
        "test_em_max": float(ev["test_em"].max()),
        "test_em_min": float(ev["test_em"].min()),
    }
    for c in em_cols:
        row[c] = float(last[c])
    two = [c for c in em_cols if "2hop" in c]
    if two:
        row["test_em_2hop"] = _nanmean([last[c] for c in two])
    for k in ("correct", "incorrect"):
        s = ev[f"logp_{k}_mean"]
        row[f"logp_{k}_init"], row[f"logp_{k}_final"] = float(s.iloc[0]), float(s.iloc[-1])
        row[f"logp_{k}_drop"] = float(s.iloc[0] - s.iloc[-1])  # > 0: the likelihood fell
        row[f"logp_{k}_max_drop"] = float(s.iloc[0] - s.min())
    row["train_reward_first"] = _nanmean(it["train_reward"].head(WINDOW))
    row["train_reward_last"] = _nanmean(it["train_reward"].tail(WINDOW))
    row["onpolicy_logp_correct_last"] = _nanmean(it["onpolicy_logp_correct"].tail(WINDOW))
    row["entropy_first"] = _nanmean(it["entropy"].head(WINDOW))
    row["entropy_final"] = _nanmean(it["entropy"].tail(WINDOW))
    row["grad_norm_max"] = float(it["grad_norm_max"].max())  # pre-clip
    row["grad_norm_mean"] = _nanmean(it["grad_norm"])
    row["searches_per_answer_last"] = _nanmean(it["searches_per_answer"].tail(WINDOW))
    row["lld_active_frac"] = _nanmean(it["lld_active_frac"])
    if "llds_active_frac" in it:
        row["llds_active_frac"] = _nanmean(it["llds_active_frac"])
    c = collapse_iteration(list(zip(ev["iteration"], ev["test_em"])), p.collapse.drop, p.collapse.min_max)
    row["collapsed"] = float(c is not None)
    row["reward_rise_before_collapse"] = reward_rise(it, c)
    return row


def reward_rise(it: pd.DataFrame, collapse: int | None) -> float:
    """How far the train reward rose before the collapse (the gate that RL learned something): the best
    ``WINDOW``-iteration mean of ``train_reward`` over the iterations before the collapsed evaluation (all of
    them when nothing collapsed) minus the mean of the first ``WINDOW`` iterations; 0 when fewer than
    ``WINDOW`` iterations precede the collapse."""
    r = it.sort_values("iteration")
    if collapse is not None:
        r = r[r["iteration"] < collapse]
    x = r["train_reward"].to_numpy(float)
    if len(x) < WINDOW:
        return 0.0
    windows = np.convolve(x, np.ones(WINDOW) / WINDOW, mode="valid")
    return float(windows.max() - windows[0])


def pairs() -> list[tuple[str, str]]:
    """(a, b) compared on their shared seeds: LLDS against each baseline / ablation, those against vanilla,
    and the high-lr pair both ways."""
    out = [("llds", b) for b in ("grpo", "llds_rgate", "llds_ma", "nll_pos", "grpo_kl")]
    out += [(a, "grpo") for a in ("llds_rgate", "llds_ma", "nll_pos", "grpo_kl")]
    return out + [("llds_hilr", "grpo_hilr"), ("grpo_hilr", "llds_hilr")]


def sft_metrics(values: SeedValues, p: Params, base: dict) -> dict[str, float]:
    """The shared SFT init's point values (one checkpoint, no seeds)."""
    return {name: base[key] for name, key in SFT_METRICS.items()}


def derived(p: Params) -> list:
    """Per pair: the paired differences of the summary metrics, the relative EM gain and the ratio of max
    pre-clip gradient norms (the mean of per-seed values; NaN when the two share no seed)."""
    out: list = [Fn(sft_metrics, list(SFT_METRICS), inputs=["base"])]
    for a, b in pairs():
        out += [Diff(m, a, b, name=f"delta.{m}.{a}_minus_{b}") for m in DELTA_METRICS]
        out.append(Gain("test_em", a, baseline=b, relative=True, name=f"relative_gain.test_em.{a}_vs_{b}"))
        out.append(Ratio("grad_norm_max", b, a, name=f"ratio.grad_norm_max.{b}_over_{a}"))
    return out


def runs_from(values: SeedValues) -> dict[str, pd.DataFrame]:
    """Each variant's per-iteration curves back as one frame (variant, seed, iteration, <curve>...)."""
    t = values.table[values.table["step"].notna()]
    out = {}
    for v in values.variants:
        tv = t[t["variant"] == v]
        if tv.empty:
            continue
        df = tv.pivot_table(index=["seed", "step"], columns="metric", values="value", aggfunc="first").reset_index()
        df = df.rename(columns={"step": "iteration"})
        df["iteration"] = df["iteration"].astype(int)
        df.columns.name = None
        out[v] = df.sort_values(["seed", "iteration"]).reset_index(drop=True)
    return out


# ------------------------------------------------------------------------------------------ plots
def _curves(ax, runs: dict[str, pd.DataFrame], col: str, smooth: int = 1):
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (variant, df) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        if col not in df:  # a curve that was never measured (all NaN) has no history rows
            continue
        for j, (_seed, run) in enumerate(df.groupby("seed")):
            s = run[["iteration", col]].dropna()
            if s.empty:
                continue
            y = s[col].rolling(smooth, min_periods=1).mean() if smooth > 1 else s[col]
            ax.plot(
                s["iteration"],
                y,
                color=color,
                alpha=0.9 if j == 0 else 0.45,
                lw=1.4,
                ls="-" if j == 0 else "--",
                label=variant if j == 0 else None,
            )
    ax.grid(alpha=0.3)


def _legend(ax):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def make_plots(p: Params, values: SeedValues, artifacts: dict, base: dict) -> dict:
    """Likelihood trajectories (the three-phase LLD picture), greedy test EM, pre-clip gradient norm,
    train reward, entropy; solid = first seed, dashed = the others."""
    import matplotlib.pyplot as plt

    runs = runs_from(values)
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
    for name, col, ylabel, smooth in (
        ("test_em_curves", "test_em", "greedy test EM", 1),
        ("grad_norm", "grad_norm_max", "pre-clip grad norm (max per iteration)", 1),
        ("train_reward", "train_reward", "train reward (5-iteration mean)", 5),
        ("onpolicy_logp_correct", "onpolicy_logp_correct", "on-policy log-prob of correct rollouts (5-it mean)", 5),
    ):
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


def report_extra(p: Params, values: SeedValues, artifacts: dict, base: dict) -> dict:
    """The first collapsed evaluation per (variant, seed) and the SFT init's diagnostics (with its loss curve)."""
    collapse = {}
    for v, df in runs_from(values).items():
        for seed, run in df.groupby("seed"):
            ev = run.dropna(subset=["test_em"])
            collapse[f"{v}/{int(seed)}"] = collapse_iteration(
                list(zip(ev["iteration"], ev["test_em"])), p.collapse.drop, p.collapse.min_max
            )
    return {
        "collapse_iteration": collapse,
        "sft": {k: v for k, v in base.items() if k != "sft_loss"},
        "sft_loss": list(base["sft_loss"]),
    }
