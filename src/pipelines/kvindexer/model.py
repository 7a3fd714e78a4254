"""The base LM (core.seqmodels.TinyTransformer with an attention that can report its probabilities and add
a memory readout), the learned indexer, the latent memory, and the streaming chunked prefill with KV
eviction that every policy shares.

Eviction is physical: after each non-final chunk every layer's cache keeps ``budget`` entries per head
(gathered per sample, layer and head), so ``KVCache.nbytes()`` is the memory actually held. Keys are stored
after RoPE and each kept entry's absolute position is tracked, so attention to retained tokens is exactly
what it was before eviction (positions survive eviction)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.core.api import Block, KVCache, TinyConfig, TinyTransformer

PROTECT = 1e9  # score bonus of sinks and recent tokens (always kept)


# ------------------------------------------------------------------------------------------ base model
@dataclass
class AttnContext:
    """What the attention of one forward records / uses (set on every block by ``KVTransformer.use``)."""

    keep_probs: bool = False
    keep_hidden: bool = False
    keep_out: bool = False
    memory: LatentMemory | None = None
    mem_state: MemState | None = None
    masks: dict[int, torch.Tensor] | None = None  # layer → bool mask [B, H, Tq, Tk] replacing the default
    probs: dict[int, torch.Tensor] = field(default_factory=dict)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    outs: dict[int, torch.Tensor] = field(default_factory=dict)


class KVBlock(Block):
    """core's block with an explicit softmax attention when a context is set: per-head probabilities,
    the layer input (for the indexer), per-layer masks and the memory's residual readout."""

    def __init__(self, c: TinyConfig, idx: int):
        super().__init__(c)
        self.idx = idx
        self.ctx: AttnContext | None = None

    def forward(self, x, pos, layer_idx, cache, mask):
        if self.ctx is not None and self.ctx.keep_hidden:
            self.ctx.hidden[self.idx] = x
        return super().forward(x, pos, layer_idx, cache, mask)

    def attend(self, q, k, v, mask):
        ctx = self.ctx
        if ctx is None:
            return super().attend(q, k, v, mask)
        if ctx.masks is not None and self.idx in ctx.masks:
            mask = ctx.masks[self.idx]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = s.softmax(-1)
        o = p @ v
        if ctx.keep_probs:
            ctx.probs[self.idx] = p
        if ctx.memory is not None and ctx.mem_state is not None:
            o = o + ctx.memory.readout(self.idx, q, ctx.mem_state)
        if ctx.keep_out:
            ctx.outs[self.idx] = o
        return o


class KVTransformer(TinyTransformer):
    """TinyTransformer whose blocks are ``KVBlock`` (same parameter names: core state dicts load as is).

    ``attn_init_std``: the attention projections (qkv, out) start at this std instead of core's 0.02. With
    0.02 the OV path is so small that attending to the needle pays nothing, and the copy task sits on a
    loss plateau for the whole budget; d_model^-0.5 leaves it within a few hundred steps."""

    def __init__(self, c: TinyConfig, attn_init_std: float | None = None):
        super().__init__(c)
        self.blocks = nn.ModuleList(KVBlock(c, i) for i in range(c.n_layers))
        self.apply(self._init)
        if attn_init_std:
            for b in self.blocks:
                nn.init.normal_(b.qkv.weight, std=attn_init_std)
                nn.init.normal_(b.out.weight, std=attn_init_std)

    def use(self, ctx: AttnContext | None) -> KVTransformer:
        for b in self.blocks:
            b.ctx = ctx
        return self


# ------------------------------------------------------------------------------------------ indexer
class Indexer(nn.Module):
    """Per layer: I_s = max_t Σ_j w_j(t) · ReLU(q_j(t) · e_s), q_j = normalise(W_q^j h_t) over the current
    chunk's queries t, e_s = normalise(W_k h_s), w = W_g h_t; h the layer-input hidden states (RMS-normed)."""

    def __init__(self, n_layers: int, d_model: int, heads: int, dim: int):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.norm = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(n_layers))
        self.wq = nn.ModuleList(nn.Linear(d_model, heads * dim, bias=False) for _ in range(n_layers))
        self.wk = nn.ModuleList(nn.Linear(d_model, dim, bias=False) for _ in range(n_layers))
        self.wg = nn.ModuleList(nn.Linear(d_model, heads) for _ in range(n_layers))

    def score(self, layer: int, h_query: torch.Tensor, h_key: torch.Tensor) -> torch.Tensor:
        """h_query [B, Tq, d], h_key [B, Tk, d] → importance [B, Tk]."""
        B, Tq, _ = h_query.shape
        hq, hk = self.norm[layer](h_query), self.norm[layer](h_key)
        q = F.normalize(self.wq[layer](hq).view(B, Tq, self.heads, self.dim), dim=-1)
        e = F.normalize(self.wk[layer](hk), dim=-1)
        w = self.wg[layer](hq)  # [B, Tq, H_I]
        s = torch.einsum("bqjd,bkd->bqjk", q, e).relu()
        return (w[..., None] * s).sum(2).amax(1)


# ------------------------------------------------------------------------------------------ memory
@dataclass
class MemState:
    M: list[torch.Tensor]  # per layer [B, H, m, d_head]
    z: list[torch.Tensor]  # per layer [B, H, m]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.M, *self.z))


class LatentMemory(nn.Module):
    """Per layer and head a linear-attention state of the evicted entries: M ← M + φ(P_k k) vᵀ,
    z ← z + φ(P_k k) (φ = elu + 1); readout r = φ(P_q q)ᵀ M / (φ(P_q q)ᵀ z + ε), added to the head's
    output as g(q) · U r with a sigmoid gate initialised near 0. An empty state reads out exactly 0."""

    EPS = 1e-6

    def __init__(self, n_layers: int, n_heads: int, d_head: int, dim: int, gate_init: float = -4.0):
        super().__init__()
        L, H = n_layers, n_heads
        init = torch.randn(L, H, d_head, dim) / math.sqrt(d_head)
        self.pk = nn.Parameter(init.clone())
        self.pq = nn.Parameter(init.clone())
        self.u = nn.Parameter(torch.randn(L, H, d_head, d_head) / math.sqrt(d_head))
        self.wg = nn.Parameter(torch.zeros(L, H, d_head))
        self.bg = nn.Parameter(torch.full((L, H), float(gate_init)))
        self.dim = dim

    @staticmethod
    def phi(x):
        return F.elu(x) + 1

    def empty(self, B: int, device=None) -> MemState:
        L, H, dh, m = self.pk.shape
        return MemState(
            [torch.zeros(B, H, m, dh, device=device) for _ in range(L)],
            [torch.zeros(B, H, m, device=device) for _ in range(L)],
        )

    def fold(self, layer: int, k: torch.Tensor, v: torch.Tensor, evicted: torch.Tensor, st: MemState) -> None:
        """Fold the entries with ``evicted`` [B, H, T] (0/1) of k, v [B, H, T, d] into the state."""
        fk = self.phi(k @ self.pk[layer]) * evicted[..., None].to(k.dtype)  # [B, H, T, m]
        st.M[layer] = st.M[layer] + fk.transpose(-1, -2) @ v
        st.z[layer] = st.z[layer] + fk.sum(2)

    def readout(self, layer: int, q: torch.Tensor, st: MemState) -> torch.Tensor:
        fq = self.phi(q @ self.pq[layer])  # [B, H, Tq, m]
        num = fq @ st.M[layer]  # [B, H, Tq, d]
        den = (fq * st.z[layer][:, :, None, :]).sum(-1, keepdim=True) + self.EPS
        g = torch.sigmoid(
            (q * self.wg[layer][None, :, None, :]).sum(-1, keepdim=True) + self.bg[layer][None, :, None, None]
        )
        return g * ((num / den) @ self.u[layer])


# ------------------------------------------------------------------------------------------ streaming
@dataclass
class Protocol:
    chunk: int
    n_sink: int
    recent: int
    snap_window: int = 8
    snap_kernel: int = 5


@dataclass
class StreamOut:
    logits: torch.Tensor  # [B, T_last, V] of the final chunk
    positions: list[torch.Tensor]  # per layer [B, H, T] cached absolute positions at answer time
    cache: KVCache
    mem_state: MemState | None
    outs: dict[int, torch.Tensor]  # per layer final-chunk attention outputs (keep_out)
    records: list[tuple]  # indexer training records (collect=True)
    kl: list[float]  # per eviction: KL(teacher future attention || indexer)


def _pool(x: torch.Tensor, kernel: int) -> torch.Tensor:
    """Average-pool [B, H, T] along T (same length, padding not counted)."""
    B, H, T = x.shape
    return F.avg_pool1d(x.reshape(B * H, 1, T), kernel, 1, kernel // 2, count_include_pad=False).reshape(B, H, T)


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [B, H, T, ...] at idx [B, H, C] along T."""
    if t.dim() == 3:
        return t.gather(2, idx)
    return t.gather(2, idx[..., None].expand(*idx.shape, t.shape[-1]))


def protected(pos: torch.Tensor, next_position: int, pr: Protocol) -> torch.Tensor:
    return (pos < pr.n_sink) | (pos >= next_position - pr.recent)


def stream(
    model: KVTransformer,
    ctx_ids: torch.Tensor,
    tail: torch.Tensor,
    policy: str,
    budget: int,
    pr: Protocol,
    *,
    indexer: Indexer | None = None,
    memory: LatentMemory | None = None,
    future: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    score_fn=None,
    keep_out: bool = False,
    collect: bool = False,
    truncate: bool = True,
) -> StreamOut:
    """Chunked prefill of ``ctx_ids`` [B, N] with eviction to ``budget`` cached entries per layer and head
    after every non-final chunk, then ``tail`` [B, T_tail] (question, and the answer when teacher-forced)
    appended to the last chunk; no eviction after it.

    policy: ``full_kv`` | ``streamingllm`` | ``h2o`` | ``snapkv`` | ``random`` | ``oracle`` (``future``
    [B, n_chunks - 1, L, T_total]: the teacher's attention mass from future queries) | ``indexer`` |
    ``fixed`` (``score_fn(layer, positions [B, H, T], chunk index) → scores``, for tests).
    Sinks (positions < n_sink) and the ``recent`` newest tokens are always kept; the rest by top score.
    ``memory`` folds the evicted entries into a latent state read by later queries. Under autograd with
    ``truncate`` only the final chunk (and the memory state, rebuilt from the evicted entries) is
    differentiated: the prefill chunks run without a graph (truncated backprop)."""
    B, N = ctx_ids.shape
    n_chunks = N // pr.chunk
    L = len(model.blocks)
    dev = ctx_ids.device
    cache = KVCache()
    actx = AttnContext(
        keep_probs=policy in ("h2o", "snapkv"),
        keep_hidden=policy == "indexer",
        memory=memory,
        mem_state=memory.empty(B, dev) if memory is not None else None,
    )
    pos: list[torch.Tensor | None] = [None] * L
    acc: list[torch.Tensor | None] = [None] * L  # h2o: accumulated attention received
    hid: list[torch.Tensor | None] = [None] * L  # indexer: layer-input hidden state of each entry
    records, kls, folds = [], [], []
    train_mode = torch.is_grad_enabled()
    model.use(actx)
    try:
        for ci in range(n_chunks):
            last = ci == n_chunks - 1
            if last and folds:
                # truncated backprop: the prefill ran without a graph; rebuild the state from the evicted
                # entries (the fold is a sum) so the loss reaches P_k through it
                actx.mem_state = memory.empty(B, dev)
                for l, k, v, ev in folds:
                    memory.fold(l, k, v, ev, actx.mem_state)
            with torch.no_grad() if (train_mode and truncate and not last) else contextlib.nullcontext():
                logits = _chunk(
                    model,
                    actx,
                    cache,
                    ctx_ids,
                    tail,
                    ci,
                    last,
                    keep_out,
                    policy,
                    budget,
                    pr,
                    pos,
                    acc,
                    hid,
                    indexer,
                    memory,
                    future,
                    generator,
                    score_fn,
                    collect,
                    records,
                    kls,
                    folds if (train_mode and truncate and memory is not None) else None,
                )
    finally:
        model.use(None)
    return StreamOut(logits, pos, cache, actx.mem_state, actx.outs, records, kls)


def _chunk(
    model,
    actx,
    cache,
    ctx_ids,
    tail,
    ci,
    last,
    keep_out,
    policy,
    budget,
    pr,
    pos,
    acc,
    hid,
    indexer,
    memory,
    future,
    generator,
    score_fn,
    collect,
    records,
    kls,
    folds,
):
    """Process chunk ``ci`` (the last one with ``tail``), update the policy's statistics, evict."""
    B, c = ctx_ids.shape[0], pr.chunk
    L, H = len(model.blocks), model.config.n_heads
    dev = ctx_ids.device
    ids = ctx_ids[:, ci * c : (ci + 1) * c]
    if last:
        ids = torch.cat([ids, tail], 1)
        actx.keep_out = keep_out
    T_new = ids.shape[1]
    actx.probs, actx.hidden, actx.outs = {}, {}, {}
    logits = model(ids, cache=cache)
    new = torch.arange(ci * c, ci * c + T_new, device=dev).expand(B, H, T_new)
    for l in range(L):
        pos[l] = new if pos[l] is None else torch.cat([pos[l], new], 2)
        if policy == "h2o":
            got = actx.probs[l].sum(2)  # [B, H, Tk]
            acc[l] = got if acc[l] is None else got + F.pad(acc[l], (0, T_new))
        if policy == "indexer":
            h = actx.hidden[l].detach()[:, None]  # [B, 1, T, d]: shared by the heads
            hid[l] = h if hid[l] is None else torch.cat([hid[l], h], 2)
    T = pos[0].shape[2]
    if last or policy == "full_kv" or T <= budget:
        return logits
    nxt = cache.next_position
    for l in range(L):
        with torch.no_grad():
            prot = protected(pos[l], nxt, pr)
            if policy == "streamingllm":
                score = pos[l].float()
            elif policy == "h2o":
                score = acc[l].detach()
            elif policy == "snapkv":
                obs = actx.probs[l][:, :, -pr.snap_window :, :].sum(2).detach()
                score = _pool(obs, pr.snap_kernel)
            elif policy == "random":
                score = torch.rand(B, 1, T, generator=generator, device=dev).expand(B, H, T)
            elif policy == "oracle":
                score = future[:, ci, l].gather(1, pos[l][:, 0]).float()[:, None].expand(B, H, T)
            elif policy == "fixed":
                score = score_fn(l, pos[l], ci)
            elif policy == "indexer":
                score = indexer.score(l, actx.hidden[l].detach(), hid[l][:, 0])[:, None].expand(B, H, T)
            else:
                raise ValueError(f"unknown eviction policy {policy!r}")
            score = score + PROTECT * prot
            if policy == "indexer" and future is not None:
                tgt = future[:, ci, l].gather(1, pos[l][:, 0]).float()
                kls.append(_kl(tgt, score[:, 0], prot[:, 0]).mean().item())
        if collect:
            tgt = future[:, ci, l].gather(1, pos[l][:, 0]).float()
            records.append((l, actx.hidden[l].detach(), hid[l][:, 0], prot[:, 0], tgt))
        idx = score.topk(budget, dim=2).indices.sort(2).values  # [B, H, budget]
        k, v = cache.keys[l], cache.values[l]
        if memory is not None:
            evicted = 1.0 - torch.zeros(B, H, T, device=dev).scatter_(2, idx, 1.0)
            memory.fold(l, k, v, evicted, actx.mem_state)
            if folds is not None:
                folds.append((l, k.detach(), v.detach(), evicted))
        cache.keys[l], cache.values[l] = _gather(k, idx), _gather(v, idx)
        pos[l] = pos[l].gather(2, idx)
        if acc[l] is not None:
            acc[l] = acc[l].gather(2, idx)
        if hid[l] is not None:
            hid[l] = _gather(hid[l], idx[:, :1])
    # every cached entry precedes the next chunk: a dummy position list keeps core's causal mask right
    cache.positions = torch.arange(budget, device=dev)
    return logits


def _kl(target: torch.Tensor, logits: torch.Tensor, prot: torch.Tensor) -> torch.Tensor:
    """KL(p* || softmax(logits)) over the evictable entries (not sinks / recent) → [B]."""
    t = target.masked_fill(prot, 0.0)
    p = t / t.sum(-1, keepdim=True).clamp_min(1e-12)
    logq = logits.masked_fill(prot, float("-inf")).log_softmax(-1)
    term = torch.where(p > 0, p * (p.clamp_min(1e-12).log() - logq), torch.zeros_like(p))
    return term.sum(-1)


def indexer_kl_loss(indexer: Indexer, records: list[tuple]) -> torch.Tensor:
    """Mean over evictions of KL(teacher future attention on the surviving cache || softmax(indexer))."""
    losses = [_kl(tgt, indexer.score(l, hq, hk), prot).mean() for l, hq, hk, prot, tgt in records]
    return torch.stack(losses).mean()


@torch.no_grad()
def teacher(model: KVTransformer, full_ids: torch.Tensor, chunk: int, n_ctx: int, batch: int = 128):
    """Full-KV pass over context + question + answer: the attention mass each position receives from the
    queries after each chunk boundary (summed over heads) [B, n_chunks - 1, L, T], and the attention
    outputs per layer [B, H, T, d]."""
    fut, outs = [], []
    L, T = len(model.blocks), full_ids.shape[1]
    batch = max(1, min(batch, int(4e8 // (model.config.n_heads * T * T))))  # bound the [B, H, T, T] probabilities
    for s in range(0, len(full_ids), batch):
        ids = full_ids[s : s + batch]
        actx = AttnContext(keep_probs=True, keep_out=True)
        model.use(actx)
        try:
            model(ids)
        finally:
            model.use(None)
        bounds = range(chunk, n_ctx, chunk)
        f = torch.stack([torch.stack([actx.probs[l][:, :, b:, :].sum((1, 2)) for l in range(L)], 1) for b in bounds], 1)
        fut.append(f)
        outs.append(torch.stack([actx.outs[l] for l in range(L)], 1))
    return torch.cat(fut), torch.cat(outs)
