"""The small causal LM of `medtpe` (core.seqmodels.TinyTransformer, scored at the last prompt position only)
and MedTPE's embedding surgery (method section "Embedding fitting"): composite rows = mean of the
sub-token rows rescaled to half the mean row norm of the input matrix, in replace mode on the IDs freed by
removed tokens, in extend mode on appended IDs; only those rows train afterwards."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.core.api import Block, TinyConfig, TinyTransformer


class _CausalBlock(Block):
    """SDPA with ``is_causal=True`` when no explicit mask is given (right padding, no cache): cheaper on
    CPU than the boolean [T, T] mask the shared block builds."""

    def attend(self, q, k, v, mask):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return super().attend(q, k, v, mask)


class ClinicalLM(TinyTransformer):
    """TinyTransformer with untied input/output embeddings whose prompt forward returns the logits at
    each row's last real token only (the 4,096-way head over every position would dominate the cost)."""

    def __init__(self, c: TinyConfig):
        super().__init__(c)
        self.blocks = nn.ModuleList(_CausalBlock(c) for _ in range(c.n_layers))
        self.blocks.apply(self._init)

    def last_logits(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids [B, T] right-padded, lengths [B] → logits [B, V] at position lengths − 1."""
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"sequence of {ids.shape[1]} tokens exceeds max_len={self.config.max_len}")
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            x = blk(x, pos, i, None, None)
        h = self.norm(x[torch.arange(len(ids), device=ids.device), lengths - 1])
        return self.head(h)


def make_model(vocab_size: int, mp) -> ClinicalLM:
    return ClinicalLM(
        TinyConfig(
            vocab_size=vocab_size,
            d_model=mp.d_model,
            n_layers=mp.n_layers,
            n_heads=mp.n_heads,
            max_len=mp.max_len,
            tie_embeddings=False,
        )
    )


def adapt_model(base: ClinicalLM, base_vocab: list[str], tpe, specials: set[str]) -> ClinicalLM:
    """A copy of ``base`` for the layered tokeniser ``tpe``: same weights, vocabulary rows re-laid out
    (extend mode grows the matrices), each composite's input row = mean of its sub-token input rows and
    output row = mean of its sub-token output rows, both rescaled to 0.5 × the mean input-row norm."""
    import copy

    m = copy.deepcopy(base)
    V_old, V_new = len(base_vocab), len(tpe.vocab)
    old_stoi = {s: i for i, s in enumerate(base_vocab)}
    E_in, E_out = base.embed.weight.detach(), base.head.weight.detach()
    if V_new != V_old:
        m.config = copy.copy(base.config)
        m.config.vocab_size = V_new
        m.embed = nn.Embedding(V_new, E_in.shape[1])
        m.head = nn.Linear(E_in.shape[1], V_new, bias=False)
        with torch.no_grad():
            m.embed.weight.zero_()
            m.head.weight.zero_()
            m.embed.weight[:V_old] = E_in
            m.head.weight[:V_old] = E_out
    target = 0.5 * E_in.norm(dim=1).mean()
    with torch.no_grad():
        for g in tpe.merges:
            new_id = tpe.stoi["".join(g)]
            if tpe.vocab[new_id] in specials:
                continue
            sub = torch.tensor([old_stoi[t] for t in g])
            for W, src in ((m.embed.weight, E_in), (m.head.weight, E_out)):
                row = src[sub].mean(0)
                W[new_id] = row * (target / row.norm().clamp_min(1e-12))
    return m


def only_rows_train(model: ClinicalLM, rows: list[int]) -> list[torch.nn.Parameter]:
    """Freeze everything but ``rows`` of the input embedding and of the LM head (gradient masks);
    returns the parameters to hand to the optimiser (with weight decay 0, so frozen rows stay put)."""
    for q in model.parameters():
        q.requires_grad_(False)
    mask = torch.zeros(model.embed.weight.shape[0], 1)
    mask[rows] = 1.0
    params = [model.embed.weight, model.head.weight]
    for w in params:
        w.requires_grad_(True)
        w.register_hook(lambda g, mk=mask: g * mk)
    return params
