"""One node per variant (``train.<variant>``): for every seed and every experiment the variant applies to,
solve its headline setting and (``grid: true``) its frontier grid, then score each decision on the test
environments. Output: the long results table of the headline settings, and the raw rows (the artifacts),
one per (task, seed, setting) with the decision's metrics, objective value, solve times and flags
(``finite_flag``: the solved objective is finite; ``finite_full_support``: the objective stays finite
without a support bound — 0 for Huber, whose value grows without bound in κ).

Hyper-parameters that baselines choose (Wasserstein / KL radius ρ) are picked on the clean calibration
split, never on test data; the credal (ε, α) and Huber (ε, κ) headline settings are fixed in the
parameters before any run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.api import Results, json_records, node_setup
from pipelines.credal_dro import model as M
from pipelines.credal_dro.data import env_demand
from pipelines.credal_dro.params import Params, Variant, tasks_of

NAN = float("nan")


def settings(spec: Variant, task_p, main: dict) -> list[dict]:
    """The hyper-parameter settings of a variant on one task; the headline one carries ``main``."""
    g = task_p.grids
    if spec.kind == "credal":
        grid = [{"eps": e, "alpha": a} for e in g.eps for a in g.alpha] if spec.grid else []
    elif spec.kind == "huber":
        grid = [{"eps": e, "kappa": spec.kappa} for e in g.eps] if spec.grid else []
        main = {"eps": main["eps"], "kappa": spec.kappa}
    elif spec.kind in ("wasserstein", "kl"):
        return [
            {"rho": r} for r in (g.rho_wasserstein if spec.kind == "wasserstein" else g.rho_kl)
        ]  # all solved; the calibration split picks the main one
    elif spec.kind == "cvar":
        return [{"beta": spec.beta, "main": True}]
    else:
        return [{"main": True}]
    out = [dict(s, main=s == main) for s in grid]
    if not any(s["main"] for s in out):
        out.insert(0, dict(main, main=True))
    return out


def _label(s: dict) -> str:
    return ",".join(f"{k}={v:g}" for k, v in s.items() if k != "main") or "default"


def _row(task: str, seed: int, variant: str, spec: Variant, s: dict, sol: M.Solved) -> dict:
    return {
        "task": task,
        "seed": int(seed),
        "variant": variant,
        "kind": spec.kind,
        "config": _label(s),
        "main": bool(s.get("main", False)),
        "eps": s.get("eps", NAN),
        "alpha": s.get("alpha", NAN),
        "kappa": s.get("kappa", NAN),
        "rho": s.get("rho", NAN),
        "beta": s.get("beta", NAN),
        "objective": sol.value,
        "wall_s": sol.wall_s,
        "solve_s": sol.solve_s,
        "cpu_s": sol.cpu_s,
        "solver": sol.solver,
        "finite_flag": float(np.isfinite(sol.value)),
        "finite_full_support": float(spec.kind != "huber"),
        "inaccurate": float(sol.inaccurate),
        "solver_tries": sol.tries,
    }


def _radius_kw(spec: Variant, s: dict) -> dict:
    """The solver keywords of the baselines without a support: the Wasserstein / KL radius, the CVaR level."""
    if spec.kind in ("wasserstein", "kl"):
        return {"rho": s["rho"]}
    if spec.kind == "cvar":
        return {"beta": s["beta"]}
    return {}


def pick_main(rows: list[dict], val_key: str) -> None:
    """Mark the setting with the best clean calibration-split metric (ties: the smaller radius)."""
    best = min(range(len(rows)), key=lambda i: (rows[i][val_key], rows[i]["rho"]))
    for i, r in enumerate(rows):
        r["main"] = i == best


# --------------------------------------------------------------------------------------- (a) newsvendor
def nv_cost(x: float, d: np.ndarray, h: float, b: float) -> float:
    return float(np.mean(np.maximum(h * (x - d), b * (d - x))))


def reference_sample(train: np.ndarray, spec: Variant, p: Params, seed: int) -> np.ndarray:
    """P0: the empirical sample, the Normal–Inverse-Gamma posterior predictive of log-demand (Student-t on
    the log scale) or the lognormal MLE; the last two as ``n_ref_draws`` seeded draws."""
    nv = p.newsvendor
    if spec.reference == "empirical":
        return train
    rng = np.random.default_rng([seed, 7])
    z = np.log(np.maximum(train, 1e-12))
    n, zbar = len(z), float(z.mean())
    if spec.reference == "lognormal":
        return np.exp(rng.normal(zbar, z.std(), nv.n_ref_draws))
    k0, a0, b0 = nv.prior_kappa0, nv.prior_a0, nv.prior_b0  # prior mean 0
    kn, an = k0 + n, a0 + n / 2
    mn = n * zbar / kn
    bn = b0 + 0.5 * ((z - zbar) ** 2).sum() + k0 * n * zbar**2 / (2 * kn)
    scale = np.sqrt(bn * (kn + 1) / (an * kn))
    return np.exp(mn + scale * rng.standard_t(2 * an, nv.n_ref_draws))


def run_newsvendor(samples: pd.DataFrame, envs: pd.DataFrame, p: Params, variant: str, seed: int) -> list[dict]:
    nv, spec, order = p.newsvendor, p.variants[variant], p.solver.order
    d = samples[samples.seed == seed]
    train = d.loc[d.split == "train", "demand"].to_numpy(float)
    calib = d.loc[d.split == "calib", "demand"].to_numpy(float)
    test = d[d.split == "test"]
    env_rows = envs[envs.seed == seed]
    env_d = {e.env: env_demand(test, e) for _, e in env_rows.iterrows()}
    ref = reference_sample(train, spec, p, seed)
    task = M.NewsvendorTask(ref, nv.h, nv.b)
    rows = []
    for s in settings(spec, nv, {"eps": nv.eps, "alpha": nv.alpha}):
        inst = f"credal_dro.train.{variant} task=newsvendor seed={seed} {_label(s)}"
        u = hi = NAN
        if spec.kind == "credal":
            u = hi = M.conformal_radius(calib, s["alpha"], inst)  # bulk [0, u], P0(B) >= 1 − α
            w = np.full(len(ref), (1 - s["eps"]) / len(ref)) + spec.tail_weight * (ref > u) / len(ref)
            kw = {"eps": s["eps"], "weights": w, "sup_fn": lambda v, u=u: task.sup_box(v, 0.0, u)}
        elif spec.kind == "huber":
            hi = s["kappa"] * float(train.max())
            kw = {"eps": s["eps"], "sup_fn": lambda v, hi=hi: task.sup_box(v, 0.0, hi)}
        else:
            kw = _radius_kw(spec, s)
        sol = M.fit(task, spec.kind, inst, order, p.solver.accept_inaccurate, **kw)
        x = float(sol.values["x"])
        r = _row("newsvendor", seed, variant, spec, s, sol)
        costs = {f"cost_{e}": nv_cost(x, dd, nv.h, nv.b) for e, dd in env_d.items()}
        r.update(
            order_qty=x,
            support_hi=hi,
            cost_calib=nv_cost(x, calib, nv.h, nv.b),
            **costs,
            worst_env_cost=max(costs.values()),
            bulk_coverage_test=float(np.mean(env_d["clean"] <= u)) if np.isfinite(u) else NAN,
        )
        rows.append(r)
    if spec.kind in ("wasserstein", "kl"):
        pick_main(rows, "cost_calib")
    return rows


# ------------------------------------------------------------------ (b, c) the linear tasks' plumbing
def _splits(df: pd.DataFrame, seed: int, y_dtype: type) -> tuple[dict, dict, dict]:
    """One seed's fit / calib / test rows: the frames, their ``x_*`` feature matrices and their targets."""
    d = df[df.seed == seed]
    feats = [c for c in d.columns if c.startswith("x_")]
    part = {s: d[d.split == s] for s in ("fit", "calib", "test")}
    X = {s: f[feats].to_numpy(float) for s, f in part.items()}
    y = {s: f["y"].to_numpy(y_dtype) for s, f in part.items()}
    return part, X, y


def _linear_kw(task, spec: Variant, s: dict, lo: np.ndarray, hi: np.ndarray) -> dict:
    """The solver keywords of every non-credal kind on a linear task: Huber's support is the box of κ times
    the fit split's feature range around its centre."""
    if spec.kind == "huber":
        half = s["kappa"] * (hi - lo) / 2
        return {"eps": s["eps"], "sup_fn": lambda v, half=half: task.sup_box(v, (hi + lo) / 2, half)}
    return _radius_kw(spec, s)


def _fit_linear(task, spec: Variant, inst: str, p: Params, X: dict, kw: dict):
    """Solve one setting; returns the solution, its weights and the affine scores on the calib and test splits."""
    sol = M.fit(task, spec.kind, inst, p.solver.order, p.solver.accept_inaccurate, **kw)
    w_, b0 = sol.values["w"], float(sol.values["b0"])
    return sol, w_, {k: X[k] @ w_ + b0 for k in ("calib", "test")}


# --------------------------------------------------------------------------------------- (b) regression
def run_regression(df: pd.DataFrame, p: Params, variant: str, seed: int) -> list[dict]:
    rp, spec = p.regression, p.variants[variant]
    part, X, y = _splits(df, seed, float)
    xi = {s: np.column_stack([X[s], y[s]]) for s in X}
    task = M.RegressionTask(X["fit"], y["fit"])
    lo, hi = xi["fit"].min(0), xi["fit"].max(0)
    rows = []
    ells: dict[float, M.Ellipsoid] = {}
    for s in settings(spec, rp, {"eps": rp.eps, "alpha": rp.alpha}):
        inst = f"credal_dro.train.{variant} task=regression seed={seed} {_label(s)}"
        e = None
        if spec.kind == "credal":
            if s["alpha"] not in ells:
                ells[s["alpha"]] = M.ellipsoid_bulk(xi["fit"], xi["calib"], s["alpha"], spec.covariance, seed, inst)
            e = ells[s["alpha"]]
            n = len(y["fit"])
            w = np.full(n, (1 - s["eps"]) / n) + spec.tail_weight * (~e.contains(xi["fit"])) / n
            kw = {"eps": s["eps"], "weights": w, "sup_fn": lambda v, e=e: task.sup_ellipsoid(v, e)}
        else:
            kw = _linear_kw(task, spec, s, lo, hi)
        sol, w_, pred = _fit_linear(task, spec, inst, p, X, kw)
        r = _row("regression", seed, variant, spec, s, sol)
        clean = float(np.mean(np.abs(y["test"] - pred["test"])))
        contam = float(np.mean(np.abs(part["test"]["y_contam"].to_numpy(float) - pred["test"])))
        r.update(
            mae_calib=float(np.mean(np.abs(y["calib"] - pred["calib"]))),
            mae_shifted_clean=clean,
            mae_shifted_contam=contam,
            worst_env_mae=max(clean, contam),
            w_norm=float(np.linalg.norm(w_)),
            bulk_coverage_test=float(e.contains(xi["test"]).mean()) if e is not None else NAN,
        )
        rows.append(r)
    if spec.kind in ("wasserstein", "kl"):
        pick_main(rows, "mae_calib")
    return rows


# ----------------------------------------------------------------------------------- (c) classification
def group_accuracies(pred: np.ndarray, y: np.ndarray, g: np.ndarray) -> dict[str, float]:
    """Accuracy overall, per group and the worst over group × class cells."""
    ok = pred == y
    cells = [ok[(g == gg) & (y == yy)].mean() for gg in (0, 1) for yy in (-1, 1) if ((g == gg) & (y == yy)).any()]
    return {
        "acc": float(ok.mean()),
        "acc_majority": float(ok[g == 0].mean()) if (g == 0).any() else NAN,
        "acc_minority": float(ok[g == 1].mean()) if (g == 1).any() else NAN,
        "worst_group_acc": float(min(cells)),
    }


def run_classification(df: pd.DataFrame, p: Params, variant: str, seed: int) -> list[dict]:
    cp_, spec = p.classification, p.variants[variant]
    part, X, y = _splits(df, seed, int)
    g_test = part["test"]["group"].to_numpy(int)
    task = M.ClassificationTask(X["fit"], y["fit"].astype(float), cp_.l2)
    lo, hi = X["fit"].min(0), X["fit"].max(0)
    rows = []
    cache: dict[float, dict[int, M.Ellipsoid]] = {}
    for s in settings(spec, cp_, {"eps": cp_.eps, "alpha": cp_.alpha}):
        inst = f"credal_dro.train.{variant} task=classification seed={seed} {_label(s)}"
        ells = None
        if spec.kind == "credal":
            if s["alpha"] not in cache:  # one ellipsoid per class, each calibrated on its class
                cache[s["alpha"]] = {
                    k: M.ellipsoid_bulk(
                        X["fit"][y["fit"] == k],
                        X["calib"][y["calib"] == k],
                        s["alpha"],
                        spec.covariance,
                        seed,
                        f"{inst} class={k}",
                    )
                    for k in (-1, 1)
                }
            ells = cache[s["alpha"]]
            inside = np.zeros(len(y["fit"]), bool)
            for k, e in ells.items():
                inside[y["fit"] == k] = e.contains(X["fit"][y["fit"] == k])
            n = len(y["fit"])
            w = np.full(n, (1 - s["eps"]) / n) + spec.tail_weight * (~inside) / n
            kw = {"eps": s["eps"], "weights": w, "sup_fn": lambda v, ells=ells: task.sup_ellipsoids(v, ells)}
        else:
            kw = _linear_kw(task, spec, s, lo, hi)
        sol, w_, score = _fit_linear(task, spec, inst, p, X, kw)
        r = _row("classification", seed, variant, spec, s, sol)
        r.update(
            group_accuracies(np.where(score["test"] >= 0, 1, -1), y["test"], g_test),
            logloss_calib=float(np.mean(np.logaddexp(0, -y["calib"] * score["calib"]))),
            w_norm=float(np.linalg.norm(w_)),
        )
        if ells is not None:
            cov = np.zeros(len(y["test"]), bool)
            for k, e in ells.items():
                cov[y["test"] == k] = e.contains(X["test"][y["test"] == k])
            r.update(
                bulk_coverage_test=float(cov.mean()),
                bulk_coverage_majority=float(cov[g_test == 0].mean()),
                bulk_coverage_minority=float(cov[g_test == 1].mean()),
            )
        rows.append(r)
    if spec.kind in ("wasserstein", "kl"):
        pick_main(rows, "logloss_calib")
    return rows


PREFIX = {"newsvendor": "nv", "regression": "reg", "classification": "cls"}
COMMON = (
    "objective",
    "wall_s",
    "solve_s",
    "cpu_s",
    "finite_flag",
    "finite_full_support",
    "inaccurate",
    "bulk_coverage_test",
)
TASK_METRICS = {
    "newsvendor": ("order_qty", "worst_env_cost"),  # + every cost_<env>
    "regression": ("mae_shifted_clean", "mae_shifted_contam", "worst_env_mae", "w_norm"),
    "classification": (
        "acc",
        "worst_group_acc",
        "acc_majority",
        "acc_minority",
        "w_norm",
        "bulk_coverage_majority",
        "bulk_coverage_minority",
    ),
}


def _finite(x) -> bool:
    return isinstance(x, int | float | np.floating | np.integer) and math.isfinite(float(x))


def results_table(variant: str, rows: list[dict]):
    """The long table of one variant: per seed, the headline setting's metrics of every experiment, prefixed
    by experiment (``nv_``, ``reg_``, ``cls_``); non-finite values are left out."""
    res = Results(variant)
    for r in rows:
        if not r["main"]:
            continue
        task, pre = r["task"], PREFIX[r["task"]]
        keys = list(COMMON) + list(TASK_METRICS[task])
        if task == "newsvendor":
            keys += [k for k in r if k.startswith("cost_") and k != "cost_calib"]
        res.add(r["seed"], **{f"{pre}_{k}": float(r[k]) for k in keys if _finite(r.get(k))})
    return res.table()


def train_variant(
    nv_samples: pd.DataFrame,
    nv_envs: pd.DataFrame,
    regression: pd.DataFrame,
    classification: pd.DataFrame,
    p: Params,
    variant: str,
):
    """The node ``train.<variant>``: every seed × every experiment the variant applies to. Returns the long
    results table (headline settings) and the raw rows, one per (task, seed, setting), grids included
    (the grid metrics, solve-time summaries and plots read them)."""
    spec = p.variants[variant]
    rows: list[dict] = []
    for seed in p.seeds:
        node_setup(p, seed)
        if "newsvendor" in tasks_of(spec):
            rows += run_newsvendor(nv_samples, nv_envs, p, variant, seed)
        if "regression" in tasks_of(spec):
            rows += run_regression(regression, p, variant, seed)
        if "classification" in tasks_of(spec):
            rows += run_classification(classification, p, variant, seed)
    return results_table(variant, rows), json_records(rows)
