"""Metrics, plots and the report of `rlcracker`: removal success (detector says "not watermarked" and the
meaning is kept), z, green fraction, similarity, copy rate and length ratio per scheme and length
(short = one chunk, long = ``long_chunks`` chunks), the threshold calibrated on unwatermarked texts, and
the RL training curves."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import Diff, Fn
from pipelines.rlcracker.model import Language, similarity
from pipelines.rlcracker.params import Params
from pipelines.rlcracker.train import make_watermark

METRICS = ("mean_z", "green_fraction", "semantic_sim", "copy_rate", "len_ratio")


def length_name(n_chunks: int) -> str:
    return "short" if n_chunks == 1 else "long"


def calibrated_thresholds(texts: pd.DataFrame, p: Params) -> dict[str, float]:
    """The (1 − fpr) quantile of z on unwatermarked texts, by ``<scheme>_<length>``."""
    out = {}
    null = texts[texts.split == "null"]
    for (scheme, n_chunks), g in null.groupby(["scheme", "n_chunks"]):
        out[f"{scheme}_{length_name(int(n_chunks))}"] = float(np.quantile(g["z"], 1 - p.watermark.fpr, method="higher"))
    return out


def attack_rows(p: Params, texts: pd.DataFrame, df: pd.DataFrame) -> list[dict]:
    """One variant's scored rewrites → one row per seed: removal success (plain, at the repo's similarity,
    at the calibrated threshold), mean z and the other scores, by scheme and length."""
    thr = calibrated_thresholds(texts, p)
    rows = []
    n_long = int(texts["n_chunks"].max())
    for seed, d in df.groupby("seed"):
        row = {"seed": int(seed)}
        for scheme in p.watermark.eval_schemes:
            for n_chunks in dict.fromkeys((1, n_long)):
                sfx = f"{scheme}_{length_name(n_chunks)}"
                g = d[(d.scheme == scheme) & (d["n_chunks"] == n_chunks)]
                undetected = g["z"] < p.watermark.z_threshold
                row[f"removal_success_{sfx}"] = 100 * float(
                    (undetected & (g.semantic_sim >= p.eval.success_sim)).mean()
                )
                row[f"removal_success_sim07_{sfx}"] = 100 * float(
                    (undetected & (g.semantic_sim > p.eval.repo_sim)).mean()
                )
                row[f"fpr_calibrated_success_{sfx}"] = 100 * float(
                    ((g["z"] <= thr[sfx]) & (g.semantic_sim >= p.eval.success_sim)).mean()
                )
                row[f"mean_z_{sfx}"] = float(g["z"].mean())
                for m in METRICS[1:]:
                    row[f"{m}_{sfx}"] = float(g[m].mean())
        rows.append(row)
    return rows


def _watermark_metrics(p: Params, texts: pd.DataFrame) -> dict[str, float]:
    out = {}
    thr = calibrated_thresholds(texts, p)
    for (scheme, n_chunks), g in texts[texts.split.isin(["test", "null"])].groupby(["scheme", "n_chunks"]):
        sfx = f"{scheme}_{length_name(int(n_chunks))}"
        wm, null = g[g.watermarked], g[~g.watermarked]
        out[f"watermark.detect_rate_{sfx}"] = 100 * float((wm["z"] > p.watermark.z_threshold).mean())
        out[f"watermark.null_fpr_{sfx}"] = 100 * float((null["z"] > p.watermark.z_threshold).mean())
        out[f"watermark.mean_z_{sfx}"] = float(wm["z"].mean())
        out[f"watermark.null_mean_z_{sfx}"] = float(null["z"].mean())
        out[f"watermark.calibrated_threshold_{sfx}"] = thr[sfx]
    return out


def watermark_names(p: Params, planned) -> list[str]:
    lengths = dict.fromkeys(("short", length_name(p.data.long_chunks)))
    schemes = dict.fromkeys([p.watermark.train_scheme, *p.watermark.eval_schemes])
    return [
        f"watermark.{k}_{s}_{ln}"
        for s in schemes
        for ln in lengths
        for k in ("detect_rate", "null_fpr", "mean_z", "null_mean_z", "calibrated_threshold")
    ]


def watermark_fn(values, p: Params, texts: pd.DataFrame) -> dict[str, float]:
    """The watermark itself (point values, one set of texts per run): detection rate and FPR at the z
    threshold, mean z of watermarked and null texts, the calibrated threshold."""
    return _watermark_metrics(p, texts)


PAIRS = (
    ("sft_paraphrase", "rlcracker"),
    ("grpo_sem_only", "rlcracker"),
    ("rlcracker", "grpo_sem_only"),
    ("rlcracker", "sft_paraphrase"),
    ("oracle_rl", "rlcracker"),
)


def derived(p: Params) -> list:
    """Paired per-seed differences ``delta.<metric>.<a>_minus_<b>`` (the ablations ran the first seeds only:
    the pairs are those seeds) and the watermark's own metrics."""
    lengths = dict.fromkeys(("short", length_name(p.data.long_chunks)))
    out = [
        Diff(f"{m}_{scheme}_{ln}", a, b, name=f"delta.{m}_{scheme}_{ln}.{a}_minus_{b}")
        for scheme in p.watermark.eval_schemes
        for ln in lengths
        for m in ("mean_z", "removal_success", "semantic_sim")
        for a, b in PAIRS
    ]
    out.append(Fn(watermark_fn, watermark_names, inputs=["texts"]))
    return out


def _success_vs_length(
    p: Params, lang: Language, texts: pd.DataFrame, df: pd.DataFrame
) -> tuple[list[int], list[float]]:
    """Joint success of the long rewrites judged on their first k chunks, k = 1, 2, 4, … long_chunks."""
    scheme = (
        p.watermark.train_scheme
        if p.watermark.train_scheme in p.watermark.eval_schemes
        else p.watermark.eval_schemes[0]
    )
    wm = make_watermark(lang, p, scheme)
    n_long = int(texts["n_chunks"].max())
    src = texts[(texts.split == "test") & texts.watermarked & (texts.scheme == scheme) & (texts.n_chunks == n_long)]
    src = src.set_index("text_id")
    d = df[(df.scheme == scheme) & (df.n_chunks == n_long) & (df.seed == df.seed.min())]  # first seed
    ks, rates = sorted({1, n_long, *(2**i for i in range(n_long.bit_length()) if 2**i < n_long)}), []
    for k in ks:
        ok = []
        for row in d.itertuples():
            y = lang.ids(" ".join(row.rewrite_chunks[:k]))
            s = lang.ids(" ".join(src.loc[row.text_id, "chunks"][:k]))
            ok.append(
                wm.z(y) < p.watermark.z_threshold
                and similarity(lang.concepts(y), lang.concepts(s)) >= p.eval.success_sim
            )
        rates.append(100 * float(np.mean(ok)) if ok else 0.0)
    return [k * p.data.answer_len for k in ks], rates


def make_plots(
    p: Params, values, artifacts: dict, lexicon: pd.DataFrame, corpus: pd.DataFrame, texts: pd.DataFrame
) -> dict:
    import matplotlib.pyplot as plt

    from pipelines.core.api import line_plot

    attacks = {v: pd.DataFrame(a["attack"]) for v, a in artifacts.items()}
    curves = {v: a["curves"] for v, a in artifacts.items() if a["curves"]}

    lang = Language(lexicon, corpus)
    scheme = (
        p.watermark.train_scheme
        if p.watermark.train_scheme in p.watermark.eval_schemes
        else p.watermark.eval_schemes[0]
    )
    n_long = int(texts["n_chunks"].max())
    thr = calibrated_thresholds(texts, p)
    figs = {}
    for n_chunks in dict.fromkeys((1, n_long)):
        fig, ax = plt.subplots(figsize=(7, 4))
        null = texts[(texts.split == "null") & (texts.scheme == scheme) & (texts.n_chunks == n_chunks)]["z"]
        ax.hist(null, bins=25, alpha=0.4, label="unwatermarked", color="gray")
        for v, df in attacks.items():
            z = df[(df.scheme == scheme) & (df.n_chunks == n_chunks)]["z"]
            ax.hist(z, bins=25, histtype="step", lw=1.5, label=v)
        ax.axvline(p.watermark.z_threshold, color="k", ls="--", label=f"z = {p.watermark.z_threshold:g}")
        ax.axvline(thr[f"{scheme}_{length_name(n_chunks)}"], color="r", ls=":", label=f"{p.watermark.fpr:.0%} FPR")
        ax.set(xlabel=f"z ({scheme})", ylabel="texts", title=f"z before/after attack, {length_name(n_chunks)} texts")
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs[f"z_hist_{length_name(n_chunks)}"] = fig
    series = {}
    for v, df in attacks.items():
        x, y = _success_vs_length(p, lang, texts, df)
        series[v] = y
    figs["success_vs_length"] = line_plot(
        x,
        series,
        "text length (tokens)",
        "joint removal success (%)",
        f"success vs length ({scheme}, s ≥ {p.eval.success_sim:g})",
    )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v, df in attacks.items():
        g = df[(df.scheme == scheme) & (df.n_chunks == n_long)]
        ax.scatter(g["semantic_sim"], g["z"], s=8, alpha=0.5, label=v)
    ax.axhline(p.watermark.z_threshold, color="k", ls="--")
    ax.axvline(p.eval.success_sim, color="k", ls=":")
    ax.set(
        xlabel="semantic similarity to the source",
        ylabel="z",
        title="removal vs fidelity (long texts; success: lower right)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["success_vs_fidelity"] = fig
    hist = {v: by_seed[min(by_seed, key=int)] for v, by_seed in curves.items()}  # the first seed
    if hist:
        fig, axes = plt.subplots(2, 3, figsize=(12, 6))
        for ax, name in zip(axes.ravel(), ("reward_sem", "similarity", "rollout_z", "kl_wm", "kl_h", "grad_norm")):
            for v, h in hist.items():
                if name in h:
                    ax.plot(h[name], label=v)
            ax.set(title=name, xlabel="update")
            if name == "grad_norm":
                ax.set_yscale("log")
        axes[0, 0].legend(fontsize=7)
        fig.tight_layout()
        figs["rl_curves"] = fig
    return figs
