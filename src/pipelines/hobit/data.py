"""Inputs of `hobit`: ``hobit_synth``, a seeded latent-hierarchy retrieval set (topic → subtopic → fact;
a query view and a document view of each fact through different random maps, so a dual encoder is
needed; a share of train facts duplicated: the contradictory negatives), or a user parquet of pairs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.hobit.params import Params

SHARED = -1  # the seed value of a table every seed uses (the user's pairs)
PAIRS_SCHEMA = TableSchema(
    "hobit.data.user_path",
    {"split": "str", "fact": "int", "q": "array[number]", "d": "array[number]"},
    min_rows=4,
    no_missing=("split", "fact"),
    allowed={"split": ("train", "val", "test")},
    covers={"split": ("train", "test")},
    lengths={"q": None, "d": None},
    finite=("q", "d"),
)


def synth_pairs(p: Params, seed: int) -> pd.DataFrame:
    """One seed's world: z = t + w_sub·u + w_fact·f (unit-Gaussian prototypes), q = A z + ε, d = B z + ε
    with A, B ~ N(0, 1/latent_dim) so that |Az| ≈ |z|. Held-out facts give one test pair each, another
    ``n_val_facts`` held-out facts one validation pair each (every tuning choice and early stopping reads
    them, never the test pairs); the rest give the train pairs, ``dup_rate`` of them twice (independent
    noise)."""
    d = p.data
    rng = np.random.default_rng([2026, seed])
    L, O = d.latent_dim, d.obs_dim
    t = rng.normal(size=(d.n_topics, L))
    u = rng.normal(size=(d.n_topics, d.n_subtopics, L))
    f = rng.normal(size=(d.n_topics, d.n_subtopics, d.n_facts, L))
    z = t[:, None, None] + d.w_subtopic * u[:, :, None] + d.w_fact * f
    z = z.reshape(-1, L)
    n_facts = len(z)
    topic = np.repeat(np.arange(d.n_topics), d.n_subtopics * d.n_facts)
    subtopic = np.repeat(np.arange(d.n_topics * d.n_subtopics), d.n_facts)
    if d.n_test_facts + d.n_val_facts >= n_facts:
        raise InputDataError(
            f"dataset 'hobit_synth': n_test_facts {d.n_test_facts} + n_val_facts "
            f"{d.n_val_facts} leave no train facts (only {n_facts} facts)"
        )
    A = rng.normal(scale=L**-0.5, size=(O, L))
    B = rng.normal(scale=L**-0.5, size=(O, L))
    perm = rng.permutation(n_facts)
    nt, nv = d.n_test_facts, d.n_val_facts
    test_f, train_f = np.sort(perm[:nt]), perm[nt + nv :]
    val_f = np.sort(perm[nt : nt + nv])
    dup_f = rng.choice(train_f, size=int(round(d.dup_rate * len(train_f))), replace=False)
    train_all = rng.permutation(np.concatenate([train_f, dup_f]))
    facts = np.concatenate([train_all, test_f, val_f])
    split = np.array(["train"] * len(train_all) + ["test"] * len(test_f) + ["val"] * len(val_f))
    zq = z[facts]
    q = zq @ A.T + d.noise * rng.normal(size=(len(facts), O))
    dd = zq @ B.T + d.noise * rng.normal(size=(len(facts), O))
    return pd.DataFrame(
        {
            "seed": seed,
            "split": split,
            "fact": facts.astype(np.int64),
            "topic": topic[facts],
            "subtopic": subtopic[facts],
            "q": list(q.astype(np.float32)),
            "d": list(dd.astype(np.float32)),
        }
    )


def check_pairs(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """A user table of pairs (:data:`PAIRS_SCHEMA`): ``split`` (train/test, both present; val optional), ``fact`` (int; pairs
    with the same id are duplicates, i.e. each other's positives), ``q`` and ``d`` (equal-length vectors of
    finite numbers). Raises InputDataError naming the dataset and the column."""
    return PAIRS_SCHEMA.refine(dataset=name).check(df)


def make_pairs(p: Params) -> pd.DataFrame:
    """The pairs of every seed (column ``seed``): synthetic per seed, or the user's table once (seed -1,
    shared by every seed)."""
    if p.data.user_path:
        path = p.data.user_path
        name = f"hobit.data.user_path ({path})"
        df = check_pairs(read_user_file(path, key="hobit.data.user_path", kind="parquet"), name)
        df = df[["split", "fact", "q", "d"]].copy()
        df["q"] = df["q"].map(lambda v: np.asarray(v, np.float32))
        df["d"] = df["d"].map(lambda v: np.asarray(v, np.float32))
        df["topic"], df["subtopic"] = -1, -1
        if not (df["split"] == "val").any():
            df = carve_val(df, p.data.n_val_facts)
        return df.assign(seed=SHARED)  # one copy for every seed
    return pd.concat([synth_pairs(p, s) for s in p.seeds], ignore_index=True)


def carve_val(df: pd.DataFrame, n_val: int) -> pd.DataFrame:
    """A user table without validation pairs: move the pairs of ``n_val`` train facts (at most a quarter of
    them, chosen with a fixed seed) to ``split = val``, so early stopping never reads the test pairs."""
    train_facts = np.unique(df.loc[df["split"] == "train", "fact"].to_numpy())
    k = min(n_val, len(train_facts) // 4)
    if k == 0:
        return df
    chosen = np.random.default_rng([2026, 11]).choice(train_facts, size=k, replace=False)
    df = df.copy()
    df.loc[(df["split"] == "train") & df["fact"].isin(chosen), "split"] = "val"
    return df


def _split(d: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = d[d["split"] == name]
    if s.empty:
        return (
            np.zeros((0, len(d["q"].iloc[0])), np.float32),
            np.zeros((0, len(d["d"].iloc[0])), np.float32),
            np.zeros(0, np.int64),
        )
    return (
        np.stack(s["q"].to_numpy()).astype(np.float32),
        np.stack(s["d"].to_numpy()).astype(np.float32),
        s["fact"].to_numpy(np.int64),
    )


def seed_arrays(df: pd.DataFrame, seed: int) -> dict[str, np.ndarray]:
    """One seed's pairs as arrays: train q/d/fact, validation and test q/fact, and the corpus (train docs,
    then validation docs, then test docs: every query is retrieved against all of them)."""
    d = df[df["seed"] == seed]
    if d.empty:
        d = df[df["seed"] == SHARED]
    (q_tr, d_tr, f_tr), (q_va, d_va, f_va), (q_te, d_te, f_te) = (_split(d, s) for s in ("train", "val", "test"))
    return {
        "q_train": q_tr,
        "d_train": d_tr,
        "fact_train": f_tr,
        "q_val": q_va,
        "fact_val": f_va,
        "q_test": q_te,
        "fact_test": f_te,
        "corpus": np.concatenate([d_tr, d_va, d_te]),
        "fact_corpus": np.concatenate([f_tr, f_va, f_te]),
    }
