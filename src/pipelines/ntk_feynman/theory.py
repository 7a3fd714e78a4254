"""The theory side: Gaussian expectations by split Gauss-Legendre quadrature, the infinite-width kernel and
NTK recursions for arbitrary inputs (Gram matrices), and the first-order (1/n) layer recursions of the
single-input preactivation/NTK statistics V, A, B, D, F (PDLT conventions, the card's equations).

Conventions (PDLT): z1 = b + W x, z_{l+1} = b + W sigma(z_l), Var b = C_b, Var W = C_W / n_l; the NTK sums
lambda_b over biases and lambda_W / n_l over weights. At first order, for i != k at layer l (n = n_{l-1}):
  V/n = Cov(z_i^2, z_k^2),  A/n = Cov(Th_ii, Th_kk),  B/n = E[Th_ik^2],
  D/n = Cov(Th_ii, z_k^2),  F/n = E[Th_ik z_i z_k].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import erf

from pipelines.ntk_feynman.params import TENSORS

SQRT2 = math.sqrt(2.0)
INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


# ---------------------------------------------------------------- activations (numpy; the MC has torch twins)
def sigma(kind: str, z: np.ndarray) -> np.ndarray:
    if kind == "relu":
        return np.maximum(z, 0.0)
    if kind == "tanh":
        return np.tanh(z)
    if kind == "gelu":  # exact GELU: z Phi(z)
        return z * 0.5 * (1.0 + erf(z / SQRT2))
    if kind == "linear":
        return np.asarray(z, dtype=float)
    raise ValueError(f"unknown activation {kind!r}")


def dsigma(kind: str, z: np.ndarray) -> np.ndarray:
    if kind == "relu":  # the step; its derivative (a delta) is never used: integrals are split at 0
        return (z > 0).astype(float)
    if kind == "tanh":
        return 1.0 - np.tanh(z) ** 2
    if kind == "gelu":
        return 0.5 * (1.0 + erf(z / SQRT2)) + z * INV_SQRT2PI * np.exp(-0.5 * z * z)
    if kind == "linear":
        return np.ones_like(np.asarray(z, dtype=float))
    raise ValueError(f"unknown activation {kind!r}")


# ---------------------------------------------------------------- Gaussian expectations
@lru_cache(maxsize=16)
def _leggauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's Gauss-Legendre nodes and weights, cached (read-only): the eigen-solve dominated the 2-D rules."""
    x, w = np.polynomial.legendre.leggauss(n)
    x.flags.writeable = False
    w.flags.writeable = False
    return x, w


@lru_cache(maxsize=16)
def _half_nodes(n: int, r: float) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes/weights on [0, r] times the standard normal density."""
    x, w = np.polynomial.legendre.leggauss(n)
    u = 0.5 * r * (x + 1.0)
    return u, 0.5 * r * w * INV_SQRT2PI * np.exp(-0.5 * u * u)


@dataclass(frozen=True)
class Quad:
    """E[g(z)], z ~ N(0, K), as a weighted sum over nodes split at z = 0: each half-line integrand of the
    activations used here (ReLU included) is smooth, so Gauss-Legendre converges spectrally there, where
    Gauss-Hermite across the ReLU kink converges only algebraically."""

    nodes_per_half: int = 96
    half_width_sd: float = 12.0
    nodes_per_half_3d: int = 20  # nodes per piece and dimension of :meth:`gridk` for 3 variables
    nodes_per_half_4d: int = 12  # ... and for 4 variables (24 x 36^3 = 1.1e6 points at most)
    half_width_sd_hi: float = 8.0  # the range of the 3-D / 4-D rules (tail mass beyond 8 s.d.: 1e-15)

    def nodes(self) -> tuple[np.ndarray, np.ndarray]:
        u, w = _half_nodes(self.nodes_per_half, self.half_width_sd)
        return np.concatenate([-u[::-1], u]), np.concatenate([w[::-1], w])

    def expect(self, g, K: float) -> float:
        u, w = self.nodes()
        return float(np.sum(w * g(math.sqrt(K) * u)))

    def grid2(self, K11: float, K12: float, K22: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Points (z1, z2) and weights of a rule for (z1, z2) ~ N(0, [[K11, K12], [K12, K22]]): the outer
        variable split at z1 = 0, the inner one at z2 = 0 (a different point for every outer node), so both
        kinks of a ReLU integrand sit on a split."""
        s1, s2 = math.sqrt(K11), math.sqrt(K22)
        rho = max(-1.0, min(1.0, K12 / (s1 * s2)))
        u, w = self.nodes()
        if 1.0 - abs(rho) < 1e-12:  # degenerate: z2 = ±(s2/s1) z1
            return s1 * u, math.copysign(1.0, rho) * s2 * u, w
        c = math.sqrt(1.0 - rho * rho)
        x, wl = _leggauss(self.nodes_per_half)
        R = self.half_width_sd
        cut = np.clip(-rho * u / c, -R, R)[:, None]  # z2 = 0 at u2 = cut
        z1s, z2s, ws = [], [], []
        for lo, hi in ((np.full_like(cut, -R), cut), (cut, np.full_like(cut, R))):
            v = lo + 0.5 * (hi - lo) * (x + 1.0)
            wv = 0.5 * (hi - lo) * wl * INV_SQRT2PI * np.exp(-0.5 * v * v)
            z1s.append(np.broadcast_to(s1 * u[:, None], v.shape))
            z2s.append(s2 * (rho * u[:, None] + c * v))
            ws.append(w[:, None] * wv)
        return (np.concatenate(z1s).ravel(), np.concatenate(z2s).ravel(), np.concatenate(ws).ravel())

    def gridk(self, K: np.ndarray, degenerate_tol: float = 1e-11) -> tuple[np.ndarray, np.ndarray]:
        """Points Z (k, N) and weights w (N,) of a rule for z ~ N(0, K), k <= 4. For k <= 2 it is :meth:`nodes`
        (scaled) and :meth:`grid2` exactly. For k = 3, 4: nested conditional (Cholesky) variables
        z_j = sum_{i<j} L_ji u_i + L_jj u_j, u_j standard normal; u_j is split where z_j = 0, i.e. at
        u_j = -sum_{i<j} L_ji u_i / L_jj (a different point for every outer node, clipped to the range), and
        also at u_j = 0 (the peak of its density, so that no piece is a long lopsided one when the inputs are
        strongly correlated); each piece of +-``half_width_sd_hi`` gets ``nodes_per_half_3d`` (``_4d``)
        Gauss-Legendre nodes. So every kink z_j = 0 of a ReLU integrand lies on a cell boundary and each
        cell's integrand is smooth.
        A variable whose conditional variance is below ``degenerate_tol`` times its variance is dropped
        (z_j = sum_{i<j} L_ji u_i: collinear or repeated inputs, no NaN; its kink is then no longer on a
        split). Zero-weight points are pruned."""
        K = np.atleast_2d(np.asarray(K, dtype=float))
        k = K.shape[0]
        if k == 1:
            u, w = self.nodes()
            return math.sqrt(K[0, 0]) * u[None, :], w
        if k == 2:
            z1, z2, w = self.grid2(K[0, 0], K[0, 1], K[1, 1])
            return np.stack([z1, z2]), w
        if k > 4:
            raise ValueError(f"gridk supports at most 4 variables, got {k}")
        n = self.nodes_per_half_3d if k == 3 else self.nodes_per_half_4d
        x, wl = _leggauss(n)
        R = self.half_width_sd_hi
        L = np.zeros((k, k))
        for j in range(k):
            for i in range(j):
                if L[i, i] > 0.0:
                    L[j, i] = (K[j, i] - L[j, :i] @ L[i, :i]) / L[i, i]
            v = K[j, j] - L[j, :j] @ L[j, :j]
            L[j, j] = math.sqrt(v) if v > degenerate_tol * K[j, j] else 0.0
        U, W = np.zeros((k, 1)), np.ones(1)
        for j in range(k):
            if L[j, j] == 0.0:  # degenerate: z_j is fixed by the outer variables
                continue
            cut = np.clip(-(L[j, :j] @ U[:j]) / L[j, j], -R, R)[:, None]
            edge = np.full_like(cut, R)
            lo0, hi0 = np.minimum(cut, 0.0), np.maximum(cut, 0.0)
            us, ws = [], []
            for lo, hi in ((-edge, lo0), (lo0, hi0), (hi0, edge)):
                v = lo + 0.5 * (hi - lo) * (x + 1.0)
                wv = 0.5 * (hi - lo) * wl * INV_SQRT2PI * np.exp(-0.5 * v * v)
                Un = np.repeat(U[:, :, None], n, axis=2)
                Un[j] = v
                us.append(Un.reshape(k, -1))
                ws.append((W[:, None] * wv).ravel())
            U, W = np.concatenate(us, axis=1), np.concatenate(ws)
            keep = W > 0.0
            U, W = U[:, keep], W[keep]
        return L @ U, W

    def expect2(self, g, h, K11: float, K12: float, K22: float) -> float:
        """E[g(z1) h(z2)] for (z1, z2) ~ N(0, [[K11, K12], [K12, K22]]) (see :meth:`grid2`)."""
        z1, z2, w = self.grid2(K11, K12, K22)
        return float(np.sum(w * g(z1) * h(z2)))


# ---------------------------------------------------------------- infinite width, arbitrary inputs
def infinite_width_gram(
    kind: str,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    X: np.ndarray,
    depth: int,
    quad: Quad | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(K^(l), Theta^(l))] for l = 1..depth: the infinite-width kernel and NTK Gram matrices of the inputs
    X (m x n0), by 1-D quadrature on the diagonal and 2-D quadrature off it."""
    quad = quad or Quad()
    X = np.atleast_2d(np.asarray(X, dtype=float))
    n0 = X.shape[1]
    G = X @ X.T / n0
    K = c_b + c_w * G
    T = lambda_b + lambda_w * G
    out = [(K.copy(), T.copy())]
    s, ds = (lambda z: sigma(kind, z)), (lambda z: dsigma(kind, z))
    m = len(X)
    for _ in range(depth - 1):
        ss, dd = np.empty((m, m)), np.empty((m, m))
        for a in range(m):
            for b in range(a, m):
                if a == b:
                    ss[a, a] = quad.expect(lambda z: s(z) ** 2, K[a, a])
                    dd[a, a] = quad.expect(lambda z: ds(z) ** 2, K[a, a])
                else:
                    ss[a, b] = ss[b, a] = quad.expect2(s, s, K[a, a], K[a, b], K[b, b])
                    dd[a, b] = dd[b, a] = quad.expect2(ds, ds, K[a, a], K[a, b], K[b, b])
        K, T = c_b + c_w * ss, lambda_b + lambda_w * ss + c_w * dd * T
        out.append((K.copy(), T.copy()))
    return out


# ---------------------------------------------------------------- first order in 1/n, single input
def aspect_ratio(widths: list[int], ell: int) -> float:
    """r = n_l / n_{l-1} for the step from layer l to l + 1 (``ell`` = l, 1-based; ``widths`` = [n_1, ..., n_L]).
    A layer-(l+1) statistic is normalised by n_l and the layer-l ones it carries by n_{l-1}, so their ratio
    multiplies every previous-layer tensor (PDLT's n_l / n_{l-1}). At l = 1 those tensors vanish (r = 1 there)."""
    return widths[ell - 1] / widths[ell - 2] if ell >= 2 else 1.0


def gaussian_moments(kind: str, K: float, Theta: float, lambda_w: float, c_w: float, quad: Quad) -> dict:
    """The Gaussian averages one layer step of the recursions needs, at variance K."""
    u, w = quad.nodes()
    z = math.sqrt(K) * u
    s, d = sigma(kind, z), dsigma(kind, z)
    E = lambda g: float(np.sum(w * g))  # noqa: E731
    dK = lambda g: float(np.sum(w * g * (z * z - K))) / (2.0 * K * K)  # d<g>_K / dK, no sigma'' needed
    # d^2<g>_K / dK^2 (Gaussian integration by parts twice: the 4th Hermite polynomial)
    dK2 = lambda g: float(np.sum(w * g * (z**4 - 6 * K * z * z + 3 * K * K))) / (4.0 * K**4)  # noqa: E731
    f = lambda_w * s**2 + c_w * Theta * d**2
    return {
        "s2": E(s**2),
        "s4": E(s**4),
        "p2": E(d**2),
        "p4": E(d**4),
        "p2s2": E(d**2 * s**2),
        "dK_s2": dK(s**2),
        "dK_p2": dK(d**2),
        "dK2_s2": dK2(s**2),
        "dK2_p2": dK2(d**2),
        "var_f": E(f * f) - E(f) ** 2,
        "cov_f_cws2": E(f * c_w * s**2) - E(f) * c_w * E(s**2),
    }


def first_order(
    kind: str,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    sq_norm: float,
    depth: int,
    widths: list[int] | None = None,
    interlayer: bool = True,
    quad: Quad | None = None,
) -> list[dict]:
    """Per layer l = 1..depth: K, Theta (infinite width), the susceptibilities, V, A, B, D, F and the mean
    corrections K1, Theta1 (E z_i^2 = K + K1/n, E Th_ii = Theta + Theta1/n).

    ``widths`` = [n_1, ..., n_L] sets the aspect ratios r = n_l / n_{l-1} of :func:`aspect_ratio` (equal
    widths: r = 1).
    ``interlayer=False`` is the ablation that keeps only the first (intra-layer) term of each recursion."""
    quad = quad or Quad()
    widths = widths or [1] * depth
    K, Th = c_b + c_w * sq_norm, lambda_b + lambda_w * sq_norm
    t = dict.fromkeys(TENSORS, 0.0)  # layer 1 is exactly Gaussian with a deterministic NTK
    K1 = Th1 = 0.0  # mean corrections: E z^2 = K + K1/n, E Th_ii = Theta + Theta1/n
    rows = [{"layer": 1, "K": K, "Theta": Th, **t, "K1": K1, "Theta1": Th1}]
    for ell in range(1, depth):
        g = gaussian_moments(kind, K, Th, lambda_w, c_w, quad)
        chi_par = c_w * g["dK_s2"]
        chi_perp = c_w * g["p2"]
        chi_th = lambda_w * g["dK_s2"] + c_w * Th * g["dK_p2"]
        r = aspect_ratio(widths, ell) if interlayer else 0.0
        new = {
            "V": c_w**2 * (g["s4"] - g["s2"] ** 2) + r * chi_par**2 * t["V"],
            "B": c_w**2 * g["p4"] * Th**2 + r * chi_perp**2 * t["B"],
            "F": c_w**2 * g["p2s2"] * Th + r * chi_par**2 * t["F"],
            "D": g["cov_f_cws2"] + r * (chi_par * chi_th * t["V"] + chi_par * chi_perp * t["D"]),
            "A": g["var_f"] + r * (chi_th**2 * t["V"] + 2 * chi_perp * chi_th * t["D"] + chi_perp**2 * t["A"]),
        }
        # mean corrections (derived in the README): second-order delta method in the fluctuating kernel,
        # plus E[Th_jj | z_j] = E[Th | prev] + F/n (z_j^2 - K)/K^2 from the row of W shared by z_j and Th_jj
        K1_new = r * (chi_par * K1 + 0.5 * c_w * g["dK2_s2"] * t["V"])
        Th1_new = r * (
            chi_perp * Th1
            + chi_th * K1
            + 0.5 * (lambda_w * g["dK2_s2"] + c_w * Th * g["dK2_p2"]) * t["V"]
            + c_w * g["dK_p2"] * (t["D"] + 2 * t["F"])
        )
        rows[-1].update(chi_par=chi_par, chi_perp=chi_perp, chi_theta=chi_th)
        K, Th = c_b + c_w * g["s2"], lambda_b + lambda_w * g["s2"] + c_w * g["p2"] * Th
        t, K1, Th1 = new, K1_new, Th1_new
        rows.append({"layer": ell + 1, "K": K, "Theta": Th, **t, "K1": K1, "Theta1": Th1})
    return rows


# ---------------------------------------------------------------- first order in 1/n, two inputs (kernel)
PAIRS = ((0, 0), (0, 1), (1, 1))  # the unique entries of a 2x2 kernel
PAIR_NAMES = tuple(f"{a + 1}{b + 1}" for a, b in PAIRS)
VERTEX_KEYS = tuple(f"V_{PAIR_NAMES[i]}_{PAIR_NAMES[j]}" for i in range(3) for j in range(i, 3))


def _pair_moments(kind: str, K: np.ndarray, quad: Quad) -> tuple[np.ndarray, np.ndarray]:
    """S[p] = <s_a s_b>_K over the pairs p, and four[p, q] = <s_a s_b s_c s_d>_K (one 2-D grid)."""
    z1, z2, w = quad.grid2(K[0, 0], K[0, 1], K[1, 1])
    s1, s2 = sigma(kind, z1), sigma(kind, z2)
    E = lambda k1, k2: float(np.sum(w * s1**k1 * s2**k2))  # noqa: E731
    deg = [(2 - (a == 1) - (b == 1), (a == 1) + (b == 1)) for a, b in PAIRS]  # powers of s_1 and s_2
    S = np.array([E(*d) for d in deg])
    four = np.array([[E(d1[0] + d2[0], d1[1] + d2[1]) for d2 in deg] for d1 in deg])
    return S, four


def kernel_derivative(f, K: np.ndarray, a: int, b: int, h: float):
    """d f(K) / dK_ab by central differences of step h, perturbing the symmetric pair K_ab = K_ba together."""
    Kp, Km = K.copy(), K.copy()
    Kp[a, b] += h
    Km[a, b] -= h
    if a != b:
        Kp[b, a], Km[b, a] = Kp[a, b], Km[a, b]
    return (f(Kp) - f(Km)) / (2 * h)


def two_input_vertex(
    kind: str,
    c_w: float,
    c_b: float,
    X: np.ndarray,
    depth: int,
    widths: list[int] | None = None,
    interlayer: bool = True,
    quad: Quad | None = None,
    h_rel: float = 1e-4,
) -> list[dict]:
    """Per layer: the 2x2 kernel K and the four-point vertex V_{(ab)(cd)} of two inputs, n Cov(z_ia z_ib,
    z_kc z_kd) for i != k, over the unique pairs (11), (12), (22):
        V' = C_W^2 (<s_a s_b s_c s_d> - <s_a s_b><s_c s_d>) + r C_W^2 sum_{e,f} dS_ab/dK_e V_ef dS_cd/dK_f,
    the derivatives taken along the unique kernel entries e (central differences of the 2-D quadrature,
    which is smooth in K even for ReLU)."""
    quad = quad or Quad()
    X = np.asarray(X, dtype=float)
    if X.shape[0] != 2:
        raise ValueError("two_input_vertex needs exactly two inputs")
    widths = widths or [1] * depth
    K = c_b + c_w * X @ X.T / X.shape[1]
    V = np.zeros((3, 3))
    out = []

    def record(ell):
        out.append(
            {
                "layer": ell,
                "K_11": K[0, 0],
                "K_12": K[0, 1],
                "K_22": K[1, 1],
                **{f"V_{PAIR_NAMES[i]}_{PAIR_NAMES[j]}": V[i, j] for i in range(3) for j in range(i, 3)},
            }
        )

    record(1)
    for ell in range(1, depth):
        S, four = _pair_moments(kind, K, quad)
        h = h_rel * math.sqrt(K[0, 0] * K[1, 1])
        J = np.empty((3, 3))
        for e, (a, b) in enumerate(PAIRS):
            J[:, e] = kernel_derivative(lambda K_: _pair_moments(kind, K_, quad)[0], K, a, b, h)
        r = aspect_ratio(widths, ell) if interlayer else 0.0
        V = c_w**2 * (four - np.outer(S, S)) + r * c_w**2 * J @ V @ J.T
        K = c_b + c_w * np.array([[S[0], S[1]], [S[1], S[2]]])
        record(ell + 1)
    return out


# ---------------------------------------------------------------- closed forms (ReLU), used as references
def relu_arccos(K11: float, K12: float, K22: float) -> tuple[float, float]:
    """(E[relu(z1) relu(z2)], E[step(z1) step(z2)]): the degree-1 and degree-0 arc-cosine kernels."""
    s = math.sqrt(K11 * K22)
    th = math.acos(max(-1.0, min(1.0, K12 / s)))
    return s * (math.sin(th) + (math.pi - th) * math.cos(th)) / (2 * math.pi), (math.pi - th) / (2 * math.pi)
