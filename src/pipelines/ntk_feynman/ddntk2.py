"""The ddNTK of TWO inputs at first order in 1/n: the means R, S, T, U with four input indices, their exact
layer-2 values, their layer-to-layer recursion at every deeper layer (our derivation, PDLT ch. 11 conventions;
the single-input version is ``ddntk``), and a Monte-Carlo sampler by Hessian forms with Rademacher probes that
never forms the (n x 2)^4 tensors.

Definitions (l f = sum_mu lambda_mu df/dtheta_mu e_mu, H[f] the Hessian in theta; i = neuron, a = input in {1, 2},
written a1..a4 -> 1..4 below; n the previous layer's width):
    ddI_{i1i2i3i4; a1a2a3a4}  = H[Th_{i1i2;a1a2}](l z_{i3;a3}, l z_{i4;a4}),
    ddII_{i1i2i3i4; a1a2a3a4} = H[z_{i3;a3}](l Th_{i1i2;a1a2}, l z_{i4;a4}),
    E[ddI]  = (1/n) [d12 d34 R_{a1a2a3a4} + d13 d24 S_{a1a2a3a4} + d14 d23 S_{a1a2a4a3}],
    E[ddII] = (1/n) [d12 d34 T_{a1a2a3a4} + d13 d24 U_{a1a2a3a4} + d14 d23 U_{a2a1a3a4}].
Why those permutations: ddI is symmetric under (i3, a3) <-> (i4, a4) (a Hessian), which maps the d13 d24 structure
onto d14 d23 with a3, a4 swapped; ddII is symmetric only under (i1, a1) <-> (i2, a2) (Th_{ik;ab} = Th_{ki;ba}),
which maps d13 d24 onto d23 d14 with a1, a2 swapped. Hence R = R_{a1a2a4a3} = R_{a2a1a3a4}, S_{a1a2a3a4} =
S_{a2a1a4a3}, T = T_{a2a1a3a4}; S_{a1a2a3a4} != S_{a1a2a4a3} and U_{a1a2a3a4} != U_{a2a1a3a4} in general (from
layer 3 on, as B_(12)(12) != B_(12)(21)). With all a equal these are ddntk's R, S, T, U.

Layer 2 (exact at any width; layer-1 preactivations act as parameters with learning-rate matrix Th, so
D_x = sum_c Th_xc d/dz_c is the direction of l z_{.;x} on one neuron; averages over (z_1, z_2) ~ N(0, K)):
    R = lW CW <s'_3 s'_4 D3 D4(s_1 s_2)> + CW^2 Th12 <s'_3 s'_4 D3 D4(s'_1 s'_2)>
    S = CW^2 Th12 <s'_3 s'_4 D3 D4(s'_1 s'_2)> + lW CW Th12 (<s_3 s'_4 D4(s'_1 s'_2)> + <s'_3 s_4 D3(s'_1 s'_2)>)
        + lW^2 Th12 <s'_1 s'_2 s_3 s_4>
    T = lW CW Th34 <s''_3 s'_4 D3(s_1 s_2)> + CW^2 Th12 Th34 <s''_3 s'_4 D3(s'_1 s'_2)>
        + lW^2 <s'_3 s_4 D3(s_1 s_2)> + lW CW Th12 <s'_3 s_4 D3(s'_1 s'_2)>
    U = CW^2 Th12 Th34 <s''_3 s'_4 D3(s'_1 s'_2)> + lW CW Th12 Th34 <s'_1 s'_2 s'_3 s'_4>

Recursion (layer l -> l + 1; R0..U0 = the layer-2 formulas at layer l's K, Th; r = n_l / n_{l-1} on every
previous-layer tensor; S[g]_e = sum_f (K^-1)_ef <g z_f> the input-indexed Stein vector; F_(ab) the 2x2 matrix
F[(ab),(ef)]; B[(ab),(cd)] as in ntk2; P, Q the two-input dNTK of ntk2.two_input_dntk):
    Z_c = lW S[d_c(s_1 s_2)] + CW Th12 S[d_c(s'_1 s'_2)],   Zs_cd = lW <d_c d_d(s_1 s_2)> + CW Th12 <d_c d_d(s'_1 s'_2)>
    X13 = lW S[s'_1 s_3] + CW Th13 S[s''_1 s'_3],  X24 = lW S[s'_2 s_4] + CW Th24 S[s''_2 s'_4],
    Y   = lW S[s'_3 s_4] + CW Th34 S[s''_3 s'_4]
    R' = R0 + CW <s'_3 s'_4> [sum_cd Zs_cd B[(c3),(d4)] + sum_c Z_c . (Q_{43c.} + Q_{34c.} - P_{c34.}) / 2]
            + CW^2 <s'_1 s'_2><s'_3 s'_4> R
    S' = S0 + X13 . F_(12) . X24 + CW <s'_2 s'_4> X13 . Q_{421.} + CW <s'_1 s'_3> Q_{312.} . X24
            + CW <s'_2 s'_4>(lW <s''_1 s_3> + CW Th13 <s'''_1 s'_3>) B[(14),(12)]
            + CW <s'_1 s'_3>(lW <s''_2 s_4> + CW Th24 <s'''_2 s'_4>) B[(32),(12)] + CW^2 <s'_1 s'_3><s'_2 s'_4> S
    T' = T0 + sum_c Z_c . F_(c3) . Y + CW <s'_1 s'_2> Y . P_{312.} + CW <s'_3 s'_4> sum_c Z_c . (Q_{43c.} + P_{c34.}
            - Q_{34c.}) / 2 + CW^2 <s'_1 s'_2><s'_3 s'_4> T
    U' = U0 + CW <s'_2 s'_4>(lW <s'_1 s'_3> + CW Th13 <s''_1 s''_3>) B[(12),(34)] + CW^2 <s'_1 s'_3><s'_2 s'_4> U
(d_c = d/dz_c pointwise, so s'' = s''' = 0 for ReLU; the kinks enter through the Stein vectors). With all a equal
this is ddntk.ddntk_first_order term by term (Z = 2 chi_Th, X = Y = chi_Th, ...).

Any number of inputs: every formula above is index-wise (sums over c run over {a1, a2}, where d_c acts), so ONE
implementation serves M = 2 and any M: :func:`_intra` (layer 2) and :func:`ddntk_layers` (the recursion) take an
expectation engine (``E(*factors)``, ``stein(*factors)``, factors ("s" | "d" | "dd" | "ddd" | "z", input)) and
M^4 arrays. :func:`two_input_ddntk` runs them on the 2-D rule (:class:`_Grid`) with ntk2's B, F, P, Q;
``multi_ddntk.multi_input_ddntk`` on ``multi.Expect`` with multi's. Likewise :func:`sample_ddntk_probes` is the
sampler for any M (:func:`sample_two_input_ddntk` is it at M = 2) and :func:`rstu_from_sums` is shape-driven.

Monte Carlo: per input tuple four Hessian forms (probes u, u', v_a = l(u.z_a), v'_a = l(u'.z_a)):
    C1 = H[tr Th_12](v_3, v_4),  C2 = H[u^T Th_12 u'](v_3, v'_4),  C3 = H[u.z_3](l tr Th_12, v_4),
    C4 = H[u.z_3](l u^T Th_12 u', v'_4);  equal widths n:
    E C1 = n R + S + S~, E C2 = R + n S + S~, E C2(a3<->a4) = R + S + n S~     (S~ = S_{a1a2a4a3}),
    E C3 = n T + U + U~, E C4 = T + n U + U~, E C4(a1<->a2) = T + U + n U~     (U~ = U_{a2a1a3a4}).
"""

from __future__ import annotations

import itertools

import numpy as np

from pipelines.ntk_feynman import ddntk, dntk, multi, ntk2, theory
from pipelines.ntk_feynman.mc import layer_batch_means
from pipelines.ntk_feynman.theory import Quad, aspect_ratio

IDX4 = tuple(np.ndindex(2, 2, 2, 2))
TENSORS = ("R", "S", "T", "U")


FN = ("s", "d", "dd", "ddd")  # factor names of sigma, sigma', sigma'', sigma''' (engine keys)


def _derivs(kind: str, z: np.ndarray) -> tuple[np.ndarray, ...]:
    """(s, s', s'', s''') pointwise (0 for ReLU's s'', s''')."""
    return theory.sigma(kind, z), theory.dsigma(kind, z), dntk.d2sigma(kind, z), ddntk.d3sigma(kind, z)


class _Grid:
    """The two-input expectation engine: averages over (z_1, z_2) ~ N(0, K) on ``Quad.grid2`` of products of
    per-input factors (("s" | "d" | "dd" | "ddd" | "z", a)), with the interface of ``multi.Expect``: ``E(*factors)``
    and the Stein vector ``stein(*factors)`` = S[g]_e = sum_f (K^-1)_ef <g z_f> (averages memoised)."""

    def __init__(self, kind: str, K: np.ndarray, quad: Quad):
        z1, z2, self.w = quad.grid2(K[0, 0], K[0, 1], K[1, 1])
        self.z = (z1, z2)
        self.d = [_derivs(kind, z1), _derivs(kind, z2)]  # d[a][k] = sigma^(k)(z_a)
        self.Kinv = np.linalg.pinv(K, rcond=1e-10)
        self._memo: dict = {}

    def E(self, *factors: tuple[str, int]) -> float:
        key = tuple(sorted(factors))
        if key not in self._memo:
            g = self.w
            for fn, a in key:
                g = g * (self.z[a] if fn == "z" else self.d[a][FN.index(fn)])
            self._memo[key] = float(np.sum(g))
        return self._memo[key]

    def stein(self, *factors: tuple[str, int]) -> np.ndarray:
        return self.Kinv @ np.array([self.E(*factors, ("z", 0)), self.E(*factors, ("z", 1))])


# Linear combinations of factor products ("polys": [(coefficient, factors)]) and their averages on an engine.
def _dprod(k: int, a1: int, a2: int, c: int) -> list:
    """d/dz_c of s^(k)(z_a1) s^(k)(z_a2)."""
    return ([(1.0, ((FN[k + 1], a1), (FN[k], a2)))] if c == a1 else []) + (
        [(1.0, ((FN[k], a1), (FN[k + 1], a2)))] if c == a2 else []
    )


def _ddprod(k: int, a1: int, a2: int, c: int, e: int) -> list:
    """d^2/dz_c dz_e of s^(k)(z_a1) s^(k)(z_a2) (k + 2 <= 3)."""
    mixed = (c == a1) * (e == a2) + (c == a2) * (e == a1)
    return (
        ([(1.0, ((FN[k + 2], a1), (FN[k], a2)))] if c == a1 == e else [])
        + ([(float(mixed), ((FN[k + 1], a1), (FN[k + 1], a2)))] if mixed else [])
        + ([(1.0, ((FN[k], a1), (FN[k + 2], a2)))] if c == a2 == e else [])
    )


def _D(Th: np.ndarray, k: int, a1: int, a2: int, x: int) -> list:
    """D_x(s^(k)_1 s^(k)_2) = sum_c Th_xc d/dz_c (only c in {a1, a2} contribute)."""
    return [(Th[x, c] * w, f) for c in sorted({a1, a2}) for w, f in _dprod(k, a1, a2, c)]


def _DD(Th: np.ndarray, k: int, a1: int, a2: int, x: int, y: int) -> list:
    cs = sorted({a1, a2})
    return [(Th[x, c] * Th[y, e] * w, f) for c in cs for e in cs for w, f in _ddprod(k, a1, a2, c, e)]


def _times(poly: list, *factors: tuple[str, int]) -> list:
    return [(w, f + factors) for w, f in poly]


def _avg(ex, poly: list) -> float:
    return sum(w * ex.E(*f) for w, f in poly)


def _stein(ex, poly: list, M: int) -> np.ndarray:
    return sum((w * ex.stein(*f) for w, f in poly), np.zeros(M))


def _intra(ex, c_w: float, lambda_w: float, Th: np.ndarray) -> dict[str, np.ndarray]:
    """R0, S0, T0, U0 (M^4 for M = len(Th) inputs): the layer-2 formulas at the engine's K and the NTK Gram Th.
    ``ex``: an expectation engine (:class:`_Grid` for two inputs, ``multi_ddntk`` 's for M), E(*factors)."""
    M = len(Th)
    E = lambda poly: _avg(ex, poly)  # noqa: E731
    out = {t: np.empty((M,) * 4) for t in TENSORS}
    for a1, a2, a3, a4 in itertools.product(range(M), repeat=4):
        t12, t34 = Th[a1, a2], Th[a3, a4]
        p34 = (("d", a3), ("d", a4))
        dd_p = E(_times(_DD(Th, 1, a1, a2, a3, a4), *p34))
        out["R"][a1, a2, a3, a4] = lambda_w * c_w * E(_times(_DD(Th, 0, a1, a2, a3, a4), *p34)) + c_w**2 * t12 * dd_p
        out["S"][a1, a2, a3, a4] = (
            c_w**2 * t12 * dd_p
            + lambda_w
            * c_w
            * t12
            * (
                E(_times(_D(Th, 1, a1, a2, a4), ("s", a3), ("d", a4)))
                + E(_times(_D(Th, 1, a1, a2, a3), ("d", a3), ("s", a4)))
            )
            + lambda_w**2 * t12 * ex.E(("d", a1), ("d", a2), ("s", a3), ("s", a4))
        )
        q, r_ = (("dd", a3), ("d", a4)), (("d", a3), ("s", a4))
        D0, D1 = _D(Th, 0, a1, a2, a3), _D(Th, 1, a1, a2, a3)
        u_sec = c_w**2 * t12 * t34 * E(_times(D1, *q))
        out["T"][a1, a2, a3, a4] = (
            lambda_w * c_w * t34 * E(_times(D0, *q))
            + u_sec
            + lambda_w**2 * E(_times(D0, *r_))
            + lambda_w * c_w * t12 * E(_times(D1, *r_))
        )
        out["U"][a1, a2, a3, a4] = u_sec + lambda_w * c_w * t12 * t34 * ex.E(("d", a1), ("d", a2), ("d", a3), ("d", a4))
    return out


def _add_interlayer(
    new: dict,
    ex,
    c_w: float,
    lambda_w: float,
    Th: np.ndarray,
    B: np.ndarray,
    F: np.ndarray,
    P: np.ndarray,
    Q: np.ndarray,
    cur: dict,
    r: float,
) -> None:
    """Adds r x (the inter-layer terms of the module docstring's recursion) to ``new`` in place (M inputs, B, F
    over the lexicographic ordered pairs, P, Q M^4, ``cur`` the previous layer's R, S, T, U)."""
    M = len(Th)
    E = lambda poly: _avg(ex, poly)  # noqa: E731
    St = lambda poly: _stein(ex, poly, M)  # noqa: E731
    Bm = lambda p, q: B[p[0] * M + p[1], q[0] * M + q[1]]  # noqa: E731
    Fm = lambda a, b: F[a * M + b].reshape(M, M)  # noqa: E731
    pp = np.array([[ex.E(("d", a), ("d", b)) for b in range(M)] for a in range(M)])  # <s'_a s'_b>
    for a1, a2, a3, a4 in itertools.product(range(M), repeat=4):
        t12, cs = Th[a1, a2], sorted({a1, a2})  # Z_c, Zs_cd vanish unless c, d in {a1, a2}
        Z = {c: lambda_w * St(_dprod(0, a1, a2, c)) + c_w * t12 * St(_dprod(1, a1, a2, c)) for c in cs}
        Zs = {
            (c, e): lambda_w * E(_ddprod(0, a1, a2, c, e)) + c_w * t12 * E(_ddprod(1, a1, a2, c, e))
            for c in cs
            for e in cs
        }
        X13 = lambda_w * ex.stein(("d", a1), ("s", a3)) + c_w * Th[a1, a3] * ex.stein(("dd", a1), ("d", a3))
        X24 = lambda_w * ex.stein(("d", a2), ("s", a4)) + c_w * Th[a2, a4] * ex.stein(("dd", a2), ("d", a4))
        Y = lambda_w * ex.stein(("d", a3), ("s", a4)) + c_w * Th[a3, a4] * ex.stein(("dd", a3), ("d", a4))
        R_ = (
            c_w
            * pp[a3, a4]
            * (
                sum(Zs[c, e] * Bm((c, a3), (e, a4)) for c in cs for e in cs)
                + sum(Z[c] @ (Q[a4, a3, c] + Q[a3, a4, c] - P[c, a3, a4]) / 2 for c in cs)
            )
            + c_w**2 * pp[a1, a2] * pp[a3, a4] * cur["R"][a1, a2, a3, a4]
        )
        b13 = lambda_w * ex.E(("dd", a1), ("s", a3)) + c_w * Th[a1, a3] * ex.E(("ddd", a1), ("d", a3))
        b24 = lambda_w * ex.E(("dd", a2), ("s", a4)) + c_w * Th[a2, a4] * ex.E(("ddd", a2), ("d", a4))
        S_ = (
            X13 @ Fm(a1, a2) @ X24
            + c_w * pp[a2, a4] * X13 @ Q[a4, a2, a1]
            + c_w * pp[a1, a3] * Q[a3, a1, a2] @ X24
            + c_w * pp[a2, a4] * b13 * Bm((a1, a4), (a1, a2))
            + c_w * pp[a1, a3] * b24 * Bm((a3, a2), (a1, a2))
            + c_w**2 * pp[a1, a3] * pp[a2, a4] * cur["S"][a1, a2, a3, a4]
        )
        T_ = (
            sum(Z[c] @ Fm(c, a3) @ Y for c in cs)
            + c_w * pp[a1, a2] * Y @ P[a3, a1, a2]
            + c_w * pp[a3, a4] * sum(Z[c] @ (Q[a4, a3, c] + P[c, a3, a4] - Q[a3, a4, c]) / 2 for c in cs)
            + c_w**2 * pp[a1, a2] * pp[a3, a4] * cur["T"][a1, a2, a3, a4]
        )
        U_ = (
            c_w
            * pp[a2, a4]
            * (lambda_w * pp[a1, a3] + c_w * Th[a1, a3] * ex.E(("dd", a1), ("dd", a3)))
            * Bm((a1, a2), (a3, a4))
            + c_w**2 * pp[a1, a3] * pp[a2, a4] * cur["U"][a1, a2, a3, a4]
        )
        for t, v in zip(TENSORS, (R_, S_, T_, U_)):
            new[t][a1, a2, a3, a4] += r * v


def ddntk_layers(
    engine, c_w: float, lambda_w: float, base: list[dict], drows: list[dict], widths: list[int], interlayer: bool = True
) -> list[dict]:
    """The recursion of the module docstring for any number M of inputs, ONE implementation for M = 2
    (:func:`two_input_ddntk`) and any M (``multi_ddntk.multi_input_ddntk``). ``engine(K)`` returns an expectation
    engine for z ~ N(0, K) (``E(*factors)``, ``stein(*factors)`` as ``multi.Expect``, factors ("s" | "d" | "dd" |
    "ddd" | "z", input)); ``base`` per layer K, Theta, B, F (B, F over the M^2 lexicographic ordered pairs) and
    ``drows`` per layer P, Q (M^4). Per layer l = 1..len(base): {"layer", "R", "S", "T", "U"} (M^4 arrays)."""
    M = len(base[0]["K"])
    cur = {t: np.zeros((M,) * 4) for t in TENSORS}
    out = [{"layer": 1, **{t: v.copy() for t, v in cur.items()}}]
    for ell in range(1, len(base)):
        K, Th, B, F = (base[ell - 1][k] for k in ("K", "Theta", "B", "F"))
        ex = engine(K)
        new = _intra(ex, c_w, lambda_w, Th)
        r = aspect_ratio(widths, ell) if interlayer else 0.0
        if r:
            _add_interlayer(new, ex, c_w, lambda_w, Th, B, F, drows[ell - 1]["P"], drows[ell - 1]["Q"], cur, r)
        cur = new
        out.append({"layer": ell + 1, **{t: v.copy() for t, v in cur.items()}})
    return out


def gram(c_w: float, c_b: float, lambda_b: float, lambda_w: float, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Layer-1 kernel K and NTK Gram Th of the two inputs X (2 x n0)."""
    X = np.asarray(X, dtype=float)
    G = X @ X.T / X.shape[1]
    return c_b + c_w * G, lambda_b + lambda_w * G


def two_input_ddntk_layer2(
    kind: str, c_w: float, c_b: float, lambda_b: float, lambda_w: float, X: np.ndarray, quad: Quad | None = None
) -> dict[str, np.ndarray]:
    """R, S, T, U (each 2x2x2x2 over (a1, a2, a3, a4)) at layer 2, exact at any width (module docstring)."""
    quad = quad or Quad()
    K, Th = gram(c_w, c_b, lambda_b, lambda_w, X)
    return _intra(_Grid(kind, K, quad), c_w, lambda_w, Th)


def two_input_ddntk(
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
    """Per layer l = 1..depth: {"layer", "R", "S", "T", "U"} (2x2x2x2 arrays) by the recursion of the module
    docstring, with K, Th, B, F from ntk2.two_input_ntk_tensors and P, Q from ntk2.two_input_dntk.
    ``interlayer=False`` keeps R0..U0 (the ablation)."""
    quad = quad or Quad()
    X = np.asarray(X, dtype=float)
    widths = widths or [1] * depth
    base = ntk2.two_input_ntk_tensors(
        kind, c_w, c_b, lambda_b, lambda_w, X, depth, widths=widths, interlayer=interlayer, quad=quad
    )
    drows = ntk2.two_input_dntk(
        kind, c_w, c_b, lambda_b, lambda_w, X, depth, widths=widths, interlayer=interlayer, quad=quad
    )
    return ddntk_layers(lambda K: _Grid(kind, K, quad), c_w, lambda_w, base, drows, widths, interlayer)


# ---------------------------------------------------------------- Monte Carlo
def sample_two_input_ddntk(
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
    layers: list[int] | None = None,
) -> np.ndarray:
    """(n_nets, depth, 4, 2, 2, 2, 2): per net, layer and input tuple (a1, a2, a3, a4) the four Hessian forms
    C1..C4 of the module docstring divided by n^2 (equal hidden widths n; one pair of Rademacher probes per net and
    layer). Forward two-input NTK recursion on leaf parameters (as ntk2.sample_two_input_dntk), each form one
    double-backward pass; no (n x 2)^4 tensor. ``layers`` (1-based, default all >= 2). float64, CPU.
    :func:`sample_ddntk_probes` with the two rows of X."""
    if np.atleast_2d(np.asarray(X)).shape[0] != 2:
        raise ValueError(f"sample_two_input_ddntk needs 2 inputs, got X of shape {np.shape(X)}")
    return sample_ddntk_probes(kind, X, width, depth, n_nets, c_w, c_b, lambda_b, lambda_w, seed, chunk, layers)


def sample_ddntk_probes(
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
    layers: list[int] | None = None,
) -> np.ndarray:
    """(n_nets, depth, 4, M, M, M, M) for the M rows of X (any M; the draws do not depend on M, so M = 2 is
    :func:`sample_two_input_ddntk` bit for bit): per net, layer and input tuple (a1, a2, a3, a4) the Hessian forms
    C1..C4 of the module docstring divided by n^2 (equal hidden widths n; one pair of Rademacher probes per net
    and layer, shared by all tuples). Forward M-input NTK recursion on leaf parameters, each form one
    double-backward pass; no (n x M)^4 tensor. ``layers`` (1-based, default all >= 2). float64, CPU."""
    import torch

    from pipelines.ntk_feynman.mc import act, leaf_params, param_inner

    f64 = {"dtype": torch.float64}
    Xt = torch.as_tensor(np.atleast_2d(np.asarray(X, dtype=float)), **f64)
    (M, n0), n = Xt.shape, int(width)
    RM, UP, OP = range(M), multi.upairs(M), multi.opairs(M)
    gen = torch.Generator().manual_seed(int(seed))
    G = (Xt @ Xt.T / n0).numpy()
    layers = sorted(set(layers or range(2, depth + 1)))
    out = np.zeros((n_nets, depth, 4) + (M,) * 4)
    for start in range(0, n_nets, chunk):
        nb = min(chunk, n_nets - start)
        Ws, bs, lam = leaf_params(gen, nb, n0, [n] * depth, c_w, c_b, lambda_w, f64)
        us = torch.randint(0, 2, (2, depth, nb, n), generator=gen).to(torch.float64) * 2 - 1
        z = [torch.einsum("bij,j->bi", Ws[0], Xt[a]) + bs[0] for a in RM]
        eye = torch.eye(n, **f64).expand(nb, n, n)
        th = {(a, c): (lambda_b + lambda_w * float(G[a, c])) * eye for a, c in UP}
        for ell in range(1, max(layers)):
            sd = [act(kind, za) for za in z]
            new = {}
            for a, c in UP:
                Mx = sd[a][1].unsqueeze(-1) * th[(a, c)] * sd[c][1].unsqueeze(-2)
                new[(a, c)] = Ws[ell] @ Mx @ Ws[ell].transpose(1, 2) + torch.diag_embed(
                    (lambda_b + lambda_w / n * (sd[a][0] * sd[c][0]).sum(-1)).unsqueeze(-1).expand(nb, n)
                )
            th = new
            z = [torch.einsum("bij,bj->bi", Ws[ell], sd[a][0]) + bs[ell] for a in RM]
            if ell + 1 not in layers:
                continue
            T = {(a, c): th[(a, c)] if a <= c else th[(c, a)].transpose(1, 2) for a, c in OP}
            params = [*Ws[: ell + 1], *bs[: ell + 1]]
            lams = [*lam[: ell + 1], *([lambda_b] * (ell + 1))]

            def lgrad(f, create=False):
                gr = torch.autograd.grad(f.sum(), params, retain_graph=True, create_graph=create, allow_unused=True)
                return [torch.zeros_like(p) if a is None else a for p, a in zip(params, gr)]

            def ldir(f):
                return [l_ * a.detach() for l_, a in zip(lams, lgrad(f))]

            def hforms(gf, a, bs_):
                """per net: H[f](a, b) for each b in bs_, from gf = grad f (create_graph)."""
                s = sum((gi * ai).sum() for gi, ai in zip(gf, a))
                if not s.requires_grad:
                    return [torch.zeros(nb, **f64) for _ in bs_]
                h = torch.autograd.grad(s, params, retain_graph=True, allow_unused=True)
                return [param_inner(h, b_, nb, f64) for b_ in bs_]

            u, u2 = us[0, ell], us[1, ell]
            uz = [(u * z[a]).sum(-1) for a in RM]
            v = [ldir((u * z[a]).sum(-1)) for a in RM]
            v2 = [ldir((u2 * z[a]).sum(-1)) for a in RM]
            tr = {p: torch.diagonal(T[p], dim1=-2, dim2=-1).sum(-1) for p in UP}
            q = {p: torch.einsum("bi,bik,bk->b", u, T[p], u2) for p in OP}
            res = np.zeros((4,) + (M,) * 4 + (nb,))
            g_tr = {p: lgrad(tr[p], create=True) for p in UP}
            g_q = {p: lgrad(q[p], create=True) for p in OP}
            g_uz = [lgrad(uz[a], create=True) for a in RM]
            l_tr = {p: ldir(tr[p]) for p in UP}
            l_q = {p: ldir(q[p]) for p in OP}
            for a3 in RM:
                for a1, a2 in UP:
                    c1 = hforms(g_tr[(a1, a2)], v[a3], v)
                    c3 = hforms(g_uz[a3], l_tr[(a1, a2)], v)
                    for a4 in RM:
                        for x1, x2 in {(a1, a2), (a2, a1)}:
                            res[0, x1, x2, a3, a4] = c1[a4].detach().numpy()
                            res[2, x1, x2, a3, a4] = c3[a4].detach().numpy()
                for a1, a2 in OP:
                    c2 = hforms(g_q[(a1, a2)], v[a3], v2)
                    c4 = hforms(g_uz[a3], l_q[(a1, a2)], v2)
                    for a4 in RM:
                        res[1, a1, a2, a3, a4] = c2[a4].detach().numpy()
                        res[3, a1, a2, a3, a4] = c4[a4].detach().numpy()
            out[start : start + nb, ell] = np.moveaxis(res, -1, 0) / n**2
        del Ws, bs, z, th
    if not np.isfinite(out).all():
        raise FloatingPointError(f"ntk_feynman {M}-input ddNTK MC ({kind}, width {width}, seed {seed}): non-finite")
    return out


def rstu_from_sums(m: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """R, S, T, U (M^4) from the means (4, M, M, M, M) of one layer's C1..C4 / n^2 (equal widths n; M = 2 for
    :func:`sample_two_input_ddntk`, any M for :func:`sample_ddntk_probes`): per tuple solves
    [[n,1,1],[1,n,1],[1,1,n]] (R, S, S~) = n^2 (C1, C2, C2 with a3<->a4), likewise T, U with a1<->a2."""
    A = np.array([[n, 1.0, 1.0], [1.0, n, 1.0], [1.0, 1.0, n]])
    M = np.shape(m[0])[0]
    out = {t: np.empty((M,) * 4) for t in TENSORS}
    for a1, a2, a3, a4 in itertools.product(range(M), repeat=4):
        s1 = np.linalg.solve(A, n * n * np.array([m[0][a1, a2, a3, a4], m[1][a1, a2, a3, a4], m[1][a1, a2, a4, a3]]))
        s2 = np.linalg.solve(A, n * n * np.array([m[2][a1, a2, a3, a4], m[3][a1, a2, a3, a4], m[3][a2, a1, a3, a4]]))
        out["R"][a1, a2, a3, a4], out["S"][a1, a2, a3, a4] = s1[0], s1[1]
        out["T"][a1, a2, a3, a4], out["U"][a1, a2, a3, a4] = s2[0], s2[1]
    return out


def pooled_two_input_ddntk(stats: np.ndarray, n: int, n_blocks: int = 20) -> list[dict]:
    """Per layer: pooled R, S, T, U of :func:`sample_two_input_ddntk` (or :func:`sample_ddntk_probes`, any M) and
    batch-mean standard errors ``<T>_se`` over ``n_blocks`` contiguous blocks of nets."""
    return layer_batch_means(stats, lambda m: rstu_from_sums(m, n), n_blocks)


__all__ = [
    "IDX4",
    "TENSORS",
    "ddntk_layers",
    "gram",
    "pooled_two_input_ddntk",
    "rstu_from_sums",
    "sample_ddntk_probes",
    "sample_two_input_ddntk",
    "two_input_ddntk",
    "two_input_ddntk_layer2",
]
