"""Forecasters: PatchTST (channel-independent patches, RevIN-normalised inputs) with the TESS gated
primitive prefix (paper §4, card Mechanism 3–4), and the baselines DLinear, sentence fusion and token
cross-attention (Time-MMD / MM-TSFlib style)."""

from __future__ import annotations

import torch
from torch import nn

from pipelines.tess.lexicon import MAX_LABELS, PRIMITIVES

K = len(PRIMITIVES)


class DLinear(nn.Module):
    """Moving-average trend + seasonal remainder, one linear map L→H each (Zeng et al. 2023)."""

    def __init__(self, L: int, H: int, kernel: int = 25):
        super().__init__()
        self.kernel = kernel
        self.trend = nn.Linear(L, H)
        self.season = nn.Linear(L, H)

    def forward(self, x: torch.Tensor, **_) -> torch.Tensor:
        pad = (self.kernel - 1) // 2
        xp = torch.cat([x[:, :1].expand(-1, pad), x, x[:, -1:].expand(-1, self.kernel - 1 - pad)], 1)
        trend = xp.unfold(1, self.kernel, 1).mean(-1)
        return self.trend(trend) + self.season(x - trend)


class GatedPrimitivePrefix(nn.Module):
    """e_k = g_k · Σ_ℓ p_k(ℓ) E_k[ℓ] + (1 − g_k) · n_k, with g_k = σ(MLP_k([z(m_k), H(p_k), p_k, pooled patches])).

    The four gate MLPs are evaluated as one batched einsum (the card measured ~10 ms/step for a Python loop)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        f = 2 + MAX_LABELS + d
        self.table = nn.Parameter(torch.randn(K, MAX_LABELS, d) * 0.02)
        self.null = nn.Parameter(torch.zeros(K, d))
        self.type_emb = nn.Parameter(torch.randn(K, d) * 0.02)
        self.w1 = nn.Parameter(torch.randn(K, f, hidden) / f**0.5)
        self.b1 = nn.Parameter(torch.zeros(K, hidden))
        self.w2 = nn.Parameter(torch.randn(K, hidden) / hidden**0.5)
        self.b2 = nn.Parameter(torch.zeros(K))

    def forward(self, probs, margin_z, entropy, pooled, gate_mode: str = "learned"):
        B = probs.shape[0]
        feats = torch.cat(
            [margin_z[..., None], entropy[..., None], probs, pooled[:, None, :].expand(B, K, -1)], -1
        )  # (B, K, F)
        h = torch.relu(torch.einsum("bkf,kfh->bkh", feats, self.w1) + self.b1)
        logit = torch.einsum("bkh,kh->bk", h, self.w2) + self.b2
        g = torch.sigmoid(logit) if gate_mode == "learned" else torch.ones_like(logit)
        content = torch.einsum("bkm,kmd->bkd", probs, self.table)
        tokens = g[..., None] * content + (1 - g[..., None]) * self.null + self.type_emb
        return tokens, g, logit


class PatchTST(nn.Module):
    """PatchTST over a univariate, RevIN-normalised history, with optional text conditioning:

    ``text="none"`` plain; ``"fusion"`` a sentence embedding mapped and added to every patch token;
    ``"xattn"`` patch tokens cross-attend to text token embeddings after the encoder; ``"tess"`` four gated
    primitive tokens prepended as a prefix. Only the patch tokens are flattened into the head, so the head
    size does not depend on the prefix and the prefix acts through attention (card: Pitfalls)."""

    def __init__(
        self,
        L: int,
        H: int,
        d: int,
        heads: int,
        layers: int,
        d_ff: int,
        patch: int,
        stride: int,
        dropout: float,
        text: str = "none",
        text_dim: int = 0,
        gate_hidden: int = 32,
    ):
        super().__init__()
        self.patch, self.stride, self.text = patch, stride, text
        self.n_patches = (L - patch) // stride + 1
        self.embed = nn.Linear(patch, d)
        self.pos = nn.Parameter(torch.randn(self.n_patches, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, d_ff, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(self.n_patches * d, H)
        if text == "fusion":
            self.text_proj = nn.Linear(text_dim, d)
        elif text == "xattn":
            self.text_proj = nn.Linear(text_dim, d)
            self.cross = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
            self.cross_norm = nn.LayerNorm(d)
        elif text == "tess":
            self.prefix = GatedPrimitivePrefix(d, gate_hidden)
        elif text != "none":
            raise ValueError(f"unknown text mode {text!r}")
        self.last_attention: torch.Tensor | None = None

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x.unfold(1, self.patch, self.stride)) + self.pos

    def forward(
        self,
        x: torch.Tensor,
        sent=None,
        tokens=None,
        token_mask=None,
        probs=None,
        margin_z=None,
        entropy=None,
        gate_mode: str = "learned",
        return_gate: bool = False,
    ):
        z = self.patches(x)  # (B, P, d)
        gate = logit = None
        if self.text == "fusion":
            z = z + self.text_proj(sent)[:, None, :]
        if self.text == "tess":
            prefix, gate, logit = self.prefix(probs, margin_z, entropy, z.mean(1), gate_mode)
            z = torch.cat([prefix, z], 1)
        z = self.encoder(self.drop(z))
        if self.text == "tess":
            z = z[:, K:]  # prefix never enters the head
        if self.text == "xattn":
            kv = self.text_proj(tokens)
            att, w = self.cross(z, kv, kv, key_padding_mask=~token_mask, need_weights=True)
            self.last_attention = w.detach()  # (B, P, T) averaged over heads
            z = self.cross_norm(z + att)
        out = self.head(z.flatten(1))
        return (out, gate, logit) if return_gate else out
