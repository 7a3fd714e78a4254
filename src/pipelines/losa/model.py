"""The block-diffusion LM and the prefix-attention policies of LoSA (card "Mechanism", steps 1-5).

``BlockDiffusionLM`` is core's TinyTransformer (bidirectional config) whose blocks route attention through
a pluggable policy (``Block.attend`` overridden). Training uses one stream [clean prefix | noised block]
with the prefix causal and the block bidirectional over prefix + block. Decoding fills the KV cache with
the prefix once, then denoises the answer block in T steps; at every step and layer a policy computes the
block queries' prefix attention (dense; Quest per-query pages; SparseD fixed per-head pages; LoSA reuse
for stable tokens + union of the active tokens' pages), the block part is dense, and the two parts are
merged with their log-sum-exps (online softmax)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.core.api import Block, KVCache, TinyConfig, TinyTransformer


# ----------------------------------------------------------------------------------------- model
class PolicyBlock(Block):
    """A transformer block whose attention a policy may take over (``policy(layer, q, k, v, x_in)``)."""

    def __init__(self, c: TinyConfig, layer_idx: int):
        super().__init__(c)
        self.layer_idx = layer_idx
        self.policy = None
        self._x_in: torch.Tensor | None = None

    def forward(self, x, pos, layer_idx, cache, mask):
        self._x_in = x  # the hidden state entering the layer (activity_signal: hidden)
        return super().forward(x, pos, layer_idx, cache, mask)

    def attend(self, q, k, v, mask):
        if self.policy is None:
            return super().attend(q, k, v, mask)
        return self.policy(self.layer_idx, q, k, v, self._x_in)


class BlockDiffusionLM(TinyTransformer):
    def __init__(self, c: TinyConfig):
        super().__init__(c)
        self.blocks = nn.ModuleList(PolicyBlock(c, i) for i in range(c.n_layers))
        self.apply(self._init)

    def set_policy(self, policy) -> None:
        for b in self.blocks:
            b.policy = policy


def build_model(p, vocab_size: int, n_prefix: int) -> BlockDiffusionLM:
    m = p.model
    std = m.init_std if m.init_std is not None else m.d_model**-0.5
    c = TinyConfig(
        vocab_size=vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        d_ff=m.d_ff,
        max_len=n_prefix + p.data.block_size,
        causal=False,
        rope_base=m.rope_base,
        init_std=std,
    )
    return BlockDiffusionLM(c)


def causal_mask(n: int, device=None) -> torch.Tensor:
    i = torch.arange(n, device=device)
    return i[None, :] <= i[:, None]


def bdlm_mask(n_prefix: int, block: int, device=None) -> torch.Tensor:
    """[T, T] bool (True = may attend): prefix causal, the block sees the whole prefix and itself."""
    t = torch.arange(n_prefix + block, device=device)
    return (t[None, :] <= t[:, None]) | (t[:, None] >= n_prefix)


def bdlm_loss(
    model: BlockDiffusionLM,
    ids: torch.Tensor,
    noised: torch.Tensor,
    masked: torch.Tensor,
    gamma: torch.Tensor,
    n_prefix: int,
):
    """Masked-diffusion loss on the block: CE on masked slots weighted by 1/γ, averaged over slots."""
    mask = bdlm_mask(n_prefix, ids.shape[1] - n_prefix, ids.device)
    logits = model(noised, attn_mask=mask)[:, n_prefix:]
    target = ids[:, n_prefix:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), reduction="none").view_as(
        target
    )
    w = masked.float() / gamma[:, None]
    loss = (ce * w).sum() / target.numel()
    acc = ((logits.argmax(-1) == target) & masked).sum() / masked.sum().clamp(min=1)
    return loss, {"masked_acc": float(acc)}


def noise_block(
    ids: torch.Tensor, n_prefix: int, gamma_min: float, mask_id: int, gen: torch.Generator, full_share: float = 0.0
):
    """Per-sample γ ~ U(gamma_min, 1], each block slot masked with prob γ, at least one slot masked.
    With ``full_share`` > 0 that share of the samples (drawn after the rest) has the whole block masked
    (γ = 1): every answer slot, every value token included, is a target of the loss."""
    n, L = ids.shape
    B = L - n_prefix
    gamma = 1.0 - (1.0 - gamma_min) * torch.rand(n, generator=gen)
    masked = torch.rand(n, B, generator=gen) < gamma[:, None]
    forced = torch.randint(0, B, (n,), generator=gen)
    masked[torch.arange(n), forced] |= ~masked.any(1)
    if full_share > 0:
        full = torch.rand(n, generator=gen) < full_share
        masked[full] = True
        gamma = torch.where(full, torch.ones_like(gamma), gamma)
    noised = ids.clone()
    noised[:, n_prefix:] = torch.where(masked, torch.full_like(ids[:, n_prefix:], mask_id), ids[:, n_prefix:])
    return noised, masked, gamma


# ----------------------------------------------------------------------------------------- kernels
def attn_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """Softmax attention that also returns the log-sum-exp of the scaled scores (float32):
    q [..., Q, d], k/v [..., K, d], mask bool broadcastable to [..., Q, K] (True = attend)."""
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ v.float()
    return o, lse


def merge_lse(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor):
    """Online-softmax merge of two attention parts over disjoint key sets: (o, lse) of their union."""
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
    z = w1 + w2
    o = (w1[..., None] * o1 + w2[..., None] * o2) / z[..., None]
    return o, m + torch.log(z)


def page_minmax(k: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-page min / max keys of the full pages of a prefix k [..., N, d] → two [..., N // page, d]."""
    n_full = k.shape[-2] // page
    kf = k[..., : n_full * page, :].reshape(*k.shape[:-2], n_full, page, k.shape[-1])
    return kf.amin(-2), kf.amax(-2)


def quest_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Quest's upper bound of q·k over a page: Σ_d max(q_d·kmin_d, q_d·kmax_d). q [..., Q, d],
    kmin/kmax [..., G, d] → [..., Q, G]."""
    qe = q.float().unsqueeze(-2)
    return torch.maximum(qe * kmin.float().unsqueeze(-3), qe * kmax.float().unsqueeze(-3)).sum(-1)


def top_pages(scores: torch.Tensor, n_pages: int) -> torch.Tensor:
    """Bool [..., G]: the ``n_pages`` best pages of each row (all of them when n_pages >= G)."""
    G = scores.shape[-1]
    if n_pages >= G:
        return torch.ones_like(scores, dtype=torch.bool)
    idx = scores.topk(n_pages, -1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)


def pages_to_tokens(pages: torch.Tensor, page: int, n_tokens: int) -> torch.Tensor:
    """Bool page mask [..., G] → token mask [..., N]; the last partial page is always loaded."""
    tok = pages.repeat_interleave(page, -1)
    tail = n_tokens - tok.shape[-1]
    if tail:
        tok = torch.cat([tok, torch.ones(*pages.shape[:-1], tail, dtype=torch.bool, device=pages.device)], -1)
    return tok


def union_page_count(selected: torch.Tensor) -> torch.Tensor:
    """Pages loaded for a step: |∪_queries selected pages| per leading index; selected [..., Q, G]."""
    return selected.any(-2).sum(-1)


# ----------------------------------------------------------------------------------------- policies
class PrefixPolicy:
    """The prefix attention of the block queries at every (step, layer) of one block's decode, and the
    statistics the report needs (loaded KV, error vs dense given the same inputs, activity deltas).

    ``spec`` is a params ``Variant``; ``budget`` the per-query token budget; ``n_prefix`` the prefix
    length; ``page`` the page size. Set ``step`` before every forward of the block."""

    def __init__(
        self,
        spec,
        budget: int | None,
        n_prefix: int,
        page: int,
        n_steps: int,
        gen: torch.Generator | None = None,
        record: bool = True,
        top_share: float = 0.5,
    ):
        self.spec, self.kind = spec, spec.kind
        self.budget, self.N, self.P, self.T = budget, n_prefix, page, n_steps
        self.n_pages = (budget // page) if budget else None
        self.n_full = n_prefix // page
        self.tail = n_prefix - self.n_full * page
        self.gen, self.record, self.top_share = gen, record, top_share
        self.step = 0
        self.meta: dict[int, tuple] = {}
        self.prev_q: dict[int, torch.Tensor] = {}
        self.ref_q: dict[int, torch.Tensor] = {}
        self.prev_x: dict[int, torch.Tensor] = {}
        self.ref_x: dict[int, torch.Tensor] = {}
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.pattern: dict[int, torch.Tensor] = {}
        self.stats: list[dict] = []

    # -- helpers
    def _meta(self, layer: int, kp: torch.Tensor):
        if layer not in self.meta:  # the prefix is frozen within a block
            self.meta[layer] = page_minmax(kp, self.P)
        return self.meta[layer]

    def _loaded_tokens(self, pages: torch.Tensor) -> torch.Tensor:
        """Tokens loaded per (batch, head) for a union page mask [b, h, G]."""
        return pages.sum(-1).float() * self.P + self.tail

    def _active(self, layer: int, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Active tokens [b, h, B] at this step (LoSA step 1)."""
        s = self.spec
        b, h, B, _ = q.shape
        if s.activity_signal == "query":
            ref = self.ref_q[layer] if s.activity_reference == "last_refresh" else self.prev_q[layer]
            delta = ((q.float() - ref) ** 2).mean(-1)
        else:
            ref = self.ref_x[layer] if s.activity_reference == "last_refresh" else self.prev_x[layer]
            delta = ((x.float() - ref) ** 2).mean(-1)[:, None, :].expand(b, h, B)
        if s.active_rule == "random":
            k = max(1, math.ceil(s.rho * B))
            r = torch.rand(b, h, B, generator=self.gen).to(q.device)
            return top_pages(r, k)
        if s.active_rule == "topk":
            return top_pages(delta, max(1, math.ceil(s.rho * B)))
        mx = delta.amax(-1, keepdim=True)
        act = delta > s.threshold * mx
        return act | top_pages(delta, 1)  # at least one active token

    # -- the attention call
    def __call__(self, layer: int, q, k, v, x_in):
        N, t = self.N, self.step
        kp, vp, kb, vb = k[:, :, :N], v[:, :, :N], k[:, :, N:], v[:, :, N:]
        b, h, B, _ = q.shape
        o_blk, l_blk = attn_lse(q, kb, vb)
        o_den, l_den = attn_lse(q, kp, vp)
        full_pages = torch.ones(b, h, self.n_full, dtype=torch.bool, device=q.device)
        active = torch.ones(b, h, B, dtype=torch.bool, device=q.device)
        if self.kind == "dense":
            o_pre, l_pre, loaded_pages = o_den, l_den, full_pages
        elif self.kind == "quest":
            kmin, kmax = self._meta(layer, kp)
            sel = top_pages(quest_scores(q, kmin, kmax), self.n_pages)  # [b, h, B, G]
            o_pre, l_pre = attn_lse(q, kp, vp, pages_to_tokens(sel, self.P, N))
            loaded_pages = sel.any(-2)
        elif self.kind == "sparsed":
            n_dense = max(1, math.ceil(self.spec.dense_fraction * self.T))
            if t < n_dense:
                o_pre, l_pre, loaded_pages = o_den, l_den, full_pages
                if t == n_dense - 1:  # fix the per-head page set from this step's attention
                    s = (q.float() @ kp.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
                    prob = torch.softmax(s, -1).sum(-2)  # [b, h, N] mass over the block's queries
                    mass = prob[..., : self.n_full * self.P].reshape(b, h, self.n_full, self.P).sum(-1)
                    self.pattern[layer] = top_pages(mass, self.n_pages)
            else:
                pat = self.pattern[layer]
                o_pre, l_pre = attn_lse(q, kp, vp, pages_to_tokens(pat, self.P, N)[:, :, None, :])
                loaded_pages = pat
        else:
            o_pre, l_pre, loaded_pages, active = self._losa(layer, q, kp, vp, x_in)
        o, _ = merge_lse(o_pre, l_pre, o_blk, l_blk)
        if self.record:
            self._record(layer, q, x_in, o, o_den, l_den, o_blk, l_blk, loaded_pages, active)
        # histories for the next step's activity
        self.prev_q[layer], self.prev_x[layer] = q.float(), x_in.float()
        if layer not in self.ref_q:
            self.ref_q[layer], self.ref_x[layer] = q.float().clone(), x_in.float().clone()
        else:
            self.ref_q[layer] = torch.where(active[..., None], q.float(), self.ref_q[layer])
            act_any = active.any(1)  # hidden ref per token
            self.ref_x[layer] = torch.where(act_any[..., None], x_in.float(), self.ref_x[layer])
        return o.to(q.dtype)

    def _losa(self, layer, q, kp, vp, x_in):
        s, N = self.spec, self.N
        b, h, B, _ = q.shape
        first = layer not in self.cache
        if first and s.first_step_mode == "dense":
            o_pre, l_pre = attn_lse(q, kp, vp)
            self.cache[layer] = (o_pre, l_pre)
            return (
                o_pre,
                l_pre,
                torch.ones(b, h, self.n_full, dtype=torch.bool, device=q.device),
                torch.ones(b, h, B, dtype=torch.bool, device=q.device),
            )
        active = torch.ones(b, h, B, dtype=torch.bool, device=q.device) if first else self._active(layer, q, x_in)
        kmin, kmax = self._meta(layer, kp)
        sel = top_pages(quest_scores(q, kmin, kmax), self.n_pages) & active[..., None]  # [b, h, B, G]
        union = sel.any(-2)  # [b, h, G]
        if s.union:
            tok = pages_to_tokens(union, self.P, N)[:, :, None, :]
        else:
            tok = pages_to_tokens(sel, self.P, N)
        o_new, l_new = attn_lse(q, kp, vp, tok)
        if first:
            o_pre, l_pre = o_new, l_new
        else:
            o_old, l_old = self.cache[layer]
            o_pre = torch.where(active[..., None], o_new, o_old)
            l_pre = torch.where(active, l_new, l_old)
        self.cache[layer] = (o_pre, l_pre)
        return o_pre, l_pre, union, active

    def _record(self, layer, q, x_in, o, o_den, l_den, o_blk, l_blk, loaded_pages, active):
        o_ref, _ = merge_lse(o_den, l_den, o_blk, l_blk)
        err = ((o - o_ref) ** 2).sum((1, 2, 3)).sqrt() / (o_ref**2).sum((1, 2, 3)).sqrt().clamp(min=1e-30)
        row = {
            "step": self.step,
            "layer": layer,
            "density": (self._loaded_tokens(loaded_pages) / self.N).cpu(),  # [b, h]
            "rel_err": err.cpu(),  # [b]
            "active": active.float().cpu(),  # [b, h, B]
            "n_meta_pages": self.n_full,
        }
        if layer in self.prev_q:
            row["dq"] = ((q.float() - self.prev_q[layer]) ** 2).mean(-1).cpu()  # [b, h, B]
            row["dx"] = ((x_in.float() - self.prev_x[layer]) ** 2).mean(-1).cpu()  # [b, B]
        self.stats.append(row)


# ----------------------------------------------------------------------------------------- decoding
def unmask_schedule(block: int, steps: int) -> list[int]:
    """Tokens committed at each of ``steps`` steps (B spread as evenly as possible, earlier steps first)."""
    base, extra = divmod(block, steps)
    return [base + (i < extra) for i in range(steps)]


def copy_cache(c: KVCache) -> KVCache:
    return KVCache(list(c.keys), list(c.values), c.positions, c.next_position)


@torch.no_grad()
def prefill(model: BlockDiffusionLM, prefix: torch.Tensor) -> KVCache:
    model.set_policy(None)
    cache = KVCache()
    model(prefix, cache=cache, attn_mask=causal_mask(prefix.shape[1], prefix.device))
    return cache


@torch.no_grad()
def decode_block(
    model: BlockDiffusionLM,
    prefix: torch.Tensor,
    block: int,
    steps: int,
    mask_id: int,
    policy=None,
    banned: list[int] | None = None,
    cache: KVCache | None = None,
) -> torch.Tensor:
    """Denoise one answer block after ``prefix`` [b, N] in ``steps`` steps (confidence-based unmasking:
    the most confident masked slots are committed, greedy tokens). Returns the block [b, B]."""
    cache = cache if cache is not None else prefill(model, prefix)
    b = prefix.shape[0]
    x = torch.full((b, block), mask_id, dtype=torch.long, device=prefix.device)
    model.set_policy(policy)
    try:
        for t, n_commit in enumerate(unmask_schedule(block, steps)):
            if policy is not None:
                policy.step = t
            logits = model(x, cache=copy_cache(cache)).float()
            if banned:
                logits[..., banned] = float("-inf")
            conf, tok = logits.softmax(-1).max(-1)
            conf = conf.masked_fill(x != mask_id, float("-inf"))
            pick = conf.topk(n_commit, -1).indices
            x.scatter_(1, pick, tok.gather(1, pick))
    finally:
        model.set_policy(None)
    return x


def _top_share(d: torch.Tensor, top_share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of δ [*, B]: the share of the row's δ mass in its top ``top_share`` tokens (rows with
    δ ≡ 0 dropped), and the rows' totals."""
    tot = d.sum(-1)
    k = max(1, int(round(top_share * d.shape[-1])))
    return (d.topk(k, -1).values.sum(-1) / tot)[tot > 0], tot


def locality_stats(stats: list[dict], top_share: float) -> dict:
    """Share of the δ mass carried by the top ``top_share`` of block tokens, per (prompt, layer, head,
    step ≥ 1) for the query signal and per (prompt, layer, step ≥ 1) for the hidden state; ``_deep``:
    layers ≥ 1 only (layer 0 is local by construction: only the committed token's input changes)."""
    out = {}
    for key, name in (("dq", "delta"), ("dx", "hidden_delta")):
        rows = [r for r in stats if key in r]
        if not rows:
            continue
        for suffix, sel in (("", rows), ("_deep", [r for r in rows if r["layer"] > 0])):
            if not sel:
                continue
            d = torch.cat([r[key].reshape(-1, r[key].shape[-1]) for r in sel]).double()  # [*, B]
            share, tot = _top_share(d, top_share)
            ok = share.numel() > 0
            out[f"{name}_top_half_share_median{suffix}"] = float(share.median()) if ok else float("nan")
            out[f"{name}_top_half_share_p10{suffix}"] = float(share.quantile(0.1)) if ok else float("nan")
            out[f"{name}_zero_fraction{suffix}"] = float((d == 0).double().mean())
            if key == "dq" and suffix == "":
                out["_delta_share_values"] = (d / tot.clamp(min=1e-30)[:, None])[tot > 0].reshape(-1).numpy()
    return out
