"""Models of `featjnd`: the small CNN cut at two standardised split points (S1, S2), and the FeatJND
estimator G_θ with its relaxed chance-constrained loss (card, Mechanism: J = softplus(G_θ(f)),
L = −λ_M·M(J) + μ·E_z[(D_t − τ)_+], dual ascent on μ) and the post-hoc global scale calibrated on val."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SPLITS = ("s1", "s2")


def _block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    # every conv followed by BN + ReLU, so split features are post-activation (card: "after the activation")
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class SmallCNN(nn.Module):
    """stem 1→w0 → s2 w0→w1 [S1] → s2 w1→w2 [S2] → w2→w3 → GAP → FC."""

    def __init__(self, in_ch: int = 1, widths: tuple[int, ...] = (16, 32, 64, 64), n_classes: int = 10):
        super().__init__()
        w0, w1, w2, w3 = widths
        self.stages = nn.ModuleList(
            [
                nn.Sequential(_block(in_ch, w0, 1), _block(w0, w1, 2)),  # → S1
                _block(w1, w2, 2),  # → S2
                _block(w2, w3, 1),
            ]
        )
        self.fc = nn.Linear(w3, n_classes)

    def encode(self, x: torch.Tensor, split: str) -> torch.Tensor:
        """E(x): the feature at the split point."""
        for stage in self.stages[: SPLITS.index(split) + 1]:
            x = stage(x)
        return x

    def head(self, f: torch.Tensor, split: str) -> torch.Tensor:
        """h(f): the frozen downstream head from the split point to the logits."""
        for stage in self.stages[SPLITS.index(split) + 1 :]:
            f = stage(f)
        return self.fc(f.mean(dim=(2, 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(x, "s2"), "s2")


def freeze(model: nn.Module) -> nn.Module:
    """Backbone and head stay in eval mode (BN stats frozen) with no gradient (card, Pitfalls)."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class JNDEstimator(nn.Module):
    """G_θ: 3×3 conv C→h, GELU, 3×3 conv h→h, GELU, 1×1 conv h→C; J = min(softplus(G_θ(f)), j_max).

    Input and output live in the per-channel normalised feature space (f / train std)."""

    def __init__(self, channels: int, hidden: int = 32, j_max: float = 10.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, hidden, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(hidden, hidden, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(hidden, channels, 1),
        )
        self.j_max = j_max
        # log J is maximised: the clamp stops J → ∞ on channels the head ignores (dead ReLUs)
        self.register_buffer("scale", torch.ones(()))  # the global scale s calibrated on val

    def raw(self, fn: torch.Tensor) -> torch.Tensor:
        return F.softplus(self.net(fn)).clamp(max=self.j_max)

    def forward(self, fn: torch.Tensor) -> torch.Tensor:
        return self.scale * self.raw(fn)


def sample_noise(
    shape: tuple[int, ...], dist: str, gen: torch.Generator | None = None, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """z with zero mean and unit variance: N(0, I), or U(−√3, √3) when ``dist == 'uniform'``."""
    if dist == "uniform":
        return (torch.rand(shape, generator=gen, device=device) * 2 - 1) * math.sqrt(3.0)
    return torch.randn(shape, generator=gen, device=device)


def kl_clean_noisy(clean_logits: torch.Tensor, noisy_logits: torch.Tensor) -> torch.Tensor:
    """D_t = KL(softmax(h(f)) ‖ softmax(h(f+δ))) per sample, in nats."""
    logp = F.log_softmax(clean_logits, -1)
    logq = F.log_softmax(noisy_logits, -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def magnitude(j: torch.Tensor, metric: str) -> torch.Tensor:
    """M(J): mean log amplitude (default) or the ℓ2 (RMS) amplitude."""
    if metric == "l2":
        return j.pow(2).mean().sqrt()
    return torch.log(j + 1e-6).mean()


def jnd_loss(
    j: torch.Tensor,
    fn: torch.Tensor,
    std: torch.Tensor,
    clean_logits: torch.Tensor,
    head,
    k: int,
    tau: float,
    lambda_m: float,
    mu: float,
    noise_dist: str,
    metric: str,
    gen: torch.Generator | None = None,
) -> tuple[torch.Tensor, float]:
    """The relaxed objective on one mini-batch with K noise draws; returns (loss, flip rate).

    The chance constraint Pr[drop ≤ ε] ≥ 1 − ρ becomes a hinge on the expected KL above τ, weighted by the
    dual variable μ (updated outside from the flip rate)."""
    b = fn.shape[0]
    z = sample_noise((k, *fn.shape), noise_dist, gen, fn.device)
    noisy = (fn.unsqueeze(0) + j.unsqueeze(0) * z).reshape(k * b, *fn.shape[1:])
    logits = head(noisy * std)
    clean = clean_logits.repeat(k, 1)
    hinge = F.relu(kl_clean_noisy(clean, logits) - tau).mean()
    flip = (logits.argmax(-1) != clean.argmax(-1)).float().mean().item()
    return -lambda_m * magnitude(j, metric) + mu * hinge, flip


@torch.no_grad()
def flip_rate(
    j: torch.Tensor, fn: torch.Tensor, std: torch.Tensor, head, draws: list[torch.Tensor], batch: int = 512
) -> float:
    """Share of predictions that change under f + J⊙z, averaged over the given noise draws."""
    flips, total = 0, 0
    for z in draws:
        for i in range(0, fn.shape[0], batch):
            f, jj, zz = fn[i : i + batch], j[i : i + batch], z[i : i + batch]
            clean = head(f * std).argmax(-1)
            noisy = head((f + jj * zz) * std).argmax(-1)
            flips += int((clean != noisy).sum())
            total += f.shape[0]
    return flips / max(total, 1)


def calibrate_scale(
    j: torch.Tensor,
    fn: torch.Tensor,
    std: torch.Tensor,
    head,
    rho: float,
    steps: int,
    draws: list[torch.Tensor],
    lo: float = 1e-3,
    hi: float = 1e2,
) -> float:
    """Global s with flip_rate(s·J) ≈ ρ on val, by bisection in log s (fixed draws keep it monotone).

    Needed because the overfit backbone flips ~4× less on train features than on held-out ones."""
    log_lo, log_hi = math.log(lo), math.log(hi)
    for _ in range(steps):
        mid = 0.5 * (log_lo + log_hi)
        if flip_rate(math.exp(mid) * j, fn, std, head, draws) > rho:
            log_hi = mid
        else:
            log_lo = mid
    return math.exp(0.5 * (log_lo + log_hi))
