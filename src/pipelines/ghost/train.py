"""Training the SSM language model once per run (the cached ``mamba2_tiny_model``), and one
``train.<variant>`` node per pruning method: scores on each calibration seed's subset, pruning over the
ratio grid, test perplexity of each pruned model (no fine-tuning, no weight reconstruction)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import fit, node_setup
from pipelines.ghost import model as M
from pipelines.ghost.params import Params


def train_model(corpus: dict[str, torch.Tensor], p: Params) -> dict:
    """Train the SSM LM with core's loop (chunked SSD forward) → ``{"config", "state_dict", "history",
    "dense_val_nll"}``."""
    device = node_setup(p, p.train.seed)
    t = p.train
    cfg = M.model_config(p)
    model = M.SelectiveSSMLM(cfg).to(device)
    train_ids = corpus["train"]
    n = len(train_ids)
    losses: list[float] = []

    def sample(step: int, gen: torch.Generator):
        return (train_ids[torch.randint(0, n, (t.batch_size,), generator=gen)].to(device),)

    fit(
        model,
        None,
        lambda m, ids: M.lm_loss(m, ids),
        steps=t.steps,
        sample_batch=sample,
        lr=t.lr,
        weight_decay=t.weight_decay,
        scheduler="onecycle",
        seed=t.seed,
        desc="ghost.mamba2_tiny",
        callback=lambda info: losses.append(info.loss),
        grad_clip=1.0,
    )
    val_nll = M.mean_nll(model, corpus["val"], p.eval.eval_batch)
    return {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "state_dict": model.state_dict(),
        "history": torch.tensor(losses),
        "dense_val_nll": torch.tensor(val_nll),
    }


def calibration_set(corpus: dict[str, torch.Tensor], p: Params, seed_index: int) -> torch.Tensor:
    """The calibration subset of one seed: disjoint ``n_calib_seqs`` slices of a fixed permutation of the
    calibration pool (optionally only topics < ``calib_max_topic``: out-of-distribution calibration)."""
    pool, topics = corpus["calib"], corpus["topics_calib"]
    idx = np.random.default_rng(p.data.world_seed).permutation(len(pool))
    if p.prune.calib_max_topic is not None:
        idx = idx[topics.numpy()[idx] < p.prune.calib_max_topic]
    k = p.prune.n_calib_seqs
    part = idx[seed_index * k : (seed_index + 1) * k]
    if len(part) < k:
        raise ValueError(
            f"ghost: calibration seed #{seed_index} needs {k} sequences, the pool has "
            f"{len(idx)} usable (data.n_calib / prune.calib_max_topic)"
        )
    return pool[torch.from_numpy(part)]


def variant_plan(p: Params, variant: str) -> list[tuple[int, int, list[float]]]:
    """[(seed index, seed, ratios)] of a variant: main variants run every seed, ablations the first only;
    the first seed also runs ``prune.extra_rhos``."""
    seeds = list(enumerate(p.seeds)) if variant in p.eval.main_variants else [(0, p.seeds[0])]
    rhos = sorted(set(p.prune.rhos))
    if variant == "dense":
        return [(i, s, [0.0]) for i, s in seeds]
    return [(i, s, sorted(set(rhos) | (set(p.prune.extra_rhos) if i == 0 else set()))) for i, s in seeds]


def prune_variant(
    corpus: dict[str, torch.Tensor], model_blob: dict, p: Params, variant: str
) -> tuple[pd.DataFrame, dict]:
    """One pruning method over its seeds and ratios → (the results table: per seed, test_ppl, delta_ppl,
    calib_time_s, state_bytes_per_seq, ... of each ratio as ``<metric>_rho050`` etc., and for ``dense``
    the SSM LM's training curve; the scores and keep masks by seed and ratio)."""
    rows, saved = [], {}
    device = node_setup(p)
    dense = M.load_model(model_blob).to(device)
    test = corpus["test"]
    dense_nll = M.mean_nll(dense, test, p.eval.eval_batch)
    for i, seed, rhos in variant_plan(p, variant):
        node_setup(p, seed)
        calib = calibration_set(corpus, p, i).to(device)
        for rho in rhos:
            model = M.load_model(model_blob).to(device)
            rng = np.random.default_rng([seed, int(round(rho * 1000))])
            keeps, scores, secs = M.prune(model, variant, rho, calib, p, rng)
            nll = M.mean_nll(model, test, p.eval.eval_batch)
            if not math.isfinite(nll):
                raise FloatingPointError(f"node 'ghost.train.{variant}': test NLL is {nll} at seed {seed}, rho {rho}")
            extra = (
                {"mqar_acc": M.recall_accuracy(model, test, corpus["mqar_mask_test"], p.eval.eval_batch)}
                if "mqar_mask_test" in corpus
                else {}
            )
            kept = float(sum(int(k.sum()) for k in keeps)) / sum(k.numel() for k in keeps)
            rows.append(
                {
                    "variant": variant,
                    "seed": seed,
                    "rho": rho,
                    "test_nll": nll,
                    "test_ppl": math.exp(nll),
                    "dense_test_ppl": math.exp(dense_nll),
                    "delta_ppl": math.exp(nll) - math.exp(dense_nll),
                    "calib_time_s": secs,
                    "kept_fraction": kept,
                    "state_bytes_per_seq": M.state_bytes_per_seq(keeps, model),
                    "top_half_mass_min": min((M.top_half_mass(s) for s in scores), default=math.nan)
                    if variant != "dense"
                    else math.nan,
                    **extra,
                }
            )
            saved.setdefault(str(seed), {})[f"{rho:g}"] = {
                "keep": torch.stack(keeps).cpu(),
                "scores": torch.stack(scores),
            }
    return results_table(variant, rows, model_blob, p), saved


REPORTED = (
    "test_ppl",
    "delta_ppl",
    "calib_time_s",
    "state_bytes_per_seq",
    "kept_fraction",
    "top_half_mass_min",
    "mqar_acc",
)


def results_table(variant: str, rows: list[dict], model_blob: dict, p: Params) -> pd.DataFrame:
    """The core long table of one variant: each ratio's metrics (dense: unsuffixed) per seed; ``dense``
    also carries the one SSM LM's training loss per step (first seed: one model per run)."""
    from pipelines.core.api import Results
    from pipelines.ghost.evaluate import rho_key

    res = Results(variant)
    for r in rows:
        suffix = "" if variant == "dense" else "_" + rho_key(r["rho"])
        res.add(
            r["seed"],
            **{
                f"{k}{suffix}": float(r[k])
                for k in REPORTED
                if r.get(k) is not None and not (isinstance(r[k], float) and math.isnan(r[k]))
            },
        )
    if variant == "dense":
        res.history(p.seeds[0], "train_loss", model_blob["history"].tolist())
    return res.table()
