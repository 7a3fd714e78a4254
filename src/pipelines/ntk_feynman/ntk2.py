"""Two inputs x_1, x_2: the NTK Gram matrix and the first-order (1/n) NTK fluctuation tensors with input
indices (PDLT's A, B, D, F), their layer recursions (our derivation, README "Two-input NTK tensors") and a
Monte-Carlo sampler of the same statistics from finite-width nets.

Definitions at layer l (n = n_{l-1}, i != k two neurons, a, b, c, d in {1, 2} input indices; the NTK of one
neuron Th_ii;ab is symmetric in (a, b), an off-diagonal entry obeys Th_ik;ab = Th_ki;ba):
  V[(ab),(cd)]/n = Cov(z_ia z_ib, z_kc z_kd)           (ab), (cd) over the unique pairs 11, 12, 22
  D[(ab),(cd)]/n = Cov(Th_ii;ab, z_kc z_kd)             (not symmetric: 3 x 3)
  A[(ab),(cd)]/n = Cov(Th_ii;ab, Th_kk;cd)              (symmetric 3 x 3)
  B[(ab),(cd)]/n = E[Th_ik;ab Th_ik;cd]                 (ab), (cd) ordered pairs 11, 12, 21, 22 (4 x 4):
                                                        a, c live on neuron i, b, d on neuron k
  F[(ab),(cd)]/n = E[Th_ik;ab z_ic z_kd]                (4 x 4; a, c on i, b, d on k)
With x_1 = x_2 (or any all-equal index set) each reduces to the single-input V, D, A, B, F of ``theory``.
"""

from __future__ import annotations

import math

import numpy as np

from pipelines.ntk_feynman import multi
from pipelines.ntk_feynman.theory import Quad, aspect_ratio, dsigma, kernel_derivative, sigma

UPAIRS = ((0, 0), (0, 1), (1, 1))  # unique (symmetric) pairs: kernel, diagonal NTK
OPAIRS = ((0, 0), (0, 1), (1, 0), (1, 1))  # ordered pairs: off-diagonal NTK entries
UNAMES = tuple(f"{a + 1}{b + 1}" for a, b in UPAIRS)
ONAMES = tuple(f"{a + 1}{b + 1}" for a, b in OPAIRS)
SQUARE = {
    "V": (UNAMES, UNAMES),
    "D": (UNAMES, UNAMES),
    "A": (UNAMES, UNAMES),
    "B": (ONAMES, ONAMES),
    "F": (ONAMES, ONAMES),
}


def flatten(name: str, M: np.ndarray) -> dict[str, float]:
    """``{"<T>_<row>_<col>": value}`` for every entry of one tensor's matrix."""
    rows, cols = SQUARE[name]
    return {f"{name}_{r}_{c}": float(M[i, j]) for i, r in enumerate(rows) for j, c in enumerate(cols)}


def _grid_moments(kind: str, K: np.ndarray, quad: Quad):
    z1, z2, w = quad.grid2(K[0, 0], K[0, 1], K[1, 1])
    z = (z1, z2)
    s = (sigma(kind, z1), sigma(kind, z2))
    d = (dsigma(kind, z1), dsigma(kind, z2))
    return z, s, d, w


def _ss_dd(kind: str, K: np.ndarray, quad: Quad) -> np.ndarray:
    """(2, 3): <s_a s_b> and <s'_a s'_b> over the unique pairs."""
    _, s, d, w = _grid_moments(kind, K, quad)
    return np.array([[np.sum(w * s[a] * s[b]) for a, b in UPAIRS], [np.sum(w * d[a] * d[b]) for a, b in UPAIRS]])


def two_input_ntk_tensors(
    kind: str,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    X: np.ndarray,
    depth: int,
    widths: list[int] | None = None,
    interlayer: bool = True,
    quad: Quad | None = None,
    h_rel: float = 1e-4,
) -> list[dict]:
    """Per layer l = 1..depth: the 2x2 kernel K and NTK Theta (infinite width) and the first-order tensors
    V, D, A (3x3 over UPAIRS) and B, F (4x4 over OPAIRS) as numpy arrays (keys "K", "Theta", "V", ...).

    One step (averages <.> over (z_1, z_2) ~ N(0, K_l), r = n_l / n_{l-1}, f_p = lambda_W s_a s_b +
    C_W Theta_ab s'_a s'_b and g_p = C_W s_a s_b for p = (ab)):
      V' = Cov(g_p, g_q) + r J V J^T,     J[p, e] = C_W d<s_a s_b>/dK_e,
      D' = Cov(f_p, g_q) + r (Jt V J^T + X D J^T),   Jt[p, e] = d<f_p>/dK_e (Theta fixed), X = diag(C_W<s'_a s'_b>)
      A' = Cov(f_p, f_q) + r (Jt V Jt^T + X D Jt^T + Jt D^T X + X A X),
      B'[(ab),(cd)] = C_W^2 Theta_ab Theta_cd <s'_a s'_b s'_c s'_d> + r C_W^2 <s'_a s'_c><s'_b s'_d> B[(ab),(cd)],
      F'[(ab),(cd)] = C_W^2 Theta_ab <s'_a s'_b s_c s_d> + r sum_{ef} L[a,c,e] L[b,d,f] F[(ab),(ef)],
        L[a,c,e] = C_W <d(s'_a s_c)/dz_e> = C_W sum_g (K^-1)_{eg} <s'_a s_c z_g>   (Stein's lemma).
    The derivatives along the unique kernel entries e are central differences of the 2-D rule (as in
    ``theory.two_input_vertex``). ``interlayer=False`` keeps only the first terms."""
    quad = quad or Quad()
    X = np.asarray(X, dtype=float)
    if X.shape[0] != 2:
        raise ValueError("two_input_ntk_tensors needs exactly two inputs")
    widths = widths or [1] * depth
    G = X @ X.T / X.shape[1]
    K, Th = c_b + c_w * G, lambda_b + lambda_w * G
    V, D, A = np.zeros((3, 3)), np.zeros((3, 3)), np.zeros((3, 3))
    B, F = np.zeros((4, 4)), np.zeros((4, 4))
    out = [{"layer": 1, "K": K.copy(), "Theta": Th.copy(), "V": V, "D": D, "A": A, "B": B, "F": F}]
    for ell in range(1, depth):
        z, s, d, w = _grid_moments(kind, K, quad)
        E = lambda a: float(np.sum(w * a))  # noqa: E731
        g = [c_w * s[a] * s[b] for a, b in UPAIRS]
        f = [lambda_w * s[a] * s[b] + c_w * Th[a, b] * d[a] * d[b] for a, b in UPAIRS]
        cov = lambda u, v: np.array([[E(x * y) - E(x) * E(y) for y in v] for x in u])  # noqa: E731
        V_in, D_in, A_in = cov(g, g), cov(f, g), cov(f, f)
        B_in = np.array(
            [[c_w**2 * Th[a, b] * Th[c, e] * E(d[a] * d[b] * d[c] * d[e]) for c, e in OPAIRS] for a, b in OPAIRS]
        )
        F_in = np.array([[c_w**2 * Th[a, b] * E(d[a] * d[b] * s[c] * s[e]) for c, e in OPAIRS] for a, b in OPAIRS])
        r = aspect_ratio(widths, ell) if interlayer else 0.0
        # susceptibilities
        h = h_rel * math.sqrt(K[0, 0] * K[1, 1])
        dS = np.empty((2, 3, 3))  # [ss|dd, p, e]
        for e, (a, b) in enumerate(UPAIRS):
            dS[:, :, e] = kernel_derivative(lambda K_: _ss_dd(kind, K_, quad), K, a, b, h)
        th_p = np.array([Th[a, b] for a, b in UPAIRS])
        J = c_w * dS[0]
        Jt = lambda_w * dS[0] + c_w * th_p[:, None] * dS[1]
        Xp = np.diag([c_w * E(d[a] * d[b]) for a, b in UPAIRS])
        Kinv = np.linalg.pinv(K, rcond=1e-10)
        L = np.array(
            [
                [
                    [c_w * sum(Kinv[e, gg] * E(d[a] * s[c] * z[gg]) for gg in range(2)) for e in range(2)]
                    for c in range(2)
                ]
                for a in range(2)
            ]
        )
        dd2 = np.array([[E(d[a] * d[c]) for c in range(2)] for a in range(2)])
        V_new = V_in + r * J @ V @ J.T
        D_new = D_in + r * (Jt @ V @ J.T + Xp @ D @ J.T)
        A_new = A_in + r * (Jt @ V @ Jt.T + Xp @ D @ Jt.T + Jt @ D.T @ Xp + Xp @ A @ Xp)
        B_new, F_new = B_in.copy(), F_in.copy()
        for i, (a, b) in enumerate(OPAIRS):
            for j, (c, e) in enumerate(OPAIRS):
                B_new[i, j] += r * c_w**2 * dd2[a, c] * dd2[b, e] * B[i, j]
                F_new[i, j] += r * sum(
                    L[a, c, e1] * L[b, e, e2] * F[i, OPAIRS.index((e1, e2))] for e1 in range(2) for e2 in range(2)
                )
        ss, ddm = _ss_dd(kind, K, quad)
        sym = lambda v: np.array([[v[0], v[1]], [v[1], v[2]]])  # noqa: E731
        K, Th = c_b + c_w * sym(ss), lambda_b + lambda_w * sym(ss) + c_w * sym(ddm) * Th
        V, D, A, B, F = V_new, D_new, A_new, B_new, F_new
        out.append({"layer": ell + 1, "K": K.copy(), "Theta": Th.copy(), "V": V, "D": D, "A": A, "B": B, "F": F})
    return out


# ---------------------------------------------------------------- dNTK of two inputs at layer 2 (exact)
def two_input_dntk_layer2(
    kind: str, c_w: float, c_b: float, lambda_b: float, lambda_w: float, X: np.ndarray, quad: Quad | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q), each 2x2x2x2 over input indices (a0, a1, a2, a3), of the layer-2 dNTK of two inputs:
        E[dTh_{i0 i1 i2; a0 a1 a2} z_{i3; a3}]
            = (1/n)[d03 d12 P_{a0a1a2a3} + d01 d23 Q_{a0a1a2a3} + d02 d13 Q_{a0a2a1a3}],
    exact at any width (layer 1 is linear in its parameters with the deterministic NTK Gram Theta, so its
    preactivations act as parameters with learning-rate matrix Theta; Wick contractions over W^(2)):
        P = lW CW <s'_0 s_3 (Th_01 s'_1 s_2 + Th_02 s_1 s'_2)> + X,
        Q = lW CW Th_12 <s_0 s'_1 s'_2 s_3> + X,
        X = CW^2 Th_12 <s'_0 s_3 (Th_01 s''_1 s'_2 + Th_02 s'_1 s''_2)>,
    averages over (z_1, z_2) ~ N(0, K^(1)). With all a equal this is dntk.dntk_first_order at layer 2. The dNTK
    recursion to deeper layers with input indices is :func:`two_input_dntk`."""
    from pipelines.ntk_feynman.dntk import d2sigma

    quad = quad or Quad()
    X = np.asarray(X, dtype=float)
    G = X @ X.T / X.shape[1]
    K, Th = c_b + c_w * G, lambda_b + lambda_w * G
    z, s, d, w = _grid_moments(kind, K, quad)
    dd = (d2sigma(kind, z[0]), d2sigma(kind, z[1]))
    E = lambda a: float(np.sum(w * a))  # noqa: E731
    P, Q = np.empty((2, 2, 2, 2)), np.empty((2, 2, 2, 2))
    for a0 in range(2):
        for a1 in range(2):
            for a2 in range(2):
                for a3 in range(2):
                    sec = (
                        c_w**2
                        * Th[a1, a2]
                        * E(d[a0] * s[a3] * (Th[a0, a1] * dd[a1] * d[a2] + Th[a0, a2] * d[a1] * dd[a2]))
                    )
                    P[a0, a1, a2, a3] = (
                        lambda_w * c_w * E(d[a0] * s[a3] * (Th[a0, a1] * d[a1] * s[a2] + Th[a0, a2] * s[a1] * d[a2]))
                        + sec
                    )
                    Q[a0, a1, a2, a3] = lambda_w * c_w * Th[a1, a2] * E(s[a0] * d[a1] * d[a2] * s[a3]) + sec
    return P, Q


def two_input_dntk(
    kind: str,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    X: np.ndarray,
    depth: int,
    widths: list[int] | None = None,
    interlayer: bool = True,
    quad: Quad | None = None,
) -> list[dict]:
    """Per layer l = 1..depth: the two-input dNTK statistics P, Q (2x2x2x2 over (a0, a1, a2, a3), conventions of
    :func:`two_input_dntk_layer2`) by the layer recursion (our derivation, README "dNTK of two inputs"). Given
    layer l (K, Theta, B, F from :func:`two_input_ntk_tensors`, averages over (z_1, z_2) ~ N(0, K_l), r =
    n_l / n_{l-1}), with the Stein vector S[g]_e = <d g / dz_e> = sum_f (K^-1)_{ef} <g z_f> and the F link
    S[g] . F_(ab) . S[h] = sum_ef S[g]_e F[(ab),(ef)] S[h]_f (g on the neuron carrying a, h on the one carrying b):
      P' = P2 + r { lW CW (S[s'_0 s_3].F_(01).S[s'_1 s_2] + S[s'_0 s_3].F_(02).S[s_1 s'_2])
                    + CW^2 Th_12 (S[s'_0 s_3].F_(01).S[s''_1 s'_2] + S[s'_0 s_3].F_(02).S[s'_1 s''_2])
                    + CW^2 <s'_1 s'_2> sum_e S[s'_0 s_3]_e P_{a0 a1 a2 e} },
      Q' = Q2 + r { lW CW S[s_0 s'_1].F_(12).S[s'_2 s_3] + CW^2 Th_01 S[s'_0 s''_1].F_(12).S[s'_2 s_3]
                    + CW^2 <s'_0 s'_1><s''_2 s_3> B[(a1 a2),(a0 a2)]
                    + CW^2 <s'_0 s'_1> sum_e Q_{a0 a1 a2 e} S[s'_2 s_3]_e },
    where P2, Q2 are the layer-2 formulas of :func:`two_input_dntk_layer2` at layer l's K, Theta (the terms with
    one layer-l neuron). With all input indices equal this is dntk.dntk_first_order. ``interlayer=False`` keeps
    P2, Q2 only (the ablation)."""
    from pipelines.ntk_feynman.dntk import d2sigma

    quad = quad or Quad()
    X = np.asarray(X, dtype=float)
    widths = widths or [1] * depth
    base = two_input_ntk_tensors(
        kind, c_w, c_b, lambda_b, lambda_w, X, depth, widths=widths, interlayer=interlayer, quad=quad
    )
    P, Q = np.zeros((2, 2, 2, 2)), np.zeros((2, 2, 2, 2))
    out = [{"layer": 1, "P": P.copy(), "Q": Q.copy()}]
    R2 = range(2)
    for ell in range(1, depth):
        K, Th, B, F = (base[ell - 1][k] for k in ("K", "Theta", "B", "F"))
        z, s, d, w = _grid_moments(kind, K, quad)
        dd = (d2sigma(kind, z[0]), d2sigma(kind, z[1]))
        E = lambda a: float(np.sum(w * a))  # noqa: E731
        Kinv = np.linalg.pinv(K, rcond=1e-10)
        St = lambda g: Kinv @ np.array([E(g * z[0]), E(g * z[1])])  # noqa: E731
        Fm = {(a, b): F[OPAIRS.index((a, b))].reshape(2, 2) for a in R2 for b in R2}  # [e, f]
        link = lambda g, ab, h: float(St(g) @ Fm[ab] @ St(h))  # noqa: E731
        r = aspect_ratio(widths, ell) if interlayer else 0.0
        Pn, Qn = np.empty_like(P), np.empty_like(Q)
        for a0 in R2:
            for a1 in R2:
                for a2 in R2:
                    for a3 in R2:
                        sec = (
                            c_w**2
                            * Th[a1, a2]
                            * E(d[a0] * s[a3] * (Th[a0, a1] * dd[a1] * d[a2] + Th[a0, a2] * d[a1] * dd[a2]))
                        )
                        p2 = (
                            lambda_w
                            * c_w
                            * E(d[a0] * s[a3] * (Th[a0, a1] * d[a1] * s[a2] + Th[a0, a2] * s[a1] * d[a2]))
                            + sec
                        )
                        q2 = lambda_w * c_w * Th[a1, a2] * E(s[a0] * d[a1] * d[a2] * s[a3]) + sec
                        g0 = d[a0] * s[a3]
                        p_int = (
                            lambda_w * c_w * (link(g0, (a0, a1), d[a1] * s[a2]) + link(g0, (a0, a2), s[a1] * d[a2]))
                            + c_w**2
                            * Th[a1, a2]
                            * (link(g0, (a0, a1), dd[a1] * d[a2]) + link(g0, (a0, a2), d[a1] * dd[a2]))
                            + c_w**2 * E(d[a1] * d[a2]) * float(St(g0) @ P[a0, a1, a2])
                        )
                        h3 = d[a2] * s[a3]
                        q_int = (
                            lambda_w * c_w * link(s[a0] * d[a1], (a1, a2), h3)
                            + c_w**2 * Th[a0, a1] * link(d[a0] * dd[a1], (a1, a2), h3)
                            + c_w**2
                            * E(d[a0] * d[a1])
                            * E(dd[a2] * s[a3])
                            * B[OPAIRS.index((a1, a2)), OPAIRS.index((a0, a2))]
                            + c_w**2 * E(d[a0] * d[a1]) * float(Q[a0, a1, a2] @ St(h3))
                        )
                        Pn[a0, a1, a2, a3] = p2 + r * p_int
                        Qn[a0, a1, a2, a3] = q2 + r * q_int
        P, Q = Pn, Qn
        out.append({"layer": ell + 1, "P": P.copy(), "Q": Q.copy()})
    return out


# ---------------------------------------------------------------- Monte Carlo (the M-input samplers at M = 2)
N_COLS = 3 + 3 + 9 + 9 + 9 + 16 + 16  # multi.n_cols(2)


def _two(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] != 2:
        raise ValueError(f"the two-input samplers need X of shape (2, n0), got {X.shape}")
    return X


def sample_two_input(
    kind: str,
    X: np.ndarray,
    width: int,
    depth: int,
    n_nets: int,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    seed: int,
    chunk_elems: int = 2_000_000,
) -> np.ndarray:
    """(n_nets, depth, N_COLS) per-net statistics of nets of equal hidden width seeing both inputs X (2 x n0):
    :func:`multi.sample_multi` at M = 2 (its column layout: m_zz[3], m_th[3], pp_zz[3x3], pp_thzz[3x3],
    pp_thth[3x3], off-diagonal B[4x4] and F[4x4] means over ordered pairs i != k)."""
    return multi.sample_multi(
        kind, _two(X), width, depth, n_nets, c_w, c_b, lambda_b, lambda_w, seed, chunk_elems=chunk_elems
    )


def _estimate(m: np.ndarray, n_prev: float) -> dict[str, np.ndarray]:
    return multi.estimate(m, n_prev, 2)


def pooled_two_input(stats: np.ndarray, n_prev: float, n_blocks: int = 20) -> list[dict]:
    """Per layer: the pooled estimates T = n_prev (E[pair product] - E[.]E[.]) and batch-mean standard errors
    (``<T>_se``) over ``n_blocks`` contiguous blocks of nets (:func:`multi.pooled_multi` at M = 2)."""
    return multi.pooled_multi(stats, n_prev, 2, n_blocks=n_blocks)


def sample_two_input_dntk(
    kind: str,
    X: np.ndarray,
    width: int,
    depth: int,
    n_nets: int,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    seed: int,
    chunk: int = 500,
) -> np.ndarray:
    """(n_nets, depth, 3, 2, 2, 2, 2) per-net contractions of the two-input dNTK (equal hidden widths n), divided
    by n^2, indexed [net, layer, kind, a0, a1, a2, a3]:
      kind 0: S1 = sum_ik z_{i;a3} dTh_{ikk;a0a1a2} = < zbar_a3 . z_a0, tr Th_a1a2 >                (exact),
      kind 1: S2 = sum_ik dTh_{iik;a0a1a2} z_{k;a3} = E_u < u . z_a0, u^T Th_a1a2 zbar_a3 >   (one Rademacher u),
      kind 2: S2 with (a1, a2) swapped, i.e. u^T Th_a2a1 zbar_a3 (Th_a2a1 = Th_a1a2^T),
    with <f, g> = sum_mu lambda_mu df/dtheta_mu dg/dtheta_mu by first-order autograd through the forward NTK
    recursion of :func:`sample_two_input` (zbar held fixed). Expectations (previous width = n):
    E S1 = n P + Q_0123 + Q_0213, E S2 = P + n Q_0123 + Q_0213 (before the division by n^2); see
    :func:`two_input_pq_from_sums`.
    :func:`multi.sample_multi_dntk` at M = 2. Its own generator (``seed``); float64, CPU."""
    return multi.sample_multi_dntk(kind, _two(X), width, depth, n_nets, c_w, c_b, lambda_b, lambda_w, seed, chunk=chunk)


def two_input_pq_from_sums(m: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q), each 2x2x2x2, from the means (3, 2, 2, 2, 2) of one layer's :func:`sample_two_input_dntk`
    columns (equal widths n, each divided by n^2): per index tuple solves E S1 = n P + Q_0123 + Q_0213,
    E S2 = P + n Q_0123 + Q_0213 and E S2' = P + Q_0123 + n Q_0213 (:func:`multi.pq_from_sums`)."""
    return multi.pq_from_sums(np.asarray(m), n)


def pooled_two_input_dntk(stats: np.ndarray, n: int, n_blocks: int = 20) -> list[dict]:
    """Per layer: pooled P, Q of :func:`sample_two_input_dntk` and batch-mean standard errors ``P_se``, ``Q_se``
    over ``n_blocks`` contiguous blocks of nets (:func:`multi.pooled_multi_dntk`)."""
    return multi.pooled_multi_dntk(stats, n, n_blocks=n_blocks)


# ---------------------------------------------------------------- pipeline tables
TENSOR_NAMES = ("V", "D", "A", "B", "F")
COLUMNS = tuple(f"c{i:02d}" for i in range(N_COLS))  # the block-mean columns of sample_two_input


def quantity_names() -> list[str]:
    """The comparison's quantity names of the two-input tensors: ``2i.<T>_<row>_<col>``."""
    return [f"2i.{k}" for t in TENSOR_NAMES for k in flatten(t, np.zeros((4, 4)) if t in "BF" else np.zeros((3, 3)))]


def flat_row(r: dict) -> dict[str, float]:
    """One layer of :func:`two_input_ntk_tensors` (or of the pooled MC) as ``{"2i.<T>_<row>_<col>": value}``."""
    return {f"2i.{k}": v for t in TENSOR_NAMES for k, v in flatten(t, np.asarray(r[t])).items()}


def pooled_blocks(blocks, n_prev: float) -> dict[str, float]:
    """Pooled estimates (nets weighted equally) and batch-mean standard errors (one batch per block row) of the
    two-input tensors from block means (columns COLUMNS, ``n_nets``), flattened as :func:`flat_row`."""
    w = blocks["n_nets"].to_numpy(float)
    M = blocks[list(COLUMNS)].to_numpy(float)
    est = flat_row(_estimate(np.average(M, axis=0, weights=w), n_prev))
    per = [flat_row(_estimate(m, n_prev)) for m in M]
    out = dict(est)
    for k in est:
        out[f"{k}_se"] = float(np.std([p[k] for p in per], ddof=1) / math.sqrt(len(M)))
    return out


# ---------------------------------------------------------------- two-input dNTK tables
IDX4 = tuple(np.ndindex(2, 2, 2, 2))
DNTK2_COLUMNS = tuple(f"s{k}_{''.join(str(i + 1) for i in idx)}" for k in range(3) for idx in IDX4)


def dntk2_quantity_names() -> list[str]:
    """The comparison's quantity names of the two-input dNTK: ``2d.<P|Q>_<a0a1a2a3>`` (inputs 1, 2)."""
    return [f"2d.{t}_{''.join(str(i + 1) for i in idx)}" for t in ("P", "Q") for idx in IDX4]


def dntk2_flat_row(P: np.ndarray, Q: np.ndarray) -> dict[str, float]:
    """P, Q (2x2x2x2) as ``{"2d.<P|Q>_<a0a1a2a3>": value}`` in the order of :func:`dntk2_quantity_names`."""
    return dict(zip(dntk2_quantity_names(), [float(P[i]) for i in IDX4] + [float(Q[i]) for i in IDX4]))


def dntk2_block_row(stats: np.ndarray) -> np.ndarray:
    """(depth, len(DNTK2_COLUMNS)) block means of :func:`sample_two_input_dntk` columns."""
    return stats.mean(0).reshape(stats.shape[1], -1)


def dntk2_pooled_blocks(blocks, n: int) -> dict[str, float]:
    """Pooled P, Q (nets weighted equally) and batch-mean standard errors (one batch per block row) from block
    means (columns DNTK2_COLUMNS, ``n_nets``) of one width n and layer, flattened as :func:`dntk2_flat_row`."""
    w = blocks["n_nets"].to_numpy(float)
    M = blocks[list(DNTK2_COLUMNS)].to_numpy(float).reshape(-1, 3, 2, 2, 2, 2)
    est = dntk2_flat_row(*two_input_pq_from_sums(np.average(M, axis=0, weights=w), n))
    per = [dntk2_flat_row(*two_input_pq_from_sums(m, n)) for m in M]
    out = dict(est)
    for k in est:
        out[f"{k}_se"] = float(np.std([q[k] for q in per], ddof=1) / math.sqrt(len(M)))
    return out


__all__ = [
    "COLUMNS",
    "DNTK2_COLUMNS",
    "dntk2_block_row",
    "dntk2_flat_row",
    "dntk2_pooled_blocks",
    "dntk2_quantity_names",
    "N_COLS",
    "ONAMES",
    "OPAIRS",
    "TENSOR_NAMES",
    "UNAMES",
    "UPAIRS",
    "flat_row",
    "flatten",
    "pooled_blocks",
    "pooled_two_input",
    "pooled_two_input_dntk",
    "quantity_names",
    "sample_two_input",
    "sample_two_input_dntk",
    "two_input_pq_from_sums",
    "two_input_dntk",
    "two_input_dntk_layer2",
    "two_input_ntk_tensors",
]
