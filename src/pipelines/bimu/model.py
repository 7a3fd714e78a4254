"""The Bayesian binary network of BiMU (paper §3, appendix "architecture") and the update rules on its
natural parameters λ: BiMU (bounded-memory update, §4), BayesBiNN (Meng et al. 2020, official form) and a
plain online step.

Weights w ∈ {−1, +1} with q(w = +1) = sigmoid(2λ), so E w = tanh λ and Var w = 1 − tanh² λ. Every tensor
carries a leading replica dimension R: seeds (or hyper-parameter settings) of one family train side by side
in one Python step, each replica with its own λ, noise and data.
Block: BinaryLinear (no bias) → LayerNorm (no affine) → reverse binary gate 1[|z| > 1]; the last layer is
BinaryLinear → LayerNorm giving the logits.
"""

from __future__ import annotations

import math

import torch

LN_EPS = 1e-5


# ---------------------------------------------------------------- the relaxed (training) forward pass
def _ln(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mu = h.mean(-1, keepdim=True)
    sd = torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + LN_EPS)
    return (h - mu) / sd, sd


def _ln_backward(dz: torch.Tensor, z: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    return (dz - dz.mean(-1, keepdim=True) - z * (dz * z).mean(-1, keepdim=True)) / sd


def gate_surrogate(z: torch.Tensor) -> torch.Tensor:
    """d gate / dz of the reverse binary gate: +1 on (0.5, 1.5), −1 on (−1.5, −0.5), 0 elsewhere."""
    a = z.abs()
    return ((a > 0.5) & (a < 1.5)).to(z.dtype) * torch.sign(z)


class RelaxedLoss(torch.autograd.Function):
    """Per-replica loss −mean_K log softmax(logits)[y] under the concrete relaxation
    w̃ = tanh((λ + ½ logit u) / τ), with a hand-written fused backward (no autograd graph: the batch-1
    stream is Python-bound, and this cuts ~170 small ops to ~30). ``noise`` holds ½ logit(u)."""

    @staticmethod
    def forward(ctx, lam1, lam2, x, y, n1, n2, tau):
        w1 = torch.tanh((lam1.unsqueeze(1) + n1) / tau)  # R K H D
        h1 = torch.einsum("rkhd,rd->rkh", w1, x)
        z1, sd1 = _ln(h1)
        a = (z1.abs() > 1).to(x.dtype)
        w2 = torch.tanh((lam2.unsqueeze(1) + n2) / tau)  # R K C H
        h2 = torch.einsum("rkch,rkh->rkc", w2, a)
        z2, sd2 = _ln(h2)
        logp = torch.log_softmax(z2, -1)
        onehot = torch.nn.functional.one_hot(y, z2.shape[-1]).to(x.dtype).unsqueeze(1)  # R 1 C
        loss = -(logp * onehot).sum(-1).mean(1)  # R
        ctx.save_for_backward(x, w1, z1, sd1, a, w2, z2, sd2, logp, onehot)
        ctx.tau = tau
        return loss

    @staticmethod
    def backward(ctx, gout):
        x, w1, z1, sd1, a, w2, z2, sd2, logp, onehot = ctx.saved_tensors
        tau, k = ctx.tau, w1.shape[1]
        dz2 = (logp.exp() - onehot) * (gout[:, None, None] / k)
        dh2 = _ln_backward(dz2, z2, sd2)
        dlam2 = (dh2.unsqueeze(-1) * a.unsqueeze(2) * (1 - w2 * w2)).sum(1) / tau
        da = torch.einsum("rkch,rkc->rkh", w2, dh2)
        dh1 = _ln_backward(da * gate_surrogate(z1), z1, sd1)
        dlam1 = (dh1.unsqueeze(-1) * x[:, None, None, :] * (1 - w1 * w1)).sum(1) / tau
        return dlam1, dlam2, None, None, None, None, None


def relaxed_loss(lam1, lam2, x, y, n1, n2, tau: float = 1.0) -> torch.Tensor:
    """Per-replica relaxed loss (R,), fused forward/backward."""
    return RelaxedLoss.apply(lam1, lam2, x, y, n1, n2, tau)


def binary_net_loss(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-replica −mean_K log softmax(logits)[y] of the binary block for weights w (R, K, ...), in plain
    autograd ops: the gate's surrogate is the derivative of clamp(|z| − ½, 0, 1), attached straight-through."""
    ln = lambda h: torch.nn.functional.layer_norm(h, h.shape[-1:], eps=LN_EPS)  # noqa: E731
    z1 = ln(torch.einsum("rkhd,rd->rkh", w1, x))
    soft = torch.clamp(z1.abs() - 0.5, 0, 1)
    a = (z1.abs() > 1).to(x.dtype) + soft - soft.detach()
    z2 = ln(torch.einsum("rkch,rkh->rkc", w2, a))
    logp = torch.log_softmax(z2, -1)
    return -logp.gather(-1, y[:, None, None].expand(-1, logp.shape[1], 1)).squeeze(-1).mean(1)


def relaxed_loss_autograd(lam1, lam2, x, y, n1, n2, tau: float = 1.0) -> torch.Tensor:
    """The relaxed loss with plain autograd ops (the reference the fused backward is tested against)."""
    return binary_net_loss(torch.tanh((lam1.unsqueeze(1) + n1) / tau), torch.tanh((lam2.unsqueeze(1) + n2) / tau), x, y)


def ste_sign(w: torch.Tensor) -> torch.Tensor:
    """sign(w) forward, the straight-through estimator backward (gradient 1 on |w| < 1, Hubara et al.)."""
    c = w.clamp(-1, 1)
    return c + (torch.where(w >= 0, 1.0, -1.0) - c).detach()


def _rand(shape, gens) -> torch.Tensor:
    """U(0, 1) of ``shape`` whose leading (replica) slices come from one generator each, so a replica's
    draws do not depend on which other replicas run beside it."""
    if isinstance(gens, torch.Generator):
        return torch.rand(shape, generator=gens)
    return torch.stack([torch.rand(shape[1:], generator=g) for g in gens])


class NoiseBlocks:
    """½ logit(u), u ~ U(0, 1), pre-sampled in blocks of steps (sampling is a large share of a step)."""

    def __init__(self, shape1, shape2, block: int, gens):
        self.s1, self.s2, self.block, self.gens = tuple(shape1), tuple(shape2), block, gens
        self.start = -1

    def _draw(self, shape):  # (block, R, ...) with replica r drawn from gens[r]
        u = _rand((shape[0], self.block, *shape[1:]), self.gens).transpose(0, 1)
        return torch.special.logit(u, eps=1e-7).mul_(0.5)

    def __call__(self, step: int):
        start = step - step % self.block
        if start != self.start:
            self.n1, self.n2, self.start = self._draw(self.s1), self._draw(self.s2), start
        return self.n1[step - start], self.n2[step - start]


# ---------------------------------------------------------------- the network and its hard-sample predictions
class BinaryBayesNet(torch.nn.Module):
    """R replicas of a D–H–C mean-field Bernoulli binary network; parameters are the natural λ."""

    def __init__(self, replicas: int, d_in: int, hidden: int, n_classes: int, init: str, gen):
        super().__init__()
        if init == "uniform":  # Equinox Linear's default U(±1/√fan_in), as BiMU's official init
            l1 = (_rand((replicas, hidden, d_in), gen) * 2 - 1) / math.sqrt(d_in)
            l2 = (_rand((replicas, n_classes, hidden), gen) * 2 - 1) / math.sqrt(hidden)
        elif init == "zero":  # BayesBiNN's λ₀ = 0
            l1, l2 = torch.zeros(replicas, hidden, d_in), torch.zeros(replicas, n_classes, hidden)
        else:
            raise ValueError(f"unknown init {init!r}")
        self.lam1, self.lam2 = torch.nn.Parameter(l1), torch.nn.Parameter(l2)

    def lams(self) -> list[torch.Tensor]:
        return [self.lam1, self.lam2]


@torch.no_grad()
def hard_probs(lam1: torch.Tensor, lam2: torch.Tensor, x: torch.Tensor, k: int, gen) -> torch.Tensor:
    """Softmax outputs (R, K, N, C) of K hard Bernoulli weight samples; x is (N, D) or (R, N, D); ``gen``
    one generator or one per replica."""
    w1 = torch.where(_rand((lam1.shape[0], k, *lam1.shape[1:]), gen) < torch.sigmoid(2 * lam1).unsqueeze(1), 1.0, -1.0)
    w2 = torch.where(_rand((lam2.shape[0], k, *lam2.shape[1:]), gen) < torch.sigmoid(2 * lam2).unsqueeze(1), 1.0, -1.0)
    xr = x if x.dim() == 3 else x.unsqueeze(0).expand(lam1.shape[0], -1, -1)
    h1 = torch.einsum("rkhd,rnd->rknh", w1, xr)
    z1, _ = _ln(h1)
    a = (z1.abs() > 1).to(x.dtype)
    z2, _ = _ln(torch.einsum("rkch,rknh->rknc", w2, a))
    return torch.softmax(z2, -1)


def uncertainty(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """From MC softmax samples (..., K, N, C): the mean prediction, aleatoric = mean entropy and epistemic =
    mutual information (both in bits), and the variation ratio (share of samples disagreeing with the
    argmax of the mean prediction)."""

    def ent(q):
        return -(q * torch.log2(q.clamp_min(1e-12))).sum(-1)

    mean = probs.mean(-3)
    alea = ent(probs).mean(-2)
    pred = mean.argmax(-1)
    agree = (probs.argmax(-1) == pred.unsqueeze(-2)).to(probs.dtype).mean(-2)
    return {
        "mean": mean,
        "pred": pred,
        "aleatoric": alea,
        "epistemic": (ent(mean) - alea).clamp_min(0),
        "vr": 1 - agree,
    }


# ---------------------------------------------------------------- posterior regulariser and update rules
def bernoulli_kl(lam: torch.Tensor, lam0: torch.Tensor | float = 0.0) -> torch.Tensor:
    """KL(q_λ ‖ q_λ₀) summed over weights, for q(w = ±1) = sigmoid(±2λ) (closed form in λ)."""
    lam0 = torch.as_tensor(lam0, dtype=lam.dtype)
    # KL = A(λ₀) − A(λ) + (λ − λ₀) tanh λ with log-partition A(λ) = log(2 cosh λ)
    a = lambda t: torch.logaddexp(t, -t)  # noqa: E731
    return (a(lam0) - a(lam) + (lam - lam0) * torch.tanh(lam)).sum()


def bernoulli_kl_grad(lam: torch.Tensor, lam0: torch.Tensor | float = 0.0) -> torch.Tensor:
    """∂KL/∂λ = (1 − tanh² λ)(λ − λ₀): the Fisher information times the distance to the prior."""
    return (1 - torch.tanh(lam) ** 2) * (lam - lam0)


def bimu_delta(
    lam: torch.Tensor,
    grad: torch.Tensor,
    *,
    lm: float,
    eta: float,
    eta_max: float,
    kappa: float,
    n_mem: float,
    relaxation: bool = True,
) -> torch.Tensor:
    """BiMU's Δλ = −(η g + s λ / N) / (s + 2 g t + 2|g| + 1/η_max), g = ℓ_m ∂L/∂λ, t = tanh λ,
    s = κ(1 − t²). ``relaxation=False`` drops the prior relaxation and the uncertainty-dependent step
    (s = 0 and the 2gt + 2|g| terms): the update is then the plain online step −η η_max g."""
    g = lm * grad
    if not relaxation:
        return -(eta * eta_max) * g
    t = torch.tanh(lam)
    s = kappa * (1 - t * t)
    return -(eta * g + s * lam / n_mem) / (s + 2 * g * t + 2 * g.abs() + 1 / eta_max)


def bayesbinn_delta(
    lam: torch.Tensor, grad: torch.Tensor, *, lr: float, prior_strength: float, lam0: float = 0.0
) -> torch.Tensor:
    """BayesBiNN (official form): ĝ = ∂L/∂λ / (1 − tanh² λ + 1e−7) (the reparameterisation gradient mapped
    to the expectation parameter), Δλ = −lr (ĝ + prior_strength (λ − λ₀))."""
    ghat = grad / (1 - torch.tanh(lam) ** 2 + 1e-7)
    return -lr * (ghat + prior_strength * (lam - lam0))


def online_delta(lam: torch.Tensor, grad: torch.Tensor, *, lr: float) -> torch.Tensor:
    """Plain online gradient step on λ (no prior, no uncertainty-dependent step)."""
    return -lr * grad


class LambdaRule(torch.optim.Optimizer):
    """A custom update on λ as a torch optimizer (``core.training.fit`` takes it as a callable optimizer).
    A replica whose gradients are all zero (no label queried) is skipped entirely, forgetting term
    included (the official code multiplies the update by 1[Σ|grad| > 0])."""

    def __init__(self, params, rule, **hp):
        super().__init__(params, {})
        self.rule, self.hp = rule, hp

    @torch.no_grad()
    def step(self, closure=None):
        ps = [q for grp in self.param_groups for q in grp["params"] if q.grad is not None]
        if not ps:
            return None
        live = sum(q.grad.abs().flatten(1).sum(1) for q in ps) > 0  # R
        for q in ps:
            d = self.rule(q, q.grad, **self.hp)
            q.add_(d * live.view(-1, *[1] * (q.dim() - 1)).to(d.dtype))
        return None


# ---------------------------------------------------------------- MESU baseline (Gaussian mean field, ReLU)
class GaussianNet(torch.nn.Module):
    """R replicas of a D–H–C Gaussian mean-field ReLU network (no biases): w ~ N(μ, σ²) per weight."""

    def __init__(self, replicas: int, d_in: int, hidden: int, n_classes: int, sigma_init: float, gen):
        super().__init__()
        self.mu1 = torch.nn.Parameter((_rand((replicas, hidden, d_in), gen) * 2 - 1) / math.sqrt(d_in))
        self.sig1 = torch.nn.Parameter(torch.full((replicas, hidden, d_in), sigma_init))
        self.mu2 = torch.nn.Parameter((_rand((replicas, n_classes, hidden), gen) * 2 - 1) / math.sqrt(hidden))
        self.sig2 = torch.nn.Parameter(torch.full((replicas, n_classes, hidden), sigma_init))

    def logits(self, x: torch.Tensor, eps1: torch.Tensor, eps2: torch.Tensor) -> torch.Tensor:
        """Logits (R, K, N, C) for x (R, N, D) under weights μ + σ ε (ε: (R, K, ...))."""
        w1 = self.mu1.unsqueeze(1) + self.sig1.unsqueeze(1) * eps1
        w2 = self.mu2.unsqueeze(1) + self.sig2.unsqueeze(1) * eps2
        h = torch.relu(torch.einsum("rkhd,rnd->rknh", w1, x))
        return torch.einsum("rkch,rknh->rknc", w2, h)


def mesu_delta(
    mu, sigma, g_mu, g_sigma, *, lr_mu: float, lr_sigma: float, sigma_prior: float, n_mem: float, mu_prior: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """MESU (Bonnet et al.): Δμ = η_μ(−σ² ∂L/∂μ + σ²(μ_p − μ)/(N σ_p²)),
    Δσ = ½ η_σ(−σ² ∂L/∂σ + σ(σ_p² − σ²)/(N σ_p²))."""
    s2, sp2 = sigma * sigma, sigma_prior**2
    d_mu = lr_mu * (-s2 * g_mu + s2 * (mu_prior - mu) / (n_mem * sp2))
    d_sigma = 0.5 * lr_sigma * (-s2 * g_sigma + sigma * (sp2 - s2) / (n_mem * sp2))
    return d_mu, d_sigma


class MesuRule(torch.optim.Optimizer):
    """MESU on (μ, σ) pairs given in the order μ₁, σ₁, μ₂, σ₂, …; gradients clamped element-wise."""

    def __init__(self, params, grad_clamp: float, **hp):
        super().__init__(params, {})
        self.clamp, self.hp = grad_clamp, hp

    @torch.no_grad()
    def step(self, closure=None):
        ps = [q for grp in self.param_groups for q in grp["params"]]
        for mu, sig in zip(ps[::2], ps[1::2]):
            if mu.grad is None or sig.grad is None:
                continue
            gm, gs = mu.grad.clamp(-self.clamp, self.clamp), sig.grad.clamp(-self.clamp, self.clamp)
            dm, ds = mesu_delta(mu, sig, gm, gs, **self.hp)
            mu.add_(dm)
            sig.add_(ds).clamp_(min=1e-6)
        return None


# ---------------------------------------------------------------- deterministic BNN baselines (latent weights)
class MetaAdam(torch.optim.Optimizer):
    """Adam on the latent weights W of a binary net; with ``m > 0`` the synaptic metaplasticity of Laborieux
    et al. (2021): a step that moves W toward zero (toward a sign flip) is scaled by 1 − tanh²(m W), so
    weights that were consolidated (large |W|) become hard to flip. ``m = 0`` is plain Adam (BNN-STE)."""

    def __init__(self, params, lr: float, m: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, {"lr": lr})
        self.m, self.betas, self.eps, self.t = m, betas, eps, 0

    @torch.no_grad()
    def step(self, closure=None):
        self.t += 1
        b1, b2 = self.betas
        for grp in self.param_groups:
            for w in grp["params"]:
                if w.grad is None:
                    continue
                st = self.state[w]
                if not st:
                    st["m1"], st["m2"] = torch.zeros_like(w), torch.zeros_like(w)
                st["m1"].mul_(b1).add_(w.grad, alpha=1 - b1)
                st["m2"].mul_(b2).addcmul_(w.grad, w.grad, value=1 - b2)
                step = -grp["lr"] * (st["m1"] / (1 - b1**self.t)) / ((st["m2"] / (1 - b2**self.t)).sqrt() + self.eps)
                if self.m > 0:
                    toward_zero = step * w < 0
                    step = torch.where(toward_zero, step * (1 - torch.tanh(self.m * w) ** 2), step)
                w.add_(step)
        return None
