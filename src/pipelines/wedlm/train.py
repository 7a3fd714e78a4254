"""Training of the WeDLM model (dual-stream causal mask recovery + AR auxiliary loss, paper §3) for every
seed, and of the optional AR-only backbone baseline. Batches are sampled on the fly from the seeded tasks."""
from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.params import parse
from pipelines.core.runtime import get_device, seed_everything, set_threads
from pipelines.core.training import check_finite
from pipelines.wedlm.data import training_batch, vocab_of
from pipelines.wedlm.model import ar_loss_from_logits, build_model, dual_stream_batch, wedlm_loss

log = logging.getLogger(__name__)


def _ar_target_mask(x: torch.Tensor, pad: int, prompt_len: int) -> torch.Tensor:
    """Every target except the left padding of the prompt (predicting PAD from PAD teaches nothing)."""
    left = torch.arange(x.shape[1], device=x.device)[None, :] < prompt_len
    return ~(left & (x == pad))


def train_one(p, chain: np.ndarray, seed: int, objective: str, train_rows: torch.Tensor | None = None,
              init_state: dict | None = None, desc: str = "wedlm") -> tuple[dict, list[dict]]:
    """Train one model; ``objective`` is ``wedlm`` (mixed) or ``ar`` (next-token only)."""
    from tqdm.auto import tqdm

    t = p.train
    v = vocab_of(p)
    gen = seed_everything(seed)
    rng = np.random.default_rng([seed, 2])
    dev = get_device(p.device)
    model = build_model(p, v.size).to(dev)
    if init_state is not None:
        model.load_state_dict(init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=t.lr, total_steps=t.steps, pct_start=0.1)
    history = []
    model.train()
    bar = tqdm(range(t.steps), desc=desc, leave=False, disable=None)
    for step in bar:
        if train_rows is None:
            x = training_batch(list(p.data.regimes), t.batch_size, rng, p, chain, v)
        else:
            x = train_rows[torch.randint(0, len(train_rows), (t.batch_size,), generator=gen)]
        x = x.to(dev)
        ar_mask = _ar_target_mask(x, v.pad, p.data.prompt_len)
        if objective == "wedlm":
            offset = int(rng.integers(0, t.block_size)) if t.random_block_offset else 0
            batch = dual_stream_batch(x.cpu(), p.data.prompt_len, t.block_size, offset, t.gamma_min, v.mask, gen)
            batch = {k: b.to(dev) for k, b in batch.items()}
            loss, parts = wedlm_loss(model, batch, x, ar_mask, t.ar_weight)
        else:
            logits, _ = model(x, torch.arange(x.shape[1], device=dev).expand_as(x))
            loss = ar_loss_from_logits(logits, x, ar_mask)
            parts = {"mlm": math.nan, "ar": loss.item()}
        check_finite(loss, desc, 0, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        sched.step()
        if step % 10 == 0 or step == t.steps - 1:
            history.append({"step": step, "loss": loss.item(), **parts})
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % 200 == 0 or step == t.steps - 1:
            log.info("%s: step %d/%d loss %.4f", desc, step + 1, t.steps, loss.item())
    model.eval()
    return {k: val.detach().cpu() for k, val in model.state_dict().items()}, history


def train_models(tasks: dict, raw: dict) -> tuple[dict, pd.DataFrame]:
    """One WeDLM model per seed (shared by the AR, streaming and block-wise decoders) and an AR-only
    model for each of ``train.ar_only_seeds``. Returns {name: state_dict} and the loss log."""
    p = parse("wedlm", raw)
    set_threads(p.threads)
    chain = tasks["chain"].numpy()
    rows = tasks.get("train_sequences")
    init = torch.load(p.model.init_path, map_location="cpu", weights_only=True) if p.model.init_path else None
    models, logs = {}, []
    for seed in p.seeds:
        sd, hist = train_one(p, chain, seed, "wedlm", rows, init, desc=f"wedlm seed {seed}")
        models[f"wedlm_seed{seed}"] = sd
        logs += [{"model": "wedlm", "seed": seed, **r} for r in hist]
    for seed in p.train.ar_only_seeds:
        sd, hist = train_one(p, chain, seed, "ar", rows, init, desc=f"ar_only seed {seed}")
        models[f"ar_only_seed{seed}"] = sd
        logs += [{"model": "ar_only", "seed": seed, **r} for r in hist]
    return models, pd.DataFrame(logs)
