"""The models of `adamspike` and the curvature they are probed with: the 1-D quadratic simulated exactly in
log space (paper §3, the constant-curvature counterexample), the 1 → H (tanh) → 1 MLP, Hessian-vector
products (an analytic R-operator in numpy, and torch double-backward as the generic reference) and warm-started
power iteration on the preconditioned Hessian D^½ H D^½ (same spectrum as Ĥ = D H)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# ---------------------------------------------------------------------------------------------------------
# 1-D quadratic f(θ) = ½ a θ², Adam / GD in log space
# ---------------------------------------------------------------------------------------------------------


def _slog_add(s1: float, l1: float, s2: float, l2: float) -> tuple[float, float]:
    """(sign, log|x|) of x1 + x2 from signed logs; log 0 = -inf."""
    if l1 == -math.inf:
        return s2, l2
    if l2 == -math.inf:
        return s1, l1
    if l1 < l2:
        s1, l1, s2, l2 = s2, l2, s1, l1
    r = math.exp(l2 - l1)
    if s1 == s2:
        return s1, l1 + math.log1p(r)
    if r == 1.0:
        return 1.0, -math.inf
    return s1, l1 + math.log1p(-r)


@dataclass
class QuadTrace:
    """Per-step record of the scalar run: everything in log10 so nothing underflows."""

    log10_loss: np.ndarray  # loss at θ_t (the step's starting point), t = 0..T (T+1 values)
    log10_g2: np.ndarray  # g_t², t = 0..T-1
    log10_v: np.ndarray  # bias-corrected v̂_t (1 for GD)
    eta_lambda_precond: np.ndarray  # η a / (√v̂_t + ε): λ(Ĥ) of the 1-D problem times η
    eta_lambda_grad: np.ndarray  # η uHu / (g u): equals the above for β₁ = 0; +inf when g u ≤ 0


def quad_run(
    a: float,
    theta0: float,
    lr: float,
    steps: int,
    optimizer: str = "adam",
    beta1: float = 0.0,
    beta2: float = 0.99,
    eps: float = 0.0,
) -> QuadTrace:
    """Adam (bias-corrected, PyTorch's update θ ← θ − η m̂/(√v̂ + ε)) or GD on ½aθ², tracked as signed logs.

    In float64 the loss of the β₂ = 0.999 run underflows (it falls below 1e-300); here θ, m and v are kept
    as (sign, log|x|), so the recursion is exact up to relative rounding however small they get."""
    if theta0 == 0:
        raise ValueError("quad.theta0 must be non-zero (θ = 0 is the minimum: nothing to simulate)")
    ln10 = math.log(10.0)
    la = math.log(a)
    s_th, l_th = math.copysign(1.0, theta0), math.log(abs(theta0))
    s_m, l_m = 1.0, -math.inf
    l_v = -math.inf
    log_loss = np.empty(steps + 1)
    log_g2, log_v, lam_p, lam_g = (np.empty(steps) for _ in range(4))
    for t in range(steps):
        log_loss[t] = (math.log(0.5) + la + 2 * l_th) / ln10
        s_g, l_g = s_th, la + l_th  # g = a θ
        log_g2[t] = 2 * l_g / ln10
        if optimizer == "gd":
            step_s, step_l = s_g, math.log(lr) + l_g  # η g
            log_v[t] = 0.0
            lam_p[t] = lam_g[t] = lr * a
        else:
            k = t + 1
            # m ← β₁ m + (1-β₁) g ;  v ← β₂ v + (1-β₂) g²
            if beta1 > 0:
                s_m, l_m = _slog_add(
                    s_m, math.log(beta1) + l_m if l_m > -math.inf else -math.inf, s_g, math.log1p(-beta1) + l_g
                )
            else:
                s_m, l_m = s_g, l_g
            l_v = (
                np.logaddexp(math.log(beta2) + l_v, math.log1p(-beta2) + 2 * l_g)
                if l_v > -math.inf
                else math.log1p(-beta2) + 2 * l_g
            )
            l_mhat = l_m - math.log(-math.expm1(k * math.log(beta1))) if beta1 > 0 else l_m
            l_vhat = l_v - math.log(-math.expm1(k * math.log(beta2)))
            l_den = float(np.logaddexp(0.5 * l_vhat, math.log(eps))) if eps > 0 else 0.5 * l_vhat
            step_s, step_l = s_m, math.log(lr) + l_mhat - l_den  # η m̂ / (√v̂ + ε)
            log_v[t] = l_vhat / ln10
            lam_p[t] = lr * a * math.exp(-l_den)
            # λ_grad = a u / g (1-D): u/g = (m̂/g)/(√v̂+ε); g u ≤ 0 → +inf (the first-order term already raises L)
            lam_g[t] = lr * a * math.exp(l_mhat - l_g - l_den) if s_m == s_g else math.inf
        s_th, l_th = _slog_add(s_th, l_th, -step_s, step_l)
        if l_th == -math.inf:
            raise FloatingPointError(f"quadratic run hit θ = 0 exactly at step {t}")
    log_loss[steps] = (math.log(0.5) + la + 2 * l_th) / ln10
    return QuadTrace(log_loss, log_g2, log_v, lam_p, lam_g)


# ---------------------------------------------------------------------------------------------------------
# The MLP 1 → H (tanh) → 1, full-batch MSE, and its curvature
# ---------------------------------------------------------------------------------------------------------


def make_mlp(width: int, seed: int):
    """PyTorch-default init (U(±1/√fan_in)), float64; parameters in the order W1, b1, W2, b2."""
    import torch

    class Mlp(torch.nn.Module):
        """1 → width (tanh) → 1; the forward is two fused addmm calls (a third less per-step overhead than
        nn.Sequential on this tiny net, which is what the default run's budget is spent on)."""

        def __init__(self):
            super().__init__()
            self.l1, self.l2 = torch.nn.Linear(1, width), torch.nn.Linear(width, 1)

        def forward(self, x):
            h = torch.tanh(torch.addmm(self.l1.bias, x, self.l1.weight.t()))
            return torch.addmm(self.l2.bias, h, self.l2.weight.t())

    torch.manual_seed(seed)
    return Mlp().double()


def flat_params(model) -> np.ndarray:
    return np.concatenate([q.detach().cpu().numpy().ravel() for q in model.parameters()])


class MlpCurvature:
    """Loss, gradient and exact Hessian-vector products (Pearlmutter's R-operator) of
    L(θ) = mean((f(x) − y)²), f(x) = W2 tanh(W1 x + b1) + b2, at one θ; the forward pass is cached so the
    several HVPs of a step share it."""

    def __init__(self, x: np.ndarray, y: np.ndarray, width: int):
        self.x, self.y, self.h_dim, self.n = x.reshape(-1), y.reshape(-1), width, x.size

    def _split(self, theta: np.ndarray):
        h = self.h_dim
        return theta[:h], theta[h : 2 * h], theta[2 * h : 3 * h], theta[3 * h]

    def at(self, theta: np.ndarray) -> MlpCurvature:
        w1, b1, w2, b2 = self._split(theta)
        self.w1, self.w2 = w1, w2
        self.hid = np.tanh(np.outer(self.x, w1) + b1)  # N × H
        self.dtanh = 1.0 - self.hid**2
        self.r = self.hid @ w2 + b2 - self.y  # residuals
        self.df = 2.0 * self.r / self.n  # dL/df
        self.dz = np.outer(self.df, w2) * self.dtanh  # dL/dz, N × H
        return self

    def loss(self) -> float:
        return float(np.mean(self.r**2))

    def grad(self) -> np.ndarray:
        return np.concatenate([self.dz.T @ self.x, self.dz.sum(0), self.df @ self.hid, [self.df.sum()]])

    def hvp(self, v: np.ndarray) -> np.ndarray:
        if v.ndim == 2:
            return self.hvp_batch(v)
        v1, c1, v2, c2 = self._split(v)
        rz = np.outer(self.x, v1) + c1
        rh = self.dtanh * rz
        rdf = 2.0 * (rh @ self.w2 + self.hid @ v2 + c2) / self.n
        rdz = (np.outer(rdf, self.w2) + np.outer(self.df, v2)) * self.dtanh - 2.0 * np.outer(
            self.df, self.w2
        ) * self.hid * rh
        return np.concatenate([rdz.T @ self.x, rdz.sum(0), rdf @ self.hid + self.df @ rh, [rdf.sum()]])

    def hvp_batch(self, vs: np.ndarray) -> np.ndarray:
        """H V for the k columns of V (P × k) in one pass: the power iterations of a step share it."""
        v1, c1, v2, c2 = (a.T for a in self._split(vs))  # (k, H) ×3, (k,)
        rz = self.x[None, :, None] * v1[:, None, :] + c1[:, None, :]  # k × N × H
        rh = self.dtanh * rz
        rdf = 2.0 * (rh @ self.w2 + v2 @ self.hid.T + c2[:, None]) / self.n  # k × N
        rdz = (rdf[:, :, None] * self.w2 + self.df[:, None] * v2[:, None, :]) * self.dtanh - 2.0 * (
            np.outer(self.df, self.w2) * self.hid
        ) * rh
        return np.concatenate([(self.x @ rdz).T, rdz.sum(1).T, (rdf @ self.hid + self.df @ rh).T, rdf.sum(1)[None]])


class QuadraticCurvature:
    """L(θ) = ½ θᵀAθ: H = A everywhere (the n-D quadratic of the reference tests)."""

    def __init__(self, a: np.ndarray):
        self.a = np.asarray(a, float)

    def at(self, theta: np.ndarray) -> QuadraticCurvature:
        return self

    def hvp(self, v: np.ndarray) -> np.ndarray:
        return self.a @ v


def autograd_hvp(model, x, y, v: np.ndarray) -> np.ndarray:
    """H v by torch double-backward at the model's current parameters (the generic reference)."""
    import torch

    params = list(model.parameters())
    loss = ((model(x).squeeze(-1) - y) ** 2).mean()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    flat = torch.cat([g.reshape(-1) for g in grads])
    if v.ndim == 2:
        return np.stack([autograd_hvp(model, x, y, v[:, j]) for j in range(v.shape[1])], axis=1)
    vt = torch.as_tensor(v, dtype=flat.dtype, device=flat.device)
    hv = torch.autograd.grad(flat @ vt, params)
    return torch.cat([h.reshape(-1) for h in hv]).detach().cpu().numpy()


def power_iteration(matvec, q0: np.ndarray, iters: int) -> tuple[float, np.ndarray]:
    """``iters`` steps of power iteration from ``q0`` (warm start); returns the Rayleigh quotient of the
    last iterate and the iterate. Finds the eigenvalue of largest magnitude of a symmetric operator."""
    q = q0 / np.linalg.norm(q0)
    lam = 0.0
    for _ in range(iters):
        aq = matvec(q)
        lam = float(q @ aq)
        norm = np.linalg.norm(aq)
        if not np.isfinite(norm) or norm == 0:
            break
        q = aq / norm
    return lam, q
