"""The report and plots of `engram`: every variant's long table (train.py) → per-seed rows (forget /
retain accuracy, edit time, the engram's identities), derived comparisons on the classes every variant
forgot, metric histories (the original model's training curve, the α sweep, the unlearning baselines'
curves) and the figures: class × edit accuracy heatmaps, forgetting vs retention, the engram cosine
matrices, the α and rcond sweeps, composition, arithmetic and edit times."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipelines.core.report import build_report  # noqa: E402
from pipelines.engram.params import Params  # noqa: E402

ITERATIVE = ("retrain", "grad_ascent", "neggrad_plus", "finetune_retain")
LABELS = {"original": "original", "engram": "engram (W−E_c)", "engram_last_layer": "engram, last layer only",
          "no_pinv": "no pinv (class PCs)", "random_edit": "random, ‖E_c‖_F per layer",
          "random_edit_data_norm": "random, E_c's data energy", "retrain": "retrain w/o class",
          "grad_ascent": "gradient ascent", "neggrad_plus": "NegGrad+", "finetune_retain": "fine-tune on retain"}


def _plot_seed(p: Params) -> int:
    return p.plot_seed if p.plot_seed is not None else p.seeds[0]


def summary_rows(results: dict[str, pd.DataFrame]) -> list[dict]:
    rows = []
    for v, df in results.items():
        s = df[df.kind == "summary"]
        for seed, g in s.groupby("seed", sort=True):
            rows.append({"variant": v, "seed": int(seed), **dict(zip(g.metric, g.value.astype(float), strict=True))})
    return rows


def common_classes(results: dict[str, pd.DataFrame]) -> list[int]:
    """The classes every edit variant forgot (the baselines may cover a subset of them)."""
    sets = [set(df[(df.kind == "per_class")].cls.unique().tolist()) for v, df in results.items() if v != "original"]
    return sorted(set.intersection(*sets)) if sets else []


def _per_class_means(df: pd.DataFrame, classes: list[int]) -> pd.DataFrame:
    """Per seed, forget and retain accuracy averaged over ``classes``."""
    d = df[(df.kind == "per_class") & df.cls.isin(classes)]
    return d.pivot_table(index="seed", columns="metric", values="value", aggfunc="mean")


def derived_metrics(results: dict[str, pd.DataFrame], rows: list[dict], p: Params) -> dict[str, float]:
    m: dict[str, float] = {}
    mean = pd.DataFrame(rows).groupby("variant").mean(numeric_only=True)

    def get(v: str, k: str) -> float:
        return float(mean.loc[v, k]) if v in mean.index and k in mean.columns and not pd.isna(mean.loc[v, k]) else math.nan

    t_eng = get("engram", "edit_time_s")
    for v in ITERATIVE:
        if v in mean.index and t_eng > 0:
            m[f"speedup.edit_time.engram_vs_{v}"] = get(v, "edit_time_s") / t_eng
    its = [get(v, "edit_time_s") for v in ITERATIVE if v in mean.index]
    if its and t_eng > 0:
        m["speedup.edit_time.engram_vs_fastest_iterative"] = min(its) / t_eng
    if "random_edit" in mean.index and "engram" in mean.index:
        m["control.forget_acc.random_edit_minus_engram"] = get("random_edit", "forget_acc") - get("engram", "forget_acc")
    classes = common_classes(results)
    m["common.n_classes"] = float(len(classes))
    for v, df in results.items():
        if v == "original" or not classes:
            continue
        pc = _per_class_means(df, classes)
        for k in ("forget_acc", "retain_acc"):
            if k in pc:
                m[f"common.{v}.{k}"] = float(pc[k].mean())
    if "common.retrain.retain_acc" in m:
        for v in results:
            if f"common.{v}.retain_acc" in m and v != "retrain":
                m[f"gap_to_retrain.retain_acc.{v}"] = m[f"common.{v}.retain_acc"] - m["common.retrain.retain_acc"]
                m[f"gap_to_retrain.forget_acc.{v}"] = m[f"common.{v}.forget_acc"] - m["common.retrain.forget_acc"]
    return m


def histories(results: dict[str, pd.DataFrame], p: Params) -> dict[str, dict]:
    """Curves with steps: the original model's test accuracy per epoch (mean over seeds), the α sweep of
    the engram (step = round(100 α)), the unlearning baselines' train-forget/retain accuracy per step
    (first seed, first class, chosen lr)."""
    out: dict[str, dict] = {}
    for v, df in results.items():
        h = df[df.kind == "history"]
        series: dict[str, list] = {}
        first = h[h.seed == p.seeds[0]] if v in ITERATIVE else h
        for name, g in first.groupby("metric", sort=True):
            s = g.groupby("cls").value.mean().sort_index()
            series[name] = [(int(k), float(x)) for k, x in s.items()]
        if v == "engram":
            a = df[df.kind == "alpha"].copy()
            a["step"] = (a.edit.astype(float) * 100).round().astype(int)
            for name, g in a.groupby("metric", sort=True):
                s = g.groupby("step").value.mean().sort_index()
                series[f"alpha_{name}"] = [(int(k), float(x)) for k, x in s.items()]
        if series:
            out[v] = series
    return out


# ------------------------------------------------------------------------------------------------ plots
def _heatmaps(results: dict[str, pd.DataFrame], seed: int, C: int):
    vs = [v for v in results if v != "original"]
    ncol = min(3, max(1, len(vs)))
    nrow = math.ceil(len(vs) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.8 * nrow), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    base = results["original"]
    base_row = base[(base.kind == "class_acc") & (base.seed == seed)].sort_values("cls").value.to_numpy()
    for ax, v in zip(axes.flat, vs, strict=False):
        df = results[v]
        d = df[(df.kind == "class_acc") & (df.seed == seed) & df.edit.str.fullmatch(r"erase_\d+")]
        edits = sorted(d.edit.unique(), key=lambda e: int(e.split("_")[1]))
        mat = np.array([d[d.edit == e].sort_values("cls").value.to_numpy() for e in edits])
        mat = np.vstack([base_row, mat]) if len(mat) else base_row[None]
        ax.axis("on")
        ax.imshow(mat, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(C), [str(c) for c in range(C)], fontsize=7)
        ax.set_yticks(range(len(mat)), ["none", *[e.split("_")[1] for e in edits]], fontsize=7)
        for i in range(mat.shape[0]):
            for j in range(mat.shape[1]):
                ax.text(j, i, f"{100 * mat[i, j]:.0f}", ha="center", va="center", fontsize=5.5,
                        color="w" if mat[i, j] < 0.6 else "k")
        ax.set(title=LABELS.get(v, v), xlabel="test class", ylabel="erased class")
    fig.suptitle(f"Test accuracy (%) per class after erasing one class (seed {seed})")
    fig.tight_layout()
    return fig


def _forget_vs_retain(results: dict[str, pd.DataFrame], classes: list[int], rows: list[dict]):
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    times = pd.DataFrame(rows).groupby("variant").edit_time_s.mean() if rows else pd.Series(dtype=float)
    for i, (v, df) in enumerate(results.items()):
        if v == "original":
            continue
        pc = _per_class_means(df, classes)
        if pc.empty:
            continue
        fx, ry = pc["forget_acc"], pc["retain_acc"]
        ax.errorbar(fx.mean(), ry.mean(), xerr=fx.std(ddof=0), yerr=ry.std(ddof=0), marker="o", ms=7, capsize=3,
                    color=f"C{i % 10}", label=f"{LABELS.get(v, v)} ({times.get(v, math.nan):.2g} s)")
    ax.set(xlabel="forget accuracy (erased class, test) →  lower is better",
           ylabel="retain accuracy (other classes, test)",
           title=f"Forgetting vs retention on classes {classes} (mean ± std over seeds)")
    ax.axvline(0.1, color="grey", ls=":", lw=1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def _cosines(df: pd.DataFrame, seed: int, C: int):
    d = df[(df.kind == "cos") & (df.seed == seed)]
    layers = sorted(d.edit.unique(), key=lambda e: int(e[1:]))
    fig, axes = plt.subplots(1, len(layers), figsize=(3.6 * len(layers), 3.4), squeeze=False)
    for ax, layer in zip(axes[0], layers, strict=True):
        g = d[d.edit == layer]
        mat = np.zeros((C, C))
        for r in g.itertuples():
            mat[int(r.cls), int(r.metric)] = r.value
        im = ax.imshow(mat, vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_xticks(range(C), [str(c) for c in range(C)], fontsize=7)
        ax.set_yticks(range(C), [str(c) for c in range(C)], fontsize=7)
        off = mat[~np.eye(C, dtype=bool)]
        ax.set(title=f"layer {layer[1:]}: off-diag mean {off.mean():.2f}")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(f"Engram cosine similarity between classes (specificity), seed {seed}")
    return fig


def _alpha(df: pd.DataFrame):
    a = df[df.kind == "alpha"].copy()
    a["alpha"] = a.edit.astype(float)
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, (metric, g) in enumerate(a.groupby("metric", sort=True)):
        s = g.groupby("alpha").value
        mu, sd = s.mean(), s.std(ddof=0).fillna(0)
        ax.plot(mu.index, mu.values, marker="o", color=f"C{k}", label=metric.replace("_", " "))
        ax.fill_between(mu.index, mu - sd, mu + sd, color=f"C{k}", alpha=0.2)
    ax.axvline(1.0, color="grey", ls=":", lw=1)
    ax.set(xlabel="α in W − α·E_c", ylabel="test accuracy (mean over erased classes)",
           title="Erasure strength: forgetting vs retention (± std over seeds)", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def _rcond(df: pd.DataFrame, L: int):
    r = df[df.kind == "rcond"].copy()
    r["rcond"] = r.edit.astype(float)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 3.8))
    for k, metric in enumerate(("forget_acc", "retain_acc")):
        s = r[r.metric == metric].groupby("rcond").value.mean()
        a1.plot(s.index, s.values, marker="o", color=f"C{k}", label=metric.replace("_", " "))
    a1.set(xscale="log", xlabel="pinv cutoff rcond (relative to λ_max)", ylabel="test accuracy", ylim=(-0.02, 1.02),
           title="Erasure vs pinv cutoff")
    a1.legend()
    a1.grid(alpha=0.3)
    for ell in range(1, L + 1):
        s = r[r.metric == f"eff_rank_l{ell}"].groupby("rcond").value.mean()
        a2.plot(s.index, s.values, marker="o", label=f"layer {ell}")
    a2.set(xscale="log", xlabel="rcond", ylabel="effective rank of Σ_R", title="Conditioning of Σ_R per layer")
    a2.legend()
    a2.grid(alpha=0.3)
    s = r[r.metric == "engram_rel_norm"].groupby("rcond").value.mean()
    a3.plot(s.index, s.values, marker="o", color="C4")
    a3.set(xscale="log", yscale="log", xlabel="rcond", ylabel="‖E_c‖_F / ‖W‖_F (all layers)",
           title="Engram norm: near-null directions of Σ_R")
    a3.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _compose(df: pd.DataFrame, seed: int, summary: dict):
    c = df[(df.kind == "compose") & (df.seed == seed)]
    names = list(dict.fromkeys(c.edit))
    ins = [float(c[(c.edit == n) & (c.metric == "acc_in_S")].value.iloc[0]) for n in names]
    outs = [float(c[(c.edit == n) & (c.metric == "acc_out_S")].value.iloc[0]) for n in names]
    names.append("all")
    ins.append(summary.get("compose_all_acc", math.nan))
    outs.append(math.nan)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(names)), 4))
    ax.bar(x - 0.2, ins, 0.4, label="accuracy on S (sufficiency)", color="C2", edgecolor="k")
    ax.bar(x + 0.2, outs, 0.4, label="accuracy outside S", color="C3", edgecolor="k")
    ax.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
    ax.set(ylabel="test accuracy", ylim=(0, 1.22),
           title=f"Composing Σ_{{c∈S}} E_c from the all-zero network (seed {seed})")
    ax.legend(fontsize=8, ncol=2, loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _arithmetic(results: dict[str, pd.DataFrame], seed: int, pair: list[int], C: int):
    a, b = pair
    base = results["original"]
    eng = results["engram"]
    acc = eng[(eng.kind == "class_acc") & (eng.seed == seed)]
    bars = {"original": base[(base.kind == "class_acc") & (base.seed == seed)],
            f"erase {{{a},{b}}}": acc[acc.edit == f"erase_{a}_{b}"],
            f"… + E_{b} (add back)": acc[acc.edit == f"erase_{a}_{b}+E{b}"],
            f"erase {{{a}}}": acc[acc.edit == f"erase_{a}"]}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    w = 0.8 / len(bars)
    for k, (name, d) in enumerate(bars.items()):
        vals = d.sort_values("cls").value.to_numpy()
        ax.bar(np.arange(C) + (k - (len(bars) - 1) / 2) * w, vals, w, label=name, color=f"C{k}", edgecolor="k", lw=0.3)
    ax.set_xticks(range(C), [str(c) for c in range(C)])
    ax.set(xlabel="test class", ylabel="accuracy", ylim=(0, 1.22),
           title=f"Linear arithmetic: W − E_{a} − E_{b}, then + E_{b} restores class {b} (seed {seed})")
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    fig.tight_layout()
    return fig


def _times(rows: list[dict]):
    t = pd.DataFrame(rows)
    t = t[t.variant != "original"].groupby("variant").edit_time_s.agg(["mean", "std"]).sort_values("mean")
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.bar(range(len(t)), t["mean"], yerr=t["std"].fillna(0), capsize=3, color="C0", edgecolor="k")
    ax.set_xticks(range(len(t)), [LABELS.get(v, v) for v in t.index], rotation=30, ha="right", fontsize=8)
    ax.set(yscale="log", ylabel="seconds per class erased (median over classes)",
           title="Edit time: closed form vs iterative unlearning")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _curves(results: dict[str, pd.DataFrame], p: Params, eng_summary: dict, base_hist: list):
    present = [v for v in ("grad_ascent", "neggrad_plus", "finetune_retain") if v in results]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    if base_hist:
        e, acc = zip(*base_hist, strict=True)
        axes[0].plot(e, acc, marker=".", color="k")
    axes[0].set(xlabel="epoch", ylabel="test accuracy", title="Original MLP training (mean over seeds)")
    axes[0].grid(alpha=0.3)
    for k, v in enumerate(present):
        h = results[v]
        h = h[(h.kind == "history") & (h.seed == p.seeds[0])]
        for metric, ls in (("forget", "-"), ("retain", "--")):
            g = h[h.metric.str.startswith(f"train_{metric}_acc")].sort_values("cls")
            if len(g):
                axes[1].plot(g.cls, g.value, ls, color=f"C{k}", label=f"{LABELS[v]}: {metric}")
    if eng_summary:
        axes[1].axhline(eng_summary.get("forget_acc", math.nan), color="C3", lw=2, alpha=0.6,
                        label="engram, one shot: forget (test)")
    axes[1].set(xlabel="unlearning step", ylabel="train accuracy",
                title=f"Iterative unlearning of class {p.unlearn.classes[0]} (seed {p.seeds[0]}, chosen lr)")
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    return fig


def make_plots(p: Params, **results: pd.DataFrame) -> dict:
    seed = _plot_seed(p)
    C = int(results["original"][results["original"].kind == "class_acc"].cls.max()) + 1
    rows = summary_rows(results)
    figs = {"class_edit_accuracy": _heatmaps(results, seed, C),
            "forget_vs_retain": _forget_vs_retain(results, common_classes(results), rows),
            "edit_time": _times(rows)}
    hist = histories(results, p)
    if "engram" in results:
        eng = results["engram"]
        summ = {r["seed"]: r for r in rows if r["variant"] == "engram"}
        L = int(max(int(e[1:]) for e in eng[eng.kind == "cos"].edit.unique()))
        figs.update({"engram_cosine": _cosines(eng, seed, C), "alpha_sweep": _alpha(eng), "rcond_sweep": _rcond(eng, L),
                     "compose": _compose(eng, seed, summ.get(seed, {})),
                     "arithmetic": _arithmetic(results, seed, p.engram.arithmetic_pair, C)})
    eng_mean = pd.DataFrame([r for r in rows if r["variant"] == "engram"]).mean(numeric_only=True).to_dict() \
        if "engram" in results else {}
    figs["training_curves"] = _curves(results, p, eng_mean, hist.get("original", {}).get("test_acc", []))
    return figs


def report(p: Params, plots: dict, **results: pd.DataFrame) -> dict:
    rows = summary_rows(results)
    metrics = derived_metrics(results, rows, p)
    return build_report("engram", p, rows, metrics, artifacts=plots, histories=histories(results, p),
                        extra={"common_classes": common_classes(results)})
