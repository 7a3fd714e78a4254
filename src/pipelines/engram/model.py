"""The card's bias-free ReLU MLP (input with an appended 1 → hidden… → classes), and a functional forward
pass over a list of weight matrices, so an edited network is just an edited list (float64 for edits)."""

from __future__ import annotations

import torch


def build_mlp(n_in: int, hidden: list[int], n_out: int) -> torch.nn.Sequential:
    """Linear layers without biases (the appended constant 1 absorbs the first layer's bias; hidden
    layers have none, so y = Wx holds exactly at every layer), ReLU between them."""
    dims = [n_in, *hidden, n_out]
    layers: list[torch.nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1], bias=False))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def weights_of(model: torch.nn.Module, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """The weight matrices W_ℓ (out × in), in order, detached copies."""
    return [m.weight.detach().to(dtype).clone() for m in model if isinstance(m, torch.nn.Linear)]


def load_weights(model: torch.nn.Module, weights: list[torch.Tensor]) -> torch.nn.Module:
    lin = [m for m in model if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for m, w in zip(lin, weights, strict=True):
            m.weight.copy_(w.to(m.weight.dtype))
    return model


def layer_inputs(weights: list[torch.Tensor], x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The input x_ℓ of every layer (x_0 = x, x_ℓ = relu(W_{ℓ−1} x_{ℓ−1})) and the logits."""
    h, inputs = x.to(weights[0].dtype), []
    for i, w in enumerate(weights):
        inputs.append(h)
        h = h @ w.T
        if i < len(weights) - 1:
            h = torch.relu(h)
    return inputs, h


def logits(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return layer_inputs(weights, x)[1]


def per_class_accuracy(weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Test accuracy of every class (C,); a class without samples gets NaN."""
    pred = logits(weights, x).argmax(1)
    hit = (pred == y).double()
    counts = torch.bincount(y, minlength=n_classes).double()
    correct = torch.bincount(y, weights=hit, minlength=n_classes)
    return torch.where(counts > 0, correct / counts.clamp_min(1), torch.full_like(counts, float("nan")))


def split_accuracy(
    weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, inside: list[int] | set[int]
) -> tuple[float, float]:
    """Accuracy on the samples whose class is in ``inside``, and on all the others (sample-weighted)."""
    pred = logits(weights, x).argmax(1)
    mask = torch.zeros_like(y, dtype=torch.bool)
    for c in inside:
        mask |= y == c
    hit = (pred == y).double()
    acc_in = float(hit[mask].mean()) if mask.any() else float("nan")
    acc_out = float(hit[~mask].mean()) if (~mask).any() else float("nan")
    return acc_in, acc_out
