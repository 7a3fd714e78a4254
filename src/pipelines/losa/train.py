"""``data.bdlm``: the one base block-diffusion LM of a run (core's training loop, masked-diffusion loss
on the answer block). ``train.<variant>``: decode every eval seed with that base model under one
prefix-attention policy per budget (no training: LoSA is inference-only), and measure accuracy, loaded
KV pages, local attention error vs dense and the activity statistics."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import StepInfo, fit, node_setup
from pipelines.losa.data import BOS, EOS, MASK, PAD, SEP
from pipelines.losa.model import (
    PrefixPolicy,
    bdlm_loss,
    build_model,
    decode_block,
    locality_stats,
    noise_block,
    prefill,
)
from pipelines.losa.params import Params

log = logging.getLogger(__name__)
LOG_EVERY = 10


def _meta(tasks: dict) -> tuple[int, int]:
    return int(tasks["meta"][0]), int(tasks["meta"][1])


def train_base(tasks: dict, p: Params) -> dict:
    """``data.bdlm``: train the base model once (seed ``train.seed``); returns its state dict and the
    loss log (every 10th step) as ``{"state": ..., "log": {"step": [...], "loss": [...], ...}}``."""
    t = p.train
    dev = node_setup(p, t.seed)
    vocab, n_prefix = _meta(tasks)
    model = build_model(p, vocab, n_prefix).to(dev)
    rows = tasks["train"].long()
    hist: dict[str, list] = {"step": [], "loss": [], "masked_acc": []}

    def sample(step: int, gen: torch.Generator):
        ids = rows[torch.randint(0, len(rows), (t.batch_size,), generator=gen)]
        noised, masked, gamma = noise_block(ids, n_prefix, t.gamma_min, MASK, gen, t.full_mask_share)
        return ids.to(dev), noised.to(dev), masked.to(dev), gamma.to(dev)

    def loss(m, ids, noised, masked, gamma):
        return bdlm_loss(m, ids, noised, masked, gamma, n_prefix)

    def record(s: StepInfo) -> None:
        if s.step % LOG_EVERY == 0 or s.step == t.steps - 1:
            hist["step"].append(s.step)
            hist["loss"].append(s.loss)
            hist["masked_acc"].append(s.extras.get("masked_acc", float("nan")))
        if s.step % 100 == 0 or s.step == t.steps - 1:
            log.info("losa base model: step %d/%d loss %.4f", s.step + 1, t.steps, s.loss)

    fit(
        model,
        None,
        loss,
        steps=t.steps,
        sample_batch=sample,
        lr=t.lr,
        weight_decay=t.weight_decay,
        optimizer="adamw",
        scheduler="onecycle",
        grad_clip=t.grad_clip,
        seed=t.seed,
        desc="losa.data.bdlm",
        callback=record,
    )
    return {
        "state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "log": {k: torch.tensor(v, dtype=torch.float64) for k, v in hist.items()},
    }


def load_model(tasks: dict, bdlm: dict, p: Params, dev: torch.device):
    vocab, n_prefix = _meta(tasks)
    model = build_model(p, vocab, n_prefix)
    model.load_state_dict(bdlm["state"])
    return model.to(dev).eval(), n_prefix


def banned_tokens() -> list[int]:
    return [BOS, EOS, MASK, SEP]


def prefill_batches(model, evals: torch.Tensor, n_prefix: int, p: Params, dev: torch.device) -> list:
    """(prefix, KV cache) per batch of prompts: the prefix is encoded once per seed and shared by every
    budget (the block steps never write into it)."""
    out = []
    for i in range(0, len(evals), p.decode.batch):
        prefix = evals[i : i + p.decode.batch, :n_prefix].long().to(dev)
        out.append((prefix, prefill(model, prefix)))
    return out


def decode_config(
    model, batches: list, n_prefix: int, p: Params, spec, budget: int | None, seed: int, record: bool = True
) -> tuple[torch.Tensor, list[dict]]:
    """Decode every prompt of one eval set under one policy; returns the blocks and the policy stats."""
    B, T = p.data.block_size, p.decode.steps
    blocks, stats = [], []
    gen = torch.Generator().manual_seed(int(seed) * 7919 + (budget or 0))
    for prefix, cache in batches:
        pol = PrefixPolicy(
            spec, budget, n_prefix, p.decode.page_size, T, gen=gen, record=record, top_share=p.locality.top_share
        )
        blocks.append(decode_block(model, prefix, B, T, MASK, pol, banned_tokens(), cache).cpu())
        stats.append(pol.stats)
    # stats of all batches, concatenated along the prompt axis
    merged = []
    for j in range(len(stats[0])):
        row = dict(stats[0][j])
        for key in ("density", "rel_err", "active", "dq", "dx"):
            if key in row:
                row[key] = torch.cat([s[j][key] for s in stats], 0)
        merged.append(row)
    return torch.cat(blocks), merged


def summarise(
    blocks: torch.Tensor, evals: torch.Tensor, n_prefix: int, stats: list[dict], p: Params, reads_page_meta: bool
) -> tuple[dict, dict]:
    """Metrics of one (variant, budget, seed) and the traces the plots use."""
    target = evals[:, n_prefix:].long()
    is_value = target != PAD
    em = (blocks == target).all(1).float().mean() * 100
    value_acc = ((blocks == target) & is_value).sum() / is_value.sum().clamp(min=1) * 100
    d_all = torch.cat([r["density"].reshape(-1) for r in stats]).double()
    err = torch.cat([r["rel_err"] for r in stats]).double()
    act_rows = [r["active"] for r in stats if r["step"] > 0]
    _P, N = p.decode.page_size, n_prefix
    n_meta = stats[0]["n_meta_pages"]
    # bytes per (head, step): K + V of the loaded tokens, plus the pages' min/max keys the scorer reads
    dense_bytes = 2.0 * N
    loaded_bytes = 2.0 * d_all.mean() * N + (2.0 * n_meta if reads_page_meta else 0.0)
    m = {
        "answer_em": float(em),
        "value_token_acc": float(value_acc),
        "kv_density": float(d_all.mean() * 100),
        "attn_out_rel_err": float(err.mean()),
        "active_fraction": float(torch.cat([a.reshape(-1) for a in act_rows]).mean()) if act_rows else 1.0,
        "bytes_loaded_ratio_vs_dense": float(loaded_bytes / dense_bytes),
        "modelled_speedup": float(dense_bytes / loaded_bytes),
    }
    loc = locality_stats(stats, p.locality.top_share)
    shares = loc.pop("_delta_share_values", None)
    m.update(loc)
    steps = sorted({r["step"] for r in stats})
    trace = {
        "density_by_step": [
            float(torch.stack([r["density"].mean() for r in stats if r["step"] == s]).mean()) for s in steps
        ],
        "err_by_step": [
            float(torch.stack([r["rel_err"].mean() for r in stats if r["step"] == s]).mean()) for s in steps
        ],
        "active_heatmap": torch.stack(
            [torch.stack([r["active"].mean((0, 1)) for r in stats if r["step"] == s]).mean(0) for s in steps]
        ).tolist(),  # [T, B]
        "delta_share_hist": np.histogram(shares, bins=p.locality.hist_bins, range=(0.0, 1.0))[0].tolist()
        if shares is not None and len(shares)
        else [],
    }
    return m, trace


def decode_variant(tasks: dict, bdlm: dict, p: Params, variant: str) -> tuple[pd.DataFrame, dict]:
    """``train.<variant>``: every (eval seed, budget) decoded with the shared base model. Returns the
    results table (per seed, each budget's metrics as ``<metric>_b<budget>``, dense's unsuffixed; dense also
    carries the base model's training curves) and the artifacts: the traces (first seed) by budget and the
    decoded blocks by seed and budget (flattened; the report compares them with dense's)."""
    spec = p.variant(variant)
    if spec is None:
        raise ValueError(f"unknown losa variant {variant!r} (variants: {[v.name for v in p.variants]})")
    rows, traces = [], {}
    for seed in p.seeds:
        dev = node_setup(p, seed)
        model, n_prefix = load_model(tasks, bdlm, p, dev)
        evals = tasks[f"eval_seed{seed}"]
        batches = prefill_batches(model, evals, n_prefix, p, dev)
        for budget in p.budgets_of(spec) or [None]:
            blocks, stats = decode_config(model, batches, n_prefix, p, spec, budget, seed)
            m, tr = summarise(blocks, evals, n_prefix, stats, p, spec.kind in ("quest", "losa"))
            bad = [k for k, v in m.items() if not np.isfinite(v) and "share" not in k]
            if bad:
                raise FloatingPointError(f"losa.train.{variant}: non-finite {bad} at budget {budget}, seed {seed}")
            rows.append(
                {
                    "seed": seed,
                    "budget": budget or n_prefix,
                    "kind": spec.kind,
                    **m,
                    "blocks": blocks.reshape(-1).tolist(),
                }
            )
            if seed == p.seeds[0]:
                traces[str(budget or n_prefix)] = tr
            log.info(
                "losa.%s budget %s seed %d: EM %.1f%% density %.1f%% err %.3f",
                variant,
                budget,
                seed,
                m["answer_em"],
                m["kv_density"],
                m["attn_out_rel_err"],
            )
    blocks = {}
    for r in rows:
        blocks.setdefault(str(r["seed"]), {})[str(r["budget"])] = r["blocks"]
    return results_table(p, variant, rows, bdlm), {"traces": traces, "blocks": blocks}


def results_table(p: Params, variant: str, rows: list[dict], bdlm: dict) -> pd.DataFrame:
    from pipelines.core.api import Results
    from pipelines.losa.evaluate import METRICS

    res = Results(variant)
    dense = p.variant(variant).kind == "dense"
    for r in rows:
        suffix = "" if dense else f"_b{int(r['budget'])}"
        res.add(r["seed"], **{f"{m}{suffix}": float(r[m]) for m in METRICS if m in r and pd.notna(r[m])})
    if dense:
        steps = bdlm["log"]["step"].long().tolist()
        res.history(p.seeds[0], "base_model_loss", bdlm["log"]["loss"].tolist(), steps=steps)
        res.history(p.seeds[0], "base_model_masked_acc", bdlm["log"]["masked_acc"].tolist(), steps=steps)
    return res.table()
