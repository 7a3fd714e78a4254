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

from pipelines.core.training import check_finite
from pipelines.rankcal import ranking as R


def _pl_nll_torch(scores: torch.Tensor, orderings: torch.Tensor) -> torch.Tensor:
    """Mean negative PL log-likelihood of observed orderings (logsumexp: scores may be ≫ 1)."""
    s = torch.gather(scores, 1, orderings)
    tail = torch.logcumsumexp(s.flip(1), dim=1).flip(1)
    return -(s - tail).sum(1).mean()


# --------------------------------------------------------------------------- PL-lin
def fit_pl_lin(x: np.ndarray, o: np.ndarray, m: int, l2: float) -> tuple[np.ndarray, np.ndarray]:
    """(W (d, m), b (m,)) maximising the PL likelihood − l2‖W‖² by L-BFGS in float64."""
    X = torch.as_tensor(x, dtype=torch.float64)
    O = torch.as_tensor(o)
    W = torch.zeros(x.shape[1], m, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(m, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], lr=1, max_iter=300, tolerance_grad=1e-8, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = _pl_nll_torch(X @ W + b, O) + l2 * (W**2).sum()
        check_finite(loss, "pl_lin", 0, 0)
        loss.backward()
        return loss

    opt.step(closure)
    return W.detach().numpy(), b.detach().numpy()


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
    s = torch.zeros(p.shape[0], m, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([s], lr=1, max_iter=100, tolerance_grad=1e-7, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")
    logsig = torch.nn.functional.logsigmoid

    def closure():
        opt.zero_grad()
        d = s[:, I] - s[:, J]
        loss = -(P * logsig(d) + (1 - P) * logsig(-d)).sum() + l2 * (s**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return s.detach().numpy()


# --------------------------------------------------------------------------- rankings as classes
def rankings_as_classes(x_train: np.ndarray, y_train: np.ndarray, x_query: np.ndarray, m: int,
                        eps: float) -> np.ndarray:
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
    scores_query: np.ndarray   # (n_query, m) log-weights at T = 1
    temperature: float         # fitted on the held-out part (1.0 when it was too small)
    heldout: int               # rankings in the held-out part (0: no hold-out)


def fit_temperature(scores: np.ndarray, orderings: np.ndarray, t_min: float, t_max: float) -> float:
    """T minimising the held-out PL NLL of scores / T by a bounded 1-D search on log T (an
    unbounded L-BFGS on log T diverges when scores are large)."""
    from scipy.optimize import minimize_scalar

    def nll(log_t: float) -> float:
        return float(-R.pl_log_likelihood(scores / np.exp(log_t), orderings).mean())

    res = minimize_scalar(nll, bounds=(np.log(t_min), np.log(t_max)), method="bounded",
                          options={"xatol": 1e-4})
    return float(np.exp(res.x))


def fit_neural_pl(x: np.ndarray, o: np.ndarray, x_query: np.ndarray, m: int, hidden: list[int], steps: int,
                  lr: float, holdout_fraction: float, min_holdout: int, t_min: float, t_max: float,
                  seed: int) -> NeuralPL:
    """MLP scores trained with full-batch Adam on the PL likelihood; T is fitted on a held-out part
    only when that part has at least ``min_holdout`` rankings (else trained on everything, T = 1)."""
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
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for step in range(steps):
        loss = _pl_nll_torch(net(X), O)
        check_finite(loss, "neural_pl", 0, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        sq = net(torch.as_tensor(x_query, dtype=torch.float32)).double().numpy()
        T = 1.0
        if len(hold):
            sh = net(torch.as_tensor(x[hold], dtype=torch.float32)).double().numpy()
            T = fit_temperature(sh, o[hold], t_min, t_max)
    return NeuralPL(sq, T, len(hold))
