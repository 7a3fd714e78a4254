"""Tests of `credal_dro`: the cvxpy programs against closed forms, brute-force grids and boundary searches on
1-D / 2-D instances; the finite credal objective where bounded-support Huber blows up; conformal bulk
coverage; solver failures naming the instance; bad parameters and user files (the end-to-end --env=test
run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.credal_dro import model as M
from pipelines.credal_dro.params import Params
from tests.conftest import ROOT

ORDER = ("CLARABEL", "SCS")


def _raw(**over) -> dict:
    raw = yaml.safe_load((ROOT / "conf/base/parameters_credal_dro.yml").read_text())["credal_dro"]
    test = yaml.safe_load((ROOT / "conf/test/parameters_credal_dro.yml").read_text())["credal_dro"]

    def merge(a, b):
        return {
            k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
            for k, v in {**a, **b}.items()
        }

    return merge(merge(raw, test), over)


def nv_objective(x, xi, h, b, eps, lo, hi):
    """(1 − ε)·E_P̂ ℓ + ε·max_{ξ∈[lo,hi]} ℓ in numpy (grid reference; x may be an array)."""
    x = np.atleast_1d(x)[:, None]
    mean = np.maximum(h * (x - xi), b * (xi - x)).mean(1)
    return (1 - eps) * mean + eps * np.maximum(h * (x[:, 0] - lo), b * (hi - x[:, 0]))


# ------------------------------------------------------------------------------- newsvendor (LP)
@pytest.mark.parametrize("eps,hi", [(0.05, 400.0), (0.1, 60.0), (0.1, 400.0), (0.3, 60.0), (0.3, 400.0)])
def test_newsvendor_lp_matches_closed_form_and_grid(eps, hi):
    rng = np.random.default_rng(3)
    xi = rng.lognormal(3, 0.8, 37)  # n·level is never an integer here: the minimiser is unique
    h, b = 1.0, 4.0
    task = M.NewsvendorTask(xi, h, b)
    sol = M.fit(task, "credal", "test", ORDER, eps=eps, sup_fn=lambda v: task.sup_box(v, 0.0, hi))
    x = float(sol.values["x"])
    x_ref = M.newsvendor_closed_form(xi, h, b, eps, 0.0, hi)
    assert x == pytest.approx(x_ref, rel=1e-5, abs=1e-5)
    grid = np.linspace(0, 1.2 * max(hi, xi.max()), 20001)
    vals = nv_objective(grid, xi, h, b, eps, 0.0, hi)
    assert sol.value == pytest.approx(float(nv_objective(x, xi, h, b, eps, 0.0, hi)[0]), rel=1e-6)
    assert sol.value <= vals.min() + 1e-6 and vals.min() - sol.value < 1e-2


@pytest.mark.parametrize("eps", [1.0, 1 - 1e-9, 0.95])
def test_newsvendor_closed_form_at_and_near_eps_one(eps):
    """ε → 1: the mean term vanishes, both quantile levels leave [0, 1] (x_hi's → +∞, x_lo's numerator → −h),
    so x* = x_c, the minimax order of the bulk's endpoints. Checked against the LP and a grid."""
    xi = np.random.default_rng(5).lognormal(3, 0.8, 37)
    h, b, hi = 1.0, 4.0, 120.0
    x = M.newsvendor_closed_form(xi, h, b, eps, 0.0, hi)
    assert x == pytest.approx((h * 0.0 + b * hi) / (h + b))
    task = M.NewsvendorTask(xi, h, b)
    sol = M.fit(task, "credal", "test", ORDER, eps=eps, sup_fn=lambda v: task.sup_box(v, 0.0, hi))
    assert float(sol.values["x"]) == pytest.approx(x, rel=1e-5)
    grid = np.linspace(0, 1.2 * hi, 120001)
    assert grid[np.argmin(nv_objective(grid, xi, h, b, eps, 0.0, hi))] == pytest.approx(x, abs=2e-3)
    with pytest.raises(ValueError, match="eps"):
        M.newsvendor_closed_form(xi, h, b, 1.5, 0.0, hi)


def test_newsvendor_decision_ignores_the_bulk_below_the_critical_eps():
    """ε < h/(h + b) and a non-binding cap: the order is a higher quantile whatever u is (card)."""
    xi = np.random.default_rng(0).lognormal(3, 0.8, 41)
    a, b = (M.newsvendor_closed_form(xi, 1, 4, 0.1, 0, u) for u in (500.0, 5000.0))
    assert a == b


# ----------------------------------------------------------------------- regression (SOCP) and sup
def _ellipse(rng):
    A = rng.normal(size=(2, 2))
    return M.Ellipsoid(rng.normal(size=2), np.linalg.cholesky(A @ A.T + 0.3 * np.eye(2)), 1.7)


def _boundary(e: M.Ellipsoid, n=200001):
    t = np.linspace(0, 2 * np.pi, n)
    return e.mu + e.r * (e.L @ np.stack([np.cos(t), np.sin(t)])).T


def test_absolute_residual_sup_over_ellipsoid_matches_boundary_search():
    rng = np.random.default_rng(1)
    e = _ellipse(rng)
    task = M.RegressionTask(rng.normal(size=(5, 1)), rng.normal(size=5))
    v = task.variables()
    v["w"].value, v["b0"].value = np.array([0.7]), -0.4
    pts = _boundary(e)  # ξ = (x, y): the sup of a convex function sits on the boundary
    brute = np.abs(pts[:, 1] - 0.7 * pts[:, 0] + 0.4).max()
    assert float(task.sup_ellipsoid(v, e).value) == pytest.approx(brute, rel=1e-6)


def test_regression_1d_solution_matches_grid():
    rng = np.random.default_rng(2)
    x = rng.normal(size=30)
    y = 0.8 * x + 0.3 * rng.standard_t(3, 30)
    xi = np.column_stack([x, y])
    e = M.ellipsoid_bulk(xi[:20], xi[20:], 0.2)
    task = M.RegressionTask(x[:20, None], y[:20])
    eps = 0.1
    sol = M.fit(task, "credal", "test", ORDER, eps=eps, sup_fn=lambda v: task.sup_ellipsoid(v, e))
    pts = _boundary(e, 4001)

    def brute(wb):  # the robust objective with the sup found on the ellipse's boundary
        w, b0 = wb
        return (1 - eps) * np.abs(y[:20] - w * x[:20] - b0).mean() + eps * np.abs(pts[:, 1] - w * pts[:, 0] - b0).max()

    from scipy.optimize import minimize

    grid = [(w, b0) for w in np.linspace(-1, 2.5, 36) for b0 in np.linspace(-1.5, 1.5, 31)]
    start = min(grid, key=brute)
    ref = minimize(brute, start, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-9, "maxiter": 4000}).fun
    assert sol.value <= ref + 1e-6 and ref - sol.value < 1e-3
    assert brute((float(sol.values["w"][0]), float(sol.values["b0"]))) == pytest.approx(sol.value, rel=1e-5)


# ------------------------------------------------------------------- classification (exp cone)
def test_logistic_sup_over_class_ellipsoids_matches_boundary_search():
    rng = np.random.default_rng(4)
    ells = {-1: _ellipse(rng), 1: _ellipse(rng)}
    task = M.ClassificationTask(rng.normal(size=(6, 2)), np.sign(rng.normal(size=6)))
    v = task.variables()
    w, b0 = np.array([1.3, -0.6]), 0.25
    v["w"].value, v["b0"].value = w, b0
    brute = max(np.logaddexp(0, -k * (_boundary(e) @ w + b0)).max() for k, e in ells.items())
    assert float(task.sup_ellipsoids(v, ells).value) == pytest.approx(brute, rel=1e-6)


def test_classification_1d_solution_matches_grid():
    rng = np.random.default_rng(5)
    y = np.sign(rng.normal(size=60))
    x = y * 0.8 + rng.normal(size=60)
    ells = {k: M.Ellipsoid(np.array([x[y == k].mean()]), np.array([[x[y == k].std()]]), 1.5) for k in (-1, 1)}
    task = M.ClassificationTask(x[:, None], y)
    eps = 0.1
    sol = M.fit(task, "credal", "test", ORDER, eps=eps, sup_fn=lambda v: task.sup_ellipsoids(v, ells))
    W, B = np.meshgrid(np.linspace(-1, 3, 401), np.linspace(-1, 1, 201), indexing="ij")
    w, b0 = W.ravel(), B.ravel()
    mean = np.logaddexp(0, -y[None] * (w[:, None] * x[None] + b0[:, None])).mean(1)
    sup = np.max(
        [
            np.logaddexp(0, -k * (w * e.mu[0] + b0) + e.r * e.L[0, 0] * np.abs(w))  # 1-D: ends of the interval
            for k, e in ells.items()
        ],
        axis=0,
    )
    grid = (1 - eps) * mean + eps * sup
    assert sol.value <= grid.min() + 1e-6 and grid.min() - sol.value < 5e-3


# ------------------------------------------------------------------------------------ baselines
def test_cvar_matches_sorted_tail_on_grid():
    xi = np.random.default_rng(6).lognormal(3, 0.8, 50)
    task = M.NewsvendorTask(xi, 1.0, 4.0)
    sol = M.fit(task, "cvar", "test", ORDER, beta=0.2)
    grid = np.linspace(0, xi.max(), 4001)
    loss = np.sort(np.maximum(grid[:, None] - xi, 4 * (xi - grid[:, None])), axis=1)[:, -10:]  # β·n = 10
    assert sol.value == pytest.approx(loss.mean(1).min(), rel=1e-3)


def test_kl_dual_matches_scipy_worst_case():
    from scipy.optimize import minimize_scalar
    from scipy.special import logsumexp

    xi = np.random.default_rng(7).lognormal(3, 0.8, 40)
    task = M.NewsvendorTask(xi, 1.0, 4.0)
    rho = 0.1

    def worst(x):  # sup_{KL(Q‖P̂) ≤ ρ} E_Q ℓ = min_λ λρ + λ log E exp(ℓ/λ)
        ell = np.maximum(x - xi, 4 * (xi - x))
        f = lambda ll: math.exp(ll) * rho + math.exp(ll) * (logsumexp(ell / math.exp(ll)) - math.log(len(xi)))
        return minimize_scalar(f, bounds=(-5, 12), method="bounded", options={"xatol": 1e-10}).fun

    sol = M.fit(task, "kl", "test", ORDER, rho=rho)
    assert sol.value == pytest.approx(worst(float(sol.values["x"])), rel=1e-4)
    grid = np.linspace(xi.min(), xi.max(), 400)
    assert sol.value <= min(worst(g) for g in grid) + 1e-3


def test_wasserstein_newsvendor_orders_what_saa_orders():
    xi = np.random.default_rng(8).lognormal(3, 0.8, 45)
    task = M.NewsvendorTask(xi, 1.0, 4.0)
    erm = M.fit(task, "erm", "test", ORDER)
    w = M.fit(task, "wasserstein", "test", ORDER, rho=2.0)
    assert float(w.values["x"]) == pytest.approx(float(erm.values["x"]), rel=1e-6)
    assert w.value == pytest.approx(erm.value + 2.0 * 4.0, rel=1e-6)


# ------------------------------------------------------------------------- vacuity (card's point)
def test_credal_objective_finite_where_huber_grows_without_bound():
    """Full-support Huber contamination of demand on [0, ∞) has an infinite worst case; on [0, κ·max]
    its objective grows linearly in κ, while the bulk-credal objective is finite without any bound."""
    rng = np.random.default_rng(9)
    train, calib = rng.lognormal(3, 0.8, 100), rng.lognormal(3, 0.8, 100)
    task = M.NewsvendorTask(train, 1.0, 4.0)
    eps = 0.1
    u = M.conformal_radius(calib, 0.05)
    credal = M.fit(task, "credal", "test", ORDER, eps=eps, sup_fn=lambda v: task.sup_box(v, 0.0, u)).value
    huber = {
        k: M.fit(
            task, "huber", "test", ORDER, eps=eps, sup_fn=lambda v, k=k: task.sup_box(v, 0.0, k * train.max())
        ).value
        for k in (10, 100, 1000)
    }
    assert math.isfinite(credal) and credal < huber[10]
    # ε·b·(κ·max − x) dominates: the objective is ≈ linear in κ
    assert huber[1000] / huber[100] == pytest.approx(10, rel=0.02)
    assert huber[1000] >= eps * 4.0 * (1000 * train.max() - M.newsvendor_closed_form(train, 1, 4, eps, 0, 1e9))
    with pytest.raises(ParameterError, match=r"credal_dro\.variants\.huber_k10\.kappa"):
        validate(Params, _raw(variants={"huber_k10": {"kind": "huber", "kappa": float("inf")}}), "credal_dro")


# ---------------------------------------------------------------------------------- bulk coverage
def test_conformal_box_has_exact_marginal_coverage():
    """P(ξ_new ≤ u) = k/(n + 1) with k = ⌈(n + 1)(1 − α)⌉ for continuous scores (split conformal)."""
    rng = np.random.default_rng(10)
    n, alpha, reps = 19, 0.1, 20000
    cal = rng.lognormal(size=(reps, n))
    k = M.conformal_index(n, alpha)
    u = np.sort(cal, axis=1)[:, k - 1]
    cover = (rng.lognormal(size=reps) <= u).mean()
    assert k == 18 and cover == pytest.approx(k / (n + 1), abs=0.01)
    with pytest.raises(ValueError, match="cannot give coverage"):
        M.conformal_index(5, 0.05, "tiny")


def test_ellipsoid_bulk_covers_fresh_points():
    rng = np.random.default_rng(11)
    A = rng.normal(size=(3, 3))
    cov = []
    for _ in range(100):
        z = rng.standard_t(4, size=(400, 3)) @ A.T
        e = M.ellipsoid_bulk(z[:100], z[100:199], 0.1)
        cov.append(e.contains(z[199:]).mean())
    assert np.mean(cov) == pytest.approx(90 / 100, abs=0.015)  # k/(n+1) with n = 99


# ---------------------------------------------------------------------------------- solver failures
def test_infeasible_and_unbounded_problems_name_the_instance():
    import cvxpy as cp

    x = cp.Variable(name="x")
    with pytest.raises(M.SolverError, match=r"newsvendor seed=3 eps=0\.1.*infeasible"):
        M.solve(cp.Problem(cp.Minimize(x), [x >= 1, x <= 0]), "newsvendor seed=3 eps=0.1", ORDER)
    with pytest.raises(M.SolverError, match=r"regression seed=0.*unbounded"):
        M.solve(cp.Problem(cp.Minimize(x)), "regression seed=0", ORDER)


def test_inaccurate_solutions_are_flagged_or_refused():
    """A solver that stops at reduced tolerances: accepted and flagged by default, a SolverError naming the
    instance when refused; a non-finite 'optimal' value is never accepted."""
    import cvxpy as cp

    class Stub:  # stands in for a cvxpy Problem whose solver answers with a fixed status and value
        def __init__(self, status, value):
            self.status, self.value, self._x = status, value, cp.Variable(name="x")
            self.solver_stats = type("S", (), {"solve_time": 0.01})()

        def solve(self, solver):
            self._x.value = np.array(1.0)

        def variables(self):
            return [self._x]

    sol = M.solve(Stub(cp.OPTIMAL_INACCURATE, 2.0), "cls seed=1", ("CLARABEL",))
    assert sol.inaccurate and sol.value == 2.0
    with pytest.raises(M.SolverError, match=r"cls seed=1.*optimal_inaccurate"):
        M.solve(Stub(cp.OPTIMAL_INACCURATE, 2.0), "cls seed=1", ("CLARABEL",), accept_inaccurate=False)
    with pytest.raises(M.SolverError, match=r"kl seed=2.*non-finite"):
        M.solve(Stub(cp.OPTIMAL, float("nan")), "kl seed=2", ("CLARABEL", "SCS"))


# ----------------------------------------------------------------------------------- data + nodes
def test_test_environments_reuse_the_clean_draws():
    from pipelines.credal_dro.data import env_demand, make_newsvendor

    p = Params.model_validate(_raw(seeds=[0]))
    samples, envs = make_newsvendor(p)
    test = samples[(samples.seed == 0) & (samples.split == "test")]
    e = envs[envs.env == "bulk_edge_20"].iloc[0]
    d, clean = env_demand(test, e), test.demand.to_numpy()
    changed = d != clean
    assert changed.mean() == pytest.approx(0.2, abs=0.03)
    assert ((d[changed] >= e.lo) & (d[changed] <= e.hi)).all()


def test_variant_node_runs_every_task_and_flags_huber():
    from pipelines.credal_dro.data import make_classification, make_newsvendor, make_regression
    from pipelines.credal_dro.train import train_variant

    p = Params.model_validate(_raw(seeds=[0], threads=1))
    nvs, nve = make_newsvendor(p)
    args = (nvs, nve, make_regression(p), make_classification(p), p)
    runs = {v: train_variant(*args, variant=v) for v in ("credal", "huber_k10")}
    out = {v: pd.DataFrame(raw) for v, (_, raw) in runs.items()}
    table = runs["credal"][0]
    assert set(table.metric) >= {"nv_cost_clean", "reg_mae_shifted_contam", "cls_worst_group_acc"}
    assert set(table.seed) == {0} and table.step.isna().all() and table.value.map(math.isfinite).all()
    assert set(out["credal"].task) == {"newsvendor", "regression", "classification"}
    assert (out["credal"].finite_full_support == 1).all() and (out["huber_k10"].finite_full_support == 0).all()
    assert out["credal"].groupby("task")["main"].sum().eq(1).all()
    assert np.isfinite(out["credal"].objective).all()


# ------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "over,key",
    [
        ({"newsvendor": {"eps": 1.5}}, r"credal_dro\.newsvendor\.eps"),
        ({"regression": {"grids": {"alpha": [0.05, 0.05]}}}, r"credal_dro\.regression\.grids\.alpha"),
        ({"variants": {"cvar_x": {"kind": "cvar"}}}, r"credal_dro\.variants\.cvar_x"),
        ({"solver": {"order": ["ECOS"]}}, r"credal_dro\.solver\.order\.0"),
        ({"classification": {"n_train": True}}, r"credal_dro\.classification\.n_train"),
    ],
)
def test_bad_parameter_names_the_key(over, key):
    with pytest.raises(ParameterError, match=key):
        validate(Params, _raw(**over), "credal_dro")


def test_bad_user_files_name_dataset_and_column(tmp_path):
    from pipelines.credal_dro.data import make_classification, make_newsvendor, make_regression

    reg = tmp_path / "reg.csv"
    pd.DataFrame({"a": np.arange(50.0), "bmi": np.arange(50.0)}).to_csv(reg, index=False)
    with pytest.raises(InputDataError, match=r"credal_dro\.regression\.user_path.*column 'target' is missing"):
        make_regression(Params.model_validate(_raw(regression={"user_path": str(reg)})))
    cls = tmp_path / "cls.csv"
    pd.DataFrame({"x_0": np.arange(50.0), "y": [2] * 50, "group": [0] * 50, "split": ["train"] * 50}).to_csv(
        cls, index=False
    )
    with pytest.raises(InputDataError, match=r"credal_dro\.classification\.user_path.*column 'y'"):
        make_classification(Params.model_validate(_raw(classification={"user_path": str(cls)})))
    nv = tmp_path / "nv.csv"
    pd.DataFrame({"demand": [-1.0] + [3.0] * 99}).to_csv(nv, index=False)
    with pytest.raises(InputDataError, match=r"credal_dro\.newsvendor\.user_path.*column 'demand'"):
        make_newsvendor(Params.model_validate(_raw(newsvendor={"user_path": str(nv)})))
