"""The train nodes of `wbmm`. The accuracy check of the paper's §4 at toy scale, one node per variant
(``train.<variant>``): the same
tiny net with WBMM/DW3 alternation vs UniRepLKNet-like DW13/DW3 (matched parameters) and DW7/DW3 (matched
FLOPs and receptive field), trained with the same budget through ``core.training.fit`` (AdamW, one-cycle,
same epochs, batch and seeds). Each node also records its own per-step throughput; the speed *claim* uses
the interleaved training-step benchmark (``bench.train_speed``), where the variants run side by side.
The two interleaved speed benchmarks are one node each (``train.operator_speed``: its table holds the row
of every timed op; ``train.train_speed``), because what each compares must run in one process."""

from __future__ import annotations

import json
import statistics
import time

import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import Results, StepInfo, fit, node_setup
from pipelines.wbmm.model import build_net
from pipelines.wbmm.ops import WBMM
from pipelines.wbmm.params import Params


def timing_clock(choice: str, device: torch.device, threads: int) -> str:
    """'auto': this process's CPU time on a 1-thread CPU run (on a shared machine it is what an idle core
    would take, while wall time also counts the waits for other jobs' time slices), else wall time
    (GPU: after a synchronize; several CPU threads: CPU time would add the threads up)."""
    if choice != "auto":
        if choice == "cpu" and (device.type != "cpu" or threads != 1):
            raise ValueError("parameter wbmm.bench.clock: 'cpu' needs device cpu and threads: 1")
        return choice
    return "cpu" if device.type == "cpu" and threads == 1 else "wall"


def cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def prepare(data: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Images standardised per channel with training statistics, on ``device``; and the class count."""
    xtr, ytr = data["x_train"], data["y_train"]
    mean = xtr.mean((0, 2, 3), keepdim=True)
    std = xtr.std((0, 2, 3), keepdim=True).clamp_min(1e-6)
    xtr, xte = ((xtr - mean) / std).to(device), ((data["x_test"] - mean) / std).to(device)
    ytr, yte = ytr.to(device), data["y_test"].to(device)
    return xtr, ytr, xte, yte, int(max(ytr.max(), yte.max()).item()) + 1


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    """Test accuracy (%) in eval mode, WBMM's M cached as at inference."""
    model.eval()
    for m in model.modules():
        if isinstance(m, WBMM):
            m.cache()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += (model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum().item()
    for m in model.modules():
        if isinstance(m, WBMM):
            m.uncache()
    return 100.0 * correct / len(y)


def train_one(
    pattern: list[str], data: dict, p: Params, seed: int, device: torch.device, clock: str, desc: str = "model"
) -> tuple[dict, dict]:
    """Train one variant on one seed (seeded by the caller); its metrics row and its state dict.
    ``fit_imgs_per_s`` is batch / median full-batch step time on ``clock`` (after 3 warm-up steps)."""
    a = p.acc
    xtr, ytr, xte, yte, n_classes = prepare(data, device)
    model = build_net(pattern, xtr.shape[1], n_classes, a).to(device)
    step_s: list[float] = []

    def on_step(info: StepInfo) -> None:
        if info.batch_size == a.batch_size:  # the last partial batch is not comparable
            step_s.append(info.cpu_seconds if clock == "cpu" else info.seconds)

    t_start, c_start = time.perf_counter(), time.process_time()
    # the old private loop had no gradient clipping: grad_clip=None keeps the recipe (and the numbers)
    fit(
        model,
        (xtr, ytr),
        cross_entropy,
        epochs=a.epochs,
        batch_size=a.batch_size,
        lr=a.lr,
        weight_decay=a.weight_decay,
        optimizer="adamw",
        scheduler="onecycle",
        grad_clip=None,
        seed=seed,
        desc=desc,
        callback=on_step,
    )
    train_s, train_cpu_s = time.perf_counter() - t_start, time.process_time() - c_start
    steady = step_s[3:] if len(step_s) > 6 else step_s
    row = {
        "test_acc": accuracy(model, xte, yte),
        "fit_imgs_per_s": a.batch_size / statistics.median(steady) if steady else float("nan"),
        "train_s": train_s,
        "train_cpu_s": train_cpu_s,
        "n_params": float(sum(q.numel() for q in model.parameters())),
    }
    return row, {k: v.detach().cpu() for k, v in model.state_dict().items()}


OPERATOR_SPEED, TRAIN_SPEED = "operator_speed", "train_speed"  # the interleaved benchmarks' nodes


def planned(p: Params) -> list[str]:
    """The train nodes: every tiny-net variant (the first is the method), then the two speed benchmarks."""
    return [*p.acc.variants, OPERATOR_SPEED, TRAIN_SPEED]


def variant_inputs(p: Params, variant: str) -> list[str]:
    return ["bench_grid"] if variant == OPERATOR_SPEED else ["images_tensors"]


def columns(df: pd.DataFrame) -> dict[str, list]:
    """A table as plain column lists (what the tensors dataset stores besides tensors)."""
    return {c: df[c].tolist() for c in df.columns}


def train_variant(data, p: Params, variant: str) -> tuple[pd.DataFrame, dict]:
    """The node ``train.<variant>``: a tiny net on every seed (its long table and state dicts), or one of
    the two interleaved benchmarks (``operator_speed``: every timed op's row and the per-round samples;
    ``train_speed``: the per-round training-step samples of every net)."""
    if variant == OPERATOR_SPEED:
        from pipelines.wbmm.bench import run_benchmark
        from pipelines.wbmm.evaluate import op_rows

        bench, env = run_benchmark(data, p)
        parts = []
        for row in op_rows(bench, p):
            parts.append(Results(row.pop("variant")).add(row.pop("seed"), **row).table())
        table = pd.concat(parts, ignore_index=True) if parts else Results(variant).table()
        return table, {"bench": columns(bench), "env": json.loads(json.dumps(env, default=str))}
    if variant == TRAIN_SPEED:
        from pipelines.wbmm.bench import train_speed

        return Results(variant).table(), {"speed": columns(train_speed(data, p))}
    res, states = Results(variant), {}
    for seed in p.seeds:
        device = node_setup(p, seed)
        # the nets train at `threads` (not bench.threads): their per-node throughput is for reference only,
        # so an explicit CPU clock falls back to wall time when this node runs several threads
        choice = "wall" if p.bench.clock == "cpu" and torch.get_num_threads() != 1 else p.bench.clock
        clock = timing_clock(choice, device, torch.get_num_threads())
        row, state = train_one(
            p.acc.variants[variant], data[str(seed)], p, seed, device, clock, desc=f"{variant} seed {seed}"
        )
        res.add(seed, **row)
        states[f"seed{seed}"] = state
    return res.table(), states
