"""A small training loop: minibatches, AdamW, early stopping on a validation score, progress, NaN guard."""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from pipelines.core.errors import NonFiniteLossError
from pipelines.core.runctx import current_node

__all__ = ["FitResult", "NonFiniteLossError", "check_finite", "fit"]


@dataclass
class FitResult:
    best_val: float
    best_epoch: int
    epochs_run: int
    history: list[dict[str, float]] = field(default_factory=list)


def check_finite(loss: torch.Tensor, what: str, epoch: int, step: int) -> None:
    if not torch.isfinite(loss).all():
        node = current_node.get() or "<outside a node>"
        raise NonFiniteLossError(f"node '{node}': {what} loss is {loss.item()} at epoch {epoch}, step {step}")


def fit(model: torch.nn.Module, train: Sequence[torch.Tensor], loss_fn: Callable[..., torch.Tensor],
        *, val_score: Callable[[torch.nn.Module], float] | None = None, epochs: int = 10, lr: float = 1e-3,
        weight_decay: float = 1e-4, batch_size: int = 128, patience: int | None = None, seed: int = 0,
        desc: str = "model", progress: bool | None = None, grad_clip: float | None = 1.0) -> FitResult:
    """Train ``model`` in place on tensors ``train`` (shuffled minibatches, seeded).

    ``loss_fn(model, *batch)`` returns a scalar loss; ``val_score(model)`` (lower is better) drives
    early stopping with ``patience`` and the best weights are restored at the end.
    ``progress=None`` shows a bar only on a terminal."""
    from tqdm.auto import tqdm

    n = len(train[0])
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    best, best_epoch, best_state, bad = math.inf, -1, None, 0
    result = FitResult(best_val=math.inf, best_epoch=-1, epochs_run=0)
    bar = tqdm(range(epochs), desc=desc, leave=False, disable=None if progress is None else not progress)
    for epoch in bar:
        model.train()
        perm = torch.randperm(n, generator=gen)
        total, count = 0.0, 0
        for step, start in enumerate(range(0, n, batch_size)):
            idx = perm[start:start + batch_size]
            loss = loss_fn(model, *(t[idx] for t in train))
            check_finite(loss, desc, epoch, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
        row = {"epoch": epoch, "train_loss": total / count}
        if val_score is not None:
            model.eval()
            with torch.no_grad():
                score = float(val_score(model))
            if not math.isfinite(score):
                node = current_node.get() or "<outside a node>"
                raise NonFiniteLossError(f"node '{node}': {desc} validation score is {score} at epoch {epoch}")
            row["val"] = score
            if score < best:
                best, best_epoch, bad = score, epoch, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                bad += 1
        result.history.append(row)
        result.epochs_run = epoch + 1
        bar.set_postfix({k: f"{v:.4f}" for k, v in row.items() if k != "epoch"})
        if patience is not None and bad > patience - 1 and val_score is not None:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    result.best_val, result.best_epoch = best, best_epoch
    return result
