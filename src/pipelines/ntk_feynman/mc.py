"""The Monte-Carlo side: sampled finite-width MLPs, their exact NTK by the forward recursion
    Th^(l+1)_ik = delta_ik (lambda_b + lambda_W / n_l sum_j sigma_j^2) + sum_jj' W_ij s'_j Th^(l)_jj' s'_j' W_kj',
batched over nets (two bmm per layer, W @ M @ W^T), and the per-net pair averages from which the pooled
estimators of V, A, B, D, F (and the mean diagonal NTK) are formed with batch-mean standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from pipelines.ntk_feynman.params import TENSORS

SQRT2 = math.sqrt(2.0)
INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)
# per-net columns: means over neurons and over ordered pairs i != k
NET_COLUMNS = ("m_q", "m_d", "pp_qq", "pp_dd", "pp_dq", "off_th2", "off_thzz", "m_z")
# two inputs (the same nets see a second input x2): means of z_a z_b and pair means over i != k of the
# products (z_ia z_ib)(z_kc z_kd) for the unique pairs 11, 12, 22
PAIR_NAMES = ("11", "12", "22")
PAIR_COMBOS = tuple((PAIR_NAMES[i], PAIR_NAMES[j]) for i in range(3) for j in range(i, 3))
PAIR_COLUMNS = (*(f"pm_{p}" for p in PAIR_NAMES), *(f"pp_{p}_{q}" for p, q in PAIR_COMBOS))


def act(kind: str, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigma(z), sigma'(z)); ReLU's derivative is the step (z is never exactly 0 in a sampled net)."""
    if kind == "relu":
        return torch.relu(z), (z > 0).to(z.dtype)
    if kind == "tanh":
        t = torch.tanh(z)
        return t, 1.0 - t * t
    if kind == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(z / SQRT2))
        return z * cdf, cdf + z * INV_SQRT2PI * torch.exp(-0.5 * z * z)
    if kind == "linear":
        return z, torch.ones_like(z)
    raise ValueError(f"unknown activation {kind!r}")


def pair_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean of a_i b_k over ordered pairs i != k (last axis), per net."""
    n = a.shape[-1]
    return (a.sum(-1) * b.sum(-1) - (a * b).sum(-1)) / (n * (n - 1))


def layer_stats(z: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
    """(nets, len(NET_COLUMNS)) pair averages of one layer: z (nets, n), th (nets, n, n)."""
    n = z.shape[-1]
    q = z * z
    d = torch.diagonal(th, dim1=-2, dim2=-1)
    off_th2 = ((th * th).sum((-2, -1)) - (d * d).sum(-1)) / (n * (n - 1))
    zthz = torch.einsum("bi,bik,bk->b", z, th, z)
    off_thzz = (zthz - (d * q).sum(-1)) / (n * (n - 1))
    return torch.stack(
        [q.mean(-1), d.mean(-1), pair_mean(q, q), pair_mean(d, d), pair_mean(d, q), off_th2, off_thzz, z.mean(-1)],
        dim=-1,
    )


def pair_stats(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """(nets, len(PAIR_COLUMNS)) two-input averages of one layer: z1, z2 (nets, n) for the same nets."""
    prods = {"11": z1 * z1, "12": z1 * z2, "22": z2 * z2}
    return torch.stack(
        [*(prods[p].mean(-1) for p in PAIR_NAMES), *(pair_mean(prods[p], prods[q]) for p, q in PAIR_COMBOS)], dim=-1
    )


def layer_step(
    kind: str, z: torch.Tensor, th: torch.Tensor, W: torch.Tensor, b: torch.Tensor, lambda_b: float, lambda_w: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z, NTK) of layer l+1 from layer l's, batched over nets: z (B, n), th (B, n, n), W (B, m, n), b (B, m).
    The lambda_W term uses the sigma's of the *current* layer, before W multiplies (the card's pitfall)."""
    s, sp = act(kind, z)
    M = sp.unsqueeze(-1) * th * sp.unsqueeze(-2)
    diag = lambda_b + lambda_w * (s * s).sum(-1) / z.shape[-1]
    th = torch.bmm(torch.bmm(W, M), W.transpose(1, 2))
    th.diagonal(dim1=-2, dim2=-1).add_(diag.unsqueeze(-1))
    return torch.bmm(W, s.unsqueeze(-1)).squeeze(-1) + b, th


def leaf_params(
    gen: torch.Generator, nb: int, n0: int, ws: list[int], c_w: float, c_b: float, lambda_w: float, f64: dict
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
    """(Ws, bs, lam) of ``nb`` MLPs with hidden widths ``ws`` on n0 inputs, as leaf tensors for autograd through
    the forward NTK recursion: per layer W (nb, n_l, n_{l-1}) ~ N(0, c_w / n_{l-1}) and b (nb, n_l) ~ N(0, c_b),
    drawn from ``gen`` layer by layer (W, then b), and the weights' learning-rate factors lambda_w / n_{l-1}."""
    Ws, bs = [], []
    for ell, n in enumerate(ws):
        fan = n0 if ell == 0 else ws[ell - 1]
        Ws.append((torch.randn(nb, n, fan, generator=gen, **f64) * math.sqrt(c_w / fan)).requires_grad_())
        bs.append((torch.randn(nb, n, generator=gen, **f64) * math.sqrt(c_b)).requires_grad_())
    lam = [lambda_w / (n0 if ell == 0 else ws[ell - 1]) for ell in range(len(ws))]
    return Ws, bs, lam


def param_inner(ga, gb, nb: int, f64: dict, weights=None) -> torch.Tensor:
    """(nb,): per net, sum over the parameter tensors of <ga_i, gb_i> (times ``weights[i]`` where given, e.g. the
    learning-rate factors); a None gradient (a parameter the function does not use) contributes 0."""
    tot = torch.zeros(nb, **f64)
    for i, (a, b) in enumerate(zip(ga, gb)):
        if a is not None and b is not None:
            t = (a * b).reshape(nb, -1).sum(-1)
            tot = tot + (t if weights is None else weights[i] * t)
    return tot


def sample_nets(
    kind: str,
    x: np.ndarray,
    width: int,
    depth: int,
    n_nets: int,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    seed: int,
    chunk_elems: int = 2_000_000,
    x2: np.ndarray | None = None,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """(n_nets, depth, len(NET_COLUMNS) [+ len(PAIR_COLUMNS) with ``x2``]) per-net statistics of ``n_nets``
    independent MLPs of equal hidden widths, in float64, drawn in chunks of nets from one seeded generator
    (layer by layer within a chunk, so the draws, not their distribution, depend on ``chunk_elems``). With a
    second input ``x2`` the same nets also give its preactivations and the two-input kernel statistics.
    ``device``: where the nets live (a GPU draws other random numbers than the CPU for the same seed)."""
    device = torch.device(device)
    f64 = {"dtype": torch.float64, "device": device}
    x = torch.as_tensor(np.asarray(x, dtype=float), **f64)
    x2t = None if x2 is None else torch.as_tensor(np.asarray(x2, dtype=float), **f64)
    n0 = x.shape[0]
    gen = torch.Generator(device=device).manual_seed(int(seed))
    per_chunk = max(1, chunk_elems // (width * width))
    n_cols = len(NET_COLUMNS) + (len(PAIR_COLUMNS) if x2 is not None else 0)
    out = np.empty((n_nets, depth, n_cols))
    th1 = lambda_b + lambda_w * float(x @ x) / n0

    def stats(z, th, z2):
        own = layer_stats(z, th)
        return (own if z2 is None else torch.cat([own, pair_stats(z, z2)], dim=-1)).cpu().numpy()

    for start in range(0, n_nets, per_chunk):
        B = min(per_chunk, n_nets - start)
        W = torch.randn(B, width, n0, generator=gen, **f64) * math.sqrt(c_w / n0)
        b = torch.randn(B, width, generator=gen, **f64) * math.sqrt(c_b)
        z = W @ x + b
        z2 = None if x2t is None else W @ x2t + b
        th = torch.diag_embed(torch.full((B, width), th1, **f64))
        out[start : start + B, 0] = stats(z, th, z2)
        for ell in range(1, depth):
            W = torch.randn(B, width, width, generator=gen, **f64) * math.sqrt(c_w / width)
            b = torch.randn(B, width, generator=gen, **f64) * math.sqrt(c_b)
            if z2 is not None:
                z2 = torch.bmm(W, act(kind, z2)[0].unsqueeze(-1)).squeeze(-1) + b
            z, th = layer_step(kind, z, th, W, b, lambda_b, lambda_w)
            out[start : start + B, ell] = stats(z, th, z2)
    if not np.isfinite(out).all():
        raise FloatingPointError(f"ntk_feynman MC ({kind}, width {width}, seed {seed}): non-finite statistics")
    return out


def estimates(df: pd.DataFrame, n_prev: float) -> dict[str, float]:
    """Pooled estimators from per-net rows (columns NET_COLUMNS), each tensor multiplied by the width of
    the previous layer: T = n_prev * (E[pair product] - E[.] E[.])."""
    return _from_means({c: float(df[c].mean()) for c in NET_COLUMNS}, n_prev)


def _from_means(m, n_prev: float) -> dict[str, float]:
    pair = {}
    if "pm_11" in m:
        pair = {f"V_{p}_{q}": n_prev * (m[f"pp_{p}_{q}"] - m[f"pm_{p}"] * m[f"pm_{q}"]) for p, q in PAIR_COMBOS}
    return {
        **pair,
        "V": n_prev * (m["pp_qq"] - m["m_q"] ** 2),
        "A": n_prev * (m["pp_dd"] - m["m_d"] ** 2),
        "D": n_prev * (m["pp_dq"] - m["m_d"] * m["m_q"]),
        "B": n_prev * m["off_th2"],
        "F": n_prev * m["off_thzz"],
        "mean_ntk": m["m_d"],
        "mean_z2": m["m_q"],
    }


def pooled(df: pd.DataFrame, n_prev: float, n_batches: int) -> dict[str, float]:
    """Pooled estimates and their batch-mean standard errors (``<name>_se``) over ``n_batches`` contiguous
    batches of nets."""
    est = estimates(df, n_prev)
    edges = np.linspace(0, len(df), n_batches + 1).round().astype(int)
    batches = [estimates(df.iloc[a:b], n_prev) for a, b in zip(edges[:-1], edges[1:])]
    out = dict(est)
    for k in est:
        vals = np.array([bt[k] for bt in batches])
        out[f"{k}_se"] = float(vals.std(ddof=1) / math.sqrt(n_batches))
    return out


def layer_batch_means(stats: np.ndarray, estimator, n_blocks: int) -> list[dict]:
    """Per layer of per-net statistics ``stats`` (nets, depth, ...): ``estimator(mean over nets)`` (a dict of
    arrays) and the batch-mean standard error ``<key>_se`` of each key over ``n_blocks`` contiguous blocks."""
    edges = np.linspace(0, len(stats), n_blocks + 1).round().astype(int)
    out = []
    for ell in range(stats.shape[1]):
        est = estimator(stats[:, ell].mean(0))
        per = [estimator(stats[a:b, ell].mean(0)) for a, b in zip(edges[:-1], edges[1:])]
        row = {"layer": ell + 1, **est}
        for k in est:
            row[f"{k}_se"] = np.std([q[k] for q in per], axis=0, ddof=1) / math.sqrt(n_blocks)
        out.append(row)
    return out


def block_table(stats: np.ndarray, n_blocks: int, **keys) -> pd.DataFrame:
    """``sample_nets``' output reduced to ``n_blocks`` contiguous blocks of nets per layer: the block means of
    NET_COLUMNS and ``n_nets`` (what the pooled estimators and the batch means need, 1/block-size of the
    per-net table), with ``keys`` (seed, width, input) as constant columns."""
    n_nets, depth, _ = stats.shape
    edges = np.linspace(0, n_nets, n_blocks + 1).round().astype(int)
    rows = []
    for blk, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        means = stats[a:b].mean(0)  # (depth, columns)
        cols = NET_COLUMNS if means.shape[1] == len(NET_COLUMNS) else (*NET_COLUMNS, *PAIR_COLUMNS)
        for ell in range(depth):
            rows.append({**keys, "block": blk, "layer": ell + 1, "n_nets": int(b - a), **dict(zip(cols, means[ell]))})
    return pd.DataFrame(rows)


def pooled_blocks(blocks: pd.DataFrame, n_prev: float) -> dict[str, float]:
    """Pooled estimates (nets weighted equally) and batch-mean standard errors, one batch per block row;
    with the two-input columns present (and not NaN) also the vertex V_<p>_<q> of the two inputs."""
    pair = all(c in blocks for c in PAIR_COLUMNS) and blocks[list(PAIR_COLUMNS)].notna().all().all()
    cols = [*NET_COLUMNS, *(PAIR_COLUMNS if pair else ())]
    w = blocks["n_nets"].to_numpy(float)
    est = _from_means({c: float(np.average(blocks[c], weights=w)) for c in cols}, n_prev)
    per = [_from_means(blocks.iloc[i][cols], n_prev) for i in range(len(blocks))]
    out = dict(est)
    nb = len(blocks)
    for k in est:
        vals = np.array([p[k] for p in per])
        out[f"{k}_se"] = float(vals.std(ddof=1) / math.sqrt(nb)) if nb > 1 else float("nan")
    return out


__all__ = [
    "NET_COLUMNS",
    "PAIR_COLUMNS",
    "TENSORS",
    "act",
    "block_table",
    "estimates",
    "layer_batch_means",
    "layer_step",
    "layer_stats",
    "pair_mean",
    "pair_stats",
    "pooled",
    "pooled_blocks",
    "sample_nets",
]
