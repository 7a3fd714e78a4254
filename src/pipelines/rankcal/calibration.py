"""ECE-style estimators of full-ranking, sub-ranking (pairwise, triples) and top-k calibration (the
paper's calibration hierarchy), their consistency-resampling debiasing, bootstrap CIs and proper scores.

Every estimator reduces to binary "score vs indicator" problems scored with core.metrics' binned ECE
(``Σ_b (n_b/n)|acc_b − conf_b|``, equal-mass bins whose edges are score quantiles). Scores equal up to a
rounding tolerance are ties and always share a bin (splitting ties inflates the ECE of constant and
instance-based predictors, whose tied scores come out one rounding step apart from ``Q @ indicator``
sums); the top-k category is a tie-aware argmax (ties → the lowest category). Bins depend only on the
predictions, so the observed outcomes and all resampled outcomes are scored in one matrix product.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.core.api import argmax_ties, binned_ece, equal_mass_bins
from pipelines.rankcal import ranking as R

NOTIONS = ("full_conf", "full_cw", "pair", "triple_conf", "top1_conf", "top1_cw", "top2_conf")


@dataclass
class Groups:
    """The binary problems making one notion: scores (g, n) and the category each outcome must hit."""

    scores: np.ndarray  # (g, n)
    lut: np.ndarray  # (g, m!) permutation index → category
    target: np.ndarray  # (g, n) the category whose indicator is compared with the score


def notion_groups(Q: np.ndarray, m: int, notion: str) -> Groups | None:
    """The binary problems of one calibration notion for predictions Q (n, m!) (None: not defined)."""
    n, K = Q.shape
    P = R.perms(m)
    if notion in ("full_conf", "top1_conf", "top2_conf", "triple_conf"):  # top-label confidence
        if notion == "full_conf":
            luts, ncat = [np.arange(K)], K
        elif notion == "top1_conf":
            luts, ncat = [P[:, 0]], m
        elif notion == "top2_conf":
            if m < 3:
                return None
            prefixes, lut = R.prefix_lut(m, 2)
            luts, ncat = [lut], len(prefixes)
        else:  # sub-rankings of order 3 need 3 < m (A = [m] would be full calibration)
            if m < 4:
                return None
            _, lut = R.subset_lut(m, 3)
            luts, ncat = list(lut), 6
        scores, targets = [], []
        for lut in luts:
            marg = R.marginal(Q, lut, ncat)
            scores.append(marg.max(1))
            targets.append(argmax_ties(marg, axis=1))  # ties up to rounding → the lowest category
        return Groups(np.stack(scores), np.stack(luts), np.stack(targets))
    if notion == "pair":
        pairs, lut = R.pair_lut(m)
        return Groups(R.pairwise_marginals(Q, m).T, lut, np.zeros((len(pairs), n), dtype=np.int64))
    if notion in ("full_cw", "top1_cw"):
        if notion == "full_cw":
            lut, ncat = np.arange(K), K
        else:
            lut, ncat = P[:, 0], m
        marg = R.marginal(Q, lut, ncat)
        cats = np.arange(ncat)
        return Groups(marg.T, np.tile(lut, (ncat, 1)), np.repeat(cats[:, None], n, axis=1))
    raise ValueError(f"unknown calibration notion {notion!r}")


def notion_calibration_error(
    groups: Groups, outcomes: np.ndarray, n_bins: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Mean over the notion's binary problems of the ECE, for each row of ``outcomes`` (r, n) of
    permutation indices (or, with ``weights``, for each bootstrap resample of ``outcomes[0]``)."""
    outcomes = np.atleast_2d(outcomes)
    vals = []
    for s, lut, tgt in zip(groups.scores, groups.lut, groups.target):
        ind = lut[outcomes] == tgt[None, :]
        vals.append(binned_ece(s, ind, n_bins, weights))
    return np.mean(vals, axis=0)


def calibration_metrics(
    Q: np.ndarray,
    y: np.ndarray,
    m: int,
    *,
    n_bins: int = 15,
    n_debias: int = 20,
    n_bootstrap: int = 0,
    full_cw_max_m: int = 4,
    rng: np.random.Generator | None = None,
    notions: tuple[str, ...] = NOTIONS,
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Every ``ece_<notion>`` and ``ece_<notion>_db`` of predictions Q (n, m!) against observed
    permutation indices y (n,), plus bootstrap 95% CIs of both when ``n_bootstrap`` > 0.

    Debiasing (consistency resampling): outcomes redrawn from the model's own Q are, by construction,
    calibrated; their mean ECE is the estimator's bias at this n and is subtracted."""
    rng = rng or np.random.default_rng(0)
    y = np.asarray(y, dtype=np.int64)
    resampled = R.sample_table(Q, rng, n_debias) if n_debias else np.empty((0, len(y)), dtype=np.int64)
    outcomes = np.vstack([y[None], resampled])
    weights = None
    if n_bootstrap:
        weights = rng.multinomial(len(y), np.full(len(y), 1.0 / len(y)), size=n_bootstrap).astype(float)
    out: dict[str, float] = {}
    ci: dict[str, tuple[float, float]] = {}
    for notion in notions:
        if notion == "full_cw" and m > full_cw_max_m:
            continue  # m! classes: class-wise full ECE is meaningless beyond m = 4
        g = notion_groups(Q, m, notion)
        if g is None:
            continue
        vals = notion_calibration_error(g, outcomes, n_bins)
        bias = float(vals[1:].mean()) if n_debias else 0.0
        out[f"ece_{notion}"] = float(vals[0])
        out[f"ece_{notion}_db"] = float(vals[0]) - bias
        if weights is not None:
            boot = notion_calibration_error(g, outcomes[:1], n_bins, weights)
            lo, hi = np.quantile(boot, [0.025, 0.975])
            ci[f"ece_{notion}"] = (float(lo), float(hi))
            ci[f"ece_{notion}_db"] = (float(lo) - bias, float(hi) - bias)
    return out, ci


def proper_scores(Q: np.ndarray, y: np.ndarray, m: int) -> dict[str, float]:
    """Full-ranking NLL, pairwise and top-1 Brier, Kendall τ of the predicted mode, top-1 accuracy."""
    n = len(y)
    q_obs = Q[np.arange(n), y]
    _, plut = R.pair_lut(m)
    p = R.pairwise_marginals(Q, m)
    won = (plut[:, y] == 0).T.astype(float)  # (n, n_pairs) 1[i ≻_Y j]
    top = R.top1_marginal(Q, m)
    first = R.perms(m)[y, 0]
    onehot = np.eye(m)[first]
    mode = argmax_ties(Q, axis=1)
    return {
        "nll": float(-np.log(np.maximum(q_obs, 1e-300)).mean()),
        "brier_pair": float(((p - won) ** 2).mean()),
        "brier_top1": float(((top - onehot) ** 2).sum(1).mean()),
        "kendall_tau_mode": float(R.kendall_tau(mode, y, m).mean()),
        "top1_acc": float((argmax_ties(top, axis=1) == first).mean()),
    }


def reliability_points(
    scores: np.ndarray, indicators: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-mass bin: mean score, observed frequency, count (for reliability diagrams)."""
    ids = equal_mass_bins(scores, n_bins)
    cnt = np.bincount(ids)
    keep = cnt > 0
    conf = np.bincount(ids, scores)[keep] / cnt[keep]
    acc = np.bincount(ids, indicators.astype(float))[keep] / cnt[keep]
    return conf, acc, cnt[keep]
