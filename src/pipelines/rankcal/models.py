"""The "popular" probabilistic label-ranking models whose calibration the paper examines, each
returning an explicit predictive table Q(π | x) over all m! orderings (m ≤ 6):

- PL-lin (Cheng et al. 2010): Plackett–Luce with log v_j(x) = w_jᵀx + b_j, L2-penalised MLE (L-BFGS);
- IB-PL: k nearest neighbours' rankings → local PL by Hunter's MM algorithm with a Gamma prior;
- IB-Mallows: k-NN → exact Kemeny centre (enumeration) and θ by MLE (Cheng & Hüllermeier 2009);
- RPC-BT: ranking by pairwise comparison (one logistic regression per label pair), turned into a
  distribution by fitting a Bradley–Terry / PL model to each instance's p_ij;
- rankings-as-classes: multinomial logistic regression over observed permutations (m ≤ 4);
- neural PL (MLP scores) and its temperature-scaled copy (the recalibration variant);
- uniform: the constant 1/m! anchor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipelines.core.api import fit
from pipelines.rankcal import ranking as R


def _pl_nll_torch(scores: torch.Tensor, orderings: torch.Tensor) -> torch.Tensor:
    """Mean negative PL log-likelihood of observed orderings (logsumexp: scores may be ≫ 1)."""
    s = torch.gather(scores, 1, orderings)
    tail = torch.logcumsumexp(s.flip(1), dim=1).flip(1)
    return -(s - tail).sum(1).mean()


# --------------------------------------------------------------------------- PL-lin
class LinearScores(torch.nn.Module):
    """log v_j(x) = w_jᵀx + b_j, in float64, started at zero (the convex problem's usual start)."""

    def __init__(self, d: int, m: int) -> None:
        super().__init__()
        self.W = torch.nn.Parameter(torch.zeros(d, m, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.zeros(m, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.W + self.b


def _lbfgs(max_iter: int, tolerance_grad: float):
    """One L-BFGS solve of a convex problem (core.training.fit with one full-batch step)."""
    return lambda params: torch.optim.LBFGS(
        params,
        lr=1,
        max_iter=max_iter,
        tolerance_grad=tolerance_grad,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )


def _full_batch(*tensors: torch.Tensor):
    return lambda step, gen: tensors  # the whole data every step (no shuffling: float-identical sums)


def fit_pl_lin(x: np.ndarray, o: np.ndarray, m: int, l2: float) -> tuple[np.ndarray, np.ndarray]:
    """(W (d, m), b (m,)) maximising the PL likelihood − l2‖W‖² by L-BFGS in float64."""
    model = LinearScores(x.shape[1], m)
    X = torch.as_tensor(x, dtype=torch.float64)
    O = torch.as_tensor(o)
    fit(
        model,
        None,
        lambda net, xb, ob: _pl_nll_torch(net(xb), ob) + l2 * (net.W**2).sum(),
        sample_batch=_full_batch(X, O),
        steps=1,
        optimizer=_lbfgs(300, 1e-8),
        grad_clip=None,
        desc="rankcal.pl_lin",
        progress=False,
    )
    return model.W.detach().numpy(), model.b.detach().numpy()


# --------------------------------------------------------------------------- instance-based
def knn_orderings(x_train: np.ndarray, o_train: np.ndarray, x_query: np.ndarray, k: int) -> np.ndarray:
    """(n_query, k, m) orderings of each query's k nearest training instances (Euclidean)."""
    from sklearn.neighbors import NearestNeighbors

    k = min(k, len(x_train))
    _, idx = NearestNeighbors(n_neighbors=k).fit(x_train).kneighbors(x_query)
    return o_train[idx]


def pl_mm(neigh: np.ndarray, alpha: float, iters: int) -> np.ndarray:
    """Hunter's (2004) MM for PL on each query's neighbour rankings (n, k, m), with a Gamma prior that
    adds ``alpha`` pseudo-wins per label (MAP under Gamma(shape 1 + α, rate α), mode 1): a label
    never ranked above another keeps v > 0, so the NLL of an unseen ordering stays finite.

    Update: v_j ← (w_j + α) / (α + Σ_rankings Σ_{stages r ≤ pos_j, r < m−1} 1 / Σ_{l unplaced at r} v_l),
    where w_j counts the stages at which j was chosen (every position but the last)."""
    n, k, m = neigh.shape
    pos = np.argsort(neigh, axis=2)  # (n, k, m) position of label j in each neighbour ranking
    wins = (pos < m - 1).sum(1).astype(float)  # (n, m)
    v = np.ones((n, m))
    rows = np.arange(n)[:, None, None]
    stage_pos = np.minimum(pos, m - 2)
    for _ in range(iters):
        vo = v[rows, neigh]  # (n, k, m) weights in ranked order
        denom = np.cumsum(vo[..., ::-1], axis=2)[..., ::-1]  # Σ over labels still unplaced at stage r
        inv = np.cumsum(1.0 / denom[..., : m - 1], axis=2)  # Σ_{r' ≤ r} 1 / denom_r'
        contrib = np.take_along_axis(inv, stage_pos, axis=2).sum(1)  # (n, m)
        # no rescaling: the prior (unlike the likelihood) fixes the scale of v
        v = (wins + alpha) / (alpha + contrib)
    return v


def ib_pl_table(neigh: np.ndarray, alpha: float, iters: int) -> np.ndarray:
    return R.pl_table(np.log(pl_mm(neigh, alpha, iters)))


def ib_mallows_table(neigh: np.ndarray, m: int, theta_max: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact Kemeny centre of each query's neighbours (enumeration over S_m, ties → lowest index)
    and θ solving E_θ[d_K] = mean neighbour distance, capped at ``theta_max``."""
    n, k, _ = neigh.shape
    idx = R.perm_index(neigh.reshape(-1, m)).reshape(n, k)
    counts = np.zeros((n, len(R.perms(m))))
    np.add.at(counts, (np.arange(n)[:, None], idx), 1.0)
    D = R.kendall_matrix(m).astype(float)
    total = counts @ D  # Σ_neighbours d_K(candidate, neighbour)
    centre = total.argmin(1)
    dbar = total[np.arange(n), centre] / k
    theta = R.mallows_theta_mle(dbar, m, theta_max)
    return R.mallows_table(centre, theta, m), theta


# --------------------------------------------------------------------------- RPC-BT
def rpc_pairwise(x_train: np.ndarray, o_train: np.ndarray, x_query: np.ndarray, m: int) -> np.ndarray:
    """(n_query, n_pairs) p_ij from one logistic regression per pair i < j; a pair whose order never
    flips in training gets the Laplace-smoothed constant (wins + 1) / (n + 2)."""
    from sklearn.linear_model import LogisticRegression

    pairs, _ = R.pair_lut(m)
    pos = np.argsort(o_train, axis=1)
    out = np.empty((len(x_query), len(pairs)))
    for c, (i, j) in enumerate(pairs):
        y = (pos[:, i] < pos[:, j]).astype(int)
        if y.min() == y.max():
            out[:, c] = (y.sum() + 1) / (len(y) + 2)
        else:
            out[:, c] = LogisticRegression(C=1.0, max_iter=1000).fit(x_train, y).predict_proba(x_query)[:, 1]
    return out


def bt_from_pairwise(p: np.ndarray, m: int, l2: float = 1e-4) -> np.ndarray:
    """Per-instance BT scores s (n, m) maximising Σ_{i<j} p_ij log σ(s_i − s_j) + (1 − p_ij) log σ(s_j − s_i)
    (batched L-BFGS; the problems are independent, so the summed objective is block-separable).
    A small L2 fixes the free shift and keeps scores finite for p near 0 or 1."""
    pairs, _ = R.pair_lut(m)
    I = torch.tensor([a for a, _ in pairs])
    J = torch.tensor([b for _, b in pairs])
    P = torch.as_tensor(np.clip(p, 1e-6, 1 - 1e-6), dtype=torch.float64)
    holder = torch.nn.ParameterDict({"s": torch.nn.Parameter(torch.zeros(p.shape[0], m, dtype=torch.float64))})
    logsig = torch.nn.functional.logsigmoid

    def loss_fn(h, pb):
        d = h["s"][:, I] - h["s"][:, J]
        return -(pb * logsig(d) + (1 - pb) * logsig(-d)).sum() + l2 * (h["s"] ** 2).sum()

    fit(
        holder,
        None,
        loss_fn,
        sample_batch=_full_batch(P),
        steps=1,
        optimizer=_lbfgs(100, 1e-7),
        grad_clip=None,
        desc="rankcal.rpc_bt",
        progress=False,
    )
    return holder["s"].detach().numpy()


# --------------------------------------------------------------------------- rankings as classes
def rankings_as_classes(
    x_train: np.ndarray, y_train: np.ndarray, x_query: np.ndarray, m: int, eps: float
) -> np.ndarray:
    """Multinomial LR over the permutations seen in training; each unseen permutation gets mass ε
    before renormalising (else the NLL of an unseen test ranking is infinite)."""
    from sklearn.linear_model import LogisticRegression

    K = len(R.perms(m))
    Q = np.full((len(x_query), K), eps)
    classes = np.unique(y_train)
    if len(classes) == 1:
        Q[:, classes[0]] = 1.0
    else:
        lr = LogisticRegression(C=1.0, max_iter=2000).fit(x_train, y_train)
        Q[:, lr.classes_] = lr.predict_proba(x_query)
    return Q / Q.sum(1, keepdims=True)


# --------------------------------------------------------------------------- neural PL + TS
@dataclass
class NeuralPL:
    scores_query: np.ndarray  # (n_query, m) log-weights at T = 1
    scores_hold: np.ndarray  # (n_hold, m) log-weights of the held-out part (empty: no hold-out)
    orderings_hold: np.ndarray  # (n_hold, m) its observed orderings


def fit_temperature(scores: np.ndarray, orderings: np.ndarray, t_min: float, t_max: float) -> float:
    """T minimising the held-out PL NLL of scores / T by a bounded 1-D search on log T (an
    unbounded L-BFGS on log T diverges when scores are large)."""
    from scipy.optimize import minimize_scalar

    def nll(log_t: float) -> float:
        return float(-R.pl_log_likelihood(scores / np.exp(log_t), orderings).mean())

    res = minimize_scalar(nll, bounds=(np.log(t_min), np.log(t_max)), method="bounded", options={"xatol": 1e-4})
    return float(np.exp(res.x))


def fit_neural_pl(
    x: np.ndarray,
    o: np.ndarray,
    x_query: np.ndarray,
    m: int,
    hidden: list[int],
    steps: int,
    lr: float,
    holdout_fraction: float,
    min_holdout: int,
    seed: int,
) -> NeuralPL:
    """MLP scores trained with full-batch Adam on the PL likelihood (core.training.fit). A held-out part
    (for the temperature of ``neural_pl_ts``) is kept out of training only when it has at least
    ``min_holdout`` rankings (else the net trains on everything and the hold-out is empty)."""
    rng = np.random.default_rng(seed)
    n_hold = int(round(holdout_fraction * len(x)))
    if n_hold >= min_holdout:
        perm = rng.permutation(len(x))
        hold, fit_idx = perm[:n_hold], perm[n_hold:]
    else:
        hold, fit_idx = np.array([], dtype=int), np.arange(len(x))
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    width = x.shape[1]
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, m))
    X = torch.as_tensor(x[fit_idx], dtype=torch.float32)
    O = torch.as_tensor(o[fit_idx])
    fit(
        net,
        None,
        lambda mdl, xb, ob: _pl_nll_torch(mdl(xb), ob),
        sample_batch=_full_batch(X, O),
        steps=steps,
        lr=lr,
        optimizer="adam",
        weight_decay=0.0,
        grad_clip=None,
        seed=seed,
        desc="rankcal.neural_pl",
    )
    with torch.no_grad():
        sq = net(torch.as_tensor(x_query, dtype=torch.float32)).double().numpy()
        sh = net(torch.as_tensor(x[hold], dtype=torch.float32)).double().numpy() if len(hold) else np.zeros((0, m))
    return NeuralPL(sq, sh, o[hold] if len(hold) else np.zeros((0, m), dtype=np.int64))
