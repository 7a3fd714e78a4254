"""The classifier, the meta-net (weight generator) and the bi-level pieces of MTS: batch-normalised
weights, the meta-gradient through one virtual SGD step (exact unroll, or the official code's
finite-difference Hessian-vector product), the online CLS_* features and the GSNR estimator."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call


class MLP(nn.Module):
    """The classifier: d–hidden–classes; ``embed`` is the penultimate layer (CLS_* features)."""

    def __init__(self, d_in: int, hidden: int, n_classes: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, n_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc1(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.embed(x))


class MetaNet(nn.Module):
    """w_i = floor + (1 − floor)·sigmoid(MLP(features_i)); the zero-initialised output layer makes every
    weight equal at the start (uniform weighting)."""

    def __init__(self, d_in: int, hidden: int, floor: float = 1e-3):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        nn.init.zeros_(self.body[2].weight)
        nn.init.zeros_(self.body[2].bias)
        self.floor = floor

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.floor + (1 - self.floor) * torch.sigmoid(self.body(f).squeeze(-1))


def normalise(w: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """w̃_i = w_i · B / Σ_j w_j: mean 1 over the batch."""
    return w * len(w) / (w.sum() + eps)


def ess(w: torch.Tensor) -> float:
    """Effective sample size (Σw)² / Σw² of a batch's weights."""
    return float(w.sum() ** 2 / (w.pow(2).sum() + 1e-12))


def weighted_loss(clf: nn.Module, theta: Mapping[str, torch.Tensor], x, y, w: torch.Tensor) -> torch.Tensor:
    losses = F.cross_entropy(functional_call(clf, dict(theta), (x,)), y, reduction="none")
    return (normalise(w) * losses).mean()


def virtual_step(
    theta: Mapping[str, torch.Tensor],
    grads,
    lr: float,
    momentum: float,
    weight_decay: float,
    buffers: Mapping[str, torch.Tensor | None],
) -> dict[str, torch.Tensor]:
    """θ' = θ − η(μ·buf + g + λθ): one step of the real SGD-momentum optimiser, from its state."""
    out = {}
    for (k, t), g in zip(theta.items(), grads):
        d = g + weight_decay * t
        b = buffers.get(k)
        if b is not None and momentum:
            d = d + momentum * b
        out[k] = t - lr * d
    return out


def meta_objective(
    clf: nn.Module,
    theta: Mapping[str, torch.Tensor],
    metanet: nn.Module,
    feats_fn,
    x,
    y,
    xm,
    ym,
    *,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    buffers: Mapping[str, torch.Tensor | None] | None = None,
    method: str = "exact",
    fd_eps: float = 1e-2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """A scalar whose gradient in φ is the meta-gradient ∇_φ L_meta(θ'(φ)), θ' one virtual step of the
    real optimiser on the weighted training loss; and {"meta_loss": L_meta(θ')}.

    ``feats_fn(theta)`` returns the meta-net input for the batch (detached from θ, e.g. the loss-only
    feature). ``method='exact'``: L_meta(θ'(φ)) itself, differentiated through the step (double
    backward). ``'finite_difference'``: the official code's Hessian-vector product, g_val =
    ∇_θ L_meta(θ'), ε = fd_eps/‖g_val‖, ĝ = −η (∇_φ L_tr(θ + ε g_val) − ∇_φ L_tr(θ − ε g_val)) / (2ε),
    returned as the surrogate ⟨φ, ĝ⟩ (ĝ detached)."""
    buffers = buffers or {}
    phi = [q for q in metanet.parameters() if q.requires_grad]
    theta = {k: t.detach().requires_grad_(True) for k, t in theta.items()}
    f = feats_fn(theta).detach()
    if method == "exact":
        loss = weighted_loss(clf, theta, x, y, metanet(f))
        grads = torch.autograd.grad(loss, list(theta.values()), create_graph=True)
        theta1 = virtual_step(theta, grads, lr, momentum, weight_decay, buffers)
        meta_loss = F.cross_entropy(functional_call(clf, theta1, (xm,)), ym)
        return meta_loss, {"meta_loss": float(meta_loss.detach())}
    if method != "finite_difference":
        raise ValueError(f"meta-gradient method {method!r} (exact | finite_difference)")
    with torch.no_grad():
        w = metanet(f)
    loss = weighted_loss(clf, theta, x, y, w)
    grads = torch.autograd.grad(loss, list(theta.values()))
    theta1 = {
        k: t.detach().requires_grad_(True)
        for k, t in virtual_step(theta, grads, lr, momentum, weight_decay, buffers).items()
    }
    meta_loss = F.cross_entropy(functional_call(clf, theta1, (xm,)), ym)
    gval = torch.autograd.grad(meta_loss, list(theta1.values()))
    norm = torch.sqrt(sum((g**2).sum() for g in gval))
    eps = fd_eps / (float(norm) + 1e-12)

    def grad_phi(sign: float):
        th = {k: (t + sign * eps * g).detach() for (k, t), g in zip(theta.items(), gval)}
        return torch.autograd.grad(weighted_loss(clf, th, x, y, metanet(f)), phi)

    gp, gm = grad_phi(1.0), grad_phi(-1.0)
    surrogate = sum((q * (-lr * (a - b) / (2 * eps)).detach()).sum() for q, a, b in zip(phi, gp, gm))
    return surrogate, {"meta_loss": float(meta_loss.detach())}


def meta_gradient(
    clf: nn.Module, theta: Mapping[str, torch.Tensor], metanet: nn.Module, feats_fn, x, y, xm, ym, **kw
) -> list[torch.Tensor]:
    """∇_φ L_meta(θ'(φ)) as a list over the meta-net's parameters (see :func:`meta_objective`)."""
    obj, _ = meta_objective(clf, theta, metanet, feats_fn, x, y, xm, ym, **kw)
    return list(torch.autograd.grad(obj, [q for q in metanet.parameters() if q.requires_grad]))


def cls_features(
    clf: MLP, x: torch.Tensor, y: torch.Tensor, xm: torch.Tensor, ym: torch.Tensor, k: int = 3
) -> torch.Tensor:
    """Online CLS_* features from the current classifier's penultimate layer: mean cosine to the k
    nearest same-class meta samples, and cosine to the same-class meta centroid. (n, 2)."""
    with torch.no_grad():
        e = F.normalize(clf.embed(x), dim=1)
        em = F.normalize(clf.embed(xm), dim=1)
        sim = e @ em.T
        same = y[:, None] == ym[None, :]
        sim_same = sim.masked_fill(~same, -2.0)
        kk = min(k, int(same.sum(1).min().clamp(min=1)))
        top = sim_same.topk(kk, dim=1).values.clamp(min=-1).mean(1)
        n_cls = int(max(int(y.max()), int(ym.max())) + 1)
        cent = torch.zeros(n_cls, em.shape[1]).index_add_(0, ym, em)
        cent = F.normalize(cent, dim=1)
        cc = (e * cent[y]).sum(1)
    return torch.stack([top, cc], 1)


def zscore(f: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Batch normalisation without affine parameters (the meta-net's input BN)."""
    return (f - f.mean(0)) / (f.std(0, unbiased=False) + eps)


def gsnr(grads: torch.Tensor, rel_floor: float = 1e-5) -> dict[str, float]:
    """Gradient signal-to-noise ratio over ``grads`` (draws × K): per coordinate (E g_k)² / Var g_k
    (unbiased variance); the median over the coordinates that carry gradient, and the aggregate
    ‖E g‖² / tr Var g.

    - The median is the usual one (numpy's: the mean of the two middle values when their count is even),
      not torch's lower median.
    - A coordinate carries no gradient when every draw is within ``rel_floor`` × max|g| of zero (e.g. a
      bias the normalisation cancels, left at float rounding); it is left out of the median and of
      ``n_coords``.
    - A coordinate that is constant but non-zero over the draws carries pure signal: its SNR is inf.
    - Degenerate inputs: all coordinates constant (none zero-only) → median and aggregate inf; nothing
      carries gradient (all zero) → ``n_coords`` 0, median and aggregate nan."""
    g = grads.double()
    mean = g.mean(0)
    const = (g == g[:1]).all(0)  # exactly constant: no noise at all
    var = torch.where(const, torch.zeros_like(mean), g.var(0, unbiased=True))
    live = g.abs().amax(0) > rel_floor * float(g.abs().max())
    per = torch.where(const, torch.full_like(mean, float("inf")), mean**2 / var)[live]
    signal, noise = float((mean**2).sum()), float(var.sum())
    aggregate = signal / noise if noise > 0 else (float("inf") if signal > 0 else float("nan"))
    return {
        "median": float(np.median(per.numpy())) if live.any() else float("nan"),
        "aggregate": aggregate,
        "n_coords": int(live.sum()),
    }
