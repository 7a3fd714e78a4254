"""Privacy accounting: opacus' RDP accountant for the Poisson-subsampled Gaussian mechanism (what the
pipeline uses), and a small independent integer-order RDP computation used by the tests as a check."""

import math

import numpy as np

from pipelines.prism.params import Params


def steps_and_rate(p: Params, n_train: int) -> tuple[int, float]:
    q = min(1.0, p.privacy.batch_size / n_train)
    return int(round(p.privacy.epochs / q)), q


def noise_multiplier(epsilon: float, delta: float, q: float, steps: int) -> float:
    import warnings

    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(
            get_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=q,
                steps=steps,
                accountant="rdp",
                epsilon_tolerance=0.005,
            )
        )


def epsilon_spent(sigma: float, delta: float, q: float, steps: int) -> float:
    import warnings

    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta))


# --- independent reference (integer orders, exact binomial expansion; Mironov et al. 2019, Balle et al. 2020)
def rdp_sampled_gaussian(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """RDP of one step of the Poisson-subsampled Gaussian at integer orders α ≥ 2:
    log Σ_k C(α,k)(1−q)^{α−k} q^k exp((k²−k)/(2σ²)) / (α−1)."""
    from scipy.special import gammaln

    out = []
    for a in orders.astype(int):
        k = np.arange(a + 1)
        logc = gammaln(a + 1) - gammaln(k + 1) - gammaln(a - k + 1)
        logq = k * math.log(q) + (a - k) * math.log1p(-q) if q < 1 else np.where(k == a, 0.0, -np.inf)
        terms = logc + logq + (k * k - k) / (2 * sigma**2)
        mx = terms.max()
        out.append((mx + math.log(np.exp(terms - mx).sum())) / (a - 1))
    return np.array(out)


def epsilon_reference(sigma: float, delta: float, q: float, steps: int, orders=None) -> float:
    orders = np.arange(2, 257) if orders is None else np.asarray(orders)
    rdp = steps * rdp_sampled_gaussian(q, sigma, orders)
    eps = rdp + np.log1p(-1 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    return float(np.nanmin(eps))


def sigma_reference(epsilon: float, delta: float, q: float, steps: int, tol: float = 1e-3) -> float:
    lo, hi = 0.1, 1.0
    while epsilon_reference(hi, delta, q, steps) > epsilon:
        hi *= 2
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if epsilon_reference(mid, delta, q, steps) <= epsilon else (mid, hi)
    return hi
