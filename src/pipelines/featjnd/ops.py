"""The measurement mechanics of `featjnd`'s experiments: matched-energy distortions and the control maps
(E1), rank correlation and bg/fg ratios (E2), token-wise dynamic quantization with budget-matched step
allocations and its rate proxy (E3). Pure tensor functions, tested against independent references."""

from __future__ import annotations

import torch


def norms64(x: torch.Tensor) -> torch.Tensor:
    """Per-sample ℓ2 norms (over every axis but the first) in float64, each sample first divided by its
    largest magnitude, so neither the squares nor their sum can overflow or underflow: exact to float64
    rounding for any finite input, whatever its dtype and scale (1e-30 and 1e30 in float32 included)."""
    x = x.detach().double().flatten(1)
    peak = x.abs().amax(1) if x.shape[1] else torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    safe = torch.where(peak > 0, peak, torch.ones_like(peak))
    return peak * torch.linalg.vector_norm(x / safe.unsqueeze(1), dim=1)


def _first(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask)[0, 0])


def match_energy(direction: torch.Tensor, f: torch.Tensor, snr_db: float) -> torch.Tensor:
    """δ = direction rescaled per image so that ‖δ‖² = ‖f‖² · 10^(−snr/10) (card E1).

    Matched per image (never per batch, which would flatter a structured map). Norms, the scale and δ are
    computed in float64 with per-image max-scaling (:func:`norms64`), so the SNRs agree to 1e-6 whatever
    the dynamic range of the map or the feature; δ is returned in the direction's dtype. A direction that
    is all zeros (nothing to rescale), non-finite entries, or a δ the dtype cannot hold to that accuracy
    raise a ValueError naming the first offending sample."""
    if direction.shape != f.shape:
        raise ValueError(
            f"match_energy: direction {tuple(direction.shape)} and feature {tuple(f.shape)} differ in shape"
        )
    d64 = direction.detach().double()
    for name, t in (("direction", d64), ("feature", f)):
        bad = ~torch.isfinite(t.detach().flatten(1)).all(1)
        if bad.any():
            raise ValueError(
                f"match_energy: the {name} of sample {_first(bad)} has non-finite entries "
                f"({int(bad.sum())} sample(s) affected)"
            )
    d_norm, f_norm = norms64(d64), norms64(f)
    zero = d_norm == 0
    if zero.any():
        raise ValueError(
            f"match_energy: the direction of sample {_first(zero)} is all zeros, so it cannot be "
            f"rescaled to {snr_db:g} dB ({int(zero.sum())} sample(s) affected)"
        )
    target = f_norm * 10.0 ** (-snr_db / 20.0)
    shape = (-1, *([1] * (direction.dim() - 1)))
    delta = (d64 * (target / d_norm).view(shape)).to(direction.dtype)
    # the cast to a narrower dtype may overflow (inf) or flush to zero/subnormals: say so, never return it
    finite = torch.isfinite(delta.flatten(1)).all(1)
    got = torch.where(finite, norms64(torch.nan_to_num(delta, posinf=0.0, neginf=0.0)), float("inf"))
    off = (target > 0) & ~((got - target).abs() <= 1e-6 * target)
    if off.any():
        i = _first(off)
        raise ValueError(
            f"match_energy: δ of sample {i} (norm {float(target[i]):.3g}) is not representable in "
            f"{direction.dtype} to 1e-6"
        )
    return delta


def snr_db(f: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Per-image SNR (dB) of the distortion δ relative to the feature f (float64, any scale)."""
    return 20.0 * torch.log10(norms64(f) / norms64(delta))


def shuffle_spatial(j: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """J permuted over positions independently within each channel of each image: keeps every channel's
    multiset of tolerances (the channel allocation) and destroys the placement."""
    b, c, h, w = j.shape
    flat = j.reshape(b * c, h * w)
    idx = torch.argsort(torch.rand(flat.shape, generator=gen), dim=1)
    return torch.gather(flat, 1, idx).reshape(b, c, h, w)


def shuffle_all(j: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """J permuted over all C·H·W entries of each image (keeps only the image's multiset)."""
    b = j.shape[0]
    flat = j.reshape(b, -1)
    idx = torch.argsort(torch.rand(flat.shape, generator=gen), dim=1)
    return torch.gather(flat, 1, idx).reshape(j.shape)


def ranks(x: torch.Tensor) -> torch.Tensor:
    """0-based ranks along the last axis, ties get their average rank (as scipy's rankdata, minus 1)."""
    sorted_x = torch.sort(x.contiguous(), dim=-1).values
    left = torch.searchsorted(sorted_x, x.contiguous(), right=False)
    right = torch.searchsorted(sorted_x, x.contiguous(), right=True)
    return (left + right - 1).double() / 2


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation of each row of a with the same row of b (shape B×N → B)."""
    ra, rb = ranks(a.double()), ranks(b.double())
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    return (ra * rb).sum(-1) / torch.sqrt(ra.pow(2).sum(-1) * rb.pow(2).sum(-1)).clamp_min(1e-300)


def pooled_mask(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The image-resolution object mask max-pooled to the feature grid (B×H×W bool)."""
    import torch.nn.functional as F

    return F.adaptive_max_pool2d(mask.float().unsqueeze(1), size).squeeze(1) > 0.5


def bg_fg_ratio(map_bhw: torch.Tensor, mask_bhw: torch.Tensor) -> torch.Tensor:
    """Per image: mean of the map outside the mask / mean inside (NaN where either side is empty)."""
    m = mask_bhw.float()
    fg = (map_bhw * m).sum((1, 2)) / m.sum((1, 2))
    bg = (map_bhw * (1 - m)).sum((1, 2)) / (1 - m).sum((1, 2))
    return bg / fg


def token_weights(j: torch.Tensor, how: str = "mean") -> torch.Tensor:
    """Aggregate a C×H×W map to one positive weight per spatial token (B×T)."""
    flat = j.reshape(j.shape[0], j.shape[1], -1)
    if how == "rms":
        return flat.pow(2).mean(1).sqrt()
    if how == "geomean":
        return torch.exp(torch.log(flat.clamp_min(1e-12)).mean(1))
    return flat.mean(1)


def steps_from_weights(w: torch.Tensor, delta0: float) -> torch.Tensor:
    """Δ_t ∝ w_t, renormalised per image so that mean_t Δ_t² = Δ0² (the noise budget Σ_t C·Δ_t²/12)."""
    w = w.double()
    return delta0 * w / w.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-300)


def permute_steps(steps: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The same per-image multiset of steps, randomly permuted over tokens (budget-matched by construction)."""
    idx = torch.argsort(torch.rand(steps.shape, generator=gen), dim=-1)
    return torch.gather(steps, -1, idx)


def quantize(
    f: torch.Tensor, steps: torch.Tensor, clip: float, dither: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-wise quantization of f (B×C×H×W) with per-token steps (B×T): Δ_t·round(f/Δ_t), or the dithered
    Δ_t·(round(f/Δ_t + u) − u) whose error is exactly uniform with variance Δ²/12.

    The range is clipped to [−clip, clip] identically for every allocation. Returns (f̂, integer symbols)."""
    b, c, h, w = f.shape
    d = steps.reshape(b, 1, h, w).to(f.dtype)
    x = f.clamp(-clip, clip) / d
    if dither is None:
        q = torch.round(x)
        return q * d, q
    q = torch.round(x + dither)
    return (q - dither) * d, q


def entropy_bits(symbols: torch.Tensor) -> float:
    """Empirical entropy (bits per element) of the quantised integer symbols: the rate proxy."""
    q = symbols.reshape(-1).long()
    lo, hi = int(q.min()), int(q.max())
    if hi - lo < 50_000_000:  # a histogram is ~20x faster than sorting for unique()
        counts = torch.bincount(q - lo)
        counts = counts[counts > 0]
    else:
        counts = torch.unique(q, return_counts=True)[1]
    p = counts.double() / counts.sum()
    return float(-(p * torch.log2(p)).sum())
