"""Metrics, the side-by-side decode timing, plots and the report of `kvindexer`."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.api import Diff, Estimate, Fn, Gain, Ratio, paired
from pipelines.kvindexer.params import Params
from pipelines.kvindexer.train import TIMING_METRICS, tensors_to_table

HEURISTICS = ("streamingllm", "h2o", "snapkv")
NON_RANDOM = ("streamingllm", "h2o", "snapkv", "oracle", "indexer", "indexer_memory", "h2o_memory")


def _em(task: str, b: int) -> str:
    return f"em_{task}_{b}"


def _sfx(task: str) -> str:
    return "" if task == "niah_single" else f"_{task.removeprefix('niah_')}"


def _pick(values, cands, metric: str, best=max) -> str | None:
    """The candidate with the best (``max``) or worst (``min``) seed mean of ``metric``, None if none ran."""
    cands = [v for v in cands if v in values.variants and values.has(v, metric)]
    return best(cands, key=lambda v: values.mean(v, metric)) if cands else None


def full_minus_worst(values, p: Params) -> dict:
    """Full KV minus the worst non-random policy (by seed mean) at every (task, budget), per seed."""
    out = {}
    for task in p.eval.tasks:
        for b in p.protocol.budgets:
            m = _em(task, b)
            worst = _pick(values, NON_RANDOM, m, min)
            if worst is None:
                continue
            full, w = values.per_seed("full_kv", m), values.per_seed(worst, m)
            out[f"gap_full_minus_worst_nonrandom{_sfx(task)}_{b}"] = {s: full[s] - w[s] for s in paired(full, w)}
    return out


def _min_names(p: Params, planned) -> list[str]:
    if len(p.protocol.budgets) < 2 or not any(h in planned for h in HEURISTICS):
        return []
    b0, b1 = sorted(p.protocol.budgets)[:2]
    return [f"gap_indexer_vs_best_heuristic_min{_sfx(t)}_{b0}_{b1}" for t in p.eval.tasks]


def min_gap_two_smallest_budgets(values, p: Params) -> dict:
    """min over the two smallest budgets of (indexer − best heuristic), per seed (the best heuristic of
    each budget chosen by its seed mean)."""
    out = {}
    b0, b1 = sorted(p.protocol.budgets)[:2]
    for task in p.eval.tasks:
        gaps = []
        for b in (b0, b1):
            m = _em(task, b)
            best = _pick(values, HEURISTICS, m)
            ind, h = values.per_seed("indexer", m), values.per_seed(best, m)
            gaps.append({s: ind[s] - h[s] for s in paired(ind, h)})
        out[f"gap_indexer_vs_best_heuristic_min{_sfx(task)}_{b0}_{b1}"] = {
            s: min(gaps[0][s], gaps[1][s]) for s in paired(*gaps)
        }
    return out


def _timing_names(p: Params, planned) -> list[str]:
    C = p.eval.timing_budget
    return [
        f"decode_speedup_indexer_memory_{C}",
        "decode_ms_per_token_cpu_full_kv",
        f"decode_ms_per_token_cpu_indexer_memory_{C}",
        "timing_rounds",
        "timing_kv_entries_full",
        "timing_kv_entries_evicted",
    ]


def timing_metrics(values, p: Params) -> dict:
    """The decode timing of train.indexer_memory (first seed) under the report's names: the speedup with
    its own order-statistic interval over the interleaved rounds, the per-token times, the cache sizes."""
    C, s = p.eval.timing_budget, int(p.seeds[0])
    t = {k: values.per_seed("indexer_memory", k)[s] for k in TIMING_METRICS}
    return {
        f"decode_speedup_indexer_memory_{C}": Estimate(
            t["decode_speedup"], t["decode_speedup_ci_low"], t["decode_speedup_ci_high"], int(t["timing_rounds"])
        ),
        "decode_ms_per_token_cpu_full_kv": t["decode_ms_per_token_cpu_full_kv"],
        f"decode_ms_per_token_cpu_indexer_memory_{C}": t["decode_ms_per_token_cpu"],
        "timing_rounds": t["timing_rounds"],
        "timing_kv_entries_full": t["timing_kv_entries_full"],
        "timing_kv_entries_evicted": t["timing_kv_entries_evicted"],
    }


def derived(p: Params) -> list:
    """The gaps the claims read (EM points, per seed, paired), the bytes ratios and the decode timing."""
    out: list = []
    for task in p.eval.tasks:
        sfx = _sfx(task)
        for b in p.protocol.budgets:
            m = _em(task, b)
            out += [
                Gain(
                    m,
                    "indexer",
                    best_of=("h2o", "streamingllm"),
                    name=f"gap_indexer_vs_best_of_h2o_streamingllm{sfx}_{b}",
                ),
                Diff(m, "oracle", "indexer", name=f"gap_oracle_minus_indexer{sfx}_{b}"),
                Gain(m, "indexer", best_of=HEURISTICS, name=f"gap_indexer_vs_best_heuristic{sfx}_{b}"),
                Diff(m, "indexer_memory", "indexer", name=f"gap_indexer_memory_minus_indexer{sfx}_{b}"),
            ]
    out.append(
        Fn(
            full_minus_worst,
            lambda p, planned: [
                f"gap_full_minus_worst_nonrandom{_sfx(t)}_{b}"
                for t in p.eval.tasks
                for b in p.protocol.budgets
                if any(v in planned for v in NON_RANDOM)
            ],
            needs_=["full_kv"],
        )
    )
    out.append(Fn(min_gap_two_smallest_budgets, _min_names, needs_=["indexer"]))
    out += [
        Ratio(f"total_bytes_{b}", v, "full_kv", name=f"kv_bytes_ratio_{v}_{b}")
        for b in p.protocol.budgets
        for v in p.variants
    ]
    out.append(Fn(timing_metrics, _timing_names, needs_=["indexer_memory"]))
    return out


# ------------------------------------------------------------------------------------------ timing
def measure_speed(p: Params, kv_eval: pd.DataFrame, kv_base: dict, trained_indexer_memory: dict | None = None) -> dict:
    """Decode time per token, side by side in one process (train.indexer_memory calls it after training):
    the full-KV cache vs the IndexMem cache at ``eval.timing_budget`` (memory readout included), batch 1,
    interleaved rounds (median ratio and its order-statistic interval). Without trained weights it uses
    untrained ones (the cost does not depend on the weights)."""
    import torch

    from pipelines.core.api import KVCache, interleaved_timing, node_setup, ratio_ci
    from pipelines.kvindexer.model import AttnContext, Indexer, LatentMemory, stream
    from pipelines.kvindexer.train import _prompt_tensors, load_base, protocol_of

    seed = p.seeds[0]
    dev = node_setup(p, seed)
    model = load_base(kv_base, p).to(dev)
    cfg = model.config
    indexer = Indexer(cfg.n_layers, cfg.d_model, p.indexer.heads, p.indexer.dim).to(dev)
    memory = LatentMemory(cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads, p.memory.dim, p.memory.gate_init).to(
        dev
    )
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
            cache = KVCache(
                list(out.cache.keys), list(out.cache.values), out.cache.positions.clone(), out.cache.next_position
            )
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

    t = interleaved_timing(
        {"full": decoder(full, None), "evicted": decoder(evicted, memory)},
        rounds=p.eval.timing_rounds,
        warmup=2,
        clock="wall",
    )
    per_tok = {k: v / n_tok for k, v in t.items()}
    est = ratio_ci(per_tok["full"], per_tok["evicted"])
    return {
        "decode_ms_per_token_cpu_full_kv": 1e3 * float(np.median(per_tok["full"])),
        "decode_ms_per_token_cpu": 1e3 * float(np.median(per_tok["evicted"])),
        "decode_speedup": est.ratio,
        "decode_speedup_ci_low": est.ci_low,
        "decode_speedup_ci_high": est.ci_high,
        "timing_rounds": len(per_tok["full"]),
        "timing_kv_entries_full": len(full.cache),
        "timing_kv_entries_evicted": len(evicted.cache),
        "timing_budget": C,
        "timing_device": str(dev),
    }


# ------------------------------------------------------------------------------------------ plots
def prompt_tables(artifacts: dict) -> dict[str, pd.DataFrame]:
    """{variant: per-prompt results} from the train nodes' artifacts."""
    return {v: tensors_to_table(a["prompts"]) for v, a in artifacts.items()}


def make_plots(p: Params, values, artifacts: dict) -> dict:
    """Compression curves, needle retention and the NIAH heatmap, from the per-prompt results."""
    import matplotlib.pyplot as plt

    results = prompt_tables(artifacts)
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
        ax.grid(alpha=0.3)
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
        ax.grid(alpha=0.3)
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
        ax.set(
            title=v, xlabel="needle depth decile", ylabel="budget C", yticks=range(len(budgets)), yticklabels=budgets
        )
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


def report_extra(p: Params, values, artifacts: dict) -> dict:
    """The NIAH depth curves (EM by needle-depth decile, pooled over seeds) and the timing record."""
    df = pd.concat(list(prompt_tables(artifacts).values()), ignore_index=True)
    timing = artifacts.get("indexer_memory", {}).get("timing")
    return {"niah_depth_curve": depth_curves(df), **({"timing": timing} if timing is not None else {})}
