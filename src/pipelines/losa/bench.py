"""``evaluate.timing``: the prefix-attention time of one block's decode (every step and layer), dense vs
Quest vs LoSA, with the KV actually gathered (what a paged kernel loads), measured side by side in one
process: interleaved rounds, median of per-round ratios with an order-statistic interval. One node,
because its measurements must interleave.

The gather-based kernels here compute the same outputs as the mask-based policies in ``model.py``
(tested); the mask-based ones serve the accuracy metrics, these the clock."""

from __future__ import annotations

import math

import torch

from pipelines.core.api import interleaved_timing, node_setup, ratio_ci
from pipelines.losa.data import MASK
from pipelines.losa.model import attn_lse, page_minmax, quest_scores, top_pages
from pipelines.losa.params import Params


def _token_index(page_idx: torch.Tensor, page: int, n_prefix: int) -> torch.Tensor:
    """Page indices [..., n] → token indices [..., n·P (+ tail)]: the pages' tokens and the partial page."""
    off = torch.arange(page, device=page_idx.device)
    tok = (page_idx[..., None] * page + off).flatten(-2)
    n_full = n_prefix // page
    if n_prefix > n_full * page:
        tail = torch.arange(n_full * page, n_prefix, device=page_idx.device).expand(*tok.shape[:-1], -1)
        tok = torch.cat([tok, tail], -1)
    return tok


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [b, h, N, d] at token indices idx [b, h, ..., M] → [b, h, ..., M, d]."""
    b, h, N, d = x.shape
    extra = idx.dim() - 3
    src = x.view(b, h, *([1] * extra), N, d).expand(*idx.shape[:-1], N, d)
    return src.gather(-2, idx[..., None].expand(*idx.shape, d))


def quest_gather(q, kp, vp, meta, n_pages: int, page: int):
    """Quest: each query scores the pages, gathers its own top pages (+ the partial page), attends."""
    kmin, kmax = meta
    n_pages = min(n_pages, kmin.shape[-2])
    idx = quest_scores(q, kmin, kmax).topk(n_pages, -1).indices  # [b, h, B, n]
    tok = _token_index(idx, page, kp.shape[-2])  # [b, h, B, M]
    kg, vg = _gather(kp, tok), _gather(vp, tok)  # [b, h, B, M, d]
    o, lse = attn_lse(q[..., None, :], kg, vg)
    return o[..., 0, :], lse[..., 0]


def losa_gather(q, kp, vp, meta, n_pages: int, page: int, active_idx: torch.Tensor | None, state: dict):
    """LoSA's step at one layer: the active queries (``active_idx`` [b, h, A]; None = all) score the pages,
    the union of their top pages is gathered once (padded to the largest union of the batch), the active
    queries attend to it, and their (o, lse) overwrite the cached ones of the stable tokens."""
    kmin, kmax = meta
    b, h, B, d = q.shape
    qa = q if active_idx is None else q.gather(2, active_idx[..., None].expand(-1, -1, -1, d))
    sel = top_pages(quest_scores(qa, kmin, kmax), n_pages)  # [b, h, A, G]
    union = sel.any(-2)  # [b, h, G]
    u = int(union.sum(-1).max())
    order = union.float().topk(u, -1).indices  # selected pages first
    valid = union.gather(-1, order)  # [b, h, u]
    tok = _token_index(order, page, kp.shape[-2])  # [b, h, M]
    ok = valid.repeat_interleave(page, -1)
    if tok.shape[-1] > ok.shape[-1]:
        ok = torch.cat([ok, ok.new_ones(b, h, tok.shape[-1] - ok.shape[-1])], -1)
    kg, vg = _gather(kp, tok), _gather(vp, tok)  # [b, h, M, d]
    o, lse = attn_lse(qa, kg, vg, ok[:, :, None, :])
    if active_idx is None:
        state["o"], state["lse"] = o, lse
    else:
        state["o"] = state["o"].scatter(2, active_idx[..., None].expand(-1, -1, -1, d), o)
        state["lse"] = state["lse"].scatter(2, active_idx, lse)
    return state["o"], state["lse"], union


def losa_decode_attention(qs: list[list[torch.Tensor]], kps, vps, metas, n_pages: int, page: int, rho: float):
    """LoSA's prefix attention over a whole block decode: qs[step][layer] [b, h, B, d]; top-⌈ρB⌉ query
    δ (consecutive steps) picks the active tokens, step 0 all active. Returns the last step's outputs."""
    states = [dict() for _ in kps]
    out = None
    for t, q_layers in enumerate(qs):
        for layer, q in enumerate(q_layers):
            act = None
            if t > 0:
                delta = ((q - qs[t - 1][layer]) ** 2).mean(-1)
                act = delta.topk(max(1, math.ceil(rho * q.shape[2])), -1).indices
            out = losa_gather(q, kps[layer], vps[layer], metas[layer], n_pages, page, act, states[layer])
    return out


def quest_decode_attention(qs, kps, vps, metas, n_pages: int, page: int):
    out = None
    for q_layers in qs:
        for layer, q in enumerate(q_layers):
            out = quest_gather(q, kps[layer], vps[layer], metas[layer], n_pages, page)
    return out


def dense_decode_attention(qs, kps, vps):
    out = None
    for q_layers in qs:
        for layer, q in enumerate(q_layers):
            out = attn_lse(q, kps[layer], vps[layer])
    return out


class _Capture:
    """A dense policy that records the block queries per (step, layer) and the prefix K/V per layer."""

    def __init__(self, n_prefix: int):
        self.N, self.step = n_prefix, 0
        self.q: dict[int, dict[int, torch.Tensor]] = {}
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, layer, q, k, v, x_in):
        self.q.setdefault(self.step, {})[layer] = q.detach().clone()
        self.kv.setdefault(layer, (k[:, :, : self.N].contiguous(), v[:, :, : self.N].contiguous()))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def measure_timing(tasks: dict, bdlm: dict, p: Params) -> dict:
    """``evaluate.timing``: captured queries / prefix KV of a dense decode of ``timing.n_prompts`` prompts,
    then the decode's prefix attention timed for dense and, per budget, Quest and LoSA (interleaved)."""
    from pipelines.losa.model import decode_block, prefill
    from pipelines.losa.train import banned_tokens, load_model

    dev = node_setup(p, p.seeds[0])
    model, n_prefix = load_model(tasks, bdlm, p, dev)
    prompts = tasks[f"eval_seed{p.seeds[0]}"][: p.timing.n_prompts, :n_prefix].long().to(dev)
    cap = _Capture(n_prefix)
    decode_block(model, prompts, p.data.block_size, p.decode.steps, MASK, cap, banned_tokens(), prefill(model, prompts))
    layers = sorted(cap.kv)
    qs = [[cap.q[t][la] for la in layers] for t in sorted(cap.q)]
    kps, vps = [cap.kv[la][0] for la in layers], [cap.kv[la][1] for la in layers]
    P = p.decode.page_size
    metas = [page_minmax(k, P) for k in kps]  # built once per block (the prefix is frozen)
    quest = next((v for v in p.variants if v.kind == "quest"), None)
    losa = next((v for v in p.variants if v.kind == "losa"), None)
    fns = {"dense": lambda: dense_decode_attention(qs, kps, vps)}
    for b in p.timing.budgets:
        if quest is not None:
            fns[f"quest_b{b}"] = lambda b=b: quest_decode_attention(qs, kps, vps, metas, b // P, P)
        if losa is not None:
            fns[f"losa_b{b}"] = lambda b=b: losa_decode_attention(qs, kps, vps, metas, b // P, P, losa.rho)
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    clock = "cpu" if dev.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    with torch.no_grad():
        times = interleaved_timing(fns, rounds=p.timing.rounds, warmup=p.timing.warmup, sync=sync, clock=clock)
    metrics: dict[str, float] = {}
    for b in p.timing.budgets:
        pairs = []
        if losa is not None:
            pairs.append((f"speedup.attn_ms.losa_vs_dense.b{b}", "dense", f"losa_b{b}"))
        if quest is not None:
            pairs.append((f"speedup.attn_ms.quest_vs_dense.b{b}", "dense", f"quest_b{b}"))
        if losa is not None and quest is not None:
            pairs.append((f"speedup.attn_ms.losa_vs_quest.b{b}", f"quest_b{b}", f"losa_b{b}"))
        for name, slow, fast in pairs:
            metrics.update(ratio_ci(times[slow], times[fast], p.timing.confidence).as_metrics(name))
    return {
        "clock": clock,
        "device": dev.type,
        "threads": torch.get_num_threads(),
        "n_prompts": len(prompts),
        "attn_ms": {k: float(torch.tensor(v).median() * 1e3) for k, v in times.items()},
        "samples_ms": {k: [float(x) * 1e3 for x in v] for k, v in times.items()},
        "metrics": metrics,
    }
