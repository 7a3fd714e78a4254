"""Expert Capacity Reallocation (card §2-3): the duty × expert cost matrix, entropic optimal transport
with a KL-relaxed expert marginal (log-domain Sinkhorn scaling), and the rules that read the selected
experts S_l from the plan (top column mass, κ coverage, greedy lowest cost, random)."""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


class TransportError(RuntimeError):
    """The Sinkhorn iterations did not produce a finite plan; the message names the instance."""


def sinkhorn_log(a: np.ndarray, b: np.ndarray, C: np.ndarray, eps: float, tau: float | None = None,
                 max_iter: int = 2000, tol: float = 1e-9, what: str = "ot") -> np.ndarray:
    """argmin_P ⟨P, C⟩ + ε·KL(P ‖ a bᵀ) + τ·KL(Pᵀ1 ‖ b)  s.t.  P1 = a   (τ = None: also Pᵀ1 = b).

    Scaling form P = diag(u) K diag(v), K = a bᵀ ⊙ exp(−C/ε): the row update is the exact projection
    u = a / (K v); the column update is the proximal step of the KL marginal penalty,
    v = (b / (Kᵀ u))^(τ/(τ+ε)) (exponent 1 when balanced). Run on log-potentials, so small ε never
    underflows. Stops when the row marginal, after a column step, is within ``tol`` of a (the fixed point)."""
    a, b, C = (np.asarray(x, float) for x in (a, b, C))
    if a.ndim != 1 or b.ndim != 1 or C.shape != (len(a), len(b)):
        raise ValueError(f"{what}: shapes a {a.shape}, b {b.shape}, C {C.shape} do not match")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError(f"{what}: marginals must be positive")
    fi = 1.0 if tau is None else tau / (tau + eps)
    logK = np.log(a)[:, None] + np.log(b)[None, :] - C / eps
    la, lb = np.log(a), np.log(b)
    lu, lv = np.zeros(len(a)), np.zeros(len(b))
    for _ in range(max_iter):
        lu = la - logsumexp(logK + lv[None, :], axis=1)
        lv = fi * (lb - logsumexp(logK + lu[:, None], axis=0))
        # after the column step the rows drift from a; at the fixed point they do not
        if np.abs(np.exp(logsumexp(lu[:, None] + logK + lv[None, :], axis=1)) - a).max() < tol:
            break
    lu = la - logsumexp(logK + lv[None, :], axis=1)          # end on the exact row projection
    P = np.exp(lu[:, None] + logK + lv[None, :])
    if not np.isfinite(P).all():
        raise TransportError(f"{what}: Sinkhorn produced a non-finite plan (eps={eps}, tau={tau})")
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
