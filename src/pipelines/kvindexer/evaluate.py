"""Metrics, the side-by-side decode timing, plots and the report of `kvindexer`."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.report import build_report
from pipelines.kvindexer.params import Params

HEURISTICS = ("streamingllm", "h2o", "snapkv")
NON_RANDOM = ("streamingllm", "h2o", "snapkv", "oracle", "indexer", "indexer_memory", "h2o_memory")


def _rows(results: dict[str, pd.DataFrame]) -> list[dict]:
    """One row per (variant, seed): EM (%), needle recall, residual error, KL and bytes per (task, budget)."""
    rows = []
    for variant, df in results.items():
        for seed, d in df.groupby("seed"):
            row = {"variant": variant, "seed": int(seed)}
            for (task, budget), g in d.groupby(["task", "budget"]):
                row[f"em_{task}_{budget}"] = 100.0 * g["correct"].mean()
                row[f"recall_of_needle_tokens_{task}_{budget}"] = g["needle_recall"].mean()
                row[f"attn_out_residual_err_{task}_{budget}"] = g["attn_out_residual_err"].mean()
                if g["kl_indexer_vs_teacher"].notna().any():
                    row[f"kl_indexer_vs_teacher_{task}_{budget}"] = g["kl_indexer_vs_teacher"].mean()
                row[f"kv_bytes_{budget}"] = g["kv_bytes"].mean()
                row[f"mem_bytes_{budget}"] = g["mem_bytes"].mean()
                row[f"total_bytes_{budget}"] = g["kv_bytes"].mean() + g["mem_bytes"].mean()
            for budget, g in d.groupby("budget"):
                row[f"ruler_mini_avg_{budget}"] = 100.0 * g.groupby("task")["correct"].mean().mean()
            if variant == "full_kv":
                for task, g in d.groupby("task"):
                    row[f"em_{task}"] = 100.0 * g[g.budget == g.budget.iloc[0]]["correct"].mean()
            rows.append(row)
    return rows


def _means(rows: list[dict]) -> dict[str, dict[str, float]]:
    df = pd.DataFrame(rows)
    return {v: g.drop(columns=["variant", "seed"]).mean(numeric_only=True).to_dict() for v, g in df.groupby("variant")}


def derived(p: Params, means: dict[str, dict[str, float]]) -> dict[str, float]:
    """The gaps the claims read (EM points on seed means), the bytes ratios; NaN where a variant is absent."""
    def em(v, task, b):
        return means.get(v, {}).get(f"em_{task}_{b}", math.nan)

    out: dict[str, float] = {}
    budgets = p.protocol.budgets
    for task in p.eval.tasks:
        sfx = "" if task == "niah_single" else f"_{task.removeprefix('niah_')}"
        for b in budgets:
            ind = em("indexer", task, b)
            out[f"gap_indexer_vs_best_of_h2o_streamingllm{sfx}_{b}"] = ind - max(em("h2o", task, b),
                                                                                   em("streamingllm", task, b))
            out[f"gap_oracle_minus_indexer{sfx}_{b}"] = em("oracle", task, b) - ind
            out[f"gap_indexer_vs_best_heuristic{sfx}_{b}"] = ind - max(em(h, task, b) for h in HEURISTICS)
            out[f"gap_indexer_memory_minus_indexer{sfx}_{b}"] = em("indexer_memory", task, b) - ind
            out[f"gap_full_minus_worst_nonrandom{sfx}_{b}"] = em("full_kv", task, b) - min(
                em(v, task, b) for v in NON_RANDOM)
        if len(budgets) >= 2:
            b0, b1 = sorted(budgets)[:2]
            out[f"gap_indexer_vs_best_heuristic_min{sfx}_{b0}_{b1}"] = min(
                out[f"gap_indexer_vs_best_heuristic{sfx}_{b0}"], out[f"gap_indexer_vs_best_heuristic{sfx}_{b1}"])
    for b in budgets:
        full = means.get("full_kv", {}).get(f"total_bytes_{b}", math.nan)
        for v, m in means.items():
            out[f"kv_bytes_ratio_{v}_{b}"] = m.get(f"total_bytes_{b}", math.nan) / full
    # any claim metric not computed here (a variant or budget left out of this run) reads NaN: never holds
    for c in p.claims:
        if not c.metric.startswith("variants.") and c.metric not in out:
            out[c.metric] = math.nan
    return out


# ------------------------------------------------------------------------------------------ timing
def measure_speed(p: Params, kv_eval: pd.DataFrame, kv_base: dict, trained_indexer_memory: dict | None = None) -> dict:
    """Decode time per token, side by side in one process: the full-KV cache vs the IndexMem cache at
    ``eval.timing_budget`` (memory readout included), batch 1, interleaved rounds (median ratio and its
    interval). Untrained indexer/memory weights are used when the indexer_memory variant is not run (the
    cost does not depend on the weights)."""
    import torch

    from pipelines.core.metrics import interleaved_timing, ratio_ci
    from pipelines.core.runtime import node_setup
    from pipelines.core.seqmodels import KVCache
    from pipelines.kvindexer.model import AttnContext, Indexer, LatentMemory, stream
    from pipelines.kvindexer.train import _prompt_tensors, load_base, protocol_of

    seed = p.seeds[0]
    dev = node_setup(p, seed)
    model = load_base(kv_base, p).to(dev)
    cfg = model.config
    indexer = Indexer(cfg.n_layers, cfg.d_model, p.indexer.heads, p.indexer.dim).to(dev)
    memory = LatentMemory(cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads, p.memory.dim,
                          p.memory.gate_init).to(dev)
    if trained_indexer_memory and seed in trained_indexer_memory:
        indexer.load_state_dict(trained_indexer_memory[seed]["indexer"])
        memory.load_state_dict(trained_indexer_memory[seed]["memory"])
    ev = kv_eval[(kv_eval.seed == seed) & (kv_eval.task == kv_eval.task.iloc[0])].iloc[:1]
    ctx, q, _ = _prompt_tensors(ev, dev)
    pr, C, n_tok = protocol_of(p), p.eval.timing_budget, p.eval.timing_tokens
    with torch.no_grad():
        full = stream(model, ctx, q, "full_kv", C, pr)
        evicted = stream(model, ctx, q, "indexer", C, pr, indexer=indexer, memory=memory)

    def decoder(out, mem):
        first = out.logits[:, -1].argmax(-1)

        def run():
            cache = KVCache(list(out.cache.keys), list(out.cache.values), out.cache.positions.clone(),
                            out.cache.next_position)
            st = None
            if mem is not None:
                st = type(out.mem_state)(list(out.mem_state.M), list(out.mem_state.z))
            model.use(AttnContext(memory=mem, mem_state=st))
            try:
                with torch.no_grad():
                    nxt = first
                    for _ in range(n_tok):
                        nxt = model(nxt[:, None], cache=cache)[:, -1].argmax(-1)
            finally:
                model.use(None)
        return run

    t = interleaved_timing({"full": decoder(full, None), "evicted": decoder(evicted, memory)},
                           rounds=p.eval.timing_rounds, warmup=2, clock="wall")
    per_tok = {k: v / n_tok for k, v in t.items()}
    est = ratio_ci(per_tok["full"], per_tok["evicted"])
    return {"decode_ms_per_token_cpu_full_kv": 1e3 * float(np.median(per_tok["full"])),
            f"decode_ms_per_token_cpu_indexer_memory_{C}": 1e3 * float(np.median(per_tok["evicted"])),
            **est.as_metrics(f"decode_speedup_indexer_memory_{C}"),
            "timing_rounds": len(per_tok["full"]), "timing_kv_entries_full": len(full.cache),
            "timing_kv_entries_evicted": len(evicted.cache), "timing_device": str(dev)}


# ------------------------------------------------------------------------------------------ plots
def make_plots(p: Params, **results: pd.DataFrame) -> dict:
    """``results``: ``results_<variant>`` per-prompt tables."""
    import matplotlib.pyplot as plt

    results = {k.removeprefix("results_"): v for k, v in results.items()}

    df = pd.concat([r for r in results.values()], ignore_index=True)
    figs = {}
    tasks = list(dict.fromkeys(df["task"]))
    variants = list(results)
    # compression curve: EM vs budget, every policy, per task
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        d = df[df.task == task]
        for v in variants:
            g = d[d.variant == v].groupby("budget")["correct"].mean() * 100
            ax.plot(g.index, g.values, "o-", label=v)
        ax.set(xlabel="KV budget C (tokens per layer)", ylabel="exact match (%)", title=f"{task}: compression curve")
        ax.grid(alpha=.3)
    axes[0][-1].legend(fontsize=7)
    figs["compression_curve"] = fig
    # needle retention: needle-token recall at answer time vs budget
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        d = df[df.task == task]
        for v in variants:
            g = d[d.variant == v].groupby("budget")["needle_recall"].mean()
            ax.plot(g.index, g.values, "o-", label=v)
        ax.set(xlabel="KV budget C", ylabel="needle tokens cached at answer time", title=f"{task}: needle retention")
        ax.grid(alpha=.3)
    axes[0][-1].legend(fontsize=7)
    figs["needle_retention"] = fig
    # NIAH heatmap per policy: EM by needle-depth decile x budget (niah_single)
    d = df[df.task == tasks[0]].assign(decile=lambda x: np.minimum((x["depth"] * 10).astype(int), 9))
    budgets = sorted(d["budget"].unique())
    n = len(variants)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, v in zip(axes.flat, variants):
        g = d[d.variant == v].pivot_table(index="budget", columns="decile", values="correct", aggfunc="mean")
        g = g.reindex(index=budgets, columns=range(10))
        ax.imshow(g.to_numpy() * 100, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set(title=v, xlabel="needle depth decile", ylabel="budget C", yticks=range(len(budgets)),
               yticklabels=budgets)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{tasks[0]}: EM (%) by needle depth and budget")
    fig.tight_layout()
    figs["niah_heatmap"] = fig
    return figs


# ------------------------------------------------------------------------------------------ report
def depth_curves(df: pd.DataFrame) -> dict:
    d = df[df.task == "niah_single"].assign(decile=lambda x: np.minimum((x["depth"] * 10).astype(int), 9))
    out = {}
    for (v, b), g in d.groupby(["variant", "budget"]):
        s = g.groupby("decile")["correct"].mean() * 100
        out[f"{v}_{b}"] = [None if i not in s.index else float(s[i]) for i in range(10)]
    return out


def report(p: Params, plots: dict, timing: dict, kv_base: dict, **outputs) -> dict:
    """``outputs``: ``results_<variant>`` (per-prompt tables) and ``trained_<variant>`` (state dicts and
    training histories per seed)."""
    trained = {k.removeprefix("trained_"): v for k, v in outputs.items() if k.startswith("trained_")}
    results = {k.removeprefix("results_"): v for k, v in outputs.items() if k.startswith("results_")}
    rows = _rows(results)
    means = _means(rows)
    metrics = derived(p, means)
    metrics.update({k: v for k, v in timing.items() if isinstance(v, int | float)})
    if "full_kv" in means:
        metrics["gate_passed"] = float(means["full_kv"].get("em_niah_single", math.nan) >= p.eval.gate_em)
    histories = {"run": {"base_loss": kv_base.get("history", [])}}
    for v, per_seed in trained.items():
        h = per_seed.get(p.seeds[0], {}).get("history", {})
        if h:
            histories[v] = dict(h)
    df = pd.concat(list(results.values()), ignore_index=True)
    return build_report("kvindexer", p, rows, metrics, artifacts=plots, histories=histories,
                        extra={"niah_depth_curve": depth_curves(df), "timing": timing})
