"""Expert Capacity Reallocation (card §2-3): the duty × expert cost matrix, entropic optimal transport
with a KL-relaxed expert marginal (a log-domain semi-relaxed Sinkhorn written here; the balanced plan by
POT's log-domain Sinkhorn), and the rules that read the selected experts S_l from the plan (top column
mass, κ coverage, greedy lowest cost, random)."""

from __future__ import annotations

import warnings

import numpy as np
from scipy.special import logsumexp


class TransportError(RuntimeError):
    """The Sinkhorn iterations did not produce a finite plan; the message names the instance."""


class TransportWarning(RuntimeWarning):
    """Sinkhorn stopped on ``max_iter`` before its fixed-point tolerance; the message names ε, τ and the
    instance, and the plan is returned (its duty marginal is within 1e-6, or TransportError is raised)."""


def _semi_relaxed_log(
    a: np.ndarray, b: np.ndarray, C: np.ndarray, eps: float, tau: float, max_iter: int, tol: float
) -> tuple[np.ndarray, float, int]:
    """Generalised Sinkhorn on log-scalings, P = diag(e^lu) K diag(e^lv), log K = log a bᵀ − C/ε.

    Row step: the exact projection onto P1 = a. Column step: the proximal step of τ·KL(Pᵀ1 ‖ b),
    lv = τ/(τ+ε)·(log b − log Kᵀe^lu), after which the expert optimality condition holds exactly; then the
    exact dual maximisation over a constant shift lu + s, lv − s (the translation-invariant step of
    Séjourné et al. 2022: without it that mode contracts only by τ/(τ+ε) per sweep, ~1 for large τ). What
    is left is the duty marginal's drift. It stops when that drift, max|P1 − a|, and the change of the
    plan over the last sweep, max_ij |Δlu_i + Δlv_j| (the relative change of every entry), are both
    ≤ ``tol``. Absolute quantities in the log domain: neither exp(−C/ε) nor the size of the scalings can
    underflow or hide a change.
    Returns (plan after the column step, residual, sweeps)."""
    logK = np.log(a)[:, None] + np.log(b)[None, :] - C / eps
    la, lb, fi = np.log(a), np.log(b), tau / (tau + eps)
    lu, lv = np.zeros(len(a)), np.zeros(len(b))
    res = np.inf
    for it in range(1, max_iter + 1):
        lu_new = la - logsumexp(logK + lv[None, :], axis=1)
        lv_new = fi * (lb - logsumexp(logK + lu_new[:, None], axis=0))
        # translation step: the dual's best constant shift lu + s, lv − s (P unchanged) sets the relaxed
        # mass Σ_j b_j e^(−ε·lv_j/τ) — which after the column step is the plan's mass — to Σa
        shift = (tau / eps) * (np.log(a.sum()) - logsumexp(lb - (eps / tau) * lv_new))
        lu_new, lv_new = lu_new + shift, lv_new - shift
        du, dv = lu_new - lu, lv_new - lv  # log P_ij moves by du_i + dv_j
        step = max(abs(du.max() + dv.max()), abs(du.min() + dv.min()))
        lu, lv = lu_new, lv_new
        drift = np.abs(np.exp(lu + logsumexp(logK + lv[None, :], axis=1)) - a).max()
        res = max(step, drift)
        if res <= tol:
            break
    return np.exp(lu[:, None] + logK + lv[None, :]), float(res), it


def sinkhorn_log(
    a: np.ndarray,
    b: np.ndarray,
    C: np.ndarray,
    eps: float,
    tau: float | None = None,
    max_iter: int = 2000,
    tol: float = 1e-9,
    what: str = "ot",
) -> np.ndarray:
    """argmin_P ⟨P, C⟩ + ε·KL(P ‖ a bᵀ) + τ·KL(Pᵀ1 ‖ b)  s.t.  P1 = a   (τ = None: also Pᵀ1 = b).

    Balanced: POT's ``ot.sinkhorn(method="sinkhorn_log")`` (it stops when ‖Pᵀ1 − b‖ ≤ ``tol``, P1 = a
    exact). Semi-relaxed: ``_semi_relaxed_log`` above, which stops when the duty marginal and both dual
    potentials have converged to ``tol``. POT's semi-relaxed solvers are not used: ``sinkhorn_stabilized``
    returns a duty marginal off by ~0.5 at ε = 1e-3, and ``sinkhorn_translation_invariant`` (scaling
    domain) underflows exp(−C/ε) for C > 0.75 at ε = 1e-3 and stops on a change relative to its largest
    scaling — a plan ~0.02 per entry from the minimiser, the same for any ``max_iter``, while the duty
    marginal is met. Either way the convergence is checked here on the returned plan: a duty marginal off
    by more than 1e-6 raises TransportError, a plan short of ``tol`` warns (TransportWarning), naming ε,
    τ and the instance."""
    a, b, C = (np.asarray(x, float) for x in (a, b, C))
    if a.ndim != 1 or b.ndim != 1 or C.shape != (len(a), len(b)):
        raise ValueError(f"{what}: shapes a {a.shape}, b {b.shape}, C {C.shape} do not match")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError(f"{what}: marginals must be positive")
    if tau is None:
        import ot

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # POT's "did not converge": judged below instead
            P = np.asarray(ot.sinkhorn(a, b, C, eps, method="sinkhorn_log", numItermax=max_iter, stopThr=tol), float)
        res = float(max(np.abs(P.sum(1) - a).max(), np.abs(P.sum(0) - b).max()))
    else:
        P, res, _ = _semi_relaxed_log(a, b, C, eps, tau, max_iter, tol)
    if not np.isfinite(P).all():
        raise TransportError(f"{what}: Sinkhorn produced a non-finite plan (eps={eps}, tau={tau})")
    err = float(np.abs(P.sum(1) - a).max())
    if err > 1e-6:
        raise TransportError(
            f"{what}: the duty marginal is off by {err:.1e} after {max_iter} iterations "
            f"(eps={eps}, tau={tau}); raise ot.max_iter or eps"
        )
    if not res <= tol:
        warnings.warn(
            f"Sinkhorn stopped unconverged at eps={eps}, tau={tau} ({what}): residual {res:.1e} > "
            f"tol {tol:.0e} after max_iter={max_iter}; raise ot.max_iter or eps",
            TransportWarning,
            stacklevel=2,
        )
    return P


def cost_matrix(
    f_u: np.ndarray, affinity: np.ndarray, head: np.ndarray, lambda_u: float, lambda_a: float, lambda_h: float
) -> np.ndarray:
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


def select(
    rule: str,
    plan: np.ndarray,
    C: np.ndarray,
    a: np.ndarray,
    n_sel: int,
    kappa: float,
    rng: np.random.Generator | None = None,
) -> list[int]:
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
