"""The tiny accuracy-check network: UniRepLKNet-style blocks (token mixer → BN → SE → FFN with GELU +
GRN → layer scale, residual) whose mixer alternates WBMM ('W') or a large DW conv with 3×3 DW ('D'),
as the paper's stage patterns do (e.g. WDW / (WD)×9); two stages, 14×14 and 7×7."""

from __future__ import annotations

import torch
from torch import nn

from pipelines.wbmm.ops import WBMM
from pipelines.wbmm.params import MIXER_RE, Acc


def make_mixer(spec: str, channels: int) -> nn.Module:
    """'w7' → WBMM with 7×7 windows; 'dw13' → 13×13 depthwise conv (bias-free: BN follows)."""
    kind, size = MIXER_RE.match(spec).groups()
    n = int(size)
    if kind == "w":
        return WBMM(channels, n)
    return nn.Conv2d(channels, channels, n, padding=n // 2, groups=channels, bias=False)


class GRN(nn.Module):
    """Global response normalisation (ConvNeXt V2), channels-last, as in UniRepLKNet's FFN."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + self.eps)
        return self.gamma * (x * nx) + self.beta + x


class SE(nn.Module):
    def __init__(self, dim: int, reduction: int = 4) -> None:
        super().__init__()
        hidden = max(4, dim // reduction)
        self.down = nn.Conv2d(dim, hidden, 1)
        self.up = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.up(torch.relu(self.down(s))))


class Block(nn.Module):
    def __init__(self, mixer: str, dim: int, ffn_ratio: int, layer_scale_init: float) -> None:
        super().__init__()
        self.mixer = make_mixer(mixer, dim)
        self.norm = nn.BatchNorm2d(dim)
        self.se = SE(dim)
        self.fc1 = nn.Linear(dim, ffn_ratio * dim)
        self.act = nn.GELU()
        self.grn = GRN(ffn_ratio * dim)
        self.fc2 = nn.Linear(ffn_ratio * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), float(layer_scale_init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.se(self.norm(self.mixer(x))).permute(0, 2, 3, 1)
        y = self.fc2(self.grn(self.act(self.fc1(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class TinyNet(nn.Module):
    """stem 3×3 → stage 1 (size², widths[0]) → 2×2 stride-2 conv + BN → stage 2 → GAP → FC."""

    def __init__(
        self,
        pattern: list[str],
        in_ch: int,
        n_classes: int,
        widths: tuple[int, int] = (16, 32),
        blocks: int = 2,
        ffn_ratio: int = 2,
        layer_scale_init: float = 1.0,
    ) -> None:
        super().__init__()
        c1, c2 = widths
        mix = [pattern[i % len(pattern)] for i in range(blocks)]  # the stage pattern, cycled
        self.stem = nn.Sequential(nn.Conv2d(in_ch, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.GELU())
        self.stage1 = nn.Sequential(*(Block(m, c1, ffn_ratio, layer_scale_init) for m in mix))
        self.down = nn.Sequential(nn.Conv2d(c1, c2, 2, stride=2), nn.BatchNorm2d(c2))
        self.stage2 = nn.Sequential(*(Block(m, c2, ffn_ratio, layer_scale_init) for m in mix))
        self.head = nn.Linear(c2, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean((2, 3)))


def build_net(pattern: list[str], in_ch: int, n_classes: int, acc: Acc) -> TinyNet:
    """The tiny net of one variant with the accuracy check's widths, depth, FFN ratio and layer scale."""
    return TinyNet(pattern, in_ch, n_classes, tuple(acc.widths), acc.blocks, acc.ffn_ratio, acc.layer_scale_init)
