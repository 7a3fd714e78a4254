"""The differential NTK (dNTK) at first order in 1/n: its layer recursions and its Monte-Carlo estimate.

Definition (PDLT ch. 11, one input): dTh_{i0 i1 i2} = sum_mu lambda_mu (dz_{i0}/dtheta_mu)(dTh_{i1 i2}/dtheta_mu),
the change of the NTK along the (lambda-weighted) gradient of z_{i0}. Its mean vanishes; its leading statistic is
the cross-correlation with the preactivations,

    E[dTh_{i0 i1 i2} z_{i3}] = (1/n) [d_{i0 i3} d_{i1 i2} P + d_{i0 i1} d_{i2 i3} Q + d_{i0 i2} d_{i1 i3} Q],

with n the previous layer's width. The recursions below are our derivation (README, "dNTK"): given layer l, the
layer-(l+1) dNTK is a polynomial in the new weights (Wick contractions over them), and the remaining sums over
layer-l neurons are evaluated at leading order, where an off-diagonal NTK entry links two neurons through
E[g(z_a) h(z_b) Th_ab] = St[g] St[h] F/n and E[g(z_a) h(z_b) Th_ab^2] = <g><h> B/n, St[g] = <g z>/K (Stein's
lemma, which for ReLU keeps the kink's contribution). sigma'' enters only as a factor of the dNTK itself; for
ReLU it is 0 almost everywhere, which is the dNTK a sampled ReLU net has. Equal widths: r = n_l / n_{l-1}
multiplies every term that carries a previous-layer tensor (F, B, P, Q), as in theory.first_order.

    P' = 2 lW CW (Th <s^2 s'^2> + r psi^2 F) + 2 CW^2 (Th^2 <s s'^2 s''> + r Th psi St[s' s''] F) + r CW^2 psi <s'^2> P
    Q' =   lW CW (Th <s^2 s'^2> + r psi^2 F) + CW^2 (2 Th^2 <s s'^2 s''> + r Th psi St[s' s''] F
                                                 + r <s'^2> <s s''> B)                     + r CW^2 psi <s'^2> Q

with psi = St[s s'] (= d<s^2>/dK, so CW psi = chi_par) and all averages at the layer's K. P = Q = 0 at layer 1.

Monte Carlo (no n x n x n tensor): with <f, g> = sum_mu lambda_mu df/dtheta_mu dg/dtheta_mu,
    S1 = sum_{i,k} z_i dTh_{ikk} = < |z|^2 / 2, tr Th >                      (exact),
    S2 = sum_{i,k} dTh_{iik} z_k = E_u < u.z, u^T Th zbar >                  (u Rademacher, zbar = z held fixed),
and E[S1] = n P + 2 Q, E[S2] = P + (n + 1) Q (n = this layer's width = the previous one's).
The NTK is built by the forward recursion (mc.layer_step) on leaf parameters, so both inner products are
first-order autograd through it: O(n^3) per layer and net.
"""

from __future__ import annotations

import math

import numpy as np

from pipelines.ntk_feynman import theory

DNTK_TENSORS = ("P", "Q")
DNTK_COLUMNS = ("s1", "s2")  # per net and layer: the two contractions (divided by n^2)


def d2sigma(kind: str, z: np.ndarray) -> np.ndarray:
    """sigma''; ReLU's (a delta at 0) is 0 almost everywhere, as in a sampled net's autograd."""
    if kind in ("relu", "linear"):
        return np.zeros_like(np.asarray(z, dtype=float))
    if kind == "tanh":
        t = np.tanh(z)
        return -2.0 * t * (1.0 - t * t)
    if kind == "gelu":
        return theory.INV_SQRT2PI * np.exp(-0.5 * z * z) * (2.0 - z * z)
    raise ValueError(f"unknown activation {kind!r}")


def dntk_moments(kind: str, K: float, quad: theory.Quad) -> dict:
    u, w = quad.nodes()
    z = math.sqrt(K) * u
    s, d, dd = theory.sigma(kind, z), theory.dsigma(kind, z), d2sigma(kind, z)
    E = lambda g: float(np.sum(w * g))  # noqa: E731
    St = lambda g: float(np.sum(w * g * z)) / K  # noqa: E731  Stein: E[g'] incl. kinks
    return {
        "s2p2": E(s * s * d * d),
        "psi": St(s * d),
        "sp2pp": E(s * d * d * dd),
        "st_ppp": St(d * dd),
        "p2": E(d * d),
        "spp": E(s * dd),
    }


def dntk_first_order(
    kind: str,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    sq_norm: float,
    depth: int,
    widths: list[int] | None = None,
    interlayer: bool = True,
    quad: theory.Quad | None = None,
) -> list[dict]:
    """Per layer l = 1..depth: the dNTK statistics P, Q (n x the cross-correlations above), next to the
    K, Theta, B, F of :func:`theory.first_order` that feed them. ``interlayer=False``: the ablation that
    keeps only the terms without a previous-layer tensor."""
    quad = quad or theory.Quad()
    widths = widths or [1] * depth
    base = theory.first_order(
        kind, c_w, c_b, lambda_b, lambda_w, sq_norm, depth, widths=widths, interlayer=interlayer, quad=quad
    )
    P = Q = 0.0
    rows = [{"layer": 1, "P": 0.0, "Q": 0.0}]
    for ell in range(1, depth):
        prev = base[ell - 1]
        K, Th, F, B = prev["K"], prev["Theta"], prev["F"], prev["B"]
        m = dntk_moments(kind, K, quad)
        r = theory.aspect_ratio(widths, ell) if interlayer else 0.0
        lin = lambda_w * c_w * (Th * m["s2p2"] + r * m["psi"] ** 2 * F)
        P, Q = (
            2 * lin
            + 2 * c_w**2 * (Th**2 * m["sp2pp"] + r * Th * m["psi"] * m["st_ppp"] * F)
            + r * c_w**2 * m["psi"] * m["p2"] * P,
            lin
            + c_w**2 * (2 * Th**2 * m["sp2pp"] + r * Th * m["psi"] * m["st_ppp"] * F + r * m["p2"] * m["spp"] * B)
            + r * c_w**2 * m["psi"] * m["p2"] * Q,
        )
        rows.append({"layer": ell + 1, "P": P, "Q": Q})
    return rows


def pq_from_sums(s1: float, s2: float, n: int, n_prev: float) -> tuple[float, float]:
    """(P, Q) from the expectations of S1 / n^2 and S2 / n^2 (n = this layer's width; the statistics are
    normalised by the previous layer's width n_prev): solves E S1 = (n^2 P + 2 n Q) / n_prev and
    E S2 = (n P + n (n + 1) Q) / n_prev."""
    a = np.array([[n * n, 2.0 * n], [float(n), n * (n + 1.0)]]) / (n_prev * n * n)
    P, Q = np.linalg.solve(a, np.array([s1, s2]))
    return float(P), float(Q)


def hidden_widths(width, depth: int) -> list[int]:
    """[n_1, ..., n_depth] from one width (equal widths) or a list of ``depth`` widths."""
    ws = [int(width)] * depth if np.ndim(width) == 0 else [int(w) for w in width]
    if len(ws) != depth or min(ws) < 1:
        raise ValueError(f"widths {width!r}: need one positive width or {depth} of them")
    return ws


def rademacher(gen, probes: int, Bn: int, ws: list[int], dev):
    """[probe][layer] -> (Bn, n_layer) Rademacher signs. Equal widths draw one (probes, depth, Bn, n) tensor, as
    before unequal widths were allowed, so their seeded draws are unchanged."""
    import torch

    def signs(shape):
        return torch.randint(0, 2, shape, generator=gen, device=dev).to(torch.float64) * 2 - 1

    if len(set(ws)) == 1:
        return signs((probes, len(ws), Bn, ws[0]))
    return [[signs((Bn, w)) for w in ws] for _ in range(probes)]


def torch_setup(x: np.ndarray, width, depth: int, seed: int, device: str):
    """(device, float64 tensor options, x as a tensor, the seeded generator, the hidden widths) of the autograd
    samplers of one input (:func:`sample_dntk`, ``ddntk.sample_ddntk``)."""
    import torch

    dev = torch.device(device)
    f64 = {"dtype": torch.float64, "device": dev}
    xt = torch.as_tensor(np.asarray(x, dtype=float), **f64)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    return dev, f64, xt, gen, hidden_widths(width, depth)


def draw_chunk(gen, Bn: int, xt, ws: list[int], c_w: float, c_b: float, lambda_b: float, lambda_w: float, f64: dict):
    """A chunk of ``Bn`` nets on the input ``xt``: their leaf parameters and the weights' learning-rate factors
    (``mc.leaf_params``), and layer 1's preactivations z (Bn, n_1) and deterministic NTK th (Bn, n_1, n_1)."""
    import torch

    from pipelines.ntk_feynman.mc import leaf_params

    n0 = xt.shape[0]
    Ws, bs, lam = leaf_params(gen, Bn, n0, ws, c_w, c_b, lambda_w, f64)
    th1 = lambda_b + lambda_w * float(xt @ xt) / n0
    z = torch.einsum("bij,j->bi", Ws[0], xt) + bs[0]
    th = torch.diag_embed(torch.full((Bn, ws[0]), th1, **f64))
    return Ws, bs, lam, z, th


def sample_dntk(
    kind: str,
    x: np.ndarray,
    width,
    depth: int,
    n_nets: int,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    seed: int,
    chunk_elems: int = 2_000_000,
    device: str = "cpu",
    probes: int = 1,
) -> np.ndarray:
    """(n_nets, depth, 2): per net and layer S1 / n^2 and S2 / n^2 (S2 averaged over ``probes`` Rademacher
    vectors), for ``n_nets`` independent MLPs, float64, one seeded generator. ``width``: one hidden width for
    every layer, or a list of ``depth`` widths (then S1, S2 are divided by each layer's own width squared, and
    :func:`pq_from_sums` takes that width and the previous layer's)."""
    import torch

    from pipelines.ntk_feynman.mc import layer_step, param_inner

    dev, f64, xt, gen, ws = torch_setup(x, width, depth, seed, device)
    per_chunk = max(1, chunk_elems // (max(ws) ** 2 * 4))
    out = np.zeros((n_nets, depth, len(DNTK_COLUMNS)))
    for start in range(0, n_nets, per_chunk):
        Bn = min(per_chunk, n_nets - start)
        Ws, bs, lam, z, th = draw_chunk(gen, Bn, xt, ws, c_w, c_b, lambda_b, lambda_w, f64)
        us = rademacher(gen, probes, Bn, ws, dev)
        for ell in range(1, depth):
            z, th = layer_step(kind, z, th, Ws[ell], bs[ell], lambda_b, lambda_w)
            params = [*Ws[: ell + 1], *bs[: ell + 1]]
            lams = [*lam[: ell + 1], *([lambda_b] * (ell + 1))]

            def grads(f):
                return torch.autograd.grad(f, params, retain_graph=True, allow_unused=True)

            def inner(ga, gb):
                return param_inner(ga, gb, Bn, f64, lams)

            zbar = z.detach()
            tr = torch.diagonal(th, dim1=-2, dim2=-1).sum(-1)
            s1 = inner(grads(0.5 * (z * z).sum()), grads(tr.sum()))
            s2 = torch.zeros(Bn, **f64)
            for k in range(probes):
                u = us[k][ell]
                s2 = s2 + inner(grads((u * z).sum()), grads(torch.einsum("bi,bik,bk->b", u, th, zbar).sum()))
            out[start : start + Bn, ell, 0] = (s1 / ws[ell] ** 2).detach().cpu().numpy()
            out[start : start + Bn, ell, 1] = (s2 / (probes * ws[ell] ** 2)).detach().cpu().numpy()
        del Ws, bs, z, th
    if not np.isfinite(out).all():
        raise FloatingPointError(f"ntk_feynman dNTK MC ({kind}, width {width}, seed {seed}): non-finite statistics")
    return out


def pooled_dntk(blocks, width: int, n_prev: float) -> dict[str, float]:
    """Pooled P, Q (nets weighted equally) and batch-mean standard errors ``P_se``, ``Q_se`` over the block rows
    (columns DNTK_COLUMNS and ``n_nets``) of one width and layer."""
    w = blocks["n_nets"].to_numpy(float)
    s = [float(np.average(blocks[c], weights=w)) for c in DNTK_COLUMNS]
    P, Q = pq_from_sums(s[0], s[1], width, n_prev)
    per = np.array([pq_from_sums(r[0], r[1], width, n_prev) for r in blocks[list(DNTK_COLUMNS)].to_numpy()])
    nb = len(blocks)
    se = per.std(0, ddof=1) / math.sqrt(nb) if nb > 1 else np.full(2, np.nan)
    return {"P": P, "Q": Q, "P_se": float(se[0]), "Q_se": float(se[1])}
