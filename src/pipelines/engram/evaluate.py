"""The derived metrics and plots of `engram`: speed-ups, the random-edit control and the comparisons on
the classes every variant forgot (per seed, paired: spec.py declares them), and the figures from every
variant's detail table (train.py): class × edit accuracy heatmaps, forgetting vs retention, the engram
cosine matrices, the α and rcond sweeps, composition, arithmetic, edit times and training curves."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipelines.engram.params import Params  # noqa: E402

ITERATIVE = ("retrain", "grad_ascent", "neggrad_plus", "finetune_retain")
LABELS = {
    "original": "original",
    "engram": "engram (W−E_c)",
    "engram_last_layer": "engram, last layer only",
    "no_pinv": "no pinv (class PCs)",
    "random_edit": "random, ‖E_c‖_F per layer",
    "random_edit_data_norm": "random, E_c's data energy",
    "retrain": "retrain w/o class",
    "grad_ascent": "gradient ascent",
    "neggrad_plus": "NegGrad+",
    "finetune_retain": "fine-tune on retain",
}


def _plot_seed(p: Params) -> int:
    return p.plot_seed if p.plot_seed is not None else p.seeds[0]


def summary_rows(values) -> list[dict]:
    """Per-seed rows ``{variant, seed, <metric>: value}`` of the results tables (core.spec.SeedValues)."""
    return values.rows()


def detail_frames(artifacts: dict) -> dict[str, pd.DataFrame]:
    """Each variant's detail table (train.py) from its JSON columns."""
    return {v: pd.DataFrame(a) for v, a in artifacts.items()}


def _classes(values, v: str, metric: str = "forget_acc") -> set[int]:
    pre = f"{metric}_class"
    return {int(k[len(pre) :]) for k in values.metrics(v) if k.startswith(pre)}


def common_classes(values) -> list[int]:
    """The classes every edit variant forgot (the baselines may cover a subset of them)."""
    sets = [_classes(values, v) for v in values.variants if v != "original"]
    return sorted(set.intersection(*sets)) if sets else []


def _common(values, v: str, k: str, classes: list[int]) -> dict[int, float]:
    """Per seed, ``k`` (forget_acc / retain_acc) averaged over ``classes``."""
    per = [values.per_seed(v, f"{k}_class{c}") for c in classes]
    seeds = sorted(set.intersection(*(set(d) for d in per)))
    return {s: float(np.mean([d[s] for d in per])) for s in seeds}


def common_metrics(values, p: Params) -> dict:
    """``common.n_classes`` and, per seed, each edit variant's forget / retain accuracy on the classes
    every variant forgot (``common.<v>.<k>``) and its gap to retraining (``gap_to_retrain.<k>.<v>``)."""
    classes = common_classes(values)
    out: dict = {"common.n_classes": float(len(classes))}
    if not classes:
        return out
    edits = [v for v in values.variants if v != "original"]
    for v in edits:
        for k in ("forget_acc", "retain_acc"):
            out[f"common.{v}.{k}"] = _common(values, v, k, classes)
    if "retrain" in edits:
        from pipelines.core.api import paired

        for v in edits:
            if v == "retrain":
                continue
            for k in ("retain_acc", "forget_acc"):
                a, b = out[f"common.{v}.{k}"], out[f"common.retrain.{k}"]
                out[f"gap_to_retrain.{k}.{v}"] = {s: a[s] - b[s] for s in paired(a, b)}
    return out


def common_names(p: Params, planned) -> list[str]:
    edits = [v for v in planned if v != "original"]
    names = ["common.n_classes", *(f"common.{v}.{k}" for v in edits for k in ("forget_acc", "retain_acc"))]
    if "retrain" in edits:
        names += [f"gap_to_retrain.{k}.{v}" for v in edits if v != "retrain" for k in ("retain_acc", "forget_acc")]
    return names


def fastest_iterative_speedup(values, p: Params) -> dict:
    """``speedup.edit_time.engram_vs_fastest_iterative``: per seed, the edit time of the fastest iterative
    variant (retraining or an unlearning baseline; chosen by its mean over seeds) over the engram's."""
    its = [v for v in ITERATIVE if v in values.variants]
    if not its:
        return {}
    fastest = min(its, key=lambda v: values.mean(v, "edit_time_s"))
    t_eng, t_it = values.per_seed("engram", "edit_time_s"), values.per_seed(fastest, "edit_time_s")
    from pipelines.core.api import paired

    return {
        "speedup.edit_time.engram_vs_fastest_iterative": {
            s: t_it[s] / t_eng[s] if t_eng[s] > 0 else math.nan for s in paired(t_eng, t_it)
        }
    }


def fastest_names(p: Params, planned) -> list[str]:
    return ["speedup.edit_time.engram_vs_fastest_iterative"] if any(v in planned for v in ITERATIVE) else []


def _per_class_means(df: pd.DataFrame, classes: list[int]) -> pd.DataFrame:
    """Per seed, forget and retain accuracy averaged over ``classes`` (a detail table)."""
    d = df[(df.kind == "per_class") & df.cls.isin(classes)]
    return d.pivot_table(index="seed", columns="metric", values="value", aggfunc="mean")


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
                ax.text(
                    j,
                    i,
                    f"{100 * mat[i, j]:.0f}",
                    ha="center",
                    va="center",
                    fontsize=5.5,
                    color="w" if mat[i, j] < 0.6 else "k",
                )
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
        ax.errorbar(
            fx.mean(),
            ry.mean(),
            xerr=fx.std(ddof=0),
            yerr=ry.std(ddof=0),
            marker="o",
            ms=7,
            capsize=3,
            color=f"C{i % 10}",
            label=f"{LABELS.get(v, v)} ({times.get(v, math.nan):.2g} s)",
        )
    ax.set(
        xlabel="forget accuracy (erased class, test) →  lower is better",
        ylabel="retain accuracy (other classes, test)",
        title=f"Forgetting vs retention on classes {classes} (mean ± std over seeds)",
    )
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
    ax.set(
        xlabel="α in W − α·E_c",
        ylabel="test accuracy (mean over erased classes)",
        title="Erasure strength: forgetting vs retention (± std over seeds)",
        ylim=(-0.02, 1.02),
    )
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
    a1.set(
        xscale="log",
        xlabel="pinv cutoff rcond (relative to λ_max)",
        ylabel="test accuracy",
        ylim=(-0.02, 1.02),
        title="Erasure vs pinv cutoff",
    )
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
    a3.set(
        xscale="log",
        yscale="log",
        xlabel="rcond",
        ylabel="‖E_c‖_F / ‖W‖_F (all layers)",
        title="Engram norm: near-null directions of Σ_R",
    )
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
    ax.set(
        ylabel="test accuracy", ylim=(0, 1.22), title=f"Composing Σ_{{c∈S}} E_c from the all-zero network (seed {seed})"
    )
    ax.legend(fontsize=8, ncol=2, loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _arithmetic(results: dict[str, pd.DataFrame], seed: int, pair: list[int], C: int):
    a, b = pair
    base = results["original"]
    eng = results["engram"]
    acc = eng[(eng.kind == "class_acc") & (eng.seed == seed)]
    bars = {
        "original": base[(base.kind == "class_acc") & (base.seed == seed)],
        f"erase {{{a},{b}}}": acc[acc.edit == f"erase_{a}_{b}"],
        f"… + E_{b} (add back)": acc[acc.edit == f"erase_{a}_{b}+E{b}"],
        f"erase {{{a}}}": acc[acc.edit == f"erase_{a}"],
    }
    fig, ax = plt.subplots(figsize=(8, 3.8))
    w = 0.8 / len(bars)
    for k, (name, d) in enumerate(bars.items()):
        vals = d.sort_values("cls").value.to_numpy()
        ax.bar(np.arange(C) + (k - (len(bars) - 1) / 2) * w, vals, w, label=name, color=f"C{k}", edgecolor="k", lw=0.3)
    ax.set_xticks(range(C), [str(c) for c in range(C)])
    ax.set(
        xlabel="test class",
        ylabel="accuracy",
        ylim=(0, 1.22),
        title=f"Linear arithmetic: W − E_{a} − E_{b}, then + E_{b} restores class {b} (seed {seed})",
    )
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    fig.tight_layout()
    return fig


def _times(rows: list[dict]):
    t = pd.DataFrame(rows)
    t = t[t.variant != "original"].groupby("variant").edit_time_s.agg(["mean", "std"]).sort_values("mean")
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.bar(range(len(t)), t["mean"], yerr=t["std"].fillna(0), capsize=3, color="C0", edgecolor="k")
    ax.set_xticks(range(len(t)), [LABELS.get(v, v) for v in t.index], rotation=30, ha="right", fontsize=8)
    ax.set(
        yscale="log",
        ylabel="seconds per class erased (median over classes)",
        title="Edit time: closed form vs iterative unlearning",
    )
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
        axes[1].axhline(
            eng_summary.get("forget_acc", math.nan),
            color="C3",
            lw=2,
            alpha=0.6,
            label="engram, one shot: forget (test)",
        )
    axes[1].set(
        xlabel="unlearning step",
        ylabel="train accuracy",
        title=f"Iterative unlearning of class {p.unlearn.classes[0]} (seed {p.seeds[0]}, chosen lr)",
    )
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    return fig


def make_plots(p: Params, values, artifacts: dict) -> dict:
    results = detail_frames(artifacts)
    seed = _plot_seed(p)
    C = int(results["original"][results["original"].kind == "class_acc"].cls.max()) + 1
    rows = summary_rows(values)
    figs = {
        "class_edit_accuracy": _heatmaps(results, seed, C),
        "forget_vs_retain": _forget_vs_retain(results, common_classes(values), rows),
        "edit_time": _times(rows),
    }
    if "engram" in results:
        eng = results["engram"]
        summ = {r["seed"]: r for r in rows if r["variant"] == "engram"}
        L = int(max(int(e[1:]) for e in eng[eng.kind == "cos"].edit.unique()))
        figs.update(
            {
                "engram_cosine": _cosines(eng, seed, C),
                "alpha_sweep": _alpha(eng),
                "rcond_sweep": _rcond(eng, L),
                "compose": _compose(eng, seed, summ.get(seed, {})),
                "arithmetic": _arithmetic(results, seed, p.engram.arithmetic_pair, C),
            }
        )
    eng_mean = (
        pd.DataFrame([r for r in rows if r["variant"] == "engram"]).mean(numeric_only=True).to_dict()
        if "engram" in results
        else {}
    )
    base = results["original"]
    h = base[(base.kind == "history") & (base.metric == "test_acc")]
    base_hist = [(int(k), float(x)) for k, x in h.groupby("cls").value.mean().sort_index().items()]
    figs["training_curves"] = _curves(results, p, eng_mean, base_hist)
    return figs


def report_extra(p: Params, values, artifacts: dict) -> dict:
    return {"common_classes": common_classes(values)}
