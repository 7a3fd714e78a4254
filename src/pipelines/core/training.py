"""The one training loop every method uses: epochs over shuffled minibatches (or the full batch), or a
fixed number of steps over batches a method samples itself; AdamW/Adam/SGD/L-BFGS; an optional
learning-rate schedule; gradient clipping; a per-step callback (metric histories, step timings);
validation with early stopping and best-state restore; a progress bar; a NaN/inf guard naming the node."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pipelines.core.errors import NonFiniteLossError
from pipelines.core.runctx import current_node

__all__ = ["FitResult", "NonFiniteLossError", "StepInfo", "check_finite", "fit"]


@dataclass
class FitResult:
    best_val: float
    best_epoch: int  # the epoch (epochs mode) or step (steps mode) of the best validation score
    epochs_run: int
    steps_run: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # one row per epoch / validation
    step_seconds: list[float] = field(default_factory=list)  # wall time of each full step


@dataclass
class StepInfo:
    """What the per-step callback sees."""

    step: int  # global step, from 0
    epoch: int
    loss: float
    batch_size: int
    seconds: float  # wall time of this step (synchronised on CUDA)
    cpu_seconds: float  # this process's CPU time for the step
    model: torch.nn.Module
    extras: dict[str, float]  # whatever loss_fn returned besides the loss
    optimizer: torch.optim.Optimizer | None = None  # its ``state`` holds e.g. Adam's moments
    grad_norm: float | None = None  # global gradient norm before clipping (None when grad_clip is off)


def check_finite(loss: torch.Tensor, what: str, epoch: int, step: int) -> None:
    if not torch.isfinite(loss).all():
        node = current_node.get() or "<outside a node>"
        raise NonFiniteLossError(f"node '{node}': {what} loss is {loss.item()} at epoch {epoch}, step {step}")


def _optimizer(spec: str | Callable, params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    if callable(spec):
        return spec(params)
    if spec == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if spec == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if spec == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, momentum=0.9)
    if spec == "lbfgs":
        return torch.optim.LBFGS(params, lr=lr, max_iter=20, line_search_fn="strong_wolfe")
    raise ValueError(f"unknown optimizer {spec!r} (adamw, adam, sgd, lbfgs or a callable)")


def _split_loss(out) -> tuple[torch.Tensor, dict[str, float]]:
    if isinstance(out, tuple):
        loss, extras = out
        return loss, {k: float(v) for k, v in extras.items()}
    return out, {}


def fit(
    model: torch.nn.Module,
    train: Sequence[torch.Tensor] | None,
    loss_fn: Callable[..., Any],
    *,
    val_score: Callable[[torch.nn.Module], float] | None = None,
    epochs: int | None = 10,
    steps: int | None = None,
    sample_batch: Callable[[int, torch.Generator], Sequence[torch.Tensor]] | None = None,
    lr: float = 1e-3,
    weight_decay: float = 1e-4,
    batch_size: int | None = 128,
    optimizer: str | Callable = "adamw",
    scheduler: str | Callable[[torch.optim.Optimizer, int], Any] | None = None,
    patience: int | None = None,
    val_every: int | None = None,
    seed: int = 0,
    desc: str = "model",
    progress: bool | None = None,
    grad_clip: float | None = None,
    callback: Callable[[StepInfo], None] | None = None,
    params: Sequence[torch.Tensor] | None = None,
) -> FitResult:
    """Train ``model`` in place.

    Data, one of:
      - ``train`` tensors with ``epochs``: seeded shuffled minibatches of ``batch_size`` (None: the full
        batch every step); ``steps`` caps the total number of steps if given;
      - ``sample_batch(step, generator)`` with ``steps``: the method draws each batch itself.
    ``loss_fn(model, *batch)`` returns a scalar loss, or ``(loss, {name: value})`` to log more.
    ``optimizer``: ``adamw`` | ``adam`` | ``sgd`` | ``lbfgs`` (full batch, closure) or ``callable(params)``;
    ``scheduler``: ``"onecycle"`` or ``callable(optimizer, total_steps)``, stepped every step.
    ``val_score(model)`` (lower is better) runs after every epoch (or every ``val_every`` steps) and
    drives early stopping with ``patience``; the best weights are restored at the end.
    ``callback(StepInfo)`` runs after every step (it sees the model and the optimizer).
    ``grad_clip``: clip the global gradient norm at this value (off by default: clipping changes an
    optimizer's dynamics, which many methods study; a method that wants it says so, e.g. ``grad_clip=1.0``).
    ``progress=None`` shows a bar only on a terminal."""
    from tqdm.auto import tqdm

    from pipelines.core.progress import note

    if sample_batch is None and train is None:
        raise ValueError("fit: give `train` tensors or a `sample_batch` function")
    if sample_batch is not None and not steps:
        raise ValueError("fit: `sample_batch` needs `steps`")
    gen = torch.Generator().manual_seed(seed)
    n = len(train[0]) if train is not None else 0
    bs = n if (batch_size is None or train is None) else min(batch_size, n)
    per_epoch = math.ceil(n / bs) if train is not None and sample_batch is None else 0
    total = steps if steps else (epochs or 1) * per_epoch
    n_epochs = (epochs or 1) if sample_batch is None else 1
    if steps and sample_batch is None and per_epoch:
        n_epochs = math.ceil(steps / per_epoch)
    trainable = list(params) if params is not None else [q for q in model.parameters() if q.requires_grad]
    opt = _optimizer(optimizer, trainable, lr, weight_decay)
    if scheduler == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(total, 1))
    elif callable(scheduler):
        sched = scheduler(opt, total)
    else:
        sched = None
    is_lbfgs = isinstance(opt, torch.optim.LBFGS)
    dev = next((q.device for q in trainable), torch.device("cpu"))
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    best, best_at, best_state, bad = math.inf, -1, None, 0
    result = FitResult(best_val=math.inf, best_epoch=-1, epochs_run=0)
    bar = tqdm(total=total, desc=desc, leave=False, disable=None if progress is None else not progress)
    step, stop = 0, False

    def validate(epoch: int, row: dict[str, float]) -> bool:
        nonlocal best, best_at, best_state, bad
        model.eval()
        with torch.no_grad():
            score = float(val_score(model))
        model.train()
        if not math.isfinite(score):
            node = current_node.get() or "<outside a node>"
            raise NonFiniteLossError(f"node '{node}': {desc} validation score is {score} at epoch {epoch}, step {step}")
        row["val"] = score
        if score < best:
            best, best_at, bad = score, (epoch if sample_batch is None and not val_every else step), 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            bad += 1
        return patience is not None and bad >= patience

    model.train()
    for epoch in range(n_epochs):
        if sample_batch is None:
            perm = torch.randperm(n, generator=gen)
            batches = ((t[perm[s : s + bs]] for t in train) for s in range(0, n, bs))
        else:
            batches = (sample_batch(i, gen) for i in range(total))
        ep_loss, ep_count, extras = 0.0, 0, {}
        for batch in batches:
            if step >= total:
                break
            batch = tuple(batch)
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            gnorm = None
            if is_lbfgs:

                def closure():
                    opt.zero_grad(set_to_none=True)
                    lo, _ = _split_loss(loss_fn(model, *batch))
                    check_finite(lo, desc, epoch, step)
                    lo.backward()
                    return lo

                loss = opt.step(closure)
                loss, extras = _split_loss(loss_fn(model, *batch)) if loss is None else (loss, {})
            else:
                loss, extras = _split_loss(loss_fn(model, *batch))
                check_finite(loss, desc, epoch, step)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if grad_clip:
                    gnorm = float(torch.nn.utils.clip_grad_norm_(trainable, grad_clip))
                opt.step()
            if sched is not None:
                sched.step()
            sync()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            size = len(batch[0]) if batch and hasattr(batch[0], "__len__") else bs
            if size == bs or sample_batch is not None:  # a short last batch is not a step time
                result.step_seconds.append(dt)
            lv = float(loss.detach())
            ep_loss += lv * size
            ep_count += size
            if callback is not None:
                callback(StepInfo(step, epoch, lv, size, dt, dc, model, extras, opt, gnorm))
            step += 1
            bar.update(1)
            note((f"{desc} step", step, total))
            if val_every and val_score is not None and step % val_every == 0:
                row = {"epoch": epoch, "step": step, "train_loss": lv, **extras}
                stop = validate(epoch, row)
                result.history.append(row)
                bar.set_postfix({k: f"{v:.4f}" for k, v in row.items() if k not in ("epoch", "step")})
                if stop:
                    break
        result.epochs_run = epoch + 1
        if not val_every:
            row = {"epoch": epoch, "step": step, "train_loss": ep_loss / max(ep_count, 1), **extras}
            if val_score is not None:
                stop = validate(epoch, row)
            result.history.append(row)
            bar.set_postfix({k: f"{v:.4f}" for k, v in row.items() if k not in ("epoch", "step")})
        if stop or step >= total:
            break
    bar.close()
    result.steps_run = step
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    result.best_val, result.best_epoch = best, best_at
    return result
