"""Expert Capacity Reallocation (card §2-3): the duty × expert cost matrix, entropic optimal transport
with a KL-relaxed expert marginal (POT's log-domain Sinkhorn), and the rules that read the selected
experts S_l from the plan (top column mass, κ coverage, greedy lowest cost, random)."""
from __future__ import annotations

import numpy as np


class TransportError(RuntimeError):
    """The Sinkhorn iterations did not produce a finite plan; the message names the instance."""


def sinkhorn_log(a: np.ndarray, b: np.ndarray, C: np.ndarray, eps: float, tau: float | None = None,
                 max_iter: int = 2000, tol: float = 1e-9, what: str = "ot") -> np.ndarray:
    """argmin_P ⟨P, C⟩ + ε·KL(P ‖ a bᵀ) + τ·KL(Pᵀ1 ‖ b)  s.t.  P1 = a   (τ = None: also Pᵀ1 = b), by POT.

    Balanced: ``ot.sinkhorn(method="sinkhorn_log")``. Semi-relaxed: ``ot.unbalanced.sinkhorn_unbalanced``
    with reg_m = (∞, τ) and its translation-invariant log-domain iterations — POT's ``sinkhorn_stabilized``
    returns, without a warning, a plan whose duty marginal is off by ~0.5 at ε = 1e-3, so the hard marginal
    is checked here and a violation raises, naming the instance."""
    import warnings

    import ot

    a, b, C = (np.asarray(x, float) for x in (a, b, C))
    if a.ndim != 1 or b.ndim != 1 or C.shape != (len(a), len(b)):
        raise ValueError(f"{what}: shapes a {a.shape}, b {b.shape}, C {C.shape} do not match")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError(f"{what}: marginals must be positive")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)      # convergence is judged below, on the marginal
        if tau is None:
            P = ot.sinkhorn(a, b, C, eps, method="sinkhorn_log", numItermax=max_iter, stopThr=tol)
        else:
            P = ot.unbalanced.sinkhorn_unbalanced(a, b, C, eps, (float("inf"), tau),
                                                  method="sinkhorn_translation_invariant",
                                                  numItermax=max_iter, stopThr=tol)
    P = np.asarray(P, float)
    if not np.isfinite(P).all():
        raise TransportError(f"{what}: Sinkhorn produced a non-finite plan (eps={eps}, tau={tau})")
    err = float(np.abs(P.sum(1) - a).max())
    if err > 1e-6:
        raise TransportError(f"{what}: the duty marginal is off by {err:.1e} after {max_iter} iterations "
                             f"(eps={eps}, tau={tau}); raise ot.max_iter or eps")
    return P


def cost_matrix(f_u: np.ndarray, affinity: np.ndarray, head: np.ndarray, lambda_u: float, lambda_a: float,
                lambda_h: float) -> np.ndarray:
    """C[c, e] = λ_u f_u(e)/max f_u + λ_a (1 − A[c, e]/max A) + λ_h 1[e ∈ head], rescaled to [0, 1].

    ``f_u`` [E]: utility selection frequency; ``affinity`` [m, E]: each duty cluster's mean router
    probability; ``head`` [E] bool: the current (overloaded) safety experts."""
    fu = f_u / max(f_u.max(), 1e-12)
    A = affinity / max(affinity.max(), 1e-12)
    C = lambda_u * fu[None, :] + lambda_a * (1.0 - A) + lambda_h * head[None, :].astype(float)
    span = C.max() - C.min()
    return (C - C.min()) / span if span > 0 else np.zeros_like(C)


def kmeans(x: np.ndarray, k: int, seed: int, iters: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding → (centroids [k, d], labels [n]). k is capped at the
    number of distinct points."""
    rng = np.random.default_rng(seed)
    k = min(k, len(np.unique(x, axis=0)))
    cent = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d2 = ((x[:, None, :] - np.asarray(cent)[None]) ** 2).sum(-1).min(1)
        cent.append(x[rng.choice(len(x), p=d2 / d2.sum())])
    cent = np.asarray(cent)
    labels = np.zeros(len(x), int)
    for _ in range(iters):
        labels = ((x[:, None, :] - cent[None]) ** 2).sum(-1).argmin(1)
        new = np.stack([x[labels == j].mean(0) if (labels == j).any() else cent[j] for j in range(k)])
        if np.allclose(new, cent):
            break
        cent = new
    return cent, labels


def select(rule: str, plan: np.ndarray, C: np.ndarray, a: np.ndarray, n_sel: int, kappa: float,
           rng: np.random.Generator | None = None) -> list[int]:
    """S_l from one layer's plan [m, E]:
    - ``top``: the ``n_sel`` experts with the largest relaxed column mass;
    - ``kappa``: the smallest set holding ≥ κ of the mass;
    - ``greedy``: the ``n_sel`` experts with the lowest duty-weighted cost Σ_c a_c C[c, e] (no OT);
    - ``random``: ``n_sel`` experts at random."""
    mass = plan.sum(0)
    if rule == "top":
        return sorted(np.argsort(-mass, kind="stable")[:n_sel].tolist())
    if rule == "kappa":
        order = np.argsort(-mass, kind="stable")
        n = int((np.cumsum(mass[order]) / mass.sum() < kappa - 1e-12).sum()) + 1
        return sorted(order[:n].tolist())
    if rule == "greedy":
        return sorted(np.argsort(a @ C, kind="stable")[:n_sel].tolist())
    if rule == "random":
        return sorted(rng.choice(plan.shape[1], n_sel, replace=False).tolist())
    raise ValueError(f"unknown selection rule {rule!r}")
