"""The closed-form engram estimator and its linear arithmetic (the paper's §3).

Per layer y = W x, with the ORIGINAL model's layer inputs x (a constant 1 appended to the network input):
  Σ_c = Σ_{x ∈ c} x xᵀ   (uncentered, summed over memory c's training samples),   Σ_R = Σ_c Σ_c,
  E_S = W Σ_S Σ_R⁺       (pinv with eigenvalues below rcond·λ_max dropped).
E_S is the minimum-norm solution of the constrained inverse problem
  min_E Σ_{x ∈ R} ‖E x − 1[x ∈ S] W x‖²   ⇔   normal equations E Σ_R = W Σ_S, rows of E in range(Σ_R):
the layer reproduces W on S's inputs and answers 0 on every other memory's inputs (least squares over R).
It is also one natural-gradient step from E = 0 on that loss, Σ_R being the K-FAC input factor.
For a partition of R the engrams add up to W Σ_R Σ_R⁺ (W on the span of the data), so erasing
(W − α E_S) and composing (Σ_{c ∈ S} E_c from the all-zero network) are plain additions.

Every function computes in float64 and returns float64 tensors, whatever float dtype it is given (the
trained weights are float32; a float32 pinv or a mixed-dtype matmul would lose the 1e-12 identities).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pipelines.engram.model import layer_inputs


def _f64(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [t.double() for t in tensors]


def class_covariances(
    weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, n_classes: int
) -> list[torch.Tensor]:
    """Per layer, the stacked summed second moments Σ_{c,ℓ} (C, d_ℓ, d_ℓ) of the model ``weights``'
    layer inputs (float64; computed once, from the unedited model)."""
    inputs, _ = layer_inputs([w.double() for w in weights], x.double())
    out = []
    for h in inputs:
        cov = torch.zeros(n_classes, h.shape[1], h.shape[1], dtype=torch.float64)
        for c in range(n_classes):
            hc = h[y == c]
            cov[c] = hc.T @ hc
        out.append(cov)
    return out


def psd_pinv(sigma: torch.Tensor, rcond: float) -> tuple[torch.Tensor, int]:
    """Σ⁺ of a symmetric PSD matrix keeping eigenvalues > rcond·λ_max, and that effective rank (a float64
    pinv of near-null directions would amplify them into catastrophic edits)."""
    evals, evecs = torch.linalg.eigh(sigma.double())
    lam_max = float(evals.max()) if evals.numel() else 0.0
    keep = evals > rcond * lam_max if lam_max > 0 else torch.zeros_like(evals, dtype=torch.bool)
    v = evecs[:, keep]
    return (v / evals[keep]) @ v.T, int(keep.sum())


def total_pinvs(covs: list[torch.Tensor], rcond: float) -> tuple[list[torch.Tensor], list[int]]:
    """Σ_R⁺ per layer (R = every memory) and the effective ranks."""
    res = [psd_pinv(c.sum(0), rcond) for c in _f64(covs)]
    return [r[0] for r in res], [r[1] for r in res]


def subset_cov(cov: torch.Tensor, subset: Iterable[int]) -> torch.Tensor:
    idx = torch.as_tensor(sorted(set(subset)), dtype=torch.long)
    return cov[idx].sum(0)


def engram(
    weights: list[torch.Tensor], covs: list[torch.Tensor], subset: Iterable[int], pinvs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """E_{S,ℓ} = W_ℓ Σ_{S,ℓ} Σ_{R,ℓ}⁺ for every layer."""
    subset = list(subset)
    return [w @ subset_cov(c, subset) @ pr for w, c, pr in zip(_f64(weights), _f64(covs), _f64(pinvs), strict=True)]


def class_engrams(
    weights: list[torch.Tensor], covs: list[torch.Tensor], pinvs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Every single-class engram at once: per layer (C, out, in)."""
    return [
        torch.einsum("oi,cij,jk->cok", w, c, pr)
        for w, c, pr in zip(_f64(weights), _f64(covs), _f64(pinvs), strict=True)
    ]


def add(
    weights: list[torch.Tensor], delta: list[torch.Tensor], alpha: float = 1.0, layers: Iterable[int] | None = None
) -> list[torch.Tensor]:
    """W_ℓ + α Δ_ℓ on the chosen layers (all by default); the others unchanged."""
    layers = set(range(len(weights))) if layers is None else set(layers)
    return [w + alpha * d if i in layers else w.clone() for i, (w, d) in enumerate(zip(weights, delta, strict=True))]


def erase(
    weights: list[torch.Tensor], eng: list[torch.Tensor], alpha: float = 1.0, layers: Iterable[int] | None = None
) -> list[torch.Tensor]:
    """Necessity: W − α E_S (all layers at once, every engram from the unedited model)."""
    return add(weights, eng, -alpha, layers)


def compose(engrams: Iterable[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Sufficiency: the all-zero network plus the engrams of S (a list of per-layer engram lists)."""
    engrams = list(engrams)
    return [torch.stack([e[i] for e in engrams]).sum(0) for i in range(len(engrams[0]))]


def cosine_matrix(per_class: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of the flattened engrams of every pair of classes (C, C)."""
    flat = per_class.double().reshape(per_class.shape[0], -1)
    flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return flat @ flat.T


def class_pc_projector(cov_c: torch.Tensor, k: int) -> torch.Tensor:
    """The no-pinv ablation's P: the projector onto the top-k eigenvectors of class c's (uncentered)
    second moment; erasing is then W − W P (class directions removed whatever other classes share)."""
    _, evecs = torch.linalg.eigh(cov_c.double())
    v = evecs[:, -min(k, cov_c.shape[0]) :]
    return v @ v.T


def data_energy(weights: list[torch.Tensor], covs: list[torch.Tensor]) -> float:
    """√(Σ_ℓ tr(W_ℓ Σ_R,ℓ W_ℓᵀ)) = √(Σ_ℓ Σ_{x∈R} ‖W_ℓ x_ℓ‖²): a weight change's size as seen by the
    data."""
    return (
        sum(float(torch.einsum("oi,ij,oj->", w, c.sum(0), w)) for w, c in zip(_f64(weights), _f64(covs), strict=True))
        ** 0.5
    )


def random_like(
    eng: list[torch.Tensor], gen: torch.Generator, sigmas: list[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """Random Gaussian directions with each layer's Frobenius norm equal to the engram's; with ``sigmas``
    (Σ_R per layer) the data energy ‖R Σ^½‖_F equals the engram's instead."""
    out = []
    for i, e in enumerate(_f64(eng)):
        r = torch.randn(e.shape, generator=gen, dtype=torch.float64)
        if sigmas is None:
            out.append(r * (e.norm() / r.norm().clamp_min(1e-300)))
        else:
            s = sigmas[i].double()
            num = float(torch.einsum("oi,ij,oj->", e, s, e)) ** 0.5
            den = max(float(torch.einsum("oi,ij,oj->", r, s, r)) ** 0.5, 1e-300)
            out.append(r * (num / den))
    return out
