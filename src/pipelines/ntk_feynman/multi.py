"""M inputs x_1 .. x_M: the NTK Gram matrix and the first-order (1/n) NTK fluctuation tensors V, D, A, B, F and
the dNTK statistics P, Q with input indices, for any M (``ntk2`` is the M = 2 case), by the same layer
recursions written index-wise (our derivation, README "NTK statistics of M inputs"), and a Monte-Carlo sampler
of the NTK tensors from finite-width nets that see all M inputs.

Definitions at layer l (n = n_{l-1}, i != k two neurons, a, b, c, d in 0..M-1 input indices):
  V[(ab),(cd)]/n = Cov(z_ia z_ib, z_kc z_kd),  D[(ab),(cd)]/n = Cov(Th_ii;ab, z_kc z_kd),
  A[(ab),(cd)]/n = Cov(Th_ii;ab, Th_kk;cd)                 (ab), (cd) over the M(M+1)/2 unique pairs a <= b
  B[(ab),(cd)]/n = E[Th_ik;ab Th_ik;cd],  F[(ab),(cd)]/n = E[Th_ik;ab z_ic z_kd]   over the M^2 ordered pairs
  E[dTh_{i0i1i2;a0a1a2} z_{i3;a3}] = (1/n)[d03 d12 P_{a0a1a2a3} + d01 d23 Q_{a0a1a2a3} + d02 d13 Q_{a0a2a1a3}].
Pairs are listed in lexicographic order, so for M = 2 they are ``ntk2.UPAIRS`` and ``ntk2.OPAIRS``.

Gaussian averages go through :class:`Expect`: an average of a product of factors, each attached to one input
index (s = sigma, d = sigma', dd = sigma'', z), is taken on the rule (``Quad.gridk``) of the distinct inputs it
touches (at most 4 for every average used here), with the grids cached per subset within a layer. So any M
works, at a cost that grows with the number of index subsets.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import torch

from pipelines.ntk_feynman.mc import act, layer_batch_means, leaf_params, pair_mean, param_inner
from pipelines.ntk_feynman.theory import Quad, aspect_ratio, dsigma, kernel_derivative, sigma

TENSOR_NAMES = ("V", "D", "A", "B", "F")


def upairs(M: int) -> list[tuple[int, int]]:
    """The M(M+1)/2 unique pairs (a <= b), lexicographic."""
    return [(a, b) for a in range(M) for b in range(a, M)]


def opairs(M: int) -> list[tuple[int, int]]:
    """The M^2 ordered pairs, lexicographic."""
    return [(a, b) for a in range(M) for b in range(M)]


def _upos(M: int) -> dict[tuple[int, int], int]:
    """Position of the unique pair of (a, b) in :func:`upairs`, for either order."""
    pos = {p: i for i, p in enumerate(upairs(M))}
    return {**pos, **{(b, a): i for (a, b), i in pos.items()}}


# ---------------------------------------------------------------- expectation engine
_FUNCS = ("z", "s", "d", "dd")


def _d2sigma(kind: str, z: np.ndarray) -> np.ndarray:
    from pipelines.ntk_feynman.dntk import d2sigma

    return d2sigma(kind, z)


class Expect:
    """Gaussian averages over z ~ N(0, K) (K: M x M) of products of per-input factors.

    ``E(("s", 0), ("d", 2), ("d", 2))`` is <sigma(z_0) sigma'(z_2)^2>. The product is integrated on
    ``quad.gridk`` of the sub-kernel of the distinct inputs it touches (inputs whose z coincide, i.e.
    K_aa + K_bb - 2 K_ab <= tol (K_aa + K_bb), share one variable). Grids, the factor arrays on them and the
    averages are cached. :meth:`stein` gives S[g]_e = <dg/dz_e> = sum_f (K_sub^-1)_{ef} <g z_f> (zero outside
    the inputs g touches)."""

    def __init__(self, kind: str, K: np.ndarray, quad: Quad | None = None, tol: float = 1e-12):
        self.kind, self.quad = kind, quad or Quad()
        self.K = np.asarray(K, dtype=float)
        self.M = len(self.K)
        self.rep = list(range(self.M))
        for a in range(self.M):
            for b in range(a):
                if self.rep[b] == b and (
                    self.K[a, a] + self.K[b, b] - 2 * self.K[a, b] <= tol * (self.K[a, a] + self.K[b, b])
                ):
                    self.rep[a] = b
                    break
        self._grids: dict = {}
        self._arrays: dict = {}
        self._memo: dict = {}
        self._stein: dict = {}

    def grid(self, subset: tuple[int, ...]) -> tuple[dict[int, np.ndarray], np.ndarray]:
        """({input: z values}, weights) of the rule for the (sorted, distinct) inputs ``subset``."""
        if subset not in self._grids:
            Z, w = self.quad.gridk(self.K[np.ix_(subset, subset)])
            self._grids[subset] = ({a: Z[j] for j, a in enumerate(subset)}, w)
        return self._grids[subset]

    def _array(self, subset, fn: str, a: int) -> np.ndarray:
        key = (subset, fn, a)
        if key not in self._arrays:
            z = self.grid(subset)[0][a]
            self._arrays[key] = {
                "z": lambda: z,
                "s": lambda: sigma(self.kind, z),
                "d": lambda: dsigma(self.kind, z),
                "dd": lambda: _d2sigma(self.kind, z),
            }[fn]()
        return self._arrays[key]

    def E(self, *factors: tuple[str, int]) -> float:
        fs = tuple(sorted((fn, self.rep[a]) for fn, a in factors))
        if fs not in self._memo:
            if not fs:
                self._memo[fs] = 1.0
            else:
                subset = tuple(sorted({a for _, a in fs}))
                prod = self.grid(subset)[1]
                for fn, a in fs:
                    prod = prod * self._array(subset, fn, a)
                self._memo[fs] = float(np.sum(prod))
        return self._memo[fs]

    def stein(self, *factors: tuple[str, int]) -> np.ndarray:
        """(M,) S[g]_e = <dg/dz_e> for g the product of ``factors`` (Stein's lemma on the touched inputs)."""
        fs = tuple(sorted((fn, self.rep[a]) for fn, a in factors))
        if fs not in self._stein:
            subset = tuple(sorted({a for _, a in fs}))
            t = np.array([self.E(*fs, ("z", g)) for g in subset])
            Ks = self.K[np.ix_(subset, subset)]
            out = np.zeros(self.M)
            out[list(subset)] = np.linalg.pinv(Ks, rcond=1e-10) @ t
            self._stein[fs] = out
        return self._stein[fs]


# ---------------------------------------------------------------- helpers
def _distinct(X: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """(the distinct rows of X, the map input -> its row among them); rows equal to rounding count once."""
    rows, idx = [], []
    for x in X:
        for j, y in enumerate(rows):
            if np.sum((x - y) ** 2) <= 1e-24 * max(np.sum(x * x), np.sum(y * y)):
                idx.append(j)
                break
        else:
            idx.append(len(rows))
            rows.append(x)
    return np.array(rows), idx


def _pair_ss_dd(kind: str, K: np.ndarray, a: int, b: int, quad: Quad) -> np.ndarray:
    """(<s_a s_b>, <s'_a s'_b>) on the rule of the sub-kernel of {a, b}."""
    sub = (a,) if a == b else (a, b)
    Z, w = quad.gridk(K[np.ix_(sub, sub)])
    za, zb = Z[0], Z[-1]
    return np.array([np.sum(w * sigma(kind, za) * sigma(kind, zb)), np.sum(w * dsigma(kind, za) * dsigma(kind, zb))])


def _susceptibilities(kind: str, K: np.ndarray, quad: Quad, h: float) -> np.ndarray:
    """(2, U, U): d<s_a s_b>/dK_e and d<s'_a s'_b>/dK_e along the unique kernel entries e (symmetric
    perturbation), by central differences of the 2-D rule of the pair; zero when e is outside {a, b}."""
    M = len(K)
    U = upairs(M)
    out = np.zeros((2, len(U), len(U)))
    for p, (a, b) in enumerate(U):
        pair = functools.partial(_pair_ss_dd, kind, a=a, b=b, quad=quad)
        for e, (c, d) in enumerate(U):
            if {c, d} <= {a, b}:
                out[:, p, e] = kernel_derivative(pair, K, c, d, h)
    return out


def _expand_pairs(T: np.ndarray, idx: list[int], Md: int, ordered: bool) -> np.ndarray:
    M = len(idx)
    if ordered:
        src = [idx[a] * Md + idx[b] for a, b in opairs(M)]
    else:
        pos = _upos(Md)
        src = [pos[(idx[a], idx[b])] for a, b in upairs(M)]
    return T[np.ix_(src, src)]


def _expand_gram(G: np.ndarray, idx: list[int]) -> np.ndarray:
    return G[np.ix_(idx, idx)]


# ---------------------------------------------------------------- the NTK tensors of M inputs
def _ntk_tensors_distinct(
    kind, c_w, c_b, lambda_b, lambda_w, X, depth, widths, interlayer, quad, h_rel, keep_engines=False
):
    M = len(X)
    U, O = upairs(M), opairs(M)
    nU, nO = len(U), len(O)
    G = X @ X.T / X.shape[1]
    K, Th = c_b + c_w * G, lambda_b + lambda_w * G
    V, D, A = np.zeros((nU, nU)), np.zeros((nU, nU)), np.zeros((nU, nU))
    B, F = np.zeros((nO, nO)), np.zeros((nO, nO))
    out = [{"layer": 1, "K": K.copy(), "Theta": Th.copy(), "V": V, "D": D, "A": A, "B": B, "F": F}]
    for ell in range(1, depth):
        ex = Expect(kind, K, quad)
        E = ex.E
        ss = np.array([E(("s", a), ("s", b)) for a, b in U])
        dd = np.array([E(("d", a), ("d", b)) for a, b in U])
        th_p = np.array([Th[a, b] for a, b in U])
        mg, mf = c_w * ss, lambda_w * ss + c_w * th_p * dd
        V_in, D_in, A_in = np.empty((nU, nU)), np.empty((nU, nU)), np.empty((nU, nU))
        for p, (a, b) in enumerate(U):
            for q, (c, d) in enumerate(U):
                ssss = E(("s", a), ("s", b), ("s", c), ("s", d))
                ddss = E(("d", a), ("d", b), ("s", c), ("s", d))
                ssdd = E(("s", a), ("s", b), ("d", c), ("d", d))
                dddd = E(("d", a), ("d", b), ("d", c), ("d", d))
                V_in[p, q] = c_w**2 * ssss - mg[p] * mg[q]
                D_in[p, q] = c_w * (lambda_w * ssss + c_w * Th[a, b] * ddss) - mf[p] * mg[q]
                A_in[p, q] = (
                    lambda_w**2 * ssss
                    + lambda_w * c_w * (Th[c, d] * ssdd + Th[a, b] * ddss)
                    + c_w**2 * Th[a, b] * Th[c, d] * dddd
                ) - mf[p] * mf[q]
        B_in, F_in = np.empty((nO, nO)), np.empty((nO, nO))
        for i, (a, b) in enumerate(O):
            for j, (c, e) in enumerate(O):
                B_in[i, j] = c_w**2 * Th[a, b] * Th[c, e] * E(("d", a), ("d", b), ("d", c), ("d", e))
                F_in[i, j] = c_w**2 * Th[a, b] * E(("d", a), ("d", b), ("s", c), ("s", e))
        r = aspect_ratio(widths, ell) if interlayer else 0.0
        h = h_rel * float(np.exp(np.mean(np.log(np.diag(K)))))  # the geometric mean of the variances
        dS = _susceptibilities(kind, K, quad, h)
        J = c_w * dS[0]
        Jt = lambda_w * dS[0] + c_w * th_p[:, None] * dS[1]
        Xp = np.diag(c_w * dd)
        L = np.array([[c_w * ex.stein(("d", a), ("s", c)) for c in range(M)] for a in range(M)])  # [a, c, e]
        dd2 = np.array([[E(("d", a), ("d", c)) for c in range(M)] for a in range(M)])
        V_new = V_in + r * J @ V @ J.T
        D_new = D_in + r * (Jt @ V @ J.T + Xp @ D @ J.T)
        A_new = A_in + r * (Jt @ V @ Jt.T + Xp @ D @ Jt.T + Jt @ D.T @ Xp + Xp @ A @ Xp)
        B_new, F_new = B_in.copy(), F_in.copy()
        for i, (a, b) in enumerate(O):
            Fi = F[i].reshape(M, M)
            for j, (c, e) in enumerate(O):
                B_new[i, j] += r * c_w**2 * dd2[a, c] * dd2[b, e] * B[i, j]
                F_new[i, j] += r * float(L[a, c] @ Fi @ L[b, e])
        sym = np.empty((2, M, M))
        for p, (a, b) in enumerate(U):
            sym[0, a, b] = sym[0, b, a] = ss[p]
            sym[1, a, b] = sym[1, b, a] = dd[p]
        if keep_engines:
            out[-1]["engine"] = ex
        K, Th = c_b + c_w * sym[0], lambda_b + lambda_w * sym[0] + c_w * sym[1] * Th
        V, D, A, B, F = V_new, D_new, A_new, B_new, F_new
        out.append({"layer": ell + 1, "K": K.copy(), "Theta": Th.copy(), "V": V, "D": D, "A": A, "B": B, "F": F})
    return out


def multi_input_ntk_tensors(
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
    """Per layer l = 1..depth: the M x M kernel K and NTK Theta (infinite width) and the first-order tensors
    V, D, A (U x U over :func:`upairs`) and B, F (M^2 x M^2 over :func:`opairs`) of the inputs X (M x n0).

    The step is ``ntk2.two_input_ntk_tensors``'s with every index running over M inputs (averages over
    z ~ N(0, K_l) on the rules of the inputs they touch, r = n_l / n_{l-1}):
      V' = Cov(g_p, g_q) + r J V J^T,  D' = Cov(f_p, g_q) + r (Jt V J^T + X D J^T),
      A' = Cov(f_p, f_q) + r (Jt V Jt^T + X D Jt^T + Jt D^T X + X A X),
      B'[(ab),(cd)] = C_W^2 Th_ab Th_cd <s'_a s'_b s'_c s'_d> + r C_W^2 <s'_a s'_c><s'_b s'_d> B[(ab),(cd)],
      F'[(ab),(cd)] = C_W^2 Th_ab <s'_a s'_b s_c s_d> + r sum_ef L[a,c,e] L[b,d,f] F[(ab),(ef)],
    with g_p = C_W s_a s_b, f_p = lambda_W s_a s_b + C_W Th_ab s'_a s'_b, J[p, e] = C_W d<s_a s_b>/dK_e and
    Jt[p, e] = d<f_p>/dK_e (Theta fixed) along the unique kernel entries (central differences of the pair's
    2-D rule, step h_rel times the geometric mean of the distinct inputs' variances; zero for e outside p),
    X = diag(C_W <s'_a s'_b>) and the Stein link L[a,c,:] = C_W S[s'_a s_c] (:meth:`Expect.stein`).
    Identical inputs are computed once and their components copied (their z, Theta coincide at every layer)."""
    quad = quad or Quad()
    X = np.atleast_2d(np.asarray(X, dtype=float))
    widths = widths or [1] * depth
    Xd, idx = _distinct(X)
    rows = _ntk_tensors_distinct(kind, c_w, c_b, lambda_b, lambda_w, Xd, depth, widths, interlayer, quad, h_rel)
    if len(Xd) == len(X):
        return rows
    Md = len(Xd)
    return [
        {
            "layer": r["layer"],
            "K": _expand_gram(r["K"], idx),
            "Theta": _expand_gram(r["Theta"], idx),
            **{t: _expand_pairs(r[t], idx, Md, ordered=t in "BF") for t in TENSOR_NAMES},
        }
        for r in rows
    ]


# ---------------------------------------------------------------- the dNTK of M inputs
def multi_input_dntk(
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
    """Per layer l = 1..depth: the dNTK statistics P, Q (M x M x M x M over (a0, a1, a2, a3)) of the inputs X,
    by ``ntk2.two_input_dntk``'s recursion (the P', Q' formulas in its docstring) with every index running over
    M inputs (Stein vectors S[g] with the inverse of the sub-kernel of the inputs g touches, F links
    S[g].F_(ab).S[h], B, F of :func:`multi_input_ntk_tensors`); P2, Q2 the exact layer-2 terms at layer l's K,
    Theta. ``interlayer=False`` keeps P2, Q2 only."""
    quad = quad or Quad()
    X = np.atleast_2d(np.asarray(X, dtype=float))
    widths = widths or [1] * depth
    Xd, idx = _distinct(X)
    M = len(Xd)
    O = {p: i for i, p in enumerate(opairs(M))}
    base = _ntk_tensors_distinct(kind, c_w, c_b, lambda_b, lambda_w, Xd, depth, widths, interlayer, quad, h_rel)
    P, Q = np.zeros((M,) * 4), np.zeros((M,) * 4)
    out = [{"layer": 1, "P": P.copy(), "Q": Q.copy()}]
    for ell in range(1, depth):
        K, Th, B, F = (base[ell - 1][k] for k in ("K", "Theta", "B", "F"))
        ex = Expect(kind, K, quad)
        E, St = ex.E, ex.stein
        Fm = {(a, b): F[O[(a, b)]].reshape(M, M) for a in range(M) for b in range(M)}

        def link(g, ab, h):
            return float(St(*g) @ Fm[ab] @ St(*h))

        r = aspect_ratio(widths, ell) if interlayer else 0.0
        Pn, Qn = np.empty_like(P), np.empty_like(Q)
        for a0, a1, a2, a3 in itertools.product(range(M), repeat=4):
            sec = (
                c_w**2
                * Th[a1, a2]
                * (
                    Th[a0, a1] * E(("d", a0), ("s", a3), ("dd", a1), ("d", a2))
                    + Th[a0, a2] * E(("d", a0), ("s", a3), ("d", a1), ("dd", a2))
                )
            )
            p2 = (
                lambda_w
                * c_w
                * (
                    Th[a0, a1] * E(("d", a0), ("s", a3), ("d", a1), ("s", a2))
                    + Th[a0, a2] * E(("d", a0), ("s", a3), ("s", a1), ("d", a2))
                )
                + sec
            )
            q2 = lambda_w * c_w * Th[a1, a2] * E(("s", a0), ("d", a1), ("d", a2), ("s", a3)) + sec
            if r == 0.0:
                Pn[a0, a1, a2, a3], Qn[a0, a1, a2, a3] = p2, q2
                continue
            g0 = (("d", a0), ("s", a3))
            p_int = (
                lambda_w
                * c_w
                * (link(g0, (a0, a1), (("d", a1), ("s", a2))) + link(g0, (a0, a2), (("s", a1), ("d", a2))))
                + c_w**2
                * Th[a1, a2]
                * (link(g0, (a0, a1), (("dd", a1), ("d", a2))) + link(g0, (a0, a2), (("d", a1), ("dd", a2))))
                + c_w**2 * E(("d", a1), ("d", a2)) * float(St(*g0) @ P[a0, a1, a2])
            )
            h3 = (("d", a2), ("s", a3))
            q_int = (
                lambda_w * c_w * link((("s", a0), ("d", a1)), (a1, a2), h3)
                + c_w**2 * Th[a0, a1] * link((("d", a0), ("dd", a1)), (a1, a2), h3)
                + c_w**2 * E(("d", a0), ("d", a1)) * E(("dd", a2), ("s", a3)) * B[O[(a1, a2)], O[(a0, a2)]]
                + c_w**2 * E(("d", a0), ("d", a1)) * float(Q[a0, a1, a2] @ St(*h3))
            )
            Pn[a0, a1, a2, a3] = p2 + r * p_int
            Qn[a0, a1, a2, a3] = q2 + r * q_int
        P, Q = Pn, Qn
        out.append({"layer": ell + 1, "P": P.copy(), "Q": Q.copy()})
    if M == len(X):
        return out
    ix = np.ix_(idx, idx, idx, idx)
    return [{"layer": r["layer"], "P": r["P"][ix], "Q": r["Q"][ix]} for r in out]


# ---------------------------------------------------------------- Monte Carlo: NTK tensors of M inputs
def n_cols(M: int) -> int:
    """Per-net columns of :func:`sample_multi` (65 for M = 2, ``ntk2.N_COLS``)."""
    U, O = M * (M + 1) // 2, M * M
    return 2 * U + 3 * U * U + 2 * O * O


def _layer_cols(z: list[torch.Tensor], th: dict) -> torch.Tensor:
    """(nets, n_cols(M)) per-net averages of one layer, in ``ntk2._layer_cols``'s layout: m_zz[U], m_th[U],
    pp_zz[UxU], pp_thzz[UxU], pp_thth[UxU], off-diagonal B[OxO] and F[OxO] means over ordered pairs i != k."""
    M = len(z)
    U, O = upairs(M), opairs(M)
    n = z[0].shape[-1]
    nn = n * (n - 1)
    zz = [z[a] * z[b] for a, b in U]
    dg = [torch.diagonal(th[p], dim1=-2, dim2=-1) for p in U]
    T = torch.stack([th[(a, b)] if a <= b else th[(b, a)].transpose(1, 2) for a, b in O], dim=1)  # (B, O, n, n)
    cols = [*(x.mean(-1) for x in zz), *(x.mean(-1) for x in dg)]
    cols += [pair_mean(x, y) for x in zz for y in zz]
    cols += [pair_mean(x, y) for x in dg for y in zz]
    cols += [pair_mean(x, y) for x in dg for y in dg]
    nb = T.shape[0]
    Tf = T.reshape(nb, len(O), n * n)
    dT = torch.diagonal(T, dim1=-2, dim2=-1)  # (B, O, n)
    Bm = (torch.bmm(Tf, Tf.transpose(1, 2)) - torch.bmm(dT, dT.transpose(1, 2))) / nn  # (B, O, O)
    Z = torch.stack(z, dim=1)  # (B, M, n)
    TZ = torch.einsum("boik,bek->boie", T, Z)  # (B, O, n, M)
    tot = torch.einsum("bci,boie->boce", Z, TZ)
    dia = torch.einsum("bci,boi,bei->boce", Z, dT, Z)
    Fm = ((tot - dia) / nn).reshape(nb, len(O), len(O))
    return torch.cat([torch.stack(cols, dim=-1), Bm.reshape(nb, -1), Fm.reshape(nb, -1)], dim=-1)


def sample_multi(
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
    """(n_nets, depth, n_cols(M)) per-net statistics of nets of equal hidden width seeing all M inputs X
    (M x n0), with the exact NTK of every input pair by the forward recursion
    Th'_ab = diag(lambda_b + lambda_W/n sum_j s_ja s_jb) + W (s'_a Th_ab s'_b) W^T (float64, CPU).
    The weights are drawn in ``ntk2.sample_two_input``'s order, so with the same seed and M = 2 the nets and
    the columns are that sampler's."""
    f64 = {"dtype": torch.float64}
    Xt = torch.as_tensor(np.atleast_2d(np.asarray(X, dtype=float)), **f64)
    M, n0 = Xt.shape
    U = upairs(M)
    gen = torch.Generator().manual_seed(int(seed))
    per_chunk = max(1, chunk_elems // (width * width))
    out = np.empty((n_nets, depth, n_cols(M)))
    G = (Xt @ Xt.T / n0).numpy()
    for start in range(0, n_nets, per_chunk):
        nb = min(per_chunk, n_nets - start)
        W = torch.randn(nb, width, n0, generator=gen, **f64) * math.sqrt(c_w / n0)
        b = torch.randn(nb, width, generator=gen, **f64) * math.sqrt(c_b)
        z = [W @ Xt[a] + b for a in range(M)]
        eye = torch.eye(width, **f64).expand(nb, width, width)
        th = {(a, c): (lambda_b + lambda_w * float(G[a, c])) * eye for a, c in U}
        out[start : start + nb, 0] = _layer_cols(z, th).numpy()
        for ell in range(1, depth):
            W = torch.randn(nb, width, width, generator=gen, **f64) * math.sqrt(c_w / width)
            b = torch.randn(nb, width, generator=gen, **f64) * math.sqrt(c_b)
            sd = [act(kind, za) for za in z]
            new = {}
            for a, c in U:
                Mx = sd[a][1].unsqueeze(-1) * th[(a, c)] * sd[c][1].unsqueeze(-2)
                t = torch.bmm(torch.bmm(W, Mx), W.transpose(1, 2))
                t.diagonal(dim1=-2, dim2=-1).add_((lambda_b + lambda_w * (sd[a][0] * sd[c][0]).mean(-1)).unsqueeze(-1))
                new[(a, c)] = t
            th = new
            z = [torch.bmm(W, sd[a][0].unsqueeze(-1)).squeeze(-1) + b for a in range(M)]
            out[start : start + nb, ell] = _layer_cols(z, th).numpy()
    return out


def estimate(m: np.ndarray, n_prev: float, M: int) -> dict[str, np.ndarray]:
    """The estimators T = n_prev (E[pair product] - E[.]E[.]) (V, D, A) and n_prev E[off-diagonal] (B, F) from
    the means of one layer's :func:`sample_multi` columns; also K, Theta over the unique pairs."""
    nU, nO = M * (M + 1) // 2, M * M
    mz, mt = m[0:nU], m[nU : 2 * nU]
    o = 2 * nU
    pz, ptz, ptt = (m[o + k * nU * nU : o + (k + 1) * nU * nU].reshape(nU, nU) for k in range(3))
    o += 3 * nU * nU
    return {
        "V": n_prev * (pz - np.outer(mz, mz)),
        "D": n_prev * (ptz - np.outer(mt, mz)),
        "A": n_prev * (ptt - np.outer(mt, mt)),
        "B": n_prev * m[o : o + nO * nO].reshape(nO, nO),
        "F": n_prev * m[o + nO * nO : o + 2 * nO * nO].reshape(nO, nO),
        "Theta": mt,
        "K": mz,
    }


def pooled_multi(stats: np.ndarray, n_prev: float, M: int, n_blocks: int = 20) -> list[dict]:
    """Per layer: the pooled estimates of :func:`estimate` and batch-mean standard errors (``<T>_se``) over
    ``n_blocks`` contiguous blocks of nets."""
    return layer_batch_means(stats, lambda m: estimate(m, n_prev, M), n_blocks)


# ---------------------------------------------------------------- Monte Carlo: dNTK of M inputs
def sample_multi_dntk(
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
    """(n_nets, depth, 3, M, M, M, M) per-net contractions of the dNTK of M inputs (equal hidden widths n),
    divided by n^2, indexed [net, layer, kind, a0, a1, a2, a3], as ``ntk2.sample_two_input_dntk`` (same draws
    for M = 2 and the same seed):
      kind 0: S1 = < zbar_a3 . z_a0, tr Th_a1a2 > (exact),  kind 1: S2 = < u . z_a0, u^T Th_a1a2 zbar_a3 >,
      kind 2: S2 with Th_a2a1 (one Rademacher u per net and layer);
    E S1 = n P + Q_0123 + Q_0213, E S2 = P + n Q_0123 + Q_0213, E S2' = P + Q_0123 + n Q_0213 (before / n^2)."""
    f64 = {"dtype": torch.float64}
    Xt = torch.as_tensor(np.atleast_2d(np.asarray(X, dtype=float)), **f64)
    M, n0 = Xt.shape
    n = int(width)
    U, O = upairs(M), opairs(M)
    RM = range(M)
    gen = torch.Generator().manual_seed(int(seed))
    G = (Xt @ Xt.T / n0).numpy()
    out = np.zeros((n_nets, depth, 3) + (M,) * 4)
    for start in range(0, n_nets, chunk):
        nb = min(chunk, n_nets - start)
        Ws, bs, lam = leaf_params(gen, nb, n0, [n] * depth, c_w, c_b, lambda_w, f64)
        us = torch.randint(0, 2, (depth, nb, n), generator=gen).to(torch.float64) * 2 - 1
        z = [torch.einsum("bij,j->bi", Ws[0], Xt[a]) + bs[0] for a in RM]
        eye = torch.eye(n, **f64).expand(nb, n, n)
        th = {(a, c): (lambda_b + lambda_w * float(G[a, c])) * eye for a, c in U}
        for ell in range(1, depth):
            sd = [act(kind, za) for za in z]
            new = {}
            for a, c in U:
                Mx = sd[a][1].unsqueeze(-1) * th[(a, c)] * sd[c][1].unsqueeze(-2)
                t = Ws[ell] @ Mx @ Ws[ell].transpose(1, 2)
                new[(a, c)] = t + torch.diag_embed(
                    (lambda_b + lambda_w / n * (sd[a][0] * sd[c][0]).sum(-1)).unsqueeze(-1).expand(nb, n)
                )
            th = new
            z = [torch.einsum("bij,bj->bi", Ws[ell], sd[a][0]) + bs[ell] for a in RM]
            T = {(a, c): th[(a, c)] if a <= c else th[(c, a)].transpose(1, 2) for a, c in O}
            params = [*Ws[: ell + 1], *bs[: ell + 1]]
            lams = [*lam[: ell + 1], *([lambda_b] * (ell + 1))]

            def grads(f):
                return torch.autograd.grad(f.sum(), params, retain_graph=True, allow_unused=True)

            def inner(ga, gb):
                return param_inner(ga, gb, nb, f64, lams)

            zbar = [za.detach() for za in z]
            u = us[ell]
            g_zz = {(a0, a3): grads((zbar[a3] * z[a0]).sum(-1)) for a0 in RM for a3 in RM}
            g_tr = {p: grads(torch.diagonal(T[p], dim1=-2, dim2=-1).sum(-1)) for p in O}
            g_uz = [grads((u * z[a0]).sum(-1)) for a0 in RM]
            g_ut = {(p, a3): grads(torch.einsum("bi,bik,bk->b", u, T[p], zbar[a3])) for p in O for a3 in RM}
            for a0, a1, a2, a3 in itertools.product(RM, repeat=4):
                vals = (
                    inner(g_zz[(a0, a3)], g_tr[(a1, a2)]),
                    inner(g_uz[a0], g_ut[((a1, a2), a3)]),
                    inner(g_uz[a0], g_ut[((a2, a1), a3)]),
                )
                for kk, v in enumerate(vals):
                    out[start : start + nb, ell, kk, a0, a1, a2, a3] = (v / n**2).detach().numpy()
        del Ws, bs, z, th
    return out


def pq_from_sums(m: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q), each M^4, from the means (3, M, M, M, M) of one layer's :func:`sample_multi_dntk` columns (equal
    widths n): per index tuple solves the three equations of ``ntk2.two_input_pq_from_sums``."""
    A = np.array([[n, 1.0, 1.0], [1.0, n, 1.0], [1.0, 1.0, n]])
    sol = np.linalg.solve(A, n * n * m.reshape(3, -1))
    return sol[0].reshape(m.shape[1:]), sol[1].reshape(m.shape[1:])


def pooled_multi_dntk(stats: np.ndarray, n: int, n_blocks: int = 20) -> list[dict]:
    """Per layer: pooled P, Q of :func:`sample_multi_dntk` and batch-mean standard errors ``P_se``, ``Q_se``."""
    return layer_batch_means(stats, lambda m: dict(zip("PQ", pq_from_sums(m, n))), n_blocks)


# ---------------------------------------------------------------- inputs
def inputs_with_cosines(x1: np.ndarray, cosines: np.ndarray, norm_ratios, seed: int) -> np.ndarray:
    """(M, n0) inputs: the first is x1; the others have norms norm_ratios[a] * |x1| (norm_ratios[0] = 1) and the
    pairwise cosines ``cosines`` (M x M, unit diagonal, positive definite). The directions orthogonal to x1
    are drawn from ``seed`` (QR of a Gaussian matrix whose first column is x1); needs n0 >= M."""
    x1 = np.asarray(x1, dtype=float)
    C = np.asarray(cosines, dtype=float)
    r = np.asarray(norm_ratios, dtype=float)
    M, n0 = len(C), len(x1)
    if n0 < M:
        raise ValueError(f"{M} inputs with prescribed cosines need n0 >= {M}, got n0 = {n0}")
    if r[0] != 1.0:
        raise ValueError("norm_ratios[0] must be 1 (the first input is x1)")
    A = np.random.default_rng(seed).standard_normal((n0, M))
    A[:, 0] = x1
    Qm, R = np.linalg.qr(A)
    Qm = Qm * np.sign(np.diag(R))  # first column = +x1/|x1|
    L = np.linalg.cholesky(C * np.outer(r, r))
    X = (L @ Qm.T) * np.linalg.norm(x1)
    X[0] = x1
    return X


# ---------------------------------------------------------------- pipeline tables ("mi.*" quantities)
def pair_names(M: int, ordered: bool) -> list[str]:
    return [f"{a + 1}{b + 1}" for a, b in (opairs(M) if ordered else upairs(M))]


def columns(M: int) -> tuple[str, ...]:
    """The block-mean columns of :func:`sample_multi` in the pipeline's tables."""
    return tuple(f"c{i:03d}" for i in range(n_cols(M)))


def flat_row(r: dict, M: int) -> dict[str, float]:
    """One layer of :func:`multi_input_ntk_tensors` (or of the pooled MC) as ``{"mi.<T>_<row>_<col>": value}``."""
    out = {}
    for t in TENSOR_NAMES:
        names = pair_names(M, ordered=t in "BF")
        Mt = np.asarray(r[t])
        out.update({f"mi.{t}_{a}_{b}": float(Mt[i, j]) for i, a in enumerate(names) for j, b in enumerate(names)})
    return out


def quantity_names(M: int) -> list[str]:
    z = {t: np.zeros((M * M, M * M)) if t in "BF" else np.zeros((M * (M + 1) // 2,) * 2) for t in TENSOR_NAMES}
    return list(flat_row(z, M))


def pooled_blocks(blocks, n_prev: float, M: int) -> dict[str, float]:
    """Pooled estimates (nets weighted equally) and batch-mean standard errors (one batch per block row) from
    block means (columns :func:`columns`, ``n_nets``), flattened as :func:`flat_row`."""
    w = blocks["n_nets"].to_numpy(float)
    X = blocks[list(columns(M))].to_numpy(float)
    est = flat_row(estimate(np.average(X, axis=0, weights=w), n_prev, M), M)
    keys = list(est)
    per = np.array([list(flat_row(estimate(m, n_prev, M), M).values()) for m in X])
    se = np.std(per, axis=0, ddof=1) / math.sqrt(len(X))
    return {**est, **{f"{k}_se": float(v) for k, v in zip(keys, se)}}


__all__ = [
    "Expect",
    "TENSOR_NAMES",
    "columns",
    "estimate",
    "flat_row",
    "inputs_with_cosines",
    "multi_input_dntk",
    "multi_input_ntk_tensors",
    "n_cols",
    "opairs",
    "pair_names",
    "pooled_blocks",
    "pooled_multi",
    "pooled_multi_dntk",
    "pq_from_sums",
    "quantity_names",
    "sample_multi",
    "sample_multi_dntk",
    "upairs",
]
