"""The base model (``data.base_model``: trained once per run, then frozen) and one node per eviction policy
(``train.<variant>``): the learned variants train their indexer (KL to the teacher's future attention,
under the same streaming eviction they face) and / or their latent memory (answer CE + attention-output
residual) with core's training loop, then every variant is evaluated on every seed, task and budget."""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import NonFiniteLossError, current_node, fit, node_setup, read_user_file
from pipelines.kvindexer.data import training_sequence, vocab_of
from pipelines.kvindexer.model import Indexer, KVTransformer, LatentMemory, Protocol, indexer_kl_loss, stream, teacher
from pipelines.kvindexer.params import Params

log = logging.getLogger(__name__)
N_Q = 3  # [Q] k [ANS]


def protocol_of(p: Params) -> Protocol:
    r = p.protocol
    return Protocol(r.chunk, r.n_sink, r.recent, r.snap_window, r.snap_kernel)


def max_len_of(p: Params) -> int:
    d = p.data
    return d.context_len + d.n_needles_multi * (N_Q + d.n_values_per_needle)


def model_of(p: Params) -> KVTransformer:
    std = p.model.attn_init_std if p.model.attn_init_std is not None else p.model.d_model**-0.5
    return KVTransformer(p.model.tiny_config(vocab_of(p).size, max_len=max_len_of(p)), std)


def load_base(blob: dict, p: Params) -> KVTransformer:
    m = model_of(p)
    m.load_state_dict(blob["state_dict"])
    m.eval()
    for q in m.parameters():
        q.requires_grad_(False)
    return m


def _prompt_tensors(df: pd.DataFrame, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ctx = torch.tensor(np.stack(df["context"].map(np.asarray).to_list()), dtype=torch.long, device=dev)
    q = torch.tensor(np.stack(df["question"].map(np.asarray).to_list()), dtype=torch.long, device=dev)
    a = torch.tensor(np.stack(df["answer"].map(np.asarray).to_list()), dtype=torch.long, device=dev)
    return ctx, q, a


# ------------------------------------------------------------------------------------------ base model
# Bump when the base model's training recipe changes in code (not in params): old cache entries then miss.
BASE_RECIPE = 2
BASE_DATA_KEYS = (
    "context_len",
    "n_keys",
    "n_values",
    "n_filler",
    "n_values_per_needle",
    "n_needles_multi",
    "multikey_distinct_values",
)


def base_cache_key(p: Params) -> str:
    """Hash of everything that determines the trained base model: its sizes and training parameters, the
    generator parameters of its training sequences and the recipe version (not the eval / policy keys)."""
    import hashlib
    import json

    blob = {
        "recipe": BASE_RECIPE,
        "model": p.model.model_dump(exclude={"init_path", "cache_dir"}),
        "data": {k: getattr(p.data, k) for k in BASE_DATA_KEYS},
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cache_file(p: Params):
    from pathlib import Path

    return Path(p.model.cache_dir) / f"base_{base_cache_key(p)}.pt" if p.model.cache_dir else None


def train_base(p: Params) -> dict:
    """Train the base LM once (``model.seed``): batches alternate one-needle prompts and multi-needle
    prompts that ask every key in turn; the loss covers every token after the context. With
    ``model.cache_dir`` the trained model is kept there under :func:`base_cache_key` and a later run with
    the same key loads it instead of training; ``model.init_path`` loads a given state dict."""
    m, d = p.model, p.data
    dev = node_setup(p, m.seed)
    model = model_of(p).to(dev)
    if m.init_path:
        model.load_state_dict(read_user_file(m.init_path, key="kvindexer.model.init_path", kind="pt")["state_dict"])
        return {
            "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
            "history": [],
            "seed": m.seed,
            "source": "init_path",
        }
    cached = _cache_file(p)
    if cached is not None and cached.exists():
        blob = torch.load(cached, map_location="cpu")
        if blob.get("key") != base_cache_key(p):
            raise ValueError(
                f"kvindexer model.cache_dir: {cached} holds key {blob.get('key')!r}, "
                f"expected {base_cache_key(p)!r} (delete the file)"
            )
        model.load_state_dict(blob["state_dict"])
        log.info("kvindexer base model: loaded from the cache %s", cached)
        return {
            "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
            "history": blob["history"],
            "seed": m.seed,
            "source": "cache",
            "cache_key": blob["key"],
        }
    v, N = vocab_of(p), d.context_len
    rng = np.random.default_rng([m.seed, 5])

    def sample(step: int, gen: torch.Generator):
        multi = step % 2 == 1
        seqs = [
            training_sequence(rng, N, v, multi, d.n_values_per_needle, d.n_needles_multi, d.multikey_distinct_values)
            for _ in range(m.batch_size)
        ]
        return (torch.tensor(seqs, dtype=torch.long, device=dev),)

    def loss_fn(model, ids):
        logits = model(ids[:, :-1])[:, N - 1 :]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, N:].reshape(-1))

    hist: list[float] = []
    fit(
        model,
        None,
        loss_fn,
        steps=m.steps,
        sample_batch=sample,
        lr=m.lr,
        weight_decay=m.weight_decay,
        scheduler="onecycle",
        seed=m.seed,
        desc="kvindexer.base",
        callback=lambda s: hist.append(s.loss),
        grad_clip=1.0,
    )
    out = {
        "state_dict": {k: t.detach().cpu() for k, t in model.state_dict().items()},
        "history": hist,
        "seed": m.seed,
        "source": "trained",
    }
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        torch.save({**out, "key": base_cache_key(p)}, tmp)
        tmp.replace(cached)  # atomic: a killed run never leaves half a model
        out["cache_key"] = base_cache_key(p)
    return out


# ------------------------------------------------------------------------------------------ learned parts
def train_indexer(model: KVTransformer, tr: pd.DataFrame, p: Params, seed: int, dev) -> tuple[Indexer, list]:
    """KL distillation of the teacher's future attention (on the surviving cache) into the indexer, under
    chunked streaming eviction by the indexer itself: every ``refresh_every`` steps the current indexer
    streams ``rollout_size`` prompts at every budget (DAgger-style), and the steps draw minibatches of the
    evictions it met (budgets cycled)."""
    ix, pr, c = p.indexer, protocol_of(p), p.protocol.chunk
    torch.manual_seed(seed)
    indexer = Indexer(len(model.blocks), p.model.d_model, ix.heads, ix.dim).to(dev)
    ctx, q, a = _prompt_tensors(tr, dev)
    fut, _ = teacher(model, torch.cat([ctx, q, a], 1), c, ctx.shape[1])
    budgets = p.protocol.budgets

    buffer: dict[int, list] = {}

    def rollouts(gen: torch.Generator) -> None:
        """Stream ``rollout_size`` prompts under eviction by the current indexer, at every budget, and keep
        the (chunk queries, surviving cache, teacher target) records of every eviction."""
        ii = torch.randperm(len(ctx), generator=gen)[: ix.rollout_size].to(dev)
        with torch.no_grad():
            for b in budgets:
                buffer[b] = stream(
                    model, ctx[ii], q[ii], "indexer", b, pr, indexer=indexer, future=fut[ii], collect=True
                ).records

    def sample(step: int, gen: torch.Generator):
        if step % ix.refresh_every == 0:
            rollouts(gen)
        recs = buffer[budgets[step % len(budgets)]]
        n = len(recs[0][1]) if recs else 0
        sel = torch.randperm(n, generator=gen)[: ix.batch_size].to(dev) if n else None
        return (torch.zeros(ix.batch_size), [(l, hq[sel], hk[sel], pr_[sel], t[sel]) for l, hq, hk, pr_, t in recs])

    def loss_fn(m, ii, records):
        if not records:
            return sum(q_.sum() for q_ in m.parameters()) * 0.0
        return indexer_kl_loss(m, records)

    hist: list[float] = []
    fit(
        indexer,
        None,
        loss_fn,
        steps=ix.steps,
        sample_batch=sample,
        lr=ix.lr,
        scheduler="onecycle",
        seed=seed,
        desc="kvindexer.indexer",
        callback=lambda s: hist.append(s.loss),
        grad_clip=1.0,
    )
    indexer.eval()
    return indexer, hist


def train_memory(
    model: KVTransformer, tr: pd.DataFrame, p: Params, seed: int, dev, policy: str, indexer: Indexer | None
) -> tuple[LatentMemory, list]:
    """The latent memory under ``policy`` eviction (base and indexer frozen): CE on the answer tokens
    (teacher-forced) + beta · Σ_l MSE(final-chunk attention output, the full-KV teacher's)."""
    mm, pr, c, N = p.memory, protocol_of(p), p.protocol.chunk, p.data.context_len
    torch.manual_seed(seed)
    cfg = model.config
    memory = LatentMemory(cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads, mm.dim, mm.gate_init).to(dev)
    ctx, q, a = _prompt_tensors(tr, dev)
    _, tout = teacher(model, torch.cat([ctx, q, a], 1), c, N)
    budgets = [mm.train_budget] if mm.train_budget else p.protocol.budgets
    n_a, s0 = a.shape[1], N - c

    def sample(step: int, gen: torch.Generator):
        ii = torch.randint(0, len(ctx), (mm.batch_size,), generator=gen).to(dev)
        return ii, budgets[step % len(budgets)]

    def loss_fn(mem, ii, budget):
        tail = torch.cat([q[ii], a[ii, :-1]], 1)
        out = stream(model, ctx[ii], tail, policy, budget, pr, indexer=indexer, memory=mem, keep_out=True)
        lg = out.logits[:, c + N_Q - 1 : c + N_Q - 1 + n_a]
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), a[ii].reshape(-1))
        t_last = out.outs[0].shape[2]
        mse = sum(F.mse_loss(out.outs[l], tout[ii, l, :, s0 : s0 + t_last]) for l in out.outs)
        return ce + mm.beta * mse, {"ce": ce.item(), "mse": float(mse.detach())}

    hist: list[float] = []
    fit(
        memory,
        None,
        loss_fn,
        steps=mm.steps,
        sample_batch=sample,
        lr=mm.lr,
        scheduler="onecycle",
        seed=seed,
        desc="kvindexer.memory",
        callback=lambda s: hist.append(s.loss),
        grad_clip=1.0,
    )
    memory.eval()
    return memory, hist


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate_policy(
    model: KVTransformer,
    ev: pd.DataFrame,
    p: Params,
    policy: str,
    budget: int,
    dev,
    *,
    indexer=None,
    memory=None,
    fut=None,
    tout=None,
    seed: int = 0,
) -> pd.DataFrame:
    """Per prompt: exact match of the 4 answer tokens (teacher-forced argmax at every answer position,
    which is all-correct exactly when greedy decoding is), needle-token recall at answer time (over layers
    and heads), KV bytes and memory-state bytes held, attention-output residual error, indexer KL.
    Prompts go in batches of ``eval.batch_size``."""
    gen = torch.Generator(device=dev).manual_seed(int(seed) * 1000 + budget)
    bs = p.eval.batch_size
    return pd.concat(
        [
            _evaluate_batch(
                model,
                ev.iloc[s : s + bs],
                p,
                policy,
                budget,
                dev,
                indexer,
                memory,
                None if fut is None else fut[s : s + bs],
                tout[s : s + bs],
                gen,
            )
            for s in range(0, len(ev), bs)
        ],
        ignore_index=True,
    )


def _evaluate_batch(model, ev, p, policy, budget, dev, indexer, memory, fut, tout, gen) -> pd.DataFrame:
    pr, c, N = protocol_of(p), p.protocol.chunk, p.data.context_len
    ctx, q, a = _prompt_tensors(ev, dev)
    n_a = a.shape[1]
    out = stream(
        model,
        ctx,
        torch.cat([q, a[:, :-1]], 1),
        "full_kv" if policy == "full_kv" else policy.removesuffix("_memory"),
        budget,
        pr,
        indexer=indexer,
        memory=memory,
        future=fut,
        generator=gen,
        keep_out=True,
    )
    pred = out.logits[:, c + N_Q - 1 : c + N_Q - 1 + n_a].argmax(-1)
    if not torch.isfinite(out.logits).all():
        raise NonFiniteLossError(f"node '{current_node.get()}': non-finite logits for policy {policy}")
    correct = (pred == a).all(-1)
    B = len(ev)
    recall = torch.zeros(B, device=dev)
    for l, ps in enumerate(out.positions):
        for i, npos in enumerate(ev["needle_pos"]):
            npos_t = torch.as_tensor(np.asarray(npos), device=dev)
            recall[i] += (ps[i][..., None] == npos_t).any(1).float().mean() / len(out.positions)
    s0 = N - c
    t_last = out.outs[0].shape[2]
    err = torch.zeros(B, device=dev)
    for l, o in out.outs.items():
        ref = tout[:, l, :, s0 : s0 + t_last]
        err += ((o - ref) ** 2).sum((1, 2, 3)) / (ref**2).sum((1, 2, 3)) / len(out.outs)
    kv_bytes = out.cache.nbytes() / B
    mem_bytes = out.mem_state.nbytes() / B if out.mem_state is not None else 0.0
    return pd.DataFrame(
        {
            "variant": policy,
            "budget": budget,
            "idx": ev["idx"].to_numpy(),
            "task": ev["task"].to_numpy(),
            "depth": ev["depth"].to_numpy(),
            "correct": correct.cpu().numpy().astype(float),
            "needle_recall": recall.cpu().numpy(),
            "attn_out_residual_err": err.cpu().numpy(),
            "kv_bytes": kv_bytes,
            "mem_bytes": mem_bytes,
            "kl_indexer_vs_teacher": float(np.mean(out.kl)) if out.kl else math.nan,
        }
    )


def train_variant(kv_train: pd.DataFrame, kv_eval: pd.DataFrame, kv_base: dict, p: Params, variant: str):
    """Train what ``variant`` learns (per seed) and evaluate it on every task and budget; ``indexer_memory``
    also times one-token decode of its cache against the full one (interleaved, in this process).
    Returns the long results table and the artifacts: the per-prompt results (the plots and depth curves
    read them), {seed: state dicts} and, for ``indexer_memory``, the timing record."""
    results, trained = [], {}
    for seed in p.seeds:
        dev = node_setup(p, int(seed))
        model = load_base(kv_base, p).to(dev)
        tr = kv_train[kv_train.seed == seed]
        indexer = memory = None
        hist: dict[str, list] = {}
        if variant in ("indexer", "indexer_memory"):
            indexer, hist["indexer_kl"] = train_indexer(model, tr, p, int(seed), dev)
        if variant.endswith("_memory"):
            memory, hist["memory_loss"] = train_memory(
                model, tr, p, int(seed), dev, variant.removesuffix("_memory"), indexer
            )
        trained[int(seed)] = {
            "indexer": indexer.state_dict() if indexer is not None else None,
            "memory": memory.state_dict() if memory is not None else None,
            "history": hist,
        }
        for _task, ev in kv_eval[kv_eval.seed == seed].groupby("task", sort=False):
            ctx, q, a = _prompt_tensors(ev, dev)
            fut, tout = teacher(model, torch.cat([ctx, q, a], 1), p.protocol.chunk, p.data.context_len)
            budgets = p.protocol.budgets[:1] if variant == "full_kv" else p.protocol.budgets
            for budget in budgets:
                r = evaluate_policy(
                    model,
                    ev,
                    p,
                    variant,
                    budget,
                    dev,
                    indexer=indexer,
                    memory=memory,
                    fut=fut,
                    tout=tout,
                    seed=int(seed),
                )
                if variant == "full_kv":  # no eviction: the same result stands at every budget
                    r = pd.concat([r.assign(budget=b) for b in p.protocol.budgets], ignore_index=True)
                results.append(r.assign(seed=int(seed)))
    prompts = pd.concat(results, ignore_index=True)
    timing = None
    if variant == "indexer_memory":
        from pipelines.kvindexer.evaluate import measure_speed

        timing = measure_speed(p, kv_eval, kv_base, trained)
    arts = {"prompts": table_to_tensors(prompts), "trained": trained}
    if timing is not None:
        arts["timing"] = timing
    return results_table(p, variant, prompts, trained, kv_base, timing), arts


def results_table(
    p: Params, variant: str, df: pd.DataFrame, trained: dict, kv_base: dict, timing: dict | None = None
) -> pd.DataFrame:
    """The long table of one variant, per seed: EM (%), needle recall, residual error, KL and bytes per
    (task, budget), the RULER-mini average per budget, full KV's EM per task; the training curves (the
    indexer's KL, the memory's loss; the base model's loss under ``full_kv``, on the first seed) and, for
    ``indexer_memory``, the decode timing on the first seed."""
    from pipelines.core.api import Results

    res = Results(variant)
    for seed, d in df.groupby("seed"):
        row: dict[str, float] = {}
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
        res.add(int(seed), **row)
        for k, h in trained.get(int(seed), {}).get("history", {}).items():
            res.history(int(seed), k, h)
    first = int(p.seeds[0])
    if variant == "full_kv" and kv_base.get("history"):
        res.history(first, "base_loss", kv_base["history"])
    if timing is not None:
        res.add(first, **{k: timing[k] for k in TIMING_METRICS})
    return res.table()


# what the decode timing adds to indexer_memory's table (first seed); evaluate.timing_metrics names them
TIMING_METRICS = (
    "decode_ms_per_token_cpu_full_kv",
    "decode_ms_per_token_cpu",
    "decode_speedup",
    "decode_speedup_ci_low",
    "decode_speedup_ci_high",
    "timing_rounds",
    "timing_kv_entries_full",
    "timing_kv_entries_evicted",
)


def table_to_tensors(df: pd.DataFrame) -> dict:
    """A per-prompt table as {column: tensor | list of str} (the tensors artifact loads weights-only)."""
    out = {}
    for c in df.columns:
        col = df[c]
        out[c] = (
            torch.from_numpy(np.ascontiguousarray(col.to_numpy()))
            if pd.api.types.is_numeric_dtype(col)
            else col.astype(str).tolist()
        )
    return out


def tensors_to_table(d: dict) -> pd.DataFrame:
    return pd.DataFrame({c: (v.numpy() if isinstance(v, torch.Tensor) else list(v)) for c, v in d.items()})
