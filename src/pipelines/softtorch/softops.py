"""`softops`: soft, differentiable drop-in relaxations of hard PyTorch primitives (written here; the
function names and modes mirror the SoftTorch library's).

Every function takes ``softness`` (> 0) and ``mode`` ∈ {hard, smooth, c0, c1, c2}; ``mode="hard"``
returns the hard primitive exactly, and every soft op converges to it as softness → 0.

* elementwise: heaviside, sign, abs, relu, clamp, round, greater/less/eq (σ_s-based);
* fuzzy logic on SoftBools in [0, 1]: logical_and/or/not/xor, all, any, where;
* soft indices: argmax (simplex projection: softmax / sparsemax / α-entmax), max, take_along_dim;
* axiswise: argsort / sort / rank / topk / median with method ∈ {neuralsort, softsort, ot,
  fast_soft_sort, sorting_network, neuralsort_smoothabs} (a SoftIndex is a trailing n-dimension of
  weights over indices); ``neuralsort`` is Grover et al.'s published operator (exact |·| in A_s),
  ``neuralsort_smoothabs`` the SoftTorch library's variant with a soft |·|;
* straight-through: ``st(fn)`` (function level) and ``*_st`` helpers.
Axiswise ops work on the last dimension (``dim=-1``) of a 1-D or batched 2-D tensor.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

MODES = ("hard", "smooth", "c0", "c1", "c2")
SORT_METHODS = ("neuralsort", "softsort", "ot", "fast_soft_sort", "sorting_network")  # timed by data.speed
# opt-in: NeuralSort with a soft |·| in A_s, as the SoftTorch library computes it (not the published operator)
EXTRA_METHODS = ("neuralsort_smoothabs",)
STD_EPS = 1e-6


def _check(softness: float, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {MODES}")
    if mode != "hard" and not softness > 0:
        raise ValueError(f"softness: must be > 0 (got {softness})")


# ------------------------------------------------------------------------------------------ elementwise
def sigmoidal(x: torch.Tensor, softness: float = 0.1, mode: str = "smooth") -> torch.Tensor:
    """σ_s(x): logistic(x/s) (smooth) or, on u = x/(5s), a clipped ramp (c0), smoothstep (c1) or
    smootherstep (c2) that is exactly 0/1 outside |u| ≤ 1. Hard: the step 1[x > 0]."""
    _check(softness, mode)
    if mode == "hard":
        return (x > 0).to(x.dtype)
    if mode == "smooth":
        return torch.sigmoid(x / softness)
    t = ((x / (5 * softness) + 1) / 2).clamp(0, 1)
    if mode == "c0":
        return t
    if mode == "c1":
        return t * t * (3 - 2 * t)
    return t**3 * (t * (6 * t - 15) + 10)


heaviside = sigmoidal


def sign(x, softness=0.1, mode="smooth"):
    return torch.sign(x) if mode == "hard" else 2 * sigmoidal(x, softness, mode) - 1


def abs(x, softness=0.1, mode="smooth"):  # noqa: A001 (mirrors torch.abs)
    return torch.abs(x) if mode == "hard" else x * sign(x, softness, mode)


def relu(x, softness=0.1, mode="smooth", gated: bool = False):
    """Default: the integral of σ_s (softplus for smooth); ``gated``: x·σ_s(x)."""
    _check(softness, mode)
    if mode == "hard":
        return torch.relu(x)
    if gated:
        return x * sigmoidal(x, softness, mode)
    if mode == "smooth":
        return softness * torch.nn.functional.softplus(x / softness)
    t = ((x / (5 * softness) + 1) / 2).clamp(0, 1)
    if mode == "c0":
        inner = t * t / 2
    elif mode == "c1":
        inner = t**3 - t**4 / 2
    else:
        inner = t**6 - 3 * t**5 + 2.5 * t**4
    return torch.where(x >= 5 * softness, x, 10 * softness * inner)


def clamp(x, lo: float, hi: float, softness=0.1, mode="smooth"):
    if mode == "hard":
        return x.clamp(lo, hi)
    return lo + relu(x - lo, softness, mode) - relu(x - hi, softness, mode)


def round(x, softness=0.1, mode="smooth", neighbours: int = 5):  # noqa: A001
    """Σ_n n·(σ_s(x − n + ½) − σ_s(x − n − ½)) over the integers n within ±neighbours of ⌊x⌋."""
    if mode == "hard":
        return torch.round(x)
    base = torch.floor(x).detach()
    out = torch.zeros_like(x)
    for k in range(-neighbours, neighbours + 1):
        n = base + k
        out = out + n * (sigmoidal(x - n + 0.5, softness, mode) - sigmoidal(x - n - 0.5, softness, mode))
    return out


def greater(x, y, softness=0.1, mode="smooth"):
    return (x > y).to(torch.result_type(x, y)) if mode == "hard" else sigmoidal(x - y, softness, mode)


def less(x, y, softness=0.1, mode="smooth"):
    return greater(y, x, softness, mode)


def eq(x, y, softness=0.1, mode="smooth"):
    """Soft |x − y| ≤ 0 on the same σ_s: 1 at x = y, → 0 as |x − y| ≫ s."""
    if mode == "hard":
        return (x == y).to(torch.result_type(x, y))
    return 2 * (1 - sigmoidal(abs(x - y, softness, mode), softness, mode))


# ----------------------------------------------------------------------------------------- fuzzy logic
def logical_and(a, b):
    return a * b


def logical_or(a, b):
    return a + b - a * b


def logical_not(a):
    return 1 - a


def logical_xor(a, b):
    return a + b - 2 * a * b


def all(a, dim=-1):  # noqa: A001
    return a.prod(dim)


def any(a, dim=-1):  # noqa: A001
    return 1 - (1 - a).prod(dim)


def where(c, x, y):
    return c * x + (1 - c) * y


# ------------------------------------------------------------------------------------ simplex / argmax
class _EntmaxBisect(torch.autograd.Function):
    """α-entmax of z over the last dim, solved by bisection on the threshold τ; exact backward
    (Peters et al. 2019): with g = y^(2−α) on the support, dz = g·dy − g·(Σ g·dy)/Σ g."""

    @staticmethod
    def forward(ctx, z, alpha: float, iters: int):
        zs = (alpha - 1) * z
        hi = zs.max(-1, keepdim=True).values
        lo = hi - 1.0  # p(τ) ≥ 1 at τ = max − 1 (since (α−1)z − τ ≥ 1 there)
        ex = 1.0 / (alpha - 1)
        for _ in range(iters):
            tau = (lo + hi) / 2
            s = ((zs - tau).clamp_min(0) ** ex).sum(-1, keepdim=True)
            lo = torch.where(s >= 1, tau, lo)
            hi = torch.where(s >= 1, hi, tau)
        y = (zs - (lo + hi) / 2).clamp_min(0) ** ex
        y = y / y.sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        ctx.alpha = alpha
        return y

    @staticmethod
    def backward(ctx, gy):
        (y,) = ctx.saved_tensors
        g = torch.where(y > 0, y ** (2 - ctx.alpha), torch.zeros_like(y))
        dz = g * gy
        dz = dz - g * dz.sum(-1, keepdim=True) / g.sum(-1, keepdim=True)
        return dz, None, None


def sparsemax(z: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of z onto the simplex (last dim), closed form by sorting."""
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    cs = zs.cumsum(-1) - 1
    support = (k * zs > cs).sum(-1, keepdim=True)
    tau = cs.gather(-1, support - 1) / support.to(z.dtype)
    return (z - tau).clamp_min(0)


def argmax(x, dim=-1, softness=0.1, mode="smooth", iters: int = 60):
    """SoftIndex over ``dim``: the projection of x/s onto the simplex — softmax (smooth), sparsemax
    (c0), α-entmax with α = 1.5 (c1) or 4/3 (c2). Hard: a one-hot of torch.argmax."""
    _check(softness, mode)
    x = x.movedim(dim, -1)
    if mode == "hard":
        out = torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(x.dtype)
    elif mode == "smooth":
        out = torch.softmax(x / softness, -1)
    elif mode == "c0":
        out = sparsemax(x / softness)
    else:
        out = _EntmaxBisect.apply(x / softness, 1.5 if mode == "c1" else 4 / 3, iters)
    return out.movedim(-1, dim) if dim not in (-1, x.dim() - 1) else out


def max(x, dim=-1, softness=0.1, mode="smooth"):  # noqa: A001
    return (
        (argmax(x, -1, softness, mode) * x).sum(-1)
        if dim in (-1, x.dim() - 1)
        else max(x.movedim(dim, -1), -1, softness, mode)
    )


def argmin(x, dim=-1, softness=0.1, mode="smooth"):
    return argmax(-x, dim, softness, mode)


def min(x, dim=-1, softness=0.1, mode="smooth"):  # noqa: A001
    return -max(-x, dim, softness, mode)


def take_along_dim(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Soft gather: ``index`` is a SoftIndex (…, k, n) over the last dim of x (…, n) → (…, k)."""
    return (index * x.unsqueeze(-2)).sum(-1)


def index_select(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Soft index_select with one SoftIndex (…, n) over the last dim of x → (…)."""
    return (index * x).sum(-1)


# --------------------------------------------------------------------------------- sorting machinery
def _squash(x: torch.Tensor, standardize: bool):
    """(q, undo): z-score along the last dim then logistic squash into (0, 1); ``undo`` maps back."""
    if not standardize:
        return x, (lambda v: v)
    mu = x.mean(-1, keepdim=True)
    sd = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + STD_EPS)
    q = torch.sigmoid((x - mu) / sd)
    return q, (lambda v: torch.logit(v.clamp(1e-12, 1 - 1e-12)) * sd + mu)


def _perm_hard(x: torch.Tensor) -> torch.Tensor:
    """One-hot (…, n, n): row i selects the input at sorted (ascending) position i."""
    return torch.nn.functional.one_hot(torch.argsort(x, dim=-1, stable=True), x.shape[-1]).to(x.dtype)


def _neuralsort(q, softness, mode, smooth_abs: bool = False):
    """NeuralSort (Grover et al. 2019): P̂[i, :] = rowproj(((n + 1 − 2i)·s − A_s·1)/τ) with
    A_s[j, k] = |s_j − s_k|, row i the i-th largest (flipped here to ascending). ``rowproj`` is the
    softmax of the published operator in smooth mode, sparsemax / entmax in c0 / c1 / c2.
    ``smooth_abs`` (method ``neuralsort_smoothabs``, the SoftTorch library's choice) replaces the exact
    |·| in A_s by the soft abs of the same mode and softness; that is not the published operator."""
    n = q.shape[-1]
    d = q.unsqueeze(-1) - q.unsqueeze(-2)
    a = (abs(d, softness, "smooth" if mode == "hard" else mode) if smooth_abs else torch.abs(d)).sum(-1)
    i = torch.arange(1, n + 1, dtype=q.dtype, device=q.device)
    scaling = n + 1 - 2 * i  # row i picks the i-th LARGEST
    logits = (scaling.unsqueeze(-1) * q.unsqueeze(-2) - a.unsqueeze(-2)) / softness
    p = _row_proj(logits, mode)
    return p.flip(-2)  # ascending


def _row_proj(logits, mode):
    if mode in ("smooth", "hard"):
        return torch.softmax(logits, -1)
    if mode == "c0":
        return sparsemax(logits)
    return _EntmaxBisect.apply(logits, 1.5 if mode == "c1" else 4 / 3, 60)


def _softsort(q, softness, mode):
    s = torch.sort(q, -1).values
    logits = -torch.abs(s.unsqueeze(-1) - q.unsqueeze(-2)) / softness
    return _row_proj(logits, mode)


def _ot(q, softness, iters: int = 200, tol: float = 1e-6):
    """tol = 0 runs exactly ``iters`` iterations (the speed benchmark's fixed-iteration OT)."""
    """Entropic OT (log-domain Sinkhorn) between q and n anchors linspace(0, 1), uniform marginals,
    regulariser ``softness``; returns P̂ = n·Γᵀ (sorted position × input)."""
    n = q.shape[-1]
    b = torch.linspace(0, 1, n, dtype=q.dtype, device=q.device)
    c = (q.unsqueeze(-1) - b) ** 2  # (…, n_in, n_anchor)
    logk = -c / softness
    loga = torch.full(q.shape, -math.log(n), dtype=q.dtype, device=q.device)
    f = torch.zeros_like(q)
    g = torch.zeros_like(q)
    for _ in range(iters):
        f = loga - torch.logsumexp(logk + g.unsqueeze(-2), -1)
        g_new = loga - torch.logsumexp(logk + f.unsqueeze(-1), -2)
        done = tol > 0 and bool((g_new - g).abs().max() < tol)
        g = g_new
        if done:
            break
    gamma = torch.exp(logk + f.unsqueeze(-1) + g.unsqueeze(-2))
    p = n * gamma.transpose(-1, -2)
    if not torch.isfinite(p).all():
        raise FloatingPointError("softops.ot: Sinkhorn produced a non-finite plan (softness too small?)")
    return p


def _bitonic_layers(n_pad: int):
    layers = []
    k = 2
    while k <= n_pad:
        j = k // 2
        while j >= 1:
            i = np.arange(n_pad)
            l_ = i ^ j
            keep = l_ > i
            i, l_ = i[keep], l_[keep]
            asc = (i & k) == 0
            lo = np.where(asc, i, l_)  # position receiving the min
            hi = np.where(asc, l_, i)
            layers.append((torch.as_tensor(lo), torch.as_tensor(hi)))
            j //= 2
        k *= 2
    return layers


@functools.lru_cache(maxsize=32)
def _layers_cached(n_pad: int):
    return _bitonic_layers(n_pad)


def _sorting_network(q, softness, mode):
    """Soft bitonic network (pad to a power of 2 with values above the range) carrying the n×n soft
    permutation: each compare-swap mixes rows with α = σ_s(b − a) (the weight of a in the min)."""
    n = q.shape[-1]
    n_pad = 1 << (n - 1).bit_length()
    batch = q.shape[:-1]
    # padding sits far enough above the range that its compare-swaps saturate (σ_s(50) ≈ 1 − 2e-22)
    top = q.detach().max(-1, keepdim=True).values.abs() + 1 + 50 * softness
    v = torch.cat([q, top + torch.arange(n_pad - n, dtype=q.dtype, device=q.device)], -1) if n_pad > n else q
    p = torch.eye(n_pad, dtype=q.dtype, device=q.device).expand(*batch, n_pad, n_pad)
    for lo, hi in _layers_cached(n_pad):
        a, b = v[..., lo], v[..., hi]
        alpha = sigmoidal(b - a, softness, mode)
        pa, pb = p[..., lo, :], p[..., hi, :]
        al = alpha.unsqueeze(-1)
        v = v.clone()
        v[..., lo] = alpha * a + (1 - alpha) * b
        v[..., hi] = (1 - alpha) * a + alpha * b
        p = p.clone()
        p[..., lo, :] = al * pa + (1 - al) * pb
        p[..., hi, :] = (1 - al) * pa + al * pb
    return p[..., :n, :n]


def argsort(
    x,
    dim=-1,
    softness=0.1,
    mode="smooth",
    method="neuralsort",
    standardize=True,
    descending=False,
    ot_iters: int = 200,
    ot_tol: float = 1e-6,
):
    """SoftIndex (…, n, n): row i is a distribution over the inputs at sorted position i."""
    _check(softness, mode)
    if dim not in (-1, x.dim() - 1):
        raise ValueError("argsort: only the last dim is supported")
    if descending:
        return argsort(-x, -1, softness, mode, method, standardize, False, ot_iters, ot_tol)
    if mode == "hard":
        return _perm_hard(x)
    q, _ = _squash(x, standardize)
    if method in ("neuralsort", "neuralsort_smoothabs"):
        return _neuralsort(q, softness, mode, smooth_abs=method == "neuralsort_smoothabs")
    if method == "softsort":
        return _softsort(q, softness, mode)
    if method == "ot":
        return _ot(q, softness, ot_iters, ot_tol)
    if method == "sorting_network":
        return _sorting_network(q, softness, mode)
    if method == "fast_soft_sort":
        raise ValueError("argsort: fast_soft_sort gives values and ranks only (no soft permutation)")
    raise ValueError(f"method: {method!r} is not one of {SORT_METHODS + EXTRA_METHODS}")


# ------------------------------------------------------------------- fast soft sort (permutahedron)
class _IsotonicDecreasing(torch.autograd.Function):
    """v = argmin_{v1 ≥ … ≥ vn} ½‖v − y‖² per row (scipy's C++ PAV); the Jacobian averages within
    each PAV block, so the backward is the block mean of the incoming gradient."""

    @staticmethod
    def forward(ctx, y):
        from scipy.optimize import isotonic_regression

        y2 = y.detach().reshape(-1, y.shape[-1]).cpu().numpy().astype(np.float64)
        out = np.empty_like(y2)
        blocks = []
        for r in range(y2.shape[0]):
            res = isotonic_regression(y2[r], increasing=False)
            out[r] = res.x
            blocks.append(res.blocks)
        ctx.blocks = blocks
        ctx.shape = y.shape
        return torch.as_tensor(out, dtype=y.dtype, device=y.device).reshape(y.shape)

    @staticmethod
    def backward(ctx, gv):
        g = gv.detach().reshape(-1, gv.shape[-1]).cpu().numpy().astype(np.float64)
        out = np.empty_like(g)
        for r, bl in enumerate(ctx.blocks):
            sums = np.add.reduceat(g[r], bl[:-1])
            sizes = np.diff(bl)
            out[r] = np.repeat(sums / sizes, sizes)
        return torch.as_tensor(out, dtype=gv.dtype, device=gv.device).reshape(ctx.shape)


def isotonic_decreasing(y: torch.Tensor) -> torch.Tensor:
    return _IsotonicDecreasing.apply(y)


def project_permutahedron(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of z onto the permutahedron P(w) = conv{permutations of w} (Blondel et
    al. 2020): with σ sorting z descending and w sorted descending, P(z) = z − v_{σ⁻¹}, where v is
    the decreasing isotonic regression of z_σ − w."""
    ws = torch.sort(w, -1, descending=True).values
    perm = torch.argsort(z.detach(), dim=-1, descending=True, stable=True)
    zs = z.gather(-1, perm)
    v = isotonic_decreasing(zs - ws)
    out_sorted = zs - v
    return torch.empty_like(out_sorted).scatter(-1, perm, out_sorted)


def _fss_sort(q, softness):
    n = q.shape[-1]
    # anchors ρ/n in (0, 1], the squashed scale (as OT's), so softness is relative to that scale
    rho = torch.arange(n, 0, -1, dtype=q.dtype, device=q.device).expand_as(q) / n
    desc = project_permutahedron(rho / softness, q)  # ε→0: sorted q (descending); ε→∞: mean(q)
    return desc.flip(-1)


def _fss_rank(q, softness):
    n = q.shape[-1]
    rho = torch.arange(n, 0, -1, dtype=q.dtype, device=q.device).expand_as(q)
    return project_permutahedron(q / softness, rho)  # ascending ranks 1..n


# --------------------------------------------------------------------------------------- value ops
def sort(
    x,
    dim=-1,
    softness=0.1,
    mode="smooth",
    method="neuralsort",
    standardize=True,
    descending=False,
    ot_iters: int = 200,
    ot_tol: float = 1e-6,
):
    """Soft sorted values (ascending unless ``descending``). Permutation methods return P̂·x;
    fast_soft_sort projects onto the permutahedron in the squashed space and maps back."""
    _check(softness, mode)
    if mode == "hard":
        return torch.sort(x, -1, descending=descending).values
    if method == "fast_soft_sort":
        q, undo = _squash(x, standardize)
        out = undo(_fss_sort(q, softness))
        return out.flip(-1) if descending else out
    p = argsort(x, -1, softness, mode, method, standardize, False, ot_iters, ot_tol)
    out = take_along_dim(x, p)
    return out.flip(-1) if descending else out


def rank(x, dim=-1, softness=0.1, mode="smooth", method="neuralsort", standardize=True, ot_iters: int = 200):
    """Soft ascending ranks in [1, n] (rank n = largest)."""
    _check(softness, mode)
    n = x.shape[-1]
    pos = torch.arange(1, n + 1, dtype=x.dtype, device=x.device)
    if mode == "hard":
        return torch.argsort(torch.argsort(x, dim=-1, stable=True), -1).to(x.dtype) + 1
    if method == "fast_soft_sort":
        q, _ = _squash(x, standardize)
        return _fss_rank(q, softness)
    p = argsort(x, -1, softness, mode, method, standardize, False, ot_iters)
    p = p / p.sum(-2, keepdim=True).clamp_min(1e-30)  # each input's distribution over positions
    return (p * pos.unsqueeze(-1)).sum(-2)


def topk(x, k: int, softness=0.1, mode="smooth", method="neuralsort", standardize=True, ot_iters: int = 200):
    """(values, SoftIndex (…, k, n)) of the k largest, in descending order."""
    p = argsort(x, -1, softness, mode, method, standardize, descending=True, ot_iters=ot_iters)[..., :k, :]
    return take_along_dim(x, p), p


def topk_mask(x, k: int, softness=0.1, mode="smooth", method="neuralsort", standardize=True, ot_iters: int = 200):
    """Soft membership of each input in the top k (sums to k)."""
    if mode == "hard":
        idx = torch.topk(x, k, -1).indices
        return torch.zeros_like(x).scatter(-1, idx, 1.0)
    if method == "fast_soft_sort":
        r = rank(x, -1, softness, mode, method, standardize)
        # a logistic soft clamp (any mode) keeps a gradient at the all-tied start; hard as softness → 0
        return clamp(r - (x.shape[-1] - k), 0.0, 1.0, softness, "smooth")
    return topk(x, k, softness, mode, method, standardize, ot_iters)[1].sum(-2)


def median(x, dim=-1, softness=0.1, mode="smooth", method="neuralsort", standardize=True, ot_iters: int = 200):
    """The lower median (like torch.median) of the soft sorted values."""
    n = x.shape[-1]
    return sort(x, -1, softness, mode, method, standardize, ot_iters=ot_iters)[..., (n - 1) // 2]


# ---------------------------------------------------------------------------------- straight-through
def st(fn):
    """Function-level straight-through: the value is ``fn(..., mode="hard")``, the gradient is that of
    ``fn(..., mode=<soft mode>)`` with the same softness."""

    @functools.wraps(fn)
    def wrapped(*args, mode: str = "smooth", **kwargs):
        soft = fn(*args, mode=mode, **kwargs)
        hard = fn(*args, mode="hard", **kwargs)
        if isinstance(soft, tuple):
            return tuple(s + (h - s).detach() for s, h in zip(soft, hard))
        return soft + (hard - soft).detach()

    return wrapped


sort_st = st(sort)
rank_st = st(rank)
greater_st = st(greater)
clamp_st = st(clamp)
round_st = st(round)
