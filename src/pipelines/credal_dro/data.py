"""Data of the three experiments (card's small-scale reproduction), seeded, one long table each:

- (a) newsvendor demand: train / calib / test draws, and the test environments as mixture components
  (clean; bulk-edge, tail and spike contamination at each ε_t) applied to the *same* test draws (common
  random numbers, so every variant is scored on identical samples);
- (b) covariate-shifted regression on sklearn's bundled diabetes (or a user CSV);
- (c) group-shift classification (synthetic, or a user CSV of embeddings).

Features and targets are standardised with the fit split's statistics only (no test leakage).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.credal_dro.params import Newsvendor, Params


def _rng(seed: int, task: str) -> np.random.Generator:
    """One stream per (seed, task): adding a task never changes another one's draws."""
    return np.random.default_rng([seed, zlib.crc32(task.encode())])


# ------------------------------------------------------------------------------------- (a) newsvendor
def demand_quantile(nv: Newsvendor, q: float) -> float:
    from scipy.stats import norm

    if nv.dist == "lognormal":
        return float(np.exp(nv.mu + nv.sigma * norm.ppf(q)))
    return float(nv.pareto_scale * (1.0 - q) ** (-1.0 / nv.pareto_index))


def draw_demand(nv: Newsvendor, n: int, rng: np.random.Generator) -> np.ndarray:
    if nv.dist == "lognormal":
        return rng.lognormal(nv.mu, nv.sigma, n)
    return nv.pareto_scale * (1.0 + rng.pareto(nv.pareto_index, n))


DEMAND = TableSchema(
    "credal_dro.newsvendor.user_path",
    {"demand": "number"},
    min_rows=30,
    no_missing=("demand",),
    finite=("demand",),
    ranges={"demand": (0, None)},
)
REGRESSION = TableSchema(
    "credal_dro.regression.user_path", patterns={".*": "number"}, min_rows=40, no_missing=(".*",)
)  # every column numeric; the target and shift feature named
CLASSIFICATION = TableSchema(
    "credal_dro.classification.user_path",
    {"y": "int", "group": "int", "split": "str"},
    patterns={"x_.*": "number"},
    min_rows=40,
    no_missing=("y", "group", "split", "x_.*"),
    allowed={"y": (0, 1, -1), "group": (0, 1), "split": ("train", "test")},
)


def read_demand(path: Path) -> np.ndarray:
    """A user demand file: CSV with a numeric, finite, non-negative column ``demand``."""
    if not path.is_file():
        raise InputDataError(f"dataset '{DEMAND.dataset}': {path} not found (a CSV with a column 'demand')")
    return read_user_file(path, key=DEMAND.dataset, schema=DEMAND, kind="csv")["demand"].to_numpy(float)


def make_newsvendor(p: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(samples, envs). samples: seed, split (train/calib/test), demand, u, v — u and v are the uniform
    draws that place and pick the contamination of a test row. envs: seed, env, eps_t, kind, lo, hi:
    demand_env = lo + (hi − lo)·u where v < eps_t, else the clean demand."""
    nv = p.newsvendor
    user = read_demand(Path(nv.user_path)) if nv.user_path else None
    frames, envs = [], []
    for seed in p.seeds:
        rng = _rng(seed, "newsvendor")
        if user is None:
            sizes = {"train": nv.n_train, "calib": nv.n_calib, "test": nv.n_test}
            parts = {s: draw_demand(nv, n, rng) for s, n in sizes.items()}
            q = {k: demand_quantile(nv, k) for k in (0.80, 0.95, 0.999)}
        else:  # a fresh train / calib / test permutation per seed; quantiles of the whole file
            perm = user[rng.permutation(len(user))]
            a, b = nv.n_train, nv.n_train + nv.n_calib
            if b >= len(perm):
                raise InputDataError(
                    f"dataset 'credal_dro.newsvendor.user_path': {len(perm)} rows, more than "
                    f"n_train + n_calib = {b} needed"
                )
            parts = {"train": perm[:a], "calib": perm[a:b], "test": perm[b:]}
            q = {k: float(np.quantile(user, k)) for k in (0.80, 0.95, 0.999)}
        for split, d in parts.items():
            frames.append(
                pd.DataFrame(
                    {"seed": seed, "split": split, "demand": d, "u": rng.random(len(d)), "v": rng.random(len(d))}
                )
            )
        envs.append({"seed": seed, "env": "clean", "eps_t": 0.0, "kind": "clean", "lo": 0.0, "hi": 0.0})
        for e in nv.eps_t:
            tag = f"{round(100 * e):02d}"
            envs += [
                {
                    "seed": seed,
                    "env": f"bulk_edge_{tag}",
                    "eps_t": e,
                    "kind": "bulk_edge",
                    "lo": q[0.80],
                    "hi": q[0.95],
                },
                {"seed": seed, "env": f"tail_{tag}", "eps_t": e, "kind": "tail", "lo": q[0.95], "hi": q[0.999]},
                {
                    "seed": seed,
                    "env": f"spike_{tag}",
                    "eps_t": e,
                    "kind": "spike",
                    "lo": 3 * q[0.999],
                    "hi": 3 * q[0.999],
                },
            ]
    return pd.concat(frames, ignore_index=True), pd.DataFrame(envs)


def env_demand(test: pd.DataFrame, env: pd.Series) -> np.ndarray:
    """The test demand of one environment (rows of one seed's test split)."""
    d = test["demand"].to_numpy(float)
    if env["kind"] == "clean":
        return d
    contam = env["lo"] + (env["hi"] - env["lo"]) * test["u"].to_numpy(float)
    return np.where(test["v"].to_numpy(float) < env["eps_t"], contam, d)


# ------------------------------------------------------------------------------------- (b) regression
def read_regression(p: Params) -> pd.DataFrame:
    """The regression table: sklearn's diabetes, or a user CSV of numeric columns holding ``target`` and
    ``shift_feature`` (every other column is a feature)."""
    r = p.regression
    if r.user_path is None:
        from sklearn.datasets import load_diabetes

        d = load_diabetes(as_frame=True)
        df = d.frame.rename(columns={"target": r.target}) if r.target != "target" else d.frame
        return df
    ds = "credal_dro.regression.user_path"
    path = Path(r.user_path)
    if not path.is_file():
        raise InputDataError(
            f"dataset '{ds}': {path} not found (a CSV of numeric columns with '{r.target}' and '{r.shift_feature}')"
        )
    return REGRESSION.refine(columns={r.target: "number", r.shift_feature: "number"}).check(
        read_user_file(path, key=ds, kind="csv")
    )


def make_regression(p: Params) -> pd.DataFrame:
    """seed, split (fit/calib/test), x_* and y standardised with the fit split, y_contam (test targets,
    ``contam_frac`` of them shifted by ``contam_sigma`` fit-split standard deviations)."""
    r = p.regression
    df = read_regression(p)
    feats = [c for c in df.columns if c != r.target]
    x_all, y_all = df[feats].to_numpy(float), df[r.target].to_numpy(float)
    s = df[r.shift_feature].to_numpy(float)
    train = s < np.quantile(s, r.shift_quantile)
    frames = []
    for seed in p.seeds:
        rng = _rng(seed, "regression")
        idx = np.flatnonzero(train)[rng.permutation(int(train.sum()))]
        n_fit = int(round(r.fit_frac * len(idx)))
        split = np.full(len(df), "test", dtype=object)
        split[idx[:n_fit]], split[idx[n_fit:]] = "fit", "calib"
        fit = split == "fit"
        mx, sx = x_all[fit].mean(0), x_all[fit].std(0)
        my, sy = y_all[fit].mean(), y_all[fit].std()
        sx[sx == 0] = 1.0
        x, y = (x_all - mx) / sx, (y_all - my) / sy
        test = np.flatnonzero(split == "test")
        hit = rng.choice(test, size=int(round(r.contam_frac * len(test))), replace=False)
        yc = y.copy()
        yc[hit] += r.contam_sigma  # σ_y = 1 on the fit split after standardising
        f = pd.DataFrame(x, columns=[f"x_{c}" for c in feats])
        f.insert(0, "split", split)
        f.insert(0, "seed", seed)
        f["y"], f["y_contam"] = y, yc
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------------- (c) classification
def mixing_matrix(d: int, world_seed: int) -> np.ndarray:
    """The fixed noise-mixing matrix, rows scaled to unit norm (unit-variance correlated noise)."""
    A = np.random.default_rng(world_seed).normal(size=(d, d))
    return A / np.linalg.norm(A, axis=1, keepdims=True)


def draw_groups(p: Params, n: int, minority: float, rng: np.random.Generator) -> pd.DataFrame:
    c = p.classification
    d = c.n_features
    A = mixing_matrix(d, c.world_seed)
    y = rng.choice([-1, 1], size=n)
    g = (rng.random(n) < minority).astype(int)
    x = rng.normal(size=(n, d)) @ A.T
    x[:, : c.n_signal] += c.class_mean * y[:, None]
    nuis = slice(c.n_signal, c.n_signal + c.n_nuisance)
    x[g == 1] += c.extra_noise * rng.normal(size=(int(g.sum()), d))
    x[g == 1, nuis] += c.nuisance_shift
    f = pd.DataFrame(x, columns=[f"x_{j}" for j in range(d)])
    f["y"], f["group"] = y, g
    return f


def read_classification(p: Params) -> pd.DataFrame:
    """A user CSV: numeric ``x_*`` features, ``y`` in {0, 1} or {−1, 1}, ``group`` in {0, 1} (1: the
    minority) and ``split`` in {train, test}."""
    ds = "credal_dro.classification.user_path"
    path = Path(p.classification.user_path)
    if not path.is_file():
        raise InputDataError(f"dataset '{ds}': {path} not found (a CSV with x_*, y, group, split)")
    df = read_user_file(path, key=ds, schema=CLASSIFICATION, kind="csv")
    feats = [c for c in df.columns if str(c).startswith("x_")]
    df = df.copy()
    df["y"] = np.where(df["y"] > 0, 1, -1)
    return df[[*feats, "y", "group", "split"]]


def make_classification(p: Params) -> pd.DataFrame:
    """seed, split (fit/calib/test), x_* standardised with the fit split, y (±1), group (1: minority)."""
    c = p.classification
    user = read_classification(p) if c.user_path else None
    frames = []
    for seed in p.seeds:
        rng = _rng(seed, "classification")
        if user is None:
            parts = {
                "fit": draw_groups(p, c.n_train, c.minority_train, rng),
                "calib": draw_groups(p, c.n_calib, c.minority_train, rng),
                "test": draw_groups(p, c.n_test, c.minority_test, rng),
            }
        else:
            tr = user[user.split == "train"].drop(columns="split")
            tr = tr.iloc[rng.permutation(len(tr))]
            n_cal = int(round(len(tr) * c.n_calib / (c.n_train + c.n_calib)))
            parts = {
                "fit": tr.iloc[n_cal:],
                "calib": tr.iloc[:n_cal],
                "test": user[user.split == "test"].drop(columns="split"),
            }
        f = pd.concat([d.assign(split=s) for s, d in parts.items()], ignore_index=True)
        feats = [col for col in f.columns if col.startswith("x_")]
        fit = f.split == "fit"
        mu, sd = f.loc[fit, feats].mean(), f.loc[fit, feats].std(ddof=0).replace(0, 1.0)
        f[feats] = (f[feats] - mu) / sd
        f.insert(0, "seed", seed)
        frames.append(f)
    return pd.concat(frames, ignore_index=True)
