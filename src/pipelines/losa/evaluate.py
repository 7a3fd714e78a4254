"""The derived metrics and the plots of `losa`: density / error ratios vs Quest (equal budget and matched
density) and EM gaps, each computed per eval seed (the gate on dense EM is declared in the parameters),
token agreement with dense, the interleaved attention timing, and the locality evidence (δ share
histogram, active-token heatmap)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.losa.params import Params

METRICS = (
    "answer_em",
    "value_token_acc",
    "token_agreement_vs_dense",
    "kv_density",
    "attn_out_rel_err",
    "active_fraction",
    "bytes_loaded_ratio_vs_dense",
    "modelled_speedup",
    "delta_top_half_share_median",
    "delta_top_half_share_p10",
    "delta_zero_fraction",
    "hidden_delta_top_half_share_median",
    "hidden_delta_top_half_share_p10",
    "hidden_delta_zero_fraction",
    "delta_top_half_share_median_deep",
    "delta_top_half_share_p10_deep",
    "delta_zero_fraction_deep",
    "hidden_delta_top_half_share_median_deep",
    "hidden_delta_top_half_share_p10_deep",
    "hidden_delta_zero_fraction_deep",
)


def frames(p: Params, values) -> dict[str, pd.DataFrame]:
    """Each variant's results as rows (seed, budget, metrics...) from the results tables (dense: budget 0)."""
    import re

    out = {}
    for v in values.variants:
        rows: dict[tuple[int, int], dict] = {}
        for k, by_seed in values.metrics(v).items():
            m = re.fullmatch(r"(.+)_b(\d+)", k)
            name, budget = (m.group(1), int(m.group(2))) if m else (k, 0)
            if name not in METRICS:
                continue
            for s_, x in by_seed.items():
                rows.setdefault((s_, budget), {"seed": s_, "budget": budget})[name] = x
        out[v] = pd.DataFrame(sorted(rows.values(), key=lambda r: (r["seed"], r["budget"])))
    return out


def _means(results: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    return {v: df.groupby("budget")[[c for c in METRICS if c in df]].mean() for v, df in results.items()}


def derived_metrics(p: Params, results: dict[str, pd.DataFrame]) -> dict[str, float]:
    """The comparisons of one eval seed's results (means over the rows given, by budget)."""
    means = _means(results)
    kinds = {v: p.variant(v).kind for v in results}
    dense = next(v for v, k in kinds.items() if k == "dense")
    dense_em = float(means[dense]["answer_em"].iloc[0])
    out: dict[str, float] = {"dense_answer_em": dense_em}
    quests = [v for v, k in kinds.items() if k == "quest"]
    sparse = [v for v, k in kinds.items() if k != "dense"]
    for qv in quests:
        qm = means[qv]
        curve = qm.sort_values("kv_density")
        for v in sparse:
            if v == qv:
                continue
            m = means[v]
            common = sorted(set(m.index) & set(qm.index))
            dr = {b: qm.loc[b, "kv_density"] / m.loc[b, "kv_density"] for b in common}
            er = {b: qm.loc[b, "attn_out_rel_err"] / m.loc[b, "attn_out_rel_err"] for b in common}
            for b in common:
                out[f"density_ratio.{v}_vs_{qv}.b{b}"] = float(dr[b])
                out[f"err_ratio.{qv}_vs_{v}.b{b}"] = float(er[b])
            if common:
                out[f"density_ratio.{v}_vs_{qv}.min"] = float(min(dr.values()))
                out[f"density_ratio.{v}_vs_{qv}.max"] = float(max(dr.values()))
                out[f"err_ratio.{qv}_vs_{v}.min"] = float(min(er.values()))
            # matched density: Quest's error interpolated (linearly in density) at this variant's density.
            # Below Quest's sparsest budget, Quest's error there is used: a lower bound of Quest's error at
            # the smaller density when its measured errors fall as density grows (checked; else NaN).
            # Above Quest's densest budget: NaN (a claim on it fails).
            xs, ys = curve["kv_density"].to_numpy(), curve["attn_out_rel_err"].to_numpy()
            for b in m.index:
                d = float(m.loc[b, "kv_density"])
                if xs[0] <= d <= xs[-1]:
                    q_err = float(np.interp(d, xs, ys))
                elif d < xs[0] and bool(np.all(np.diff(ys) <= 0)):
                    q_err = float(ys[0])
                else:
                    q_err = math.nan
                out[f"matched_density_err_ratio.{qv}_vs_{v}.b{b}"] = q_err / float(m.loc[b, "attn_out_rel_err"])
    # EM gaps: the claims on them require the gate dense_retrieves (conf: gates), untested when it fails
    for v in sparse:
        for b in means[v].index:
            gap = float(means[v].loc[b, "answer_em"]) - dense_em
            out[f"gated.answer_em_gap.{v}_minus_{dense}.b{b}"] = gap
            for w in sparse:
                if w != v and kinds[v] == "losa" and kinds[w] in ("sparsed", "quest") and b in means[w].index:
                    g = float(means[v].loc[b, "answer_em"] - means[w].loc[b, "answer_em"])
                    out[f"gated.answer_em_gap.{v}_minus_{w}.b{b}"] = g
    return out


def per_seed_comparisons(values, p: Params) -> dict:
    """:func:`derived_metrics` on each eval seed (the seeds every variant decoded): ``{name: {seed: value}}``."""
    res = frames(p, values)
    seeds = sorted(set.intersection(*(set(df["seed"]) for df in res.values())))
    out: dict = {}
    for s_ in seeds:
        for k, x in derived_metrics(p, {v: df[df["seed"] == s_] for v, df in res.items()}).items():
            out.setdefault(k, {})[s_] = x
    return out


def token_agreement(values, p: Params, artifacts: dict) -> dict:
    """``token_agreement_vs_dense.<v>.b<budget>``: per seed, % of block tokens equal to dense's decode of
    the same prompt."""
    dense = next(v for v in artifacts if p.variant(v).kind == "dense")
    ref = artifacts[dense]["blocks"]
    out: dict = {}
    for v, a in artifacts.items():
        if v == dense:
            continue
        for s_, by_budget in a["blocks"].items():
            r = np.asarray(next(iter(ref[s_].values())))
            for b, blk in by_budget.items():
                out.setdefault(f"token_agreement_vs_dense.{v}.b{b}", {})[int(s_)] = float(
                    (np.asarray(blk) == r).mean() * 100
                )
    return out


def timing_metrics(values, p: Params, timing: dict, bdlm: dict) -> dict:
    """The interleaved attention timing (ratios with their order-statistic interval over rounds; medians in
    ms) and the base model's final training loss / masked accuracy."""
    from pipelines.core.api import Estimate

    tm = timing["metrics"]
    out: dict = {
        k: Estimate(x, tm[f"{k}.ci_low"], tm[f"{k}.ci_high"], n=p.timing.rounds)
        for k, x in tm.items()
        if not k.endswith((".ci_low", ".ci_high"))
    }
    for name, ms in timing["attn_ms"].items():
        out[f"attn_ms_cpu.{name}" if timing["device"] == "cpu" else f"attn_ms.{name}"] = float(ms)
    log = bdlm["log"]
    out["base_model.final_loss"] = float(log["loss"][-1])
    out["base_model.final_masked_acc"] = float(log["masked_acc"][-1])
    return out


def report_extra(p: Params, values, artifacts: dict, timing: dict) -> dict:
    return {"timing": {k: timing[k] for k in ("clock", "device", "threads", "n_prompts", "attn_ms")}}


# ----------------------------------------------------------------------------------------- plots
def make_plots(p: Params, values, artifacts: dict, timing: dict, bdlm: dict) -> dict:
    """Accuracy vs density per method, δ-share histogram, active heatmap, density by step, timing, loss."""
    import matplotlib.pyplot as plt

    from pipelines.core.api import bar_plot, heatmap, line_plot

    results = frames(p, values)
    traces = {v: a["traces"] for v, a in artifacts.items()}
    means = _means(results)
    kinds = {v: p.variant(v).kind for v in results}
    figs = {}

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for v, m in means.items():
        m = m.sort_values("kv_density")
        style = dict(marker="*", ms=12) if kinds[v] == "dense" else dict(marker="o")
        axes[0].plot(m["kv_density"], m["attn_out_rel_err"], label=v, **style)
        axes[1].plot(m["kv_density"], m["answer_em"], label=v, **style)
        for b, r in m.iterrows():
            if kinds[v] != "dense":
                axes[0].annotate(str(b), (r["kv_density"], r["attn_out_rel_err"]), fontsize=6)
    axes[0].set(
        xlabel="KV density loaded per step (% of prefix)",
        ylabel="attention-output rel. error vs dense",
        title="local attention error vs loaded KV (labels: budget)",
    )
    axes[1].set(
        xlabel="KV density loaded per step (% of prefix)",
        ylabel="answer EM (%)",
        title="answer EM vs loaded KV (gate dense_retrieves: conf)",
    )
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    figs["accuracy_vs_density"] = fig

    dense = next(v for v, k in kinds.items() if k == "dense")
    losa = next((v for v, k in kinds.items() if k == "losa"), None)
    hist_src = dense
    tr = next(iter(traces[hist_src].values()))
    if tr["delta_share_hist"]:
        counts = np.asarray(tr["delta_share_hist"], float)
        edges = np.linspace(0, 1, len(counts) + 1)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(edges[:-1], counts / max(counts.sum(), 1), width=edges[1] - edges[0], align="edge", edgecolor="k")
        ax.set_yscale("log")
        ax.set(
            xlabel="token's share of the step's query-δ mass (block of "
            f"{p.data.block_size}; uniform = {1 / p.data.block_size:.3f})",
            ylabel="fraction of (token, layer, head, step)",
            title=f"locality: per-token query change between denoising steps ({hist_src}, seed {p.seeds[0]})",
        )
        fig.tight_layout()
        figs["delta_share_histogram"] = fig

    if losa is not None:
        budget, tr = next(iter(traces[losa].items()))
        hm = np.asarray(tr["active_heatmap"], float)
        figs["active_tokens_heatmap"] = heatmap(
            hm,
            list(range(hm.shape[1])),
            list(range(hm.shape[0])),
            fmt="{:.2f}",
            title=f"{losa}: active fraction by (step, block position), budget {budget}",
            xlabel="block position",
            ylabel="denoising step",
        )

    steps = list(range(p.decode.steps))
    series = {}
    for v, tv in traces.items():
        for b, t in tv.items():
            if kinds[v] == "dense" or b == str(min(map(int, tv))):
                series[f"{v}" + ("" if kinds[v] == "dense" else f"@{b}")] = [100 * x for x in t["density_by_step"]]
    figs["density_by_step"] = line_plot(
        steps, series, "denoising step", "KV density loaded (%)", "loaded KV per step (smallest budget of each variant)"
    )

    names = list(timing["attn_ms"])
    figs["attention_time"] = bar_plot(
        names,
        [timing["attn_ms"][n] for n in names],
        ylabel=f"ms per block decode ({timing['clock']} clock)",
        title=f"prefix attention, {timing['n_prompts']} prompts, interleaved",
    )
    log = bdlm["log"]
    figs["base_model_loss"] = line_plot(
        log["step"].tolist(), {"loss": log["loss"].tolist()}, "step", "masked-diffusion loss", "base model training"
    )
    return figs
