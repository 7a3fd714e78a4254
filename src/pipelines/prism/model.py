"""The adapted model and the DP mechanisms of the card: naive DP-LoRA (per-example clipping of the factor
gradients, factor noise), FFA-LoRA (frozen down-projection), dense DP fine-tuning, and PRISM (tangent lift,
intrinsic-norm clipping, isotropic tangent noise, DP-aware scalar adaptive step, QR + 2r×2r retraction).

Notation: an adapted layer has weight W + Z with Z = A Bᵀ, A: m×r (up), B: n×r (down). For a linear layer
the per-example gradient is rank one, G_i = δ_i a_iᵀ (δ = ∂ℓ_i/∂pre-activation, a = the layer input), so every
per-example norm below is computed in factored form; no per-example m×n tensor is built."""

from __future__ import annotations

import functools
import math

import torch

LAYERS = ("1", "2")


# ---------------------------------------------------------------- tangent-space geometry (PRISM)
def usv(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The SVD Z = U diag(s) Vᵀ of Z = A Bᵀ from QR of the factors and an r×r core, with a sign convention
    (the largest-|·| entry of each column of U is positive) so U, s, V depend on Z alone, not on the gauge."""
    qa, ra = torch.linalg.qr(A)
    qb, rb = torch.linalg.qr(B)
    uc, s, vch = torch.linalg.svd(ra @ rb.T)
    U, V = qa @ uc, qb @ vch.T
    sign = torch.sign(U.gather(0, U.abs().argmax(0, keepdim=True))).squeeze(0)
    sign[sign == 0] = 1
    return U * sign, s, V * sign


def tangent_project(U: torch.Tensor, V: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """P_T(G) = P_U G + G P_V − P_U G P_V, the orthogonal projection onto the tangent space at Z."""
    UG = U @ (U.T @ G)
    return UG + (G - UG) @ V @ V.T


def intrinsic_sq_norms(U: torch.Tensor, V: torch.Tensor, delta: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """‖P_T(δ_i a_iᵀ)‖²_F for every example: ‖Uᵀδ‖²‖a‖² + (‖δ‖² − ‖Uᵀδ‖²)‖Vᵀa‖²."""
    pu = (delta @ U).pow(2).sum(1)
    pv = (a @ V).pow(2).sum(1)
    return pu * a.pow(2).sum(1) + (delta.pow(2).sum(1) - pu).clamp_min(0) * pv


def tangent_dim(m: int, n: int, r: int) -> int:
    return r * (m + n - r)


def canonical_basis(U: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of span(U) that depends on the subspace alone: QR of P_U Ω for a fixed Ω. The
    SVD basis is not unique when singular values repeat (the balanced init has S0 = s0·I), so the noise is
    drawn in this basis to make the *sample*, not only its distribution, identical across gauges."""
    m, r = U.shape
    omega = _omega(m, r).to(U.dtype)
    q, rr = torch.linalg.qr(U @ (U.T @ omega))
    return q * torch.sign(torch.diagonal(rr))


@functools.lru_cache(maxsize=32)
def _omega(m: int, r: int) -> torch.Tensor:
    return torch.randn(m, r, generator=torch.Generator().manual_seed(12345), dtype=torch.float64)


def tangent_noise(
    U: torch.Tensor, V: torch.Tensor, std: float, gen: torch.Generator, samples: int | None = None
) -> torch.Tensor:
    """An isotropic Gaussian on T_Z with per-coordinate std: draws r² + (m−r)r + (n−r)r numbers' worth
    (E: r×r, N1: m×r, N2: n×r, then projected), ν = U E Vᵀ + (I−UUᵀ)N1 Vᵀ + U N2ᵀ(I−VVᵀ), with U, V
    replaced by their canonical bases (same spans). ``samples``: that many draws, stacked."""
    m, r = U.shape
    n = V.shape[0]
    U, V = canonical_basis(U), canonical_basis(V)
    lead = () if samples is None else (samples,)
    E = torch.randn(*lead, r, r, generator=gen, dtype=U.dtype)
    N1 = torch.randn(*lead, m, r, generator=gen, dtype=U.dtype)
    N2 = torch.randn(*lead, n, r, generator=gen, dtype=U.dtype)
    N1 = N1 - U @ (U.T @ N1)
    N2 = N2 - V @ (V.T @ N2)
    return std * (U @ E @ V.T + N1 @ V.T + U @ N2.mT)


def factor_noise(A: torch.Tensor, B: torch.Tensor, std: float, gen: torch.Generator, samples: int | None = None):
    """The official factor-coordinate sampler: noise_A = (I − P_A) N1 N^{-1/2} std, noise_B = N2 M^{-1/2} std
    (M = AᵀA, N = BᵀB); noise_A Bᵀ + A noise_Bᵀ is isotropic on T_Z (a second reference for the tests)."""
    M, N = A.T @ A, B.T @ B

    def inv_sqrt(S):
        w, Q = torch.linalg.eigh(S)
        return Q @ torch.diag(w.rsqrt()) @ Q.T

    lead = () if samples is None else (samples,)
    N1 = torch.randn(*lead, *A.shape, generator=gen, dtype=A.dtype)
    N2 = torch.randn(*lead, *B.shape, generator=gen, dtype=A.dtype)
    PA = A @ torch.linalg.solve(M, A.T)
    return std * (N1 - PA @ N1) @ inv_sqrt(N), std * N2 @ inv_sqrt(M)


def lift(A: torch.Tensor, B: torch.Tensor, xi: torch.Tensor, rcond: float = 1e-6):
    """Factor-coordinate lift of a matrix xi: dA = g_A N⁺ − ½ P_A g_A N⁺, dB = g_B M⁺ − ½ P_B g_B M⁺ with
    g_A = xi B, g_B = xiᵀ A; then dA Bᵀ + A dBᵀ = P_T(xi), and (AG, BG⁻ᵀ) gives (dA G, dB G⁻ᵀ)."""
    Mp = torch.linalg.pinv(A.T @ A, rtol=rcond)
    Np = torch.linalg.pinv(B.T @ B, rtol=rcond)
    gA, gB = xi @ B @ Np, xi.T @ A @ Mp
    dA = gA - 0.5 * A @ (Mp @ (A.T @ gA))
    dB = gB - 0.5 * B @ (Np @ (B.T @ gB))
    return dA, dB


def retract(A: torch.Tensor, B: torch.Tensor, dA: torch.Tensor, dB: torch.Tensor, t: float):
    """Best rank-r approximation of A Bᵀ + t (dA Bᵀ + A dBᵀ) from QR of [A, dA], [B, dB] and the SVD of the
    2r×2r core, re-factored balanced (A = U√S, B = V√S)."""
    r = A.shape[1]
    q1, r1 = torch.linalg.qr(torch.cat([A, dA], 1))
    q2, r2 = torch.linalg.qr(torch.cat([B, dB], 1))
    eye, zero = torch.eye(r, dtype=A.dtype), torch.zeros(r, r, dtype=A.dtype)
    K = torch.cat([torch.cat([eye, t * eye], 1), torch.cat([t * eye, zero], 1)], 0)
    uc, s, vch = torch.linalg.svd(r1 @ K @ r2.T)
    root = s[:r].sqrt()
    return q1 @ uc[:, :r] * root, q2 @ vch[:r].T * root


def procrustes(A_new: torch.Tensor, B_new: torch.Tensor, A_prev: torch.Tensor):
    """Rotate balanced factors (A, B) → (AO, BO), O orthogonal, to be closest to the previous A."""
    u, _, vh = torch.linalg.svd(A_new.T @ A_prev)
    O = u @ vh
    return A_new @ O, B_new @ O


# ---------------------------------------------------------------- the model
class AdaptedMLP(torch.nn.Module):
    """The frozen teacher-shaped MLP with adapters on its two hidden weight matrices. `kind`: lora (Z = ABᵀ)
    or dense (Z = D). The forward keeps the layer inputs and pre-activations (with their gradients) so the
    DP step can form per-example gradients δ_i a_iᵀ in factored form."""

    def __init__(
        self,
        base: dict,
        kind: str,
        rank: int = 4,
        init: str = "standard",
        init_scale: float = 1e-3,
        gauge: torch.Tensor | None = None,
        gen: torch.Generator | None = None,
        dtype: torch.dtype = torch.float64,
        freeze_B: bool = False,
    ):
        super().__init__()
        self.kind = kind
        for k, v in base.items():
            self.register_buffer(k, v.detach().clone().to(dtype))
        self.stash: list = []
        for l in LAYERS:
            W = getattr(self, f"W{l}")
            m, n = W.shape
            if kind == "dense":
                setattr(self, f"D{l}", torch.nn.Parameter(torch.zeros(m, n, dtype=dtype)))
                continue
            if init == "standard":  # LoRA: up-projection 0, down-projection U(±1/√n)
                A = torch.zeros(m, rank, dtype=dtype)
                B = (torch.rand(n, rank, generator=gen, dtype=dtype) * 2 - 1) / math.sqrt(n)
            else:  # small balanced Z0 = U0 S0 V0ᵀ, subtracted from W
                U0 = torch.linalg.qr(torch.randn(m, rank, generator=gen, dtype=dtype))[0]
                V0 = torch.linalg.qr(torch.randn(n, rank, generator=gen, dtype=dtype))[0]
                s0 = init_scale * torch.linalg.matrix_norm(W, ord=2)
                A, B = U0 * s0.sqrt(), V0 * s0.sqrt()
                W -= A @ B.T
            if gauge is not None:  # the same Z0 in another gauge: (A G, B G⁻ᵀ)
                A, B = A @ gauge.to(dtype), B @ torch.linalg.inv(gauge.to(dtype)).T
            setattr(self, f"A{l}", torch.nn.Parameter(A))
            setattr(self, f"B{l}", torch.nn.Parameter(B, requires_grad=not freeze_B))

    def delta_w(self, l: str) -> torch.Tensor:
        if self.kind == "dense":
            return getattr(self, f"D{l}")
        return getattr(self, f"A{l}") @ getattr(self, f"B{l}").T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z1 = x @ (self.W1 + self.delta_w("1")).T + self.b1
        h1 = torch.tanh(z1)
        z2 = h1 @ (self.W2 + self.delta_w("2")).T + self.b2
        h2 = torch.tanh(z2)
        if self.training and torch.is_grad_enabled():
            z1.retain_grad()
            z2.retain_grad()
            self.stash = [(x, z1), (h1.detach(), z2)]
        return h2 @ self.W3.T + self.b3


# ---------------------------------------------------------------- DP steps
class DPStep(torch.optim.Optimizer):
    """One DP step per call, reading the per-example (δ_i, a_i) the forward kept. Mechanisms:
    naive / ffa / dense (clip the per-example gradient of the trained tensors jointly to C, add N(0, σ²C²)
    per coordinate, divide by the expected batch b, then SGD or Adam) and prism (below)."""

    def __init__(
        self,
        model: AdaptedMLP,
        mechanism: str,
        optimizer: str,
        lr: float,
        sigma: float,
        clip: float,
        batch: float,
        gen: torch.Generator,
        beta1: float = 0.9,
        beta2: float = 0.999,
        floor: float = 0.1,
    ):
        self.model, self.mech, self.opt_name = model, mechanism, optimizer
        self.sigma, self.clip, self.batch, self.gen = sigma, clip, batch, gen
        self.beta1, self.beta2, self.floor = beta1, beta2, floor
        params = [q for q in model.parameters() if q.requires_grad]
        super().__init__(params, {"lr": lr})
        self.adam = {id(q): (torch.zeros_like(q), torch.zeros_like(q)) for q in params} if optimizer == "adam" else {}
        self.t = 0
        self.mom = {l: None for l in LAYERS}
        self.v = {l: 0.0 for l in LAYERS}
        self.log = {
            "clip_fraction": [],
            "noise_sq": [],
            "noise_factor_sq": [],
            "sigma_min_S": [],
            "noise_sq_closed": [],
        }

    def _per_example(self):
        n = len(self.model.stash[0][0])
        return [(a, z.grad * n) for a, z in self.model.stash]  # loss is the batch mean

    @torch.no_grad()
    def step(self, closure=None):
        self.t += 1
        if self.mech == "prism":
            self._prism_step()
        else:
            self._factor_step()
        return None

    def _scale(self, sq: torch.Tensor) -> torch.Tensor:
        norm = sq.sqrt()
        self.log["clip_fraction"].append(float((norm > self.clip).double().mean()))
        return torch.clamp(self.clip / norm.clamp_min(1e-30), max=1.0)

    def _factor_step(self):
        m, ex = self.model, self._per_example()
        sq = 0.0
        parts = []
        for l, (a, d) in zip(LAYERS, ex):
            if self.mech == "dense":
                sq = sq + d.pow(2).sum(1) * a.pow(2).sum(1)
                parts.append((l, a, d, None, None))
                continue
            A, B = getattr(m, f"A{l}"), getattr(m, f"B{l}")
            u, w = a @ B, d @ A  # g_A,i = δ_i (Bᵀa_i)ᵀ, g_B,i = a_i (Aᵀδ_i)ᵀ
            sq = sq + d.pow(2).sum(1) * u.pow(2).sum(1)
            if self.mech == "naive":
                sq = sq + a.pow(2).sum(1) * w.pow(2).sum(1)
            parts.append((l, a, d, u, w))
        c = self._scale(sq)
        std = self.sigma * self.clip
        noise_sq = factor_sq = 0.0
        for l, a, d, u, w in parts:
            cd = d * c[:, None]
            grads = (
                [(getattr(m, f"D{l}"), cd.T @ a)]
                if self.mech == "dense"
                else [(getattr(m, f"A{l}"), cd.T @ u)]
                + ([(getattr(m, f"B{l}"), (a * c[:, None]).T @ w)] if self.mech == "naive" else [])
            )
            noise = []
            for prm, g in grads:
                nz = std * torch.randn(g.shape, generator=self.gen, dtype=g.dtype) / self.batch
                noise.append(nz)
                factor_sq += float(nz.pow(2).sum())
                prm.grad = g / self.batch + nz
            # the noise this puts on Z to first order: ν_A Bᵀ + A ν_Bᵀ (gauge dependent), ν_D for dense
            if self.mech == "dense":
                nu = noise[0]
            else:
                nu = noise[0] @ getattr(m, f"B{l}").T
                if self.mech == "naive":
                    nu = nu + getattr(m, f"A{l}") @ noise[1].T
            noise_sq += float(nu.pow(2).sum())
        self.log["noise_sq"].append(noise_sq)
        self.log["noise_factor_sq"].append(factor_sq)
        self._apply_update()

    def _apply_update(self, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
        """Plain SGD (no momentum) or Adam (Kingma & Ba, bias-corrected) on the privatised gradients."""
        lr = self.param_groups[0]["lr"]
        for q in self.param_groups[0]["params"]:
            if self.opt_name != "adam":
                q.sub_(lr * q.grad)
                continue
            m, v = self.adam[id(q)]
            m.mul_(b1).add_(q.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(q.grad, q.grad, value=1 - b2)
            q.sub_(lr * (m / (1 - b1**self.t)) / ((v / (1 - b2**self.t)).sqrt() + eps))

    def _prism_step(self):
        m, ex = self.model, self._per_example()
        geo, sq = [], 0.0
        for l, (a, d) in zip(LAYERS, ex):
            A, B = getattr(m, f"A{l}").data, getattr(m, f"B{l}").data
            U, s, V = usv(A, B)
            geo.append((l, A, B, U, s, V, a, d))
            sq = sq + intrinsic_sq_norms(U, V, d, a)
        c = self._scale(sq)
        std = self.sigma * self.clip / self.batch
        noise_sq = closed = 0.0
        smin = math.inf
        for l, A, B, U, s, V, a, d in geo:
            G = (d * c[:, None]).T @ a  # Σ_i c_i δ_i a_iᵀ, one matmul
            xi = tangent_project(U, V, G) / self.batch
            nu = tangent_noise(U, V, std, self.gen)
            noise_sq += float(nu.pow(2).sum())
            dt = tangent_dim(*G.shape, U.shape[1])
            closed += std**2 * dt
            g = xi + nu
            if self.opt_name == "adaptive":
                e_noise = std**2 * dt
                prev = self.mom[l]
                mom = (1 - self.beta1) * g + (self.beta1 * tangent_project(U, V, prev) if prev is not None else 0)
                self.mom[l] = mom
                self.v[l] = self.beta2 * self.v[l] + (1 - self.beta2) * float(g.pow(2).sum())
                v_hat = max(self.v[l] / (1 - self.beta2**self.t) - e_noise, self.floor * e_noise)
                step = self.param_groups[0]["lr"] / math.sqrt(v_hat)
                direction = mom / (1 - self.beta1**self.t)
            else:
                step, direction = self.param_groups[0]["lr"], g
            dA, dB = lift(A, B, direction)
            A2, B2 = retract(A, B, dA, dB, -step)
            A2, B2 = procrustes(A2, B2, A)
            getattr(m, f"A{l}").data.copy_(A2)
            getattr(m, f"B{l}").data.copy_(B2)
            smin = min(smin, float(s.min()))
        self.log["noise_sq"].append(noise_sq)
        self.log["noise_sq_closed"].append(closed)
        self.log["sigma_min_S"].append(smin)
