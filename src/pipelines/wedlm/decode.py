"""Decoders on one causal model with a KV cache (paper §4, Algorithm 1 in the engine's order):
AR greedy, WeDLM streaming parallel decoding (commit the leading filled slots every forward, refill the
window), and the block-wise baseline (commit only whole blocks). Batched over prompts of equal length;
caches are ragged per row (a validity mask), which is exact because attention does not depend on where a
key sits physically, only on the mask and its logical (RoPE) position."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipelines.wedlm.model import TinyLM, entropy


class KVCache:
    """Per-layer K/V buffers [N, H, S+1, dh] with a per-row length; slot S is a write sink."""

    def __init__(self, model: TinyLM, n: int, size: int, device):
        layer = model.layers[0]
        h, dh = layer.h, model.emb.embedding_dim // layer.h
        self.size = size
        self.k = [torch.zeros(n, h, size + 1, dh, device=device) for _ in model.layers]
        self.v = [torch.zeros(n, h, size + 1, dh, device=device) for _ in model.layers]
        self.len = torch.zeros(n, dtype=torch.long, device=device)

    def past(self) -> list:
        return list(zip(self.k, self.v))

    def valid(self) -> torch.Tensor:
        return torch.arange(self.size + 1, device=self.len.device)[None, :] < self.len[:, None]

    def write(self, kvs: list, count: torch.Tensor) -> None:
        """Append the first ``count[i]`` physical slots of a forward's new K/V to row i."""
        n, h, t, dh = kvs[0][0].shape
        j = torch.arange(t, device=count.device)[None, :]
        dest = torch.where(j < count[:, None], self.len[:, None] + j, torch.full_like(j, self.size))
        if int((self.len + count).max()) > self.size:
            raise RuntimeError("KV cache overflow (raise its size)")
        idx = dest[:, None, :, None].expand(n, h, t, dh)
        for buf_k, buf_v, (k, v) in zip(self.k, self.v, kvs):
            buf_k.scatter_(2, idx, k)
            buf_v.scatter_(2, idx, v)
        self.len = self.len + count

    def select(self, keep: torch.Tensor) -> None:
        self.k = [b[keep] for b in self.k]
        self.v = [b[keep] for b in self.v]
        self.len = self.len[keep]


def forward_on_cache(model: TinyLM, cache: KVCache, tok: torch.Tensor, pos: torch.Tensor):
    """One causal forward over new slots (physical order) on top of the cache ("small prefill")."""
    n, t = tok.shape
    causal = torch.ones(t, t, dtype=torch.bool, device=tok.device).tril()
    mask = torch.cat([cache.valid()[:, None, :].expand(n, t, -1), causal[None].expand(n, t, t)], 2)
    return model(tok, pos, mask, past=cache.past())


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # generated tokens per prompt, up to and including the first EOS
    forwards: list[int]  # sequential model calls, prefill included
    processed: list[int]  # token instances run through the model after the prompt
    cached: list[int]  # generated tokens whose K/V entered the cache
    fills: list[int]
    out_of_order: list[int]  # fills that left an unfilled mask to their left
    # per forward of row 0: committed (in the cache), decided (committed + leading filled run), filled
    trace: list[dict] = field(default_factory=list)


def _leading(filled: torch.Tensor) -> torch.Tensor:
    return filled.long().cumprod(1).sum(1)


@torch.no_grad()
def decode_ar(model: TinyLM, prompts: torch.Tensor, eos: int, max_new: int) -> DecodeResult:
    """Greedy next-token decoding with a KV cache."""
    n, P = prompts.shape
    dev = prompts.device
    cache = KVCache(model, n, P + max_new + 1, dev)
    pos = torch.arange(P, device=dev).expand(n, P)
    logits, kvs = forward_on_cache(model, cache, prompts, pos)
    cache.write(kvs, torch.full((n,), P, device=dev))
    tok = logits[:, -1].argmax(-1)
    out = [[int(t)] for t in tok]
    fwd = [1] * n
    proc = [0] * n
    ids = torch.arange(n, device=dev)
    trace = [{"step": 0, "committed": 0, "decided": 1, "filled": 0, "window": 0}]
    for step in range(1, max_new):
        alive = torch.tensor(
            [out[i][-1] != eos and len(out[i]) < max_new for i in ids.tolist()], dtype=torch.bool, device=dev
        )
        if not alive.any():
            break
        if not alive.all():
            keep = alive.nonzero().squeeze(1)
            ids, tok = ids[keep], tok[keep]
            cache.select(keep)
        p = cache.len[:, None].clone()
        logits, kvs = forward_on_cache(model, cache, tok[:, None], p)
        cache.write(kvs, torch.ones_like(cache.len))
        tok = logits[:, -1].argmax(-1)
        for a, i in enumerate(ids.tolist()):
            out[i].append(int(tok[a]))
            fwd[i] += 1
            proc[i] += 1
        if ids[0] == 0:
            trace.append({"step": step, "committed": len(out[0]) - 1, "decided": len(out[0]), "filled": 0, "window": 0})
    return DecodeResult(out, fwd, proc, list(proc), [len(o) for o in out], [0] * n, trace)


def _predict(win_tok, win_filled, has_logit, win_logits, tau, lam, fallback):
    """Entropy-threshold filling with the distance penalty H~ = H + λ·d (d in slots from the leftmost
    remaining mask); if nothing passes, fill one slot (argmin of H~, or the leftmost mask)."""
    A, W = win_tok.shape
    idx = torch.arange(W, device=win_tok.device)[None, :].expand(A, W)
    cand = ~win_filled & has_logit
    big = torch.full_like(idx, W)
    leftmost = torch.where(~win_filled, idx, big).min(1).values
    h = entropy(win_logits)
    htil = h + lam * (idx - leftmost[:, None]).clamp_min(0).float()
    fill = cand & (htil < tau)
    none = ~fill.any(1) & cand.any(1)
    if none.any():
        if fallback == "argmin":
            choice = torch.where(cand, htil, torch.full_like(htil, float("inf"))).argmin(1)
        else:
            choice = torch.where(cand, idx, big).min(1).values
        rows = none.nonzero().squeeze(1)
        fill[rows, choice[rows]] = True
    pred = win_logits.argmax(-1)
    after = win_filled | fill
    first_gap = torch.where(~after, idx, big).min(1).values
    ooo = (fill & (idx > first_gap[:, None])).sum(1)
    return torch.where(fill, pred, win_tok), after, fill.sum(1), ooo


@torch.no_grad()
def decode_parallel(
    model: TinyLM,
    prompts: torch.Tensor,
    eos: int,
    mask_id: int,
    max_new: int,
    window: int,
    tau: float,
    lam: float,
    mode: str = "stream",
    refill: str = "before_forward",
    fallback: str = "argmin",
) -> DecodeResult:
    """WeDLM streaming (``mode='stream'``) or block-wise (``mode='block'``) parallel decoding.

    Every forward runs [slots to commit, other filled slots, masks] in that physical order on top of the
    cache; committed slots' K/V (computed while they saw only the cache and logically earlier tokens)
    extend the cache. Stream commits the leading filled run each forward; block commits the window only
    once all its W slots are filled, in a forward that already carries the next block's W masks."""
    if mode not in ("stream", "block"):
        raise ValueError(f"mode must be 'stream' or 'block', got {mode!r}")
    n, P = prompts.shape
    W, dev = window, prompts.device
    cache = KVCache(model, n, P + max_new + 2 * W + 2, dev)
    out: list[list[int]] = [[] for _ in range(n)]
    fwd, proc, cached, fills, ooo = ([0] * n for _ in range(5))
    final: list[list[int] | None] = [None] * n
    trace: list[dict] = []
    ids = torch.arange(n, device=dev)
    ar = torch.arange(W, device=dev)[None, :]

    # prefill fused with the first window: [prompt, W masks]; the prompt is committed
    tok0 = torch.cat([prompts, torch.full((n, W), mask_id, device=dev)], 1)
    logits, kvs = forward_on_cache(model, cache, tok0, torch.arange(P + W, device=dev).expand(n, -1))
    cache.write(kvs, torch.full((n,), P, device=dev))
    base = torch.full((n,), P, device=dev)
    win_tok = torch.full((n, W), mask_id, device=dev)
    win_filled = torch.zeros(n, W, dtype=torch.bool, device=dev)
    has = torch.ones(n, W, dtype=torch.bool, device=dev)
    win_logits = logits[:, P:]
    for i in range(n):
        fwd[i], proc[i] = 1, W
    step = 0
    while True:
        win_tok, win_filled, nf, no = _predict(win_tok, win_filled, has, win_logits, tau, lam, fallback)
        lead = _leading(win_filled)
        outlen = torch.tensor([len(out[i]) for i in ids.tolist()], device=dev)
        eos_lead = ((win_tok == eos) & (ar < lead[:, None])).any(1)
        done = eos_lead | (outlen + lead >= max_new)
        for a, i in enumerate(ids.tolist()):
            fills[i] += int(nf[a])
            ooo[i] += int(no[a])
            if i == 0:
                trace.append(
                    {
                        "step": step,
                        "committed": len(out[0]),
                        "decided": len(out[0]) + int(lead[a]),
                        "filled": int(win_filled[a].sum()),
                        "window": W,
                    }
                )
            if done[a]:
                seq = out[i] + win_tok[a, : int(lead[a])].tolist()
                if eos in seq:
                    seq = seq[: seq.index(eos) + 1]
                final[i] = seq[:max_new]
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            ids, base, win_tok, win_filled = ids[keep], base[keep], win_tok[keep], win_filled[keep]
            cache.select(keep)
            lead = lead[keep]
        step += 1
        if step > 4 * (max_new + W) + 8:
            raise RuntimeError("parallel decoding made no progress")
        A = ids.numel()
        c = lead if mode == "stream" else torch.where(win_filled.all(1), W, 0)
        cmax = int(c.max())
        ext_tok = torch.cat([win_tok, torch.full((A, cmax), mask_id, device=dev)], 1)
        ext_filled = torch.cat([win_filled, torch.zeros(A, cmax, dtype=torch.bool, device=dev)], 1)
        E = W + cmax
        off = torch.arange(E, device=dev)[None, :].expand(A, E)
        # engine order: the c refill masks join this forward; printed Algorithm 1: they wait a step
        in_fwd = off < (W + c[:, None] if refill == "before_forward" else W)
        key = torch.where(in_fwd, torch.where(ext_filled, off, E + off), 2 * E + off)
        perm = key.argsort(1)
        T = int(in_fwd.sum(1).max())
        perm_t = perm[:, :T]
        logits, kvs = forward_on_cache(model, cache, ext_tok.gather(1, perm_t), base[:, None] + perm_t)
        cache.write(kvs, c)  # the c leading filled slots are exactly the first c physical slots
        ext_logits = torch.zeros(A, E, logits.shape[-1], device=dev)
        ext_logits.scatter_(1, perm_t[:, :, None].expand(-1, -1, logits.shape[-1]), logits)
        ext_has = in_fwd & ext_filled.logical_not()
        for a, i in enumerate(ids.tolist()):
            ca = int(c[a])
            out[i].extend(ext_tok[a, :ca].tolist())
            fwd[i] += 1
            proc[i] += int(in_fwd[a].sum())
            cached[i] += ca
        sh = c[:, None] + ar
        win_tok = ext_tok.gather(1, sh)
        win_filled = ext_filled.gather(1, sh)
        has = ext_has.gather(1, sh)
        win_logits = ext_logits.gather(1, sh[:, :, None].expand(-1, -1, logits.shape[-1]))
        base = base + c
    return DecodeResult([f for f in final], fwd, proc, cached, fills, ooo, trace)
