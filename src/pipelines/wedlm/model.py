"""The tiny causal transformer (RoPE on *logical* positions) and WeDLM's training construction:
dual-stream input, per-block masking with topological reordering, the 2L × 2L attention mask and the
mixed loss (masked-slot CE weighted by 1/γ + next-token AR loss) — paper §3 "causal mask recovery"."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate pairs of x [N, H, T, dh] by angles pos · base^(-2i/dh); pos [N, T] are logical positions,
    so a token keeps its angle wherever it sits physically."""
    dh = x.shape[-1]
    inv = base ** (-torch.arange(0, dh, 2, dtype=torch.float32, device=x.device) / dh)
    ang = pos.to(torch.float32)[:, None, :, None] * inv  # [N, 1, T, dh/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Layer(nn.Module):
    def __init__(self, d: int, h: int, d_ff: int, rope_base: float):
        super().__init__()
        self.h, self.rope_base = h, rope_base
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Linear(d_ff, d))

    def forward(self, x, pos, mask, past):
        N, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(N, T, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        q, k = rope(q, pos, self.rope_base), rope(k, pos, self.rope_base)
        new_kv = (k, v)  # what a cache stores: keys already rotated by their logical position
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + self.out(a.transpose(1, 2).reshape(N, T, d))
        return x + self.ff(self.ln2(x)), new_kv


class TinyLM(nn.Module):
    """One LM head for both roles: at a [MASK] input it predicts that slot's own token, at an observed
    token the next token (the input tells the two apart, as in the paper)."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, rope_base: float = 10000.0):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(Layer(d_model, n_heads, d_ff, rope_base) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(
        self, tokens: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None = None, past: list | None = None
    ):
        """tokens, pos [N, T]; mask [N or 1, T, S_past + T] (True = may attend; default causal over the
        physical order); past: per layer (k, v) [N, H, S_past, dh]. Returns logits and per-layer new (k, v)."""
        T = tokens.shape[1]
        if mask is None:
            s = 0 if past is None else past[0][0].shape[2]
            mask = torch.ones(T, s + T, dtype=torch.bool, device=tokens.device).tril(s)[None]
        x = self.emb(tokens)
        kvs = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, pos, mask, None if past is None else past[i])
            kvs.append(kv)
        return self.head(self.ln(x)), kvs


def build_model(p, vocab_size: int) -> TinyLM:
    m = p.model
    return TinyLM(vocab_size, m.d_model, m.n_heads, m.n_layers, m.d_ff, m.rope_base)


def block_ids(L: int, block: int, offset: int) -> torch.Tensor:
    """Block index of each logical position; boundaries shifted by ``offset`` (0 ≤ offset < block)."""
    return (torch.arange(L) + offset) // block


def dual_stream_mask(blk: torch.Tensor) -> torch.Tensor:
    """[2L, 2L] boolean mask (True = attend). Rows/cols 0..L-1: clean stream x0 (causal); L..2L-1: the
    prediction stream xt, physically reordered inside each block. An xt slot in block k sees x0 of blocks
    < k and the xt slots of its own block that are physically not later; never earlier xt blocks."""
    L = blk.numel()
    i = torch.arange(L)
    m = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    m[:L, :L] = i[None, :] <= i[:, None]
    m[L:, :L] = blk[None, :] < blk[:, None]
    m[L:, L:] = (blk[None, :] == blk[:, None]) & (i[None, :] <= i[:, None])
    return m


def dual_stream_batch(
    x: torch.Tensor, prompt_len: int, block: int, offset: int, gamma_min: float, mask_id: int, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """Training input of causal mask recovery for clean sequences x [N, L].

    Per (sequence, block) a ratio γ ~ U(0, 1] (clamped to ≥ gamma_min) masks round(γ · #maskable) random
    answer positions (the prompt is never masked); each block is reordered observed-first, then masks,
    both by ascending logical position, and positions travel with the tokens."""
    N, L = x.shape
    blk = block_ids(L, block, offset)
    n_blk = int(blk.max()) + 1
    maskable = (torch.arange(L) >= prompt_len).expand(N, L)
    gamma = torch.rand(N, n_blk, generator=gen).mul(-1).add(1).clamp_min(gamma_min)  # (0, 1] → clamped
    per_block = torch.zeros(N, n_blk).index_add_(1, blk, maskable.float())
    n_mask = torch.round(gamma * per_block)
    # random rank of each maskable position inside its block (non-maskable ones rank last)
    score = torch.where(maskable, torch.rand(N, L, generator=gen), torch.full((N, L), 2.0))
    order = torch.argsort(blk[None, :] * 4.0 + score, dim=1)
    block_start = torch.searchsorted(blk, torch.arange(n_blk))
    rank = torch.empty_like(order)
    rank.scatter_(1, order, (torch.arange(L) - block_start[blk]).expand(N, L).contiguous())
    masked = maskable & (rank < n_mask.gather(1, blk.expand(N, L)))
    # topological reordering inside blocks
    key = blk[None, :] * (2 * L) + masked.long() * L + torch.arange(L)[None, :]
    perm = torch.argsort(key, dim=1)
    xt_masked = masked.gather(1, perm)
    xt_clean = x.gather(1, perm)
    xt_tok = torch.where(xt_masked, torch.full_like(xt_clean, mask_id), xt_clean)
    w = (1.0 / gamma).gather(1, blk.expand(N, L)) * xt_masked  # blocks are fixed under the permutation
    w = w / w.sum().clamp_min(1e-12)
    pos0 = torch.arange(L).expand(N, L)
    return {
        "tokens": torch.cat([x, xt_tok], 1),
        "pos": torch.cat([pos0, perm], 1),
        "mlm_target": torch.where(xt_masked, xt_clean, torch.full_like(xt_clean, IGNORE)),
        "mlm_weight": w,
        "mask": dual_stream_mask(blk)[None],
    }


def wedlm_loss(
    model: TinyLM, batch: dict, x: torch.Tensor, ar_target_mask: torch.Tensor, ar_weight: float
) -> tuple[torch.Tensor, dict]:
    """(L_mlm + ar_weight · L_ar) / 2: masked slots predict their own token (no shift), weighted by 1/γ;
    the clean stream predicts the next token."""
    L = x.shape[1]
    logits, _ = model(batch["tokens"], batch["pos"], batch["mask"])
    tgt = batch["mlm_target"]
    ce = F.cross_entropy(
        logits[:, L:].reshape(-1, logits.shape[-1]), tgt.clamp_min(0).reshape(-1), reduction="none"
    ).view_as(tgt)
    l_mlm = (ce * batch["mlm_weight"]).sum()
    l_ar = ar_loss_from_logits(logits[:, :L], x, ar_target_mask)
    return (l_mlm + ar_weight * l_ar) / 2, {"mlm": l_mlm.item(), "ar": l_ar.item()}


def ar_loss_from_logits(logits: torch.Tensor, x: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Next-token CE on x; ``target_mask`` [N, L] marks which targets count (not the left padding)."""
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none").view(
        x.shape[0], -1
    )
    m = target_mask[:, 1:].float()
    return (ce * m).sum() / m.sum().clamp_min(1.0)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the untempered softmax."""
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)
