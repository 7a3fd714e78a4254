"""The tiny MoE transformer of `mesa` (core's TinyTransformer with each block's FFN replaced by a top-k
routed mixture of experts) and what the method reads from it: routing profiles on safety-decision
tokens (card §1), the expert-masking attack, and per-expert trainable masks for targeted alignment."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from pipelines.core.api import Block, TinyConfig, TinyTransformer, Tokenizer
from pipelines.mesa.params import Model as ModelParams


class MoE(nn.Module):
    """Top-k routed experts (softmax router, gates renormalised over the k chosen, Mixtral-style),
    computed densely and gated. ``expert_mask`` (False = masked: router logit −∞) is the masking
    attack. After each forward ``last`` holds the MoE input, router probabilities and top-k indices."""

    def __init__(self, d: int, d_ff: int, n_experts: int, top_k: int):
        super().__init__()
        self.k, self.E = top_k, n_experts
        self.router = nn.Linear(d, n_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(n_experts, d, d_ff) * d**-0.5)
        self.b1 = nn.Parameter(torch.zeros(n_experts, d_ff))
        self.w2 = nn.Parameter(torch.randn(n_experts, d_ff, d) * 0.02)
        self.b2 = nn.Parameter(torch.zeros(n_experts, d))
        self.register_buffer("expert_mask", torch.ones(n_experts, dtype=torch.bool), persistent=False)
        self.last: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x).masked_fill(~self.expert_mask, float("-inf"))
        probs = logits.softmax(-1)
        top_v, top_i = logits.topk(self.k, -1)
        gates = torch.zeros_like(probs).scatter(-1, top_i, top_v.softmax(-1))  # [B, T, E]
        h = F.gelu(torch.einsum("btd,edf->btef", x, self.w1) + self.b1)
        y = torch.einsum("btef,efd->bted", h, self.w2) + self.b2
        self.last = {"input": x, "probs": probs, "topi": top_i}
        return torch.einsum("bte,bted->btd", gates, y)


class MoEBlock(Block):
    def __init__(self, c: TinyConfig, layer_idx: int = 0, *, n_experts: int = 8, top_k: int = 2, d_expert: int = 128):
        super().__init__(c, layer_idx)
        self.ff = MoE(c.d_model, d_expert, n_experts, top_k)


def make_model(vocab_size: int, m: ModelParams) -> TinyTransformer:
    cfg = TinyConfig(
        vocab_size=vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads, max_len=m.max_len
    )
    return TinyTransformer(
        cfg, block_cls=lambda c, i: MoEBlock(c, i, n_experts=m.n_experts, top_k=m.top_k, d_expert=m.d_expert)
    )


def moes(model: TinyTransformer) -> list[MoE]:
    return [b.ff for b in model.blocks]


def tokenizer(vocab: list[str]) -> Tokenizer:
    return Tokenizer(vocab, level="word")


def vocabulary(*tables: pd.DataFrame) -> list[str]:
    seen: dict[str, None] = {}
    for df in tables:
        for t in (*df["prompt"], *df["answer"]):
            for s in t.split():
                seen.setdefault(s)
    return sorted(seen)


# ------------------------------------------------------------------------------------------- batches
@dataclass
class Encoded:
    """Right-padded ``<bos> prompt answer <eos>`` ids, the answer marker's position, the loss mask
    (positions whose next token is an answer token or <eos>) and the row kinds."""

    ids: torch.Tensor  # [N, T]
    ans_pos: torch.Tensor  # [N]
    loss_mask: torch.Tensor  # [N, T-1] bool over next-token targets
    harmful: torch.Tensor  # [N] bool

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx: torch.Tensor) -> Encoded:
        return Encoded(self.ids[idx], self.ans_pos[idx], self.loss_mask[idx], self.harmful[idx])


def encode(df: pd.DataFrame, tok: Tokenizer) -> Encoded:
    seqs, ans = [], []
    for prompt, answer in zip(df["prompt"], df["answer"]):
        p = tok.encode(prompt, bos=True)
        seqs.append(p + tok.encode(answer, eos=True))
        ans.append(len(p) - 1)
    T = max(map(len, seqs))
    ids = torch.full((len(seqs), T), tok.pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    ans_pos = torch.tensor(ans)
    pos = torch.arange(T - 1)[None, :]
    loss_mask = (pos >= ans_pos[:, None]) & (ids[:, 1:] != tok.pad_id)
    return Encoded(ids, ans_pos, loss_mask, torch.tensor((df["kind"] == "harmful").to_numpy()))


def decision_mask(enc: Encoded, window: int) -> torch.Tensor:
    """[N, T] True at the last ``window`` prompt positions (ending at the answer marker): the tokens that
    carry the refuse / comply decision."""
    pos = torch.arange(enc.ids.shape[1])[None, :]
    return (pos <= enc.ans_pos[:, None]) & (pos > enc.ans_pos[:, None] - window)


def real_mask(enc: Encoded, pad_id: int) -> torch.Tensor:
    return enc.ids != pad_id


# ------------------------------------------------------------------------------------------- losses
def sft_loss(logits: torch.Tensor, enc: Encoded) -> torch.Tensor:
    lp = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), enc.ids[:, 1:].reshape(-1), reduction="none")
    m = enc.loss_mask.reshape(-1).float()
    return (lp * m).sum() / m.sum().clamp_min(1)


def load_balance_loss(model: TinyTransformer, token_mask: torch.Tensor) -> torch.Tensor:
    """Switch-style E · Σ_e f_e P_e per layer (f_e: share of top-k selections, P_e: mean router
    probability), averaged over layers; 1 at perfect balance."""
    out = []
    m = token_mask.float()
    n = m.sum().clamp_min(1)
    for moe in moes(model):
        probs, topi = moe.last["probs"], moe.last["topi"]
        sel = torch.zeros_like(probs).scatter(-1, topi, 1.0) / moe.k
        f = (sel * m[..., None]).sum((0, 1)) / n
        P = (probs * m[..., None]).sum((0, 1)) / n
        out.append(moe.E * (f * P).sum())
    return torch.stack(out).mean()


# ------------------------------------------------------------------------------------------- routing
@torch.no_grad()
def run(model: TinyTransformer, enc: Encoded, batch: int = 1024) -> dict[str, torch.Tensor]:
    """One no-grad pass: logits [N, T, V] and, per layer, MoE inputs, router probs and top-k [L, N, T, ...]."""
    model.eval()
    outs: dict[str, list] = {"logits": [], "input": [], "probs": [], "topi": []}
    for s in range(0, len(enc), batch):
        outs["logits"].append(model(enc.ids[s : s + batch]))
        for key in ("input", "probs", "topi"):
            outs[key].append(torch.stack([m.last[key] for m in moes(model)]))
    return {"logits": torch.cat(outs["logits"]), **{k: torch.cat(outs[k], 1) for k in ("input", "probs", "topi")}}


def selection_freq(topi: torch.Tensor, token_mask: torch.Tensor, n_experts: int) -> np.ndarray:
    """[L, n_experts]: each expert's share of the top-k selections on the masked tokens (rows sum to 1)."""
    L = topi.shape[0]
    out = np.zeros((L, n_experts))
    for layer in range(L):
        sel = topi[layer][token_mask]  # [n, k]
        out[layer] = np.bincount(sel.reshape(-1).numpy(), minlength=n_experts) / max(sel.numel(), 1)
    return out


def coverage(freq: np.ndarray, share: float = 0.8) -> np.ndarray:
    """Per layer: the fewest experts that hold ``share`` of the selections."""
    srt = -np.sort(-freq, axis=1)
    return (np.cumsum(srt, axis=1) < share - 1e-12).sum(1) + 1


def top_share(freq: np.ndarray, n: int = 2) -> np.ndarray:
    return -np.sort(-freq, axis=1)[:, :n].sum(1)


def set_expert_mask(model: TinyTransformer, masked: list[list[int]] | None) -> None:
    """Masking attack: router logits of ``masked[layer]`` experts set to −∞ (None: unmask all)."""
    for layer, moe in enumerate(moes(model)):
        moe.expert_mask.fill_(True)
        if masked is not None:
            moe.expert_mask[list(masked[layer])] = False


def expert_grad_masks(model: TinyTransformer, selected: list[list[int]], router: bool = True) -> tuple[list, list]:
    """Trainable tensors and gradient hooks for targeted alignment: only the ``selected[layer]`` experts'
    weights (and the routers) receive updates; everything else stays frozen. Returns (params, handles)."""
    for q in model.parameters():
        q.requires_grad_(False)
    params, handles = [], []
    for layer, moe in enumerate(moes(model)):
        keep = torch.zeros(moe.E)
        keep[list(selected[layer])] = 1.0
        if keep.sum() > 0:
            for t in (moe.w1, moe.b1, moe.w2, moe.b2):
                t.requires_grad_(True)
                shape = (moe.E,) + (1,) * (t.dim() - 1)
                handles.append(t.register_hook(lambda g, k=keep.view(shape): g * k))
                params.append(t)
        if router:
            moe.router.weight.requires_grad_(True)
            params.append(moe.router.weight)
    return params, handles


def trainable_count(model: TinyTransformer, selected: list[list[int]] | None, router: bool) -> int:
    """Parameters that can change: all of them (selected None) or the selected experts' slices + routers."""
    if selected is None:
        return sum(q.numel() for q in model.parameters())
    n = 0
    for layer, moe in enumerate(moes(model)):
        per_expert = sum(t[0].numel() for t in (moe.w1, moe.b1, moe.w2, moe.b2))
        n += per_expert * len(selected[layer]) + (moe.router.weight.numel() if router else 0)
    return n
