"""The accuracy check of the paper's §4 at toy scale: the same tiny net with WBMM/DW3 alternation vs
UniRepLKNet-like DW13/DW3 (matched parameters) and DW7/DW3 (matched FLOPs and receptive field), trained
with the same budget (AdamW, one-cycle, same epochs, batch and seeds); per-step times give throughput."""
from __future__ import annotations

import math
import statistics
import time

import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.params import parse
from pipelines.core.runtime import get_device, seed_everything, set_threads
from pipelines.core.training import check_finite
from pipelines.wbmm.bench import timing_clock
from pipelines.wbmm.model import TinyNet
from pipelines.wbmm.ops import WBMM


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    model.eval()
    for m in model.modules():
        if isinstance(m, WBMM):
            m.cache()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    for m in model.modules():
        if isinstance(m, WBMM):
            m.uncache()
    return 100.0 * correct / len(y)


def train_one(pattern: list[str], data: dict, raw: dict, seed: int, device: torch.device,
              desc: str = "model", clock: str = "wall") -> tuple[dict, dict]:
    """Train one variant on one seed; returns its metrics row and its state dict. Throughput comes from
    the median step time on ``clock`` ('cpu': this process's CPU time, see bench.timing_clock)."""
    from tqdm.auto import tqdm

    p = parse("wbmm", raw).acc
    gen = seed_everything(seed)
    xtr, ytr = data["x_train"], data["y_train"]
    mean = xtr.mean((0, 2, 3), keepdim=True)
    std = xtr.std((0, 2, 3), keepdim=True).clamp_min(1e-6)
    xtr, xte = ((xtr - mean) / std).to(device), ((data["x_test"] - mean) / std).to(device)
    ytr, yte = ytr.to(device), data["y_test"].to(device)
    n_classes = int(max(ytr.max(), yte.max()).item()) + 1
    model = TinyNet(pattern, xtr.shape[1], n_classes, tuple(p.widths), p.blocks, p.ffn_ratio,
                    p.layer_scale_init).to(device)
    steps_per_epoch = math.ceil(len(ytr) / p.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=p.lr, total_steps=p.epochs * steps_per_epoch)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    step_s: list[float] = []
    t_start, c_start = time.perf_counter(), time.process_time()
    for epoch in tqdm(range(p.epochs), desc=desc, leave=False, disable=None):
        model.train()
        perm = torch.randperm(len(ytr), generator=gen).to(device)
        for step in range(steps_per_epoch):
            idx = perm[step * p.batch_size:(step + 1) * p.batch_size]
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            check_finite(loss, desc, epoch, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            sync()
            if len(idx) == p.batch_size:  # full batches only: the last partial one is not comparable
                step_s.append(time.process_time() - c0 if clock == "cpu" else time.perf_counter() - t0)
    train_s, train_cpu_s = time.perf_counter() - t_start, time.process_time() - c_start
    # the median step (after the first few, which include allocator and kernel warm-up) is robust to
    # bursts of load from other processes on a shared machine; the wall time is kept as well
    steady = step_s[3:] if len(step_s) > 6 else step_s
    row = {"test_acc": _accuracy(model, xte, yte), "train_imgs_per_s": p.batch_size / statistics.median(steady),
           "train_s": train_s, "train_cpu_s": train_cpu_s, "n_params": float(sum(q.numel() for q in model.parameters()))}
    return row, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def train_accuracy(images: dict, raw: dict) -> tuple[pd.DataFrame, dict]:
    """Every variant × every seed, variants interleaved within a seed so load bursts hit all of them."""
    p = parse("wbmm", raw)
    set_threads(p.threads)
    device = get_device(p.device)
    clock = timing_clock(p.bench.clock, device, torch.get_num_threads())
    rows, states = [], {}
    for seed in p.seeds:
        for name, pattern in p.acc.variants.items():
            row, state = train_one(pattern, images[str(seed)], raw, seed, device, desc=f"{name} seed {seed}",
                                     clock=clock)
            rows.append({"variant": name, "seed": seed, **row})
            states[f"{name}/seed{seed}"] = state
    return pd.DataFrame(rows), states
