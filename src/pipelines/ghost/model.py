"""GHOST (§3 of the paper): per-state-channel scores of a Mamba2-style SSM from forward-pass statistics
(controllability E‖S_t[:, n]‖² × observability C_{t,n}², taken jointly), the baselines' scores (weight and
activation magnitude, random, Taylor and Fisher on a per-channel mask), grouped per-layer selection with
sequential layer-by-layer recalibration, masking, and hard truncation of in_proj / conv1d rows.

The model is core's ``SelectiveSSMLM``; a state channel (g, n) of a layer is channel n of B and C in group
g, shared by the heads of that group. Scores and masks are [n_groups, d_state] per layer."""

from __future__ import annotations

import copy
import dataclasses
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from pipelines.core.api import SelectiveSSM, SelectiveSSMLM, SSMConfig
from pipelines.ghost.params import FORWARD, GRADIENT, Params


# ------------------------------------------------------------------------------------------- model
def model_config(p: Params, vocab_size: int | None = None) -> SSMConfig:
    m = p.model
    return SSMConfig(
        vocab_size=vocab_size or p.data.vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        d_state=m.d_state,
        n_heads=m.n_heads,
        n_groups=m.n_groups,
        expand=m.expand,
        d_conv=m.d_conv,
        max_len=p.data.seq_len,
        scan="chunked",
        chunk_size=m.chunk_size,
    )


def build_model(config: dict) -> SelectiveSSMLM:
    return SelectiveSSMLM(SSMConfig(**config))


def load_model(blob: dict) -> SelectiveSSMLM:
    model = build_model(blob["config"])
    model.load_state_dict(blob["state_dict"])
    return model.eval()


def lm_loss(model: SelectiveSSMLM, ids: torch.Tensor, per_sequence: bool = False) -> torch.Tensor:
    """Mean next-token NLL (nats) of ``ids`` [B, T] (per sequence [B] with ``per_sequence``)."""
    logits = model(ids[:, :-1])
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    nll = nll.view(ids.shape[0], -1)
    return nll.mean(1) if per_sequence else nll.mean()


@torch.no_grad()
def mean_nll(model: SelectiveSSMLM, ids: torch.Tensor, batch: int) -> float:
    tot, n = 0.0, 0
    dev = model.embed.weight.device
    for s in range(0, len(ids), batch):
        part = ids[s : s + batch].to(dev)
        tot += float(lm_loss(model, part)) * len(part)
        n += len(part)
    return tot / n


@torch.no_grad()
def recall_accuracy(model: SelectiveSSMLM, ids: torch.Tensor, mask: torch.Tensor, batch: int) -> float:
    """Greedy next-token accuracy at the positions ``mask`` [B, T] marks (MQAR: the queried values)."""
    hits, n = 0, 0
    dev = model.embed.weight.device
    for s in range(0, len(ids), batch):
        part, m = ids[s : s + batch].to(dev), mask[s : s + batch, 1:].to(dev)
        pred = model(part[:, :-1]).argmax(-1)
        hits += int((pred == part[:, 1:])[m].sum())
        n += int(m.sum())
    return hits / n if n else math.nan


def groups_of(layer: SelectiveSSM) -> tuple[int, int]:
    """(n_groups, heads per group)."""
    return layer.g, layer.h // layer.g


def group_mask_to_heads(layer: SelectiveSSM, keep: torch.Tensor) -> torch.Tensor:
    """A [G, N] keep mask as the layer's [H, N] state_mask (every head of a group shares it)."""
    return keep.to(layer.state_mask).repeat_interleave(groups_of(layer)[1], 0)


def set_masks(model: SelectiveSSMLM, masks: list[torch.Tensor]) -> None:
    for layer, keep in zip(model.layers, masks):
        layer.state_mask.copy_(group_mask_to_heads(layer, keep))


def current_masks(model: SelectiveSSMLM) -> list[torch.Tensor]:
    return [layer.state_mask[:: groups_of(layer)[1]].bool().clone() for layer in model.layers]


@torch.no_grad()
def layer_input(model: SelectiveSSMLM, ids: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """The normalised input of layer ``layer_idx`` (earlier layers as they are now, masks included)."""
    x = model.embed(ids)
    for i in range(layer_idx):
        x = x + model.layers[i](model.norms[i](x))
    return model.norms[layer_idx](x)


# ------------------------------------------------------------------------------------------- scores
@torch.no_grad()
def forward_statistics(layer: SelectiveSSM, u: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics of one layer's state channels from an explicit sequential scan over ``u`` [B, T, d]:
    sums over sequences and steps, per [G, N] channel (heads of a group summed):

    - ``joint``: ‖S_t^{(h)}[:, n]‖² C_{t,n}²   (GHOST: the exact squared output error of removing n alone)
    - ``ctrl``:  ‖S_t^{(h)}[:, n]‖²            (controllability: the empirical Gramian diagonal)
    - ``obs``:   C_{t,n}²                       (observability as readout strength)
    - ``hankel``: √(W_c · W_o) per head and channel, W_c = mean ‖S_t[:, n]‖², W_o = mean over t of the
      time-varying observability Gramian diagonal q_t = C_{t,n}² + a_{t+1}² q_{t+1} (the output energy a
      unit state at t produces), i.e. the empirical Hankel value of mode n (balanced truncation)
    - ``abs_b``, ``abs_c``: Σ |B_{t,n}|, Σ |C_{t,n}| (activation magnitude); ``count``: B·T."""
    x, _, b, cc, dt, decay = layer._split(u)
    Bsz, T, H, P = x.shape
    N = b.shape[-1]
    h = u.new_zeros(Bsz, H, P, N)
    joint, ctrl = u.new_zeros(H, N), u.new_zeros(H, N)
    c2 = cc.square()  # [B, T, H, N]
    for t in range(T):
        h = decay[:, t, :, None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * b[:, t, :, None, :]
        energy = h.square().sum(2)  # [B, H, N] = ‖S_t[:, n]‖²
        joint += (energy * c2[:, t]).sum(0)
        ctrl += energy.sum(0)
    q = c2[:, -1].clone()
    wo = q.sum(0)
    a2 = decay.square()
    for t in range(T - 2, -1, -1):
        q = c2[:, t] + a2[:, t + 1, :, None] * q
        wo += q.sum(0)
    count = float(Bsz * T)
    hankel = ((ctrl / count) * (wo / count)).clamp_min(0).sqrt()
    G, rep = groups_of(layer)
    grp = lambda a: a.view(G, rep, N).sum(1)  # noqa: E731
    first = lambda a: a.view(Bsz, T, G, rep, N)[:, :, :, 0].abs().sum((0, 1))  # noqa: E731 (shared by heads)
    return {
        "joint": grp(joint),
        "ctrl": grp(ctrl),
        "obs": grp(c2.sum((0, 1))),
        "hankel": grp(hankel),
        "abs_b": first(b),
        "abs_c": first(cc),
        "count": torch.tensor(count),
    }


def forward_score(stats: dict[str, torch.Tensor], scorer: str) -> torch.Tensor:
    n = stats["count"]
    if scorer in ("ghost", "ghost_no_recal"):
        return stats["joint"]
    if scorer == "ghost_separate":  # E‖S_n‖² · E[C_n²], not the joint E
        return (stats["ctrl"] / n) * (stats["obs"] / n)
    if scorer == "balanced_truncation":
        return stats["hankel"]
    if scorer == "controllability":
        return stats["ctrl"]
    if scorer == "observability":
        return stats["obs"]
    if scorer == "activation_magnitude":
        return (stats["abs_b"] / n) * (stats["abs_c"] / n)
    raise ValueError(f"not a forward-statistic scorer: {scorer!r}")


def weight_magnitude(layer: SelectiveSSM) -> torch.Tensor:
    """‖W_B[g, n]‖ · ‖W_C[g, n]‖ from in_proj's B and C rows."""
    G, N, d_in = layer.g, layer.n, layer.d_in
    W = layer.in_proj.weight.detach()
    wb = W[2 * d_in : 2 * d_in + G * N].norm(dim=1).view(G, N)
    wc = W[2 * d_in + G * N : 2 * d_in + 2 * G * N].norm(dim=1).view(G, N)
    return wb * wc


def gradient_scores(model: SelectiveSSMLM, ids: torch.Tensor, layers: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """Taylor |Σ_b ∂L_b/∂m_n| and Fisher mean_b (∂L_b/∂m_n)² of a per-channel mask m (= 1 where kept) for
    each layer in ``layers``, L_b the mean NLL of calibration sequence b. One backward pass: the mask is
    given per sequence ([B, 1, H, N]), so its gradient is per sequence."""
    saved = [layer.state_mask for layer in model.layers]
    Bsz = ids.shape[0]
    masks = {}
    try:
        for l in layers:
            layer = model.layers[l]
            m = saved[l][None, None].expand(Bsz, 1, *saved[l].shape).clone().requires_grad_(True)
            layer.state_mask = m
            masks[l] = m
        with torch.enable_grad():
            loss = lm_loss(model, ids, per_sequence=True).sum()
            grads = torch.autograd.grad(loss, [masks[l] for l in layers])
    finally:
        for layer, s in zip(model.layers, saved):
            layer.state_mask = s
    out = {}
    for l, g in zip(layers, grads):
        G, rep = groups_of(model.layers[l])
        per_seq = g[:, 0].reshape(Bsz, G, rep, -1).sum(2)  # [B, G, N]: heads of a group share m
        out[l] = {"taylor": per_seq.sum(0).abs(), "fisher": per_seq.square().mean(0)}
    return out


def score_layers(
    model: SelectiveSSMLM, scorer: str, calib: torch.Tensor, layers: list[int], rng: np.random.Generator
) -> dict[int, torch.Tensor]:
    """Scores [G, N] of ``layers`` on the model as it is now (higher = keep)."""
    if scorer == "random":
        return {l: torch.from_numpy(rng.random((model.layers[l].g, model.layers[l].n))) for l in layers}
    if scorer == "weight_magnitude":
        return {l: weight_magnitude(model.layers[l]) for l in layers}
    if scorer in GRADIENT:
        return {l: s[scorer] for l, s in gradient_scores(model, calib, layers).items()}
    if scorer in FORWARD:
        return {
            l: forward_score(forward_statistics(model.layers[l], layer_input(model, calib, l)), scorer) for l in layers
        }
    raise ValueError(f"unknown scorer {scorer!r}")


# ------------------------------------------------------------------------------------------- selection
def keep_top(scores: torch.Tensor, rho: float) -> torch.Tensor:
    """Keep the top round((1 − ρ)·N) channels of every group (row) of ``scores`` [G, N]; ties broken by
    index order (stable)."""
    G, N = scores.shape
    k = max(1, int(round((1.0 - rho) * N)))
    order = torch.argsort(scores.double(), dim=1, descending=True, stable=True)
    keep = torch.zeros(G, N, dtype=torch.bool)
    keep.scatter_(1, order[:, :k], True)
    return keep


def keep_global(scores: list[torch.Tensor], rho: float) -> list[torch.Tensor]:
    """Global mode: scores normalised to unit sum within each layer, then one threshold across layers
    (every group keeps at least one channel)."""
    norm = [s.double() / s.double().sum().clamp_min(1e-300) for s in scores]
    flat = torch.cat([s.flatten() for s in norm])
    k = max(1, int(round((1.0 - rho) * flat.numel())))
    order = torch.argsort(flat, descending=True, stable=True)
    keep_flat = torch.zeros(flat.numel(), dtype=torch.bool)
    keep_flat[order[:k]] = True
    out, off = [], 0
    for s in norm:
        kp = keep_flat[off : off + s.numel()].view_as(s).clone()
        off += s.numel()
        for g in range(s.shape[0]):
            if not kp[g].any():
                kp[g, int(torch.argmax(s[g]))] = True
        out.append(kp)
    return out


def prune(
    model: SelectiveSSMLM, scorer: str, rho: float, calib: torch.Tensor, p: Params, rng: np.random.Generator
) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """Prune ``model`` in place (masks) → (keep masks per layer, scores per layer, calibration CPU
    seconds). Forward-statistic and gradient scorers are recalibrated layer by layer (score layer l on
    the network whose layers < l are already pruned) unless ``prune.recalibrate`` is off, the variant is
    ``ghost_no_recal`` or the mode is global (which needs every layer's scores at once)."""
    L = len(model.layers)
    if rho <= 0.0 or scorer == "dense":
        return [k.cpu() for k in current_masks(model)], [torch.zeros(l.g, l.n) for l in model.layers], 0.0
    data_dependent = scorer in FORWARD or scorer in GRADIENT
    sequential = data_dependent and p.prune.recalibrate and scorer != "ghost_no_recal" and p.prune.mode == "per_layer"
    scores: list[torch.Tensor] = [None] * L  # type: ignore[list-item]
    keeps: list[torch.Tensor] = [None] * L  # type: ignore[list-item]
    seconds = 0.0
    if sequential:
        for l in range(L):
            t0 = time.process_time()
            scores[l] = score_layers(model, scorer, calib, [l], rng)[l].float().cpu()  # .cpu() syncs
            seconds += time.process_time() - t0
            keeps[l] = keep_top(scores[l], rho)
            model.layers[l].state_mask.copy_(group_mask_to_heads(model.layers[l], keeps[l]))
        return keeps, scores, seconds
    sync = (lambda: torch.cuda.synchronize(calib.device)) if calib.device.type == "cuda" else (lambda: None)
    t0 = time.process_time()
    by_layer = score_layers(model, scorer, calib, list(range(L)), rng)
    sync()
    seconds = time.process_time() - t0
    scores = [by_layer[l].float().cpu() for l in range(L)]
    keeps = keep_global(scores, rho) if p.prune.mode == "global" else [keep_top(s, rho) for s in scores]
    set_masks(model, keeps)
    return keeps, scores, seconds


# ------------------------------------------------------------------------------------------- truncation
def truncate(model: SelectiveSSMLM, keeps: list[torch.Tensor]) -> SelectiveSSMLM:
    """Hard truncation: a new model whose layer l has d_state = the most channels any of its groups keeps,
    built by slicing in_proj's B and C rows, the matching conv1d channels and biases (the kernels need one
    d_state per layer). A group that keeps fewer (global mode) is padded with some of its pruned channels,
    switched off in the truncated layer's state_mask, so the output still equals the masked model's."""
    new = copy.deepcopy(model)
    for l, (layer, keep) in enumerate(zip(model.layers, keeps)):
        G, N, d_in = layer.g, layer.n, layer.d_in
        k = int(keep.sum(1).max())
        idx, on = [], []
        for g in range(G):
            kept = torch.nonzero(keep[g]).flatten()
            pad = torch.nonzero(~keep[g]).flatten()[: k - len(kept)]
            chans = torch.cat([kept, pad]).sort().values
            idx.append(g * N + chans)
            on.append(keep[g, chans])
        dev = layer.in_proj.weight.device
        idx = torch.cat(idx).to(dev)
        rows = torch.cat(
            [
                torch.arange(2 * d_in, device=dev),
                2 * d_in + idx,
                2 * d_in + G * N + idx,
                torch.arange(2 * d_in + 2 * G * N, layer.in_proj.out_features, device=dev),
            ]
        )
        small = SelectiveSSM(dataclasses.replace(layer.c, d_state=k)).to(layer.in_proj.weight)
        with torch.no_grad():
            small.in_proj.weight.copy_(layer.in_proj.weight[rows])
            small.in_proj.bias.copy_(layer.in_proj.bias[rows])
            if layer.conv1d is not None:
                ch = torch.cat([torch.arange(d_in, device=dev), d_in + idx, d_in + G * N + idx])
                small.conv1d.weight.copy_(layer.conv1d.weight[ch])
                small.conv1d.bias.copy_(layer.conv1d.bias[ch])
            for name in ("log_neg_a", "dt_bias", "d_skip"):
                getattr(small, name).copy_(getattr(layer, name))
            small.out_proj.load_state_dict(layer.out_proj.state_dict())
            small.state_mask.copy_(group_mask_to_heads(small, torch.stack(on).to(dev)))
        new.layers[l] = small
    return new.eval()


def state_bytes_per_seq(keeps: list[torch.Tensor], model: SelectiveSSMLM) -> int:
    """Recurrent SSM state of one sequence in fp32: Σ_layers H · P · N_kept · 4 bytes."""
    return int(sum(layer.h * layer.dh * int(keep.sum(1).max()) * 4 for layer, keep in zip(model.layers, keeps)))


def top_half_mass(scores: torch.Tensor) -> float:
    """Share of a layer's total score held by its top 50% channels."""
    s = scores.double().flatten().clamp_min(0).sort(descending=True).values
    tot = float(s.sum())
    return float(s[: math.ceil(len(s) / 2)].sum()) / tot if tot > 0 else math.nan
