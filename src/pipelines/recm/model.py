"""Relaxed equivariant layers for cyclic translations of periodic 1-D signals, the Reynolds projector
onto the equivariant (block-circulant) maps, and the per-layer relaxation state that the RECM rule
(train.py) updates: h_{l+1} = σ(E_l h_l + θ_l · U_l h_l), E_l a circular convolution, U_l a dense map
on the flattened (channels · length) features, θ_l a buffer (never a trainable parameter)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# --------------------------------------------------------------------------- the group and its projector
def shift(x: torch.Tensor, k: int) -> torch.Tensor:
    """The group action of C_L on signals (..., L): a cyclic shift by k positions."""
    return torch.roll(x, shifts=k, dims=-1)


def diag_sums(M: torch.Tensor, c_out: int, c_in: int, L: int) -> torch.Tensor:
    """D[o, c, d] = Σ_i M_(o,c)[i, (i + d) mod L]: the sums along the circulant diagonals of every (o, c)
    L×L block of a dense map M (c_out·L, c_in·L). A strided view of the block laid twice side by side
    (differentiable, no index tensors)."""
    B = M.reshape(c_out, L, c_in, L).permute(0, 2, 1, 3)
    B2 = torch.cat([B, B], dim=-1).contiguous()  # (o, c, L, 2L)
    s = B2.stride()
    return B2.as_strided((c_out, c_in, L, L), (s[0], s[1], 1, 2 * L + 1)).sum(-1)  # [o, c, d]


def reynolds(M: torch.Tensor, c_out: int, c_in: int, L: int) -> torch.Tensor:
    """P_eq(M) = (1/|G|) Σ_g ρ_out(g)⁻¹ M ρ_in(g) for a dense map M of shape (c_out·L, c_in·L) between
    flattened (channel, position) features: every (o, c) L×L block averaged along its circulant
    diagonals (the block's entry (i, j) is replaced by the mean over i' of (i', i' + (j − i) mod L))."""
    mean = diag_sums(M, c_out, c_in, L) / L  # (o, c, d)
    ar = torch.arange(L, device=M.device)
    dmat = (ar[None, :] - ar[:, None]) % L  # d = (j − i) mod L
    return mean[:, :, dmat].permute(0, 2, 1, 3).reshape(c_out * L, c_in * L)  # (o, i, c, j)


def perp_inner(A: torch.Tensor, B: torch.Tensor, c_out: int, c_in: int, L: int) -> torch.Tensor:
    """⟨P⊥A, P⊥B⟩_F = ⟨A, B⟩ − ⟨P_eq A, P_eq B⟩ (P_eq is an orthogonal projector; each diagonal of a
    block holds L equal entries, so ⟨P_eq A, P_eq B⟩ = Σ D_A D_B / L)."""
    return (A * B).sum() - (diag_sums(A, c_out, c_in, L) * diag_sums(B, c_out, c_in, L)).sum() / L


def perp(M: torch.Tensor, c_out: int, c_in: int, L: int) -> torch.Tensor:
    """P_⊥ = I − P_eq: the part of a dense map that breaks the symmetry."""
    return M - reynolds(M, c_out, c_in, L)


def conv_as_dense(weight: torch.Tensor, L: int) -> torch.Tensor:
    """The (c_out·L, c_in·L) matrix of a circular cross-correlation with ``weight`` (c_out, c_in, k)."""
    c_out, c_in, k = weight.shape
    M = weight.new_zeros(c_out, L, c_in, L)
    ar = torch.arange(L, device=weight.device)
    for t in range(k):
        M[:, ar, :, (ar + t - k // 2) % L] = weight[:, :, t].unsqueeze(0).expand(L, c_out, c_in)
    return M.reshape(c_out * L, c_in * L)


# --------------------------------------------------------------------------- the layer and the net
class RelaxedLayer(nn.Module):
    """z = E h + θ · U h (+ per-channel bias). ``use_eq=False`` drops E (the unconstrained baseline).

    During training with ``track=True`` the layer keeps its input h and the gradient δ = ∂L/∂z (a hook
    on the pre-activation), from which the RECM rule forms the dense-map gradient G = Σ_b δ_b h_bᵀ; this
    is ∂L/∂W_eff for W_eff = E + θU and does not vanish as θ → 0 (unlike U.grad / θ)."""

    def __init__(
        self, c_in: int, c_out: int, L: int, kernel: int, use_eq: bool = True, theta0: float = 1.0, u_init: str = "zero"
    ):
        super().__init__()
        self.c_in, self.c_out, self.L, self.kernel, self.use_eq = c_in, c_out, L, kernel, use_eq
        self.u_init = u_init if use_eq else "random"  # dense maps only: they must start random
        self.E = nn.Parameter(torch.empty(c_out, c_in, kernel)) if use_eq else None
        self.U = nn.Parameter(torch.empty(c_out * L, c_in * L))
        self.bias = nn.Parameter(torch.zeros(c_out))
        self.register_buffer("theta", torch.tensor(float(theta0)))
        self.track = False
        self.h: torch.Tensor | None = None
        self.delta: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # the two branches on the same (fan-in) scale so that θ means the same thing in every layer
        if self.E is not None:
            nn.init.normal_(self.E, std=1.0 / math.sqrt(self.c_in * self.kernel))
        if self.u_init == "zero":  # the relaxed net starts as its equivariant part (W_eff = E)
            nn.init.zeros_(self.U)
        else:
            nn.init.normal_(self.U, std=1.0 / math.sqrt(self.c_in * self.L))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        B = h.shape[0]
        z = self.bias.view(1, -1, 1).expand(B, self.c_out, self.L)
        if self.E is not None:
            hp = F.pad(h, (self.kernel // 2, self.kernel // 2), mode="circular")
            z = z + F.conv1d(hp, self.E)
        th = float(self.theta)
        if th != 0.0:
            z = z + th * (h.reshape(B, -1) @ self.U.T).view(B, self.c_out, self.L)
        if self.track and torch.is_grad_enabled():
            self.h = h.detach()
            if z.requires_grad:
                z.register_hook(self._keep_delta)
        return z

    def _keep_delta(self, grad: torch.Tensor) -> None:
        self.delta = grad.detach()

    def dense_grad(self) -> torch.Tensor:
        """G = Σ_b δ_b h_bᵀ of the last tracked forward/backward, (c_out·L, c_in·L)."""
        B = self.h.shape[0]
        return self.delta.reshape(B, -1).T @ self.h.reshape(B, -1)

    def effective_dense(self) -> torch.Tensor:
        """W_eff = E (as a dense circulant map) + θ U."""
        W = self.theta * self.U
        if self.E is not None:
            W = W + conv_as_dense(self.E, self.L)
        return W


class RelaxedNet(nn.Module):
    """Input (c_in, L) → ``hidden`` relaxed layers of ``channels`` with GELU → a relaxed output layer."""

    def __init__(
        self,
        c_in: int = 2,
        channels: int = 8,
        hidden: int = 3,
        L: int = 32,
        kernel: int = 5,
        use_eq: bool = True,
        theta0: float = 1.0,
        u_init: str = "zero",
    ):
        super().__init__()
        dims = [c_in] + [channels] * hidden + [1]
        self.layers = nn.ModuleList(
            RelaxedLayer(a, b, L, kernel, use_eq, theta0, u_init) for a, b in zip(dims[:-1], dims[1:])
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = F.gelu(h)
        return h[:, 0]

    def thetas(self) -> list[float]:
        return [float(layer.theta) for layer in self.layers]

    def set_theta(self, values) -> None:
        if isinstance(values, int | float):
            values = [values] * len(self.layers)
        for layer, v in zip(self.layers, values):
            layer.theta.fill_(float(v))

    def set_track(self, on: bool) -> None:
        for layer in self.layers:
            layer.track = on
            if not on:
                layer.h = layer.delta = None


def equivariance_error(model: nn.Module, x: torch.Tensor, shifts: list[int] | None = None) -> float:
    """E‖f(g·x) − g·f(x)‖² / E‖f(x)‖² over the inputs and the shifts (default: every non-trivial one)."""
    L = x.shape[-1]
    shifts = shifts or list(range(1, L))
    with torch.no_grad():
        fx = model(x)
        num = sum(float(((model(shift(x, k)) - shift(fx, k)) ** 2).sum()) for k in shifts) / len(shifts)
        den = float((fx**2).sum())
    return num / max(den, 1e-30)
