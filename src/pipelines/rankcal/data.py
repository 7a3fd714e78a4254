"""Label-ranking data of the small-scale study: semi-synthetic rankings derived from scikit-learn's
bundled data as in Cheng & Hüllermeier (2009) (type A: classification → ranking of the classes by
GaussianNB joint log-likelihood; type B: regression targets → ranking by value), synthetic data with a
known truth (Plackett–Luce and Mallows), and user files in the full environment.

Tie-break (documented, deterministic): equal values rank the lower label index first (stable sort).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.core.api import InputDataError, read_feature_csv
from pipelines.rankcal import ranking as R
from pipelines.rankcal.params import Params


def rank_by_value(values: np.ndarray) -> np.ndarray:
    """Orderings (best first) by descending value; ties go to the lower label index."""
    return np.argsort(-np.asarray(values, float), axis=1, kind="stable")


def nb_rankings(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Type A: fit GaussianNB on the whole set, rank classes by joint log-likelihood. (Ranking by
    ``predict_proba`` would tie many rows at underflowed zeros.)"""
    from sklearn.naive_bayes import GaussianNB

    nb = GaussianNB().fit(x, y)
    return rank_by_value(nb.predict_joint_log_proba(x))


def real_dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, orderings) of a semi-synthetic dataset from sklearn's bundled data (no download)."""
    from sklearn import datasets as skd

    if name in ("iris", "wine"):
        d = getattr(skd, f"load_{name}")()
        return d.data, nb_rankings(d.data, d.target)
    if name == "digits5":
        d = skd.load_digits(n_class=5)
        return d.data, nb_rankings(d.data, d.target)
    if name == "diabetes":
        d = skd.load_diabetes()
        cols = list(d.feature_names)
        lab = [cols.index(c) for c in ("s1", "s2", "s3", "s4")]
        feat = [cols.index(c) for c in ("age", "sex", "bmi", "bp", "s5", "s6")]
        z = (d.data[:, lab] - d.data[:, lab].mean(0)) / d.data[:, lab].std(0)
        return d.data[:, feat], rank_by_value(z)
    if name == "linnerud":  # n = 20: a smoke test only
        d = skd.load_linnerud()
        z = (d.target - d.target.mean(0)) / d.target.std(0)
        return d.data, rank_by_value(z)
    raise ValueError(f"unknown dataset {name!r}")


def synthetic_world(n_features: int, m: int, w_std: float, world_seed: int) -> np.ndarray:
    """The fixed utility weights W (m, d) shared by all seeds."""
    return np.random.default_rng(world_seed).normal(0.0, w_std, size=(m, n_features))


def sample_mallows(centres: np.ndarray, theta: float, rng: np.random.Generator) -> np.ndarray:
    """Mallows(centre, θ) orderings by the repeated insertion model: the label at centre position i
    is inserted at position j ≤ i of the partial ranking with probability ∝ exp(−θ (i − j))."""
    n, m = centres.shape
    out = np.empty_like(centres)
    for r in range(n):
        cur: list[int] = []
        for i in range(m):
            w = np.exp(-theta * (i - np.arange(i + 1)))
            j = rng.choice(i + 1, p=w / w.sum())
            cur.insert(j, int(centres[r, i]))
        out[r] = cur
    return out


def synthetic_dataset(
    kind: str, n: int, W: np.ndarray, theta: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, W.shape[1]))
    u = x @ W.T
    if kind == "pl_truth":
        return x, R.sample_pl(u, rng)
    return x, sample_mallows(rank_by_value(u), theta, rng)


def read_user_file(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A user dataset ``file:<name>``: a CSV with numeric feature columns ``x_*`` and a column ``ranking``
    holding the labels 0..m−1 best→worst, e.g. "2,0,1,3" (the same m on every row). Checked before any
    training: a missing file, column, a wrong dtype, an empty table or a malformed ranking stops the run
    with one line naming the dataset (and the column)."""
    ds = f"file:{name}"
    df, feats = read_feature_csv(
        path,
        ds,
        {"ranking": "str"},
        min_rows=2,
        hint="data.user_dir holds <name>.csv files with columns x_* and 'ranking'; see src/pipelines/rankcal/README.md",
        key=f"rankcal.data.user_dir ({ds})",
    )
    try:
        orderings = [[int(t) for t in str(s).strip("()[] ").split(",")] for s in df["ranking"]]
    except ValueError:
        bad = next(
            s
            for s in df["ranking"]
            if not all(t.strip().lstrip("-").isdigit() for t in str(s).strip("()[] ").split(","))
        )
        raise InputDataError(
            f"dataset '{ds}': column 'ranking' holds {bad!r}; expected labels separated by commas, e.g. \"2,0,1,3\""
        ) from None
    m = len(orderings[0])
    for r, o in enumerate(orderings):
        if sorted(o) != list(range(m)):
            raise InputDataError(
                f"dataset '{ds}': column 'ranking', row {r}: {df['ranking'].iloc[r]!r} is not an "
                f"ordering of the labels 0..{m - 1}"
            )
    return df[feats].to_numpy(float), np.array(orderings, dtype=np.int64)


def _frame(name: str, seed: int, x: np.ndarray, orderings: np.ndarray, split: np.ndarray) -> pd.DataFrame:
    df = pd.DataFrame(x, columns=[f"x_{i}" for i in range(x.shape[1])])
    df.insert(0, "ranking", [",".join(map(str, o)) for o in orderings])
    df.insert(0, "m", orderings.shape[1])
    df.insert(0, "split", split)
    df.insert(0, "seed", seed)
    df.insert(0, "dataset", name)
    return df


def make_datasets(p: Params) -> pd.DataFrame:
    """All datasets × seeds in one long table (dataset, seed, split, m, ranking, x_*); real-derived
    data get a fresh 70/30 split per seed, synthetic data a fresh draw per seed from a fixed world.
    User files are read and checked first, so a bad one stops the run before anything is computed."""
    d = p.data
    frames = []
    for name in d.datasets:
        if name.startswith("file:"):
            x, o = read_user_file(Path(d.user_dir) / f"{name[5:]}.csv", name[5:])
        elif name in ("pl_truth", "mallows_truth"):
            x = o = None
        else:
            x, o = real_dataset(name)
        if o is not None and not 2 <= o.shape[1] <= R.MAX_EXACT_M:
            raise InputDataError(
                f"dataset '{name}': column 'ranking' has m = {o.shape[1]} labels; exact "
                f"tables need 2 <= m <= {R.MAX_EXACT_M}"
            )
        for seed in p.seeds:
            # a stream per (seed, dataset) so adding a dataset never changes another one's draws
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            if x is None:
                s = d.synthetic
                W = synthetic_world(s.n_features, s.m, s.w_std, s.world_seed)
                xs, os_ = synthetic_dataset(name, s.n_train + s.n_test, W, s.mallows_theta, rng)
                split = np.array(["train"] * s.n_train + ["test"] * s.n_test)
                frames.append(_frame(name, seed, xs, os_, split))
            else:
                n_test = int(round(d.test_fraction * len(x)))
                split = np.array(["train"] * len(x), dtype=object)
                split[rng.permutation(len(x))[:n_test]] = "test"
                frames.append(_frame(name, seed, x, o, split.astype(str)))
    return pd.concat(frames, ignore_index=True)


def unpack(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """(features, orderings, m) of one dataset × seed × split slice of the long table."""
    m = int(df["m"].iloc[0])
    feats = [c for c in df.columns if c.startswith("x_") and df[c].notna().all()]
    orderings = np.array([[int(t) for t in s.split(",")] for s in df["ranking"]], dtype=np.int64)
    return df[feats].to_numpy(float), orderings, m
