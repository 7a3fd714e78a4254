"""One train node, ``train.wedlm``: it trains the models — ``wedlm`` (dual-stream causal mask recovery + AR
auxiliary loss, paper §3; one model per seed, decoded four ways) and ``ar_only`` (next-token loss only, the
backbone baseline; ``train.ar_only_seeds``) — each seed with core's training loop on batches sampled on the
fly from the seeded tasks, decodes the test set with each model's weights, then times every decoder side by
side in the same process (interleaved rounds: evaluate.measure_speed). Its table reports one row variant per
decoder (``ar``, ``wedlm``, ``wedlm_fast``, ``blockwise``, ``ar_only``)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import StepInfo, fit, node_setup, read_user_file
from pipelines.wedlm.data import training_batch, vocab_of
from pipelines.wedlm.evaluate import decode_test
from pipelines.wedlm.model import ar_loss_from_logits, build_model, dual_stream_batch, wedlm_loss
from pipelines.wedlm.params import Params, trained_variants

log = logging.getLogger(__name__)

OBJECTIVES = {"wedlm": "wedlm", "ar_only": "ar"}
LOG_EVERY = 10  # fit-log rows: every 10th step and the last


def _ar_target_mask(x: torch.Tensor, pad: int, prompt_len: int) -> torch.Tensor:
    """Every target except the left padding of the prompt (predicting PAD from PAD teaches nothing)."""
    left = torch.arange(x.shape[1], device=x.device)[None, :] < prompt_len
    return ~(left & (x == pad))


def batch_sampler(
    p: Params,
    chain: np.ndarray | None,
    seed: int,
    objective: str,
    dev: torch.device,
    train_rows: torch.Tensor | None = None,
):
    """``sample_batch(step, gen)`` for core.training.fit. ``gen`` is fit's torch generator (seeded with
    the model seed): it draws the rows of a file dataset and the dual-stream masks; the synthetic
    sequences and the block offsets come from ``default_rng([seed, 2])``. Returns (x, ar target mask)
    for ``ar``, plus the dual-stream tensors for ``wedlm``."""
    t, v = p.train, vocab_of(p)
    rng = np.random.default_rng([seed, 2])

    def sample(step: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        if train_rows is None:
            x = training_batch(list(p.data.regimes), t.batch_size, rng, p, chain, v)
        else:
            x = train_rows[torch.randint(0, len(train_rows), (t.batch_size,), generator=gen)]
        ar_mask = _ar_target_mask(x, v.pad, p.data.prompt_len)
        if objective == "ar":
            return x.to(dev), ar_mask.to(dev)
        offset = int(rng.integers(0, t.block_size)) if t.random_block_offset else 0
        b = dual_stream_batch(x, p.data.prompt_len, t.block_size, offset, t.gamma_min, v.mask, gen)
        return tuple(
            z.to(dev) for z in (x, ar_mask, b["tokens"], b["pos"], b["mlm_target"], b["mlm_weight"], b["mask"])
        )

    return sample


def _loss(objective: str, ar_weight: float):
    if objective == "ar":

        def ar(model, x, ar_mask):
            logits, _ = model(x, torch.arange(x.shape[1], device=x.device).expand_as(x))
            loss = ar_loss_from_logits(logits, x, ar_mask)
            return loss, {"mlm": math.nan, "ar": loss.item()}

        return ar

    def mixed(model, x, ar_mask, tokens, pos, mlm_target, mlm_weight, mask):
        batch = {"tokens": tokens, "pos": pos, "mlm_target": mlm_target, "mlm_weight": mlm_weight, "mask": mask}
        return wedlm_loss(model, batch, x, ar_mask, ar_weight)

    return mixed


def train_one(
    p: Params,
    chain: np.ndarray | None,
    seed: int,
    objective: str,
    dev: torch.device,
    train_rows: torch.Tensor | None = None,
    init_state: dict | None = None,
    desc: str = "wedlm",
) -> tuple[dict, list[dict]]:
    """Train one model with core.training.fit (AdamW, one-cycle with 10 % warm-up, gradient clipping);
    ``objective`` is ``wedlm`` (mixed) or ``ar`` (next-token only). The caller seeds torch first (the
    initial weights). Returns the CPU state dict and the loss log (every 10th step and the last)."""
    t = p.train
    model = build_model(p, vocab_of(p).size).to(dev)
    if init_state is not None:
        model.load_state_dict(init_state)
    history: list[dict] = []

    def record(s: StepInfo) -> None:
        if s.step % LOG_EVERY == 0 or s.step == t.steps - 1:
            history.append({"step": s.step, "loss": s.loss, **s.extras})
        if s.step % 200 == 0 or s.step == t.steps - 1:
            log.info("%s: step %d/%d loss %.4f", desc, s.step + 1, t.steps, s.loss)

    fit(
        model,
        None,
        _loss(objective, t.ar_weight),
        steps=t.steps,
        sample_batch=batch_sampler(p, chain, seed, objective, dev, train_rows),
        lr=t.lr,
        weight_decay=t.weight_decay,
        optimizer="adamw",
        scheduler=lambda opt, total: torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=t.lr, total_steps=total, pct_start=0.1
        ),
        grad_clip=t.grad_clip,
        seed=seed,
        desc=desc,
        callback=record,
    )
    return {k: val.detach().cpu() for k, val in model.state_dict().items()}, history


def train_model(
    tasks: dict, test: pd.DataFrame, p: Params, variant: str
) -> tuple[dict, pd.DataFrame, pd.DataFrame, dict]:
    """Train one model ``variant`` (``wedlm`` on ``seeds``, ``ar_only`` on
    ``train.ar_only_seeds``) and decode the test set with each seed's weights. Returns the state dicts
    ``{"seed<k>": ...}``, the loss log, the decodes (one row per item and decoder config) and the decode
    traces of the first seed."""
    if variant not in OBJECTIVES:
        raise ValueError(f"unknown wedlm variant {variant!r} (one of {sorted(OBJECTIVES)})")
    seeds = list(p.seeds) if variant == "wedlm" else list(p.train.ar_only_seeds)
    chain = tasks["chain"].numpy() if "chain" in tasks else None  # None: the user's own data
    rows = tasks.get("train_sequences")
    init = read_user_file(p.model.init_path, key="wedlm.model.init_path", kind="pt") if p.model.init_path else None
    models, logs, decodes, traces = {}, [], [], {}
    for seed in seeds:
        dev = node_setup(p, seed)  # threads, seed (the initial weights), device
        sd, hist = train_one(p, chain, seed, OBJECTIVES[variant], dev, rows, init, desc=f"{variant} seed {seed}")
        models[f"seed{seed}"] = sd
        logs += [{"model": variant, "seed": seed, **r} for r in hist]
        dec, tr = decode_test(sd, variant, seed, test, chain, p, dev)
        decodes.append(dec)
        if seed == seeds[0]:
            traces = tr
    return models, pd.DataFrame(logs), pd.concat(decodes, ignore_index=True), traces


def _plain(x):
    """JSON-plain copy (the artifacts are loaded weights-only: no numpy scalars)."""
    return json.loads(json.dumps(x, default=float))


def train_variant(tasks: dict, test: pd.DataFrame, p: Params, variant: str):
    """``train.wedlm``: every trained model (:func:`train_model`), the decoders' interleaved wall clock, and
    the long table: per decoder and seed the count-based metrics and wall clock (evaluate._variant_rows),
    and the per-round tokens/s of each regime as a curve over the timing rounds
    (``tokens_per_sec_rounds_<regime>``, what the paired speed ratios are computed from). Artifacts: the
    weights, the fit log, the decode traces of the first seed, the τ frontier (and sweep)."""
    from pipelines.core.api import Results
    from pipelines.wedlm.evaluate import _tables, measure_speed

    models, logs, decodes, traces = {}, [], [], {}
    for v in trained_variants(p):
        models[v], log_v, dec, tr = train_model(tasks, test, p, v)
        logs.append(log_v)
        decodes.append(dec)
        for regime, by_variant in tr.items():
            traces.setdefault(regime, {}).update(by_variant)
    timing = measure_speed(p, test, **models)
    regimes, rows, _, frontier, sweep = _tables(p, pd.concat(decodes, ignore_index=True), timing)
    res: dict[str, Results] = {}
    for row in rows:
        res.setdefault(row["variant"], Results(row["variant"])).add(
            row["seed"], **{k: x for k, x in row.items() if k not in ("variant", "seed")}
        )
    t = timing.assign(tps=timing.tokens / timing.seconds)
    for (v, seed, regime), d in t.groupby(["variant", "seed", "regime"], sort=False):
        d = d.sort_values("round")
        res.setdefault(v, Results(v)).history(int(seed), f"tokens_per_sec_rounds_{regime}", d["tps"], d["round"])
    logs = [df for df in logs if len(df)]
    arts = {
        "models": models,
        "fit_log": _plain(pd.concat(logs, ignore_index=True).to_dict("records") if logs else []),
        "traces": _plain(traces),
        "frontier": _plain(frontier.to_dict("records")),
        "sweep": _plain(sweep.to_dict("records") if len(sweep) else []),
    }
    return pd.concat([r.table() for r in res.values()], ignore_index=True), arts
