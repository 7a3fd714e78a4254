"""The second-order differential NTK (ddNTK) at first order in 1/n: its Monte-Carlo estimate by autograd
contractions with random probes, the exact layer-2 values of its statistics and their layer-to-layer recursion
at every deeper layer (PDLT ch. 11 conventions, one input; our derivation, README "ddNTK").

Definitions (lambda-weighted parameter gradients, l f = sum_mu lambda_mu df/dtheta_mu e_mu; H[f] the Hessian):
    ddI_{i1 i2 i3 i4}  = H[Th_{i1 i2}](l z_{i3}, l z_{i4}),
    ddII_{i1 i2 i3 i4} = H[z_{i3}](l Th_{i1 i2}, l z_{i4}),
    E[ddI]  = (1/n) [d12 d34 R + (d13 d24 + d14 d23) S],
    E[ddII] = (1/n) [d12 d34 T + (d13 d24 + d14 d23) U]         (n: the previous layer's width).

Monte Carlo (no n^4 tensor): with Rademacher probes u, u' and v = l(u.z), v' = l(u'.z),
    C1 = H[tr Th](v, v)               E = sum_ik ddI_iikk = (n^2 R + 2 n S) / n_prev
    C2 = H[u^T Th u'](v, v')          E = sum_ik ddI_ikik = (n R + n (n + 1) S) / n_prev
    C3 = H[u.z](l tr Th, v)           E = sum_ik ddII_iikk = (n^2 T + 2 n U) / n_prev
    C4 = H[u.z](l u^T Th u', v')      E = sum_ik ddII_ikik = (n T + n (n + 1) U) / n_prev
each Hessian form one double-backward pass through the forward NTK recursion (mc.layer_step).
"""

from __future__ import annotations

import math

import numpy as np

from pipelines.ntk_feynman import dntk, theory

DDNTK_TENSORS = ("R", "S", "T", "U")
DDNTK_COLUMNS = ("c1", "c2", "c3", "c4")  # per net and layer: the four contractions divided by n^2


def d3sigma(kind: str, z: np.ndarray) -> np.ndarray:
    """sigma'''; 0 for ReLU (almost everywhere) and linear."""
    if kind in ("relu", "linear"):
        return np.zeros_like(np.asarray(z, dtype=float))
    if kind == "tanh":
        t = np.tanh(z)
        return -2.0 * (1.0 - t * t) * (1.0 - 3.0 * t * t)
    if kind == "gelu":
        return theory.INV_SQRT2PI * np.exp(-0.5 * z * z) * (z**3 - 4.0 * z)
    raise ValueError(f"unknown activation {kind!r}")


def layer2_values(kind: str, c_w: float, lambda_w: float, K: float, Th: float, quad: theory.Quad) -> dict:
    """R, S, T, U of the layer after one with a deterministic NTK Th and Gaussian preactivations of variance K
    (layer 1 -> 2): exact at any width (README, "ddNTK")."""
    u, w = quad.nodes()
    z = math.sqrt(K) * u
    s, d1, d2, d3 = theory.sigma(kind, z), theory.dsigma(kind, z), dntk.d2sigma(kind, z), d3sigma(kind, z)
    E = lambda g: float(np.sum(w * g))  # noqa: E731
    s2p2, p4, sp2pp, p2pp2, p3ppp = (
        E(s * s * d1 * d1),
        E(d1**4),
        E(s * d1 * d1 * d2),
        E(d1 * d1 * d2 * d2),
        E(d1**3 * d3),
    )
    return {
        "R": 2 * lambda_w * c_w * Th**2 * (p4 + sp2pp) + 2 * c_w**2 * Th**3 * (p2pp2 + p3ppp),
        "S": lambda_w**2 * Th * s2p2 + 4 * lambda_w * c_w * Th**2 * sp2pp + 2 * c_w**2 * Th**3 * (p2pp2 + p3ppp),
        "T": 2 * lambda_w**2 * Th * s2p2 + 4 * lambda_w * c_w * Th**2 * sp2pp + 2 * c_w**2 * Th**3 * p2pp2,
        "U": lambda_w * c_w * Th**2 * p4 + 2 * c_w**2 * Th**3 * p2pp2,
    }


def ddntk_moments(kind: str, K: float, quad: theory.Quad) -> dict:
    """The Gaussian averages one step of the ddNTK recursion needs, at variance K. Averages that come from
    Hessians of sigma are pointwise (sigma'' = sigma''' = 0 for ReLU, as in a sampled net's autograd); the links
    between two neurons are Stein factors St[g] = <g z>/K (which keep the ReLU kink)."""
    u, w = quad.nodes()
    z = math.sqrt(K) * u
    s, d1, d2, d3 = theory.sigma(kind, z), theory.dsigma(kind, z), dntk.d2sigma(kind, z), d3sigma(kind, z)
    E = lambda g: float(np.sum(w * g))  # noqa: E731
    St = lambda g: float(np.sum(w * g * z)) / K  # noqa: E731
    return {
        "p2": E(d1 * d1),
        "pp2": E(d2 * d2),
        "spp": E(s * d2),
        "pppp": E(d1 * d3),
        "h_s2": E(d1 * d1 + s * d2),
        "h_p2": E(d2 * d2 + d1 * d3),  # <(s^2)''>/2, <(s'^2)''>/2
        "psi": St(s * d1),
        "omega": St(d1 * d2),
    }  # d<s^2>/dK, d<s'^2>/dK


def ddntk_first_order(
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
    """Per layer l = 1..depth: R, S, T, U (n x the ddNTK means, README "ddNTK recursion"). Layer 1: 0; layer 2:
    :func:`layer2_values` (exact); deeper layers: the intra-layer term (``layer2_values`` at the layer's K, Theta)
    plus the inter-layer terms, which carry the previous layer's B, F, P, Q, R, S, T, U:

        R' = R0 + 2 chi_perp (lW <s'^2 + s s''> + CW Th <s''^2 + s' s'''>) B + 2 chi_perp chi_Th (Q - P/2)
                + chi_perp^2 R
        S' = S0 + chi_Th^2 F + 2 chi_perp chi_Th Q + 2 chi_perp (lW <s s''> + CW Th <s' s'''>) B + chi_perp^2 S
        T' = T0 + 2 chi_Th^2 F + 2 chi_perp chi_Th P + chi_perp^2 T
        U' = U0 + chi_perp (lW <s'^2> + CW Th <s''^2>) B + chi_perp^2 U

    with chi_perp = CW <s'^2>, chi_Th = lW St[s s'] + CW Th St[s' s''] (theory.first_order's chi_theta), r = n_l /
    n_{l-1} on every previous-layer tensor (equal widths: r = 1). ``interlayer=False`` keeps R0..U0 only."""
    quad = quad or theory.Quad()
    widths = widths or [1] * depth
    base = theory.first_order(
        kind, c_w, c_b, lambda_b, lambda_w, sq_norm, depth, widths=widths, interlayer=interlayer, quad=quad
    )
    d_rows = dntk.dntk_first_order(
        kind, c_w, c_b, lambda_b, lambda_w, sq_norm, depth, widths=widths, interlayer=interlayer, quad=quad
    )
    t = dict.fromkeys(DDNTK_TENSORS, 0.0)
    rows = [{"layer": 1, **t}]
    for ell in range(1, depth):
        prev, dprev = base[ell - 1], d_rows[ell - 1]
        K, Th, F, B, P, Q = prev["K"], prev["Theta"], prev["F"], prev["B"], dprev["P"], dprev["Q"]
        intra = layer2_values(kind, c_w, lambda_w, K, Th, quad)
        m = ddntk_moments(kind, K, quad)
        r = theory.aspect_ratio(widths, ell) if interlayer else 0.0
        chi_p = c_w * m["p2"]
        chi_t = lambda_w * m["psi"] + c_w * Th * m["omega"]
        t = {
            "R": intra["R"]
            + r
            * (
                2 * chi_p * (lambda_w * m["h_s2"] + c_w * Th * m["h_p2"]) * B
                + 2 * chi_p * chi_t * (Q - 0.5 * P)
                + chi_p**2 * t["R"]
            ),
            "S": intra["S"]
            + r
            * (
                chi_t**2 * F
                + 2 * chi_p * chi_t * Q
                + 2 * chi_p * (lambda_w * m["spp"] + c_w * Th * m["pppp"]) * B
                + chi_p**2 * t["S"]
            ),
            "T": intra["T"] + r * (2 * chi_t**2 * F + 2 * chi_p * chi_t * P + chi_p**2 * t["T"]),
            "U": intra["U"] + r * (chi_p * (lambda_w * m["p2"] + c_w * Th * m["pp2"]) * B + chi_p**2 * t["U"]),
        }
        rows.append({"layer": ell + 1, **t})
    return rows


def sample_ddntk(
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
    layers: list[int] | None = None,
) -> np.ndarray:
    """(n_nets, depth, 4): per net and layer C1..C4 / n^2 (one pair of Rademacher probes per net and layer),
    for ``n_nets`` MLPs, float64, one seeded generator. ``width``: one hidden width for every layer, or a list of
    ``depth`` widths (each layer's contractions are divided by its own width squared). ``layers`` (1-based): the
    layers to evaluate (default all >= 2; layer 1 is linear in its parameters, so its ddNTK is 0)."""
    import torch

    from pipelines.ntk_feynman.mc import layer_step, param_inner

    dev, f64, xt, gen, ws = dntk.torch_setup(x, width, depth, seed, device)
    layers = sorted(set(layers or range(2, depth + 1)))
    per_chunk = max(1, chunk_elems // (max(ws) ** 2 * 8))
    out = np.zeros((n_nets, depth, len(DDNTK_COLUMNS)))
    for start in range(0, n_nets, per_chunk):
        Bn = min(per_chunk, n_nets - start)
        Ws, bs, lam, z, th = dntk.draw_chunk(gen, Bn, xt, ws, c_w, c_b, lambda_b, lambda_w, f64)
        us = dntk.rademacher(gen, 2, Bn, ws, dev)
        for ell in range(1, max(layers)):
            z, th = layer_step(kind, z, th, Ws[ell], bs[ell], lambda_b, lambda_w)
            if ell + 1 not in layers:
                continue
            params = [*Ws[: ell + 1], *bs[: ell + 1]]
            lams = [*lam[: ell + 1], *([lambda_b] * (ell + 1))]

            def lgrad(f, create=False):
                g = torch.autograd.grad(f, params, retain_graph=True, create_graph=create, allow_unused=True)
                return [torch.zeros_like(p) if a is None else a for p, a in zip(params, g)]

            def lam_(g):
                return [l_ * a.detach() for l_, a in zip(lams, g)]

            def hess(f, a, b):
                """per net: H[f](a, b), a and b constant (detached, lambda-weighted) directions."""
                g = lgrad(f, create=True)
                s = sum((gi * ai).sum() for gi, ai in zip(g, a))
                if not s.requires_grad:  # f linear in the parameters along a
                    return torch.zeros(Bn, **f64)
                h = torch.autograd.grad(s, params, retain_graph=True, allow_unused=True)
                return param_inner(h, b, Bn, f64)

            u, u2 = us[0][ell], us[1][ell]
            uz, u2z = (u * z).sum(), (u2 * z).sum()
            tr = torch.diagonal(th, dim1=-2, dim2=-1).sum()
            q = torch.einsum("bi,bik,bk->", u, th, u2)
            v, v2 = lam_(lgrad(uz)), lam_(lgrad(u2z))
            c = [hess(tr, v, v), hess(q, v, v2), hess(uz, lam_(lgrad(tr)), v), hess(uz, lam_(lgrad(q)), v2)]
            for j, cj in enumerate(c):
                out[start : start + Bn, ell, j] = (cj / ws[ell] ** 2).detach().cpu().numpy()
        del Ws, bs, z, th
    if not np.isfinite(out).all():
        raise FloatingPointError(f"ntk_feynman ddNTK MC ({kind}, width {width}, seed {seed}): non-finite statistics")
    return out


def rstu_from_sums(c: np.ndarray, n: int, n_prev: float) -> dict[str, float]:
    """R, S, T, U from the expectations of C1..C4 / n^2 (same linear system as the dNTK's P, Q)."""
    R, S = dntk.pq_from_sums(c[0], c[1], n, n_prev)
    T, U = dntk.pq_from_sums(c[2], c[3], n, n_prev)
    return {"R": R, "S": S, "T": T, "U": U}


def pooled_ddntk(blocks, width: int, n_prev: float) -> dict[str, float]:
    """Pooled R, S, T, U (nets weighted equally) and batch-mean standard errors ``<T>_se`` over the block rows
    (columns DDNTK_COLUMNS and ``n_nets``) of one width and layer."""
    w = blocks["n_nets"].to_numpy(float)
    c = np.array([float(np.average(blocks[k], weights=w)) for k in DDNTK_COLUMNS])
    est = rstu_from_sums(c, width, n_prev)
    per = np.array([list(rstu_from_sums(r, width, n_prev).values()) for r in blocks[list(DDNTK_COLUMNS)].to_numpy()])
    nb = len(blocks)
    se = per.std(0, ddof=1) / math.sqrt(nb) if nb > 1 else np.full(4, np.nan)
    return {**est, **{f"{t}_se": float(s) for t, s in zip(DDNTK_TENSORS, se)}}
