"""The bulk-calibrated credal objective and its baselines as convex programs in cvxpy.

- Bulk sets (split-conformal, on the calibration split): a demand box [0, u] and Mahalanobis ellipsoids
  {μ + Lu : ‖u‖ ≤ r}, with u / r the ⌈(n_cal + 1)(1 − α)⌉-th smallest calibration score.
- Robust objective (mean + sup): R(θ) = Σ_i w_i ℓ(θ, ξ_i) + ε·sup_{ξ∈B} ℓ(θ, ξ), w_i = (1 − ε)/n (+ the
  optional tail term κ_t·1{ξ_i ∉ B}/n). The sup has a closed form for each (loss, bulk) pair used:
  newsvendor on a box → the larger endpoint cost (LP); absolute residual on an ellipsoid →
  |aᵀμ − b0| + r‖Lᵀa‖ (SOCP); logistic on per-class ellipsoids → max_y log(1 + exp(−y(wᵀμ_y + b) +
  r_y‖L_yᵀw‖)) (exponential cone).
- Baselines on the same loss: ERM, Huber contamination with a κ-inflated bounded support (the same sup
  over a box), Wasserstein-1 (ERM + ρ·Lip), CVaR_β (Rockafellar–Uryasev) and KL-DRO (exponential-cone
  dual).

Every solve goes through :func:`solve`: a solver that does not return ``optimal`` (infeasible, unbounded,
inaccurate, error) hands over to the next one in ``solver.order``; if none succeeds, :class:`SolverError`
names the instance (task, variant, seed, hyper-parameters) and what each solver said — never a NaN.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


class SolverError(RuntimeError):
    """No solver returned an optimal solution; the message names the instance and each solver's status."""


@dataclass
class Solved:
    value: float
    solver: str
    wall_s: float  # cvxpy compile + solve, all solvers tried until this one (what a user waits)
    solve_s: float  # the solver's own time
    cpu_s: float  # process CPU time of wall_s (insensitive to other jobs on a shared machine)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    inaccurate: bool = False  # accepted at the solver's reduced tolerances (``optimal_inaccurate``)
    tries: str = ""  # what the solvers tried before said


_WARM: set[str] = set()


def warm_up(order) -> None:
    """Solve a 1-variable LP once per solver and process, so the first timed solve does not pay for
    cvxpy's and the solver's lazy imports and first-call set-up (seconds on a cold process)."""
    import cvxpy as cp

    for name in order:
        if name not in _WARM:
            x = cp.Variable()
            try:
                cp.Problem(cp.Minimize(cp.abs(x - 1))).solve(solver=name)
            except cp.error.SolverError:
                pass
            _WARM.add(name)


def solve(
    prob, instance: str, order: tuple[str, ...] | list[str] = ("CLARABEL", "SCS"), accept_inaccurate: bool = True
) -> Solved:
    """Solve ``prob`` with the solvers in ``order``: the first that reports ``optimal`` — or, when
    ``accept_inaccurate``, ``optimal_inaccurate`` (it stopped at its reduced tolerances, typically on a
    degenerate optimum such as w = 0; flagged in the result) — with a finite value and finite variables
    wins. Anything else (infeasible, unbounded, a solver error, non-finite values) hands over to the next
    solver; when none is left, :class:`SolverError` names the instance and what every solver said."""
    import cvxpy as cp

    tried = []
    good = (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) if accept_inaccurate else (cp.OPTIMAL,)
    warm_up(order)
    t0, c0 = time.perf_counter(), time.process_time()
    for name in order:
        try:
            prob.solve(solver=name)
        except cp.error.SolverError as exc:  # a numerical breakdown inside the solver
            tried.append(f"{name}: solver error ({str(exc).splitlines()[0][:80]})")
            continue
        except cp.error.DCPError as exc:  # a modelling bug, not a numerical one: stop here
            raise SolverError(f"{instance}: the problem is not DCP ({exc})") from None
        status = prob.status
        vals = {v.name(): v.value for v in prob.variables()}
        finite = (
            prob.value is not None
            and math.isfinite(prob.value)
            and all(v is not None and np.all(np.isfinite(v)) for v in vals.values())
        )
        if finite and status in good:
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if status != cp.OPTIMAL:
                log.warning("%s: %s returned %s (accepted, flagged)", instance, name, status)
            return Solved(
                float(prob.value),
                name,
                wall,
                float(prob.solver_stats.solve_time or wall),
                cpu,
                {k: np.asarray(v, float) for k, v in vals.items()},
                status != cp.OPTIMAL,
                "; ".join(tried),
            )
        tried.append(f"{name}: {status}" + ("" if finite or status not in good else " with non-finite values"))
    raise SolverError(f"{instance}: no solver returned an optimal solution ({'; '.join(tried)})")


# ------------------------------------------------------------------------------------------ bulk sets
def conformal_index(n_cal: int, alpha: float, instance: str = "bulk") -> int:
    """The 1-based rank ⌈(n_cal + 1)(1 − α)⌉ of the calibration score that is the bulk radius."""
    k = math.ceil((n_cal + 1) * (1 - alpha) - 1e-12)
    if k > n_cal:
        raise ValueError(
            f"{instance}: {n_cal} calibration points cannot give coverage 1 − α = {1 - alpha:g} "
            f"(need n_cal >= {math.ceil(1 / alpha - 1)})"
        )
    return k


def conformal_radius(scores: np.ndarray, alpha: float, instance: str = "bulk") -> float:
    s = np.sort(np.asarray(scores, float))
    return float(s[conformal_index(len(s), alpha, instance) - 1])


@dataclass
class Ellipsoid:
    """{μ + L u : ‖u‖₂ ≤ r}, i.e. (ξ − μ)ᵀΣ⁻¹(ξ − μ) ≤ r² with Σ = LLᵀ."""

    mu: np.ndarray
    L: np.ndarray
    r: float

    def scores(self, xi: np.ndarray) -> np.ndarray:
        from scipy.linalg import solve_triangular

        return np.linalg.norm(solve_triangular(self.L, (np.atleast_2d(xi) - self.mu).T, lower=True), axis=0)

    def contains(self, xi: np.ndarray) -> np.ndarray:
        return self.scores(xi) <= self.r * (1 + 1e-12)


def scatter(fit: np.ndarray, covariance: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Location and Cholesky factor of the scatter: the sample mean/covariance or MinCovDet."""
    if covariance == "mcd":
        from sklearn.covariance import MinCovDet

        mcd = MinCovDet(random_state=seed).fit(fit)
        mu, cov = mcd.location_, mcd.covariance_
    else:
        mu, cov = fit.mean(0), np.cov(fit, rowvar=False)
    cov = np.atleast_2d(cov) + 1e-8 * np.eye(fit.shape[1])  # a flat direction must not break Cholesky
    return mu, np.linalg.cholesky(cov)


def ellipsoid_bulk(
    fit: np.ndarray, calib: np.ndarray, alpha: float, covariance: str = "sample", seed: int = 0, instance: str = "bulk"
) -> Ellipsoid:
    """Shape from the fit split, radius calibrated on the held-out calibration split."""
    mu, L = scatter(fit, covariance, seed)
    e = Ellipsoid(mu, L, 0.0)
    e.r = conformal_radius(e.scores(calib), alpha, instance)
    return e


# ---------------------------------------------------------------------------------- task definitions
class Task:
    """A loss ℓ(θ, ξ) on a sample, its sup over a bulk (box or ellipsoids) and its Lipschitz constant."""

    loss_scale: float = 1.0  # typical loss size (KL's exponential cones work on ℓ / scale)

    def variables(self) -> dict: ...
    def penalty(self, v: dict):  # a regulariser shared by every formulation (0: none)
        return 0.0

    def losses(self, v: dict): ...  # cvxpy expression (n,) of per-sample losses on the reference
    def lipschitz(self, v: dict): ...  # Lip of ℓ in ξ (Wasserstein-1 dual)


@dataclass
class NewsvendorTask(Task):
    xi: np.ndarray  # reference demand sample
    h: float
    b: float

    @property
    def loss_scale(self) -> float:
        return max(self.h, self.b) * max(float(np.median(self.xi)), 1e-9)

    def variables(self) -> dict:
        import cvxpy as cp

        return {"x": cp.Variable(nonneg=True, name="x")}

    def losses(self, v):
        import cvxpy as cp

        x = v["x"]
        return cp.maximum(self.h * (x - self.xi), self.b * (self.xi - x))

    def sup_box(self, v, lo: float, hi: float):
        """ℓ is convex piecewise linear in ξ: its sup over [lo, hi] sits at an endpoint."""
        import cvxpy as cp

        x = v["x"]
        return cp.maximum(self.h * (x - lo), self.b * (hi - x))

    def lipschitz(self, v):
        return max(self.h, self.b)  # does not depend on x: Wasserstein DRO orders what SAA orders


@dataclass
class RegressionTask(Task):
    X: np.ndarray
    y: np.ndarray

    def variables(self) -> dict:
        import cvxpy as cp

        return {"w": cp.Variable(self.X.shape[1], name="w"), "b0": cp.Variable(name="b0")}

    def losses(self, v):
        import cvxpy as cp

        return cp.abs(self.y - self.X @ v["w"] - v["b0"])

    def _a(self, v):
        import cvxpy as cp

        return cp.hstack([-v["w"], np.ones(1)])  # residual = aᵀξ − b0 with ξ = (x, y)

    def sup_ellipsoid(self, v, e: Ellipsoid):
        import cvxpy as cp

        a = self._a(v)
        return cp.abs(e.mu @ a - v["b0"]) + e.r * cp.norm(e.L.T @ a, 2)

    def sup_box(self, v, centre: np.ndarray, half: np.ndarray):
        import cvxpy as cp

        a = self._a(v)
        return cp.abs(centre @ a - v["b0"]) + cp.norm(cp.multiply(half, a), 1)

    def lipschitz(self, v):
        import cvxpy as cp

        return cp.norm(self._a(v), 2)  # ℓ2 transport cost on (x, y)


@dataclass
class ClassificationTask(Task):
    X: np.ndarray
    y: np.ndarray  # ±1
    l2: float = 0.0  # λ‖w‖², the same for every variant (a separable sample has no logistic minimiser)

    def penalty(self, v):
        import cvxpy as cp

        return self.l2 * cp.sum_squares(v["w"]) if self.l2 else 0.0

    def variables(self) -> dict:
        import cvxpy as cp

        return {"w": cp.Variable(self.X.shape[1], name="w"), "b0": cp.Variable(name="b0")}

    def losses(self, v):
        import cvxpy as cp

        return cp.logistic(-cp.multiply(self.y, self.X @ v["w"] + v["b0"]))

    def sup_ellipsoids(self, v, ells: dict[int, Ellipsoid]):
        """The bulk is the union of per-class ellipsoids × {class}: the max of the per-class sups."""
        import cvxpy as cp

        terms = [
            cp.logistic(-yk * (e.mu @ v["w"] + v["b0"]) + e.r * cp.norm(e.L.T @ v["w"], 2)) for yk, e in ells.items()
        ]
        return cp.maximum(*terms) if len(terms) > 1 else terms[0]

    def sup_box(self, v, centre: np.ndarray, half: np.ndarray):
        import cvxpy as cp

        spread = cp.norm(cp.multiply(half, v["w"]), 1)
        return cp.maximum(*[cp.logistic(-yk * (centre @ v["w"] + v["b0"]) + spread) for yk in (-1, 1)])

    def lipschitz(self, v):
        import cvxpy as cp

        return cp.norm(v["w"], 2)  # transport on x only (labels fixed)


# ------------------------------------------------------------------------------------------ objectives
def objective(
    task: Task,
    kind: str,
    v: dict,
    *,
    eps: float = 0.0,
    sup=None,
    weights: np.ndarray | None = None,
    rho: float = 0.0,
    beta: float = 1.0,
):
    """(objective expression, extra constraints) of one DRO formulation on ``task``'s reference sample."""
    import cvxpy as cp

    loss = task.losses(v)
    n = loss.shape[0]
    if kind == "erm" or (kind in ("wasserstein", "kl") and rho == 0):
        return cp.sum(loss) / n, []
    if kind in ("credal", "huber"):  # mean + sup (the sup over the bulk or the κ-box)
        w = np.full(n, (1 - eps) / n) if weights is None else weights
        return w @ loss + eps * sup, []
    if kind == "wasserstein":
        return cp.sum(loss) / n + rho * task.lipschitz(v), []
    if kind == "cvar":  # CVaR_β = min_η η + E[(ℓ − η)+]/β (Rockafellar–Uryasev)
        eta = cp.Variable(name="eta")
        return eta + cp.sum(cp.pos(loss - eta)) / (beta * n), []
    if kind == "kl":  # sup_{KL(Q‖P)≤ρ} E_Q ℓ = inf_{λ>0,η} λρ + η + λ E[exp((ℓ − η)/λ) − 1]
        # on ℓ / scale (the value is positively homogeneous in ℓ): exponential cones need O(1) arguments
        c = task.loss_scale
        lam, eta = cp.Variable(nonneg=True, name="lam"), cp.Variable(name="eta")
        t, s = cp.Variable(n, name="t"), cp.Variable(n, name="s")
        cons = [t >= loss / c, cp.constraints.ExpCone(t - eta, lam * np.ones(n), s)]
        return c * (lam * rho + eta + cp.sum(s) / n - lam), cons
    raise ValueError(f"unknown kind {kind!r}")


def fit(task: Task, kind: str, instance: str, order, accept_inaccurate: bool = True, **kw) -> Solved:
    """Build and solve one formulation (a fresh problem per setting: at these sizes a DPP-parametrised
    problem's first compile costs more than the re-solves it saves; see README)."""
    import cvxpy as cp

    v = task.variables()
    sup = kw.pop("sup_fn", None)
    obj, cons = objective(task, kind, v, sup=sup(v) if sup else None, **kw)
    return solve(cp.Problem(cp.Minimize(obj + task.penalty(v)), cons), instance, order, accept_inaccurate)


# ---------------------------------------------------------------------------------- closed forms (tests)
def newsvendor_closed_form(xi: np.ndarray, h: float, b: float, eps: float, lo: float, hi: float) -> float:
    """x* = max(x_lo, min(x_hi, x_c)) for the empirical reference (card's closed form); quantiles are the
    left-continuous inverse of the empirical CDF, unique when n·level is not an integer. At ε = 1 the mean
    term is gone and x* = x_c: the limit ε → 1 of the formula (x_hi's level → +∞, and x_lo's → −∞ since its
    numerator tends to −h), computed directly instead of dividing by 1 − ε = 0."""
    if not 0 <= eps <= 1:
        raise ValueError(f"newsvendor_closed_form: eps must lie in [0, 1], got {eps}")
    s = np.sort(xi)
    n = len(s)

    def q(level: float) -> float:
        if level <= 0:
            return -np.inf
        if level >= 1:
            return np.inf
        return float(s[math.ceil(n * level - 1e-12) - 1])

    x_c = (h * lo + b * hi) / (h + b)
    if eps == 1:
        return x_c
    x_hi = q(b / ((h + b) * (1 - eps)))
    x_lo = q((b - eps * (h + b)) / ((h + b) * (1 - eps)))
    return max(x_lo, min(x_hi, x_c))
