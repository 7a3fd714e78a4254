"""The WBMM operator (paper §3: relative-position table → per-window Toeplitz matrices → one batched
matmul with the identity residual) and the token mixers it is compared with: depthwise convolution,
an im2col ("unfold") depthwise convolution with regular memory access, and Swin-style windowed attention.

Conventions (checked in tests/methods/test_wbmm.py against ``F.conv2d``):
- the table ``R`` (C × (2w−1)²) is indexed by the (input − output) offset of two tokens of a window, which
  is exactly ``F.conv2d``'s cross-correlation kernel ``K = R.view(C, 1, 2w−1, 2w−1)``: no flip;
- inside each w×w window, ``wbmm(x) = x + depthwise_conv(x, K)`` with zero padding at window borders;
- H and W are zero-padded up to multiples of w (as the dense backbones do) and the output is cropped back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def relative_index(w: int, device: torch.device | str | None = None) -> torch.Tensor:
    """I ∈ Z^{w²×w²}: I[a, b] = (r_a − r_b + w − 1)(2w − 1) + (c_a − c_b + w − 1) for input token a and
    output token b of a window (row-major token order)."""
    if w < 1:
        raise ValueError(f"window w must be >= 1, got {w}")
    r, c = torch.meshgrid(torch.arange(w, device=device), torch.arange(w, device=device), indexing="ij")
    r, c = r.flatten(), c.flatten()
    dr = r[:, None] - r[None, :]  # input − output, the cross-correlation offset
    dc = c[:, None] - c[None, :]
    return (dr + w - 1) * (2 * w - 1) + (dc + w - 1)


def build_matrix(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """M = R[:, I]: one w²×w² Toeplitz-of-Toeplitz matrix per channel (C × w² × w²). Differentiable in R
    (the backward is a scatter-add, which is why training rebuilds it every step). ``index_select`` on the
    flattened index: on CPU it was 5-7x faster than ``table[:, index]`` forward and ~3x in backward."""
    c, n = table.shape[0], index.shape[0]
    return table.index_select(1, index.reshape(-1)).view(c, n, n)


def window_partition(x: torch.Tensor, w: int) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """B×C×H×W → C × (B·nW) × w² (one contiguous permute copy), zero-padding H, W up to multiples of w.
    Returns the windows and (H, W, H_pad, W_pad) for :func:`window_reverse`."""
    b, c, h, wd = x.shape
    hp, wp = math.ceil(h / w) * w, math.ceil(wd / w) * w
    if (hp, wp) != (h, wd):
        x = F.pad(x, (0, wp - wd, 0, hp - h))
    xw = x.view(b, c, hp // w, w, wp // w, w).permute(1, 0, 2, 4, 3, 5).reshape(c, -1, w * w)
    return xw, (h, wd, hp, wp)


def window_reverse(y: torch.Tensor, w: int, batch: int, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """C × (B·nW) × w² → B×C×H×W (the second permute copy), cropping the padding."""
    h, wd, hp, wp = shape
    c = y.shape[0]
    out = y.view(c, batch, hp // w, wp // w, w, w).permute(1, 0, 2, 4, 3, 5).reshape(batch, c, hp, wp)
    if (hp, wp) != (h, wd):
        out = out[:, :, :h, :wd]
    return out


def wbmm(x: torch.Tensor, matrix: torch.Tensor, w: int) -> torch.Tensor:
    """Y = X·M + X per window and channel, as one ``baddbmm`` with C as the batch dimension."""
    xw, shape = window_partition(x, w)
    y = torch.baddbmm(xw, xw, matrix)  # Y[c, n, b] = X[c, n, b] + Σ_a X[c, n, a] M[c, a, b]
    return window_reverse(y, w, x.shape[0], shape)


class WBMM(nn.Module):
    """The token mixer: a learnable per-channel relative-position table (truncated-normal, std 0.02).

    In training, M is rebuilt from R every call (gradients flow to R); :meth:`cache` stores M as a
    buffer for inference, as the paper's optional cached-M deployment does."""

    def __init__(self, channels: int, window: int, std: float = 0.02) -> None:
        super().__init__()
        self.window = window
        self.table = nn.Parameter(torch.empty(channels, (2 * window - 1) ** 2))
        nn.init.trunc_normal_(self.table, std=std, a=-2 * std, b=2 * std)
        self.register_buffer("index", relative_index(window), persistent=False)
        self._cached: torch.Tensor | None = None

    def cache(self) -> WBMM:
        with torch.no_grad():
            self._cached = build_matrix(self.table, self.index).contiguous()
        return self

    def uncache(self) -> WBMM:
        self._cached = None
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self._cached if (self._cached is not None and not self.training) else build_matrix(self.table, self.index)
        return wbmm(x, m, self.window)


def dw_kernel_to_table(kernel: torch.Tensor, w: int) -> torch.Tensor:
    """Embed C×k×k depthwise kernels (odd k ≤ 2w−1) in a (2w−1)² table, unflipped and centred: the
    structural re-parameterisation of small DW branches into WBMM (inside a window only)."""
    c, k, k2 = kernel.shape
    if k != k2 or k % 2 == 0 or k > 2 * w - 1:
        raise ValueError(f"kernel must be odd, square and at most 2w-1={2 * w - 1}, got {k}x{k2}")
    table = kernel.new_zeros(c, 2 * w - 1, 2 * w - 1)
    o = w - 1 - k // 2
    table[:, o : o + k, o : o + k] = kernel
    return table.view(c, -1)


def unfold_dwconv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise conv as im2col + einsum (regular memory access, k² times the input in memory).
    ``weight`` is C×1×k×k as in ``nn.Conv2d(groups=C)``."""
    b, c, h, wd = x.shape
    k = weight.shape[-1]
    cols = F.unfold(x, k, padding=k // 2).view(b, c, k * k, h * wd)
    return torch.einsum("bckp,ck->bcp", cols, weight.view(c, k * k)).view(b, c, h, wd)


def unfold_buffer_mb(batch: int, channels: int, size: int, k: int, bytes_per: int = 4) -> float:
    """Size of the im2col buffer of :func:`unfold_dwconv` in MB."""
    return batch * channels * k * k * size * size * bytes_per / 2**20


class WindowAttention(nn.Module):
    """Swin-style windowed multi-head self-attention on the same partition as WBMM (qkv projection,
    softmax(QKᵀ/√d + relative-position bias)·V, output projection): data-dependent window weights."""

    def __init__(self, channels: int, window: int, head_dim: int = 32) -> None:
        super().__init__()
        self.window = window
        self.heads = channels // head_dim if channels % head_dim == 0 and channels >= head_dim else 1
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.bias_table = nn.Parameter(torch.zeros(self.heads, (2 * window - 1) ** 2))
        nn.init.trunc_normal_(self.bias_table, std=0.02)
        self.register_buffer("index", relative_index(window), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, wd = x.shape
        w = self.window
        xw, shape = window_partition(x, w)  # C × (B·nW) × w²
        tokens = xw.permute(1, 2, 0)  # (B·nW) × w² × C
        n = tokens.shape[0]
        q, k, v = self.qkv(tokens).view(n, w * w, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        bias = self.bias_table[:, self.index.T]  # heads × out × in
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0))
        y = self.proj(y.transpose(1, 2).reshape(n, w * w, c))
        return window_reverse(y.permute(2, 0, 1), w, b, shape)
