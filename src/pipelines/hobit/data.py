"""Inputs of `hobit`: ``hobit_synth``, a seeded latent-hierarchy retrieval set (topic → subtopic → fact;
a query view and a document view of each fact through different random maps, so a dual encoder is
needed; a share of train facts duplicated: the contradictory negatives), or a user parquet of pairs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.core.schemas import InputDataError, TableSchema
from pipelines.hobit.params import Params

SHARED = -1                     # the seed value of a table every seed uses (the user's pairs)
PAIRS_SCHEMA = TableSchema("hobit.data.user_path",
                           {"split": "str", "fact": "int", "q": "array[number]", "d": "array[number]"},
                           min_rows=4, no_missing=("split", "fact"), allowed={"split": ("train", "test")},
                           covers={"split": ("train", "test")}, lengths={"q": None, "d": None}, finite=("q", "d"))


def synth_pairs(p: Params, seed: int) -> pd.DataFrame:
    """One seed's world: z = t + w_sub·u + w_fact·f (unit-Gaussian prototypes), q = A z + ε, d = B z + ε
    with A, B ~ N(0, 1/latent_dim) so that |Az| ≈ |z|. Held-out facts give one test pair each; the rest
    give the train pairs, ``dup_rate`` of them twice (independent noise)."""
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
    if d.n_test_facts >= n_facts:
        raise InputDataError(f"dataset 'hobit_synth': n_test_facts {d.n_test_facts} leaves no train facts "
                             f"(only {n_facts} facts)")
    A = rng.normal(scale=L ** -0.5, size=(O, L))
    B = rng.normal(scale=L ** -0.5, size=(O, L))
    perm = rng.permutation(n_facts)
    test_f, train_f = np.sort(perm[:d.n_test_facts]), perm[d.n_test_facts:]
    dup_f = rng.choice(train_f, size=int(round(d.dup_rate * len(train_f))), replace=False)
    train_all = rng.permutation(np.concatenate([train_f, dup_f]))
    facts = np.concatenate([train_all, test_f])
    split = np.array(["train"] * len(train_all) + ["test"] * len(test_f))
    zq = z[facts]
    q = zq @ A.T + d.noise * rng.normal(size=(len(facts), O))
    dd = zq @ B.T + d.noise * rng.normal(size=(len(facts), O))
    return pd.DataFrame({"seed": seed, "split": split, "fact": facts.astype(np.int64), "topic": topic[facts],
                         "subtopic": subtopic[facts], "q": list(q.astype(np.float32)),
                         "d": list(dd.astype(np.float32))})


def check_pairs(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """A user table of pairs (:data:`PAIRS_SCHEMA`): ``split`` (train/test, both present), ``fact`` (int; pairs
    with the same id are duplicates, i.e. each other's positives), ``q`` and ``d`` (equal-length vectors of
    finite numbers). Raises InputDataError naming the dataset and the column."""
    return PAIRS_SCHEMA.refine(dataset=name).check(df)


def make_pairs(p: Params) -> pd.DataFrame:
    """The pairs of every seed (column ``seed``): synthetic per seed, or the user's table once (seed -1,
    shared by every seed)."""
    if p.data.user_path:
        path = p.data.user_path
        name = f"hobit.data.user_path ({path})"
        if not Path(path).is_file():
            raise InputDataError(f"dataset '{name}': no file at {path}")
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's input error
            raise InputDataError(f"dataset '{name}': not a readable parquet ({type(exc).__name__}: {exc})") from None
        df = check_pairs(df, name)
        df = df[["split", "fact", "q", "d"]].copy()
        df["q"] = df["q"].map(lambda v: np.asarray(v, np.float32))
        df["d"] = df["d"].map(lambda v: np.asarray(v, np.float32))
        df["topic"], df["subtopic"] = -1, -1
        return df.assign(seed=SHARED)          # one copy for every seed
    return pd.concat([synth_pairs(p, s) for s in p.seeds], ignore_index=True)


def seed_arrays(df: pd.DataFrame, seed: int) -> dict[str, np.ndarray]:
    """One seed's pairs as arrays: train q/d/fact, test q/fact, and the corpus (train docs then test docs)."""
    d = df[df["seed"] == seed]
    if d.empty:
        d = df[df["seed"] == SHARED]
    tr, te = d[d["split"] == "train"], d[d["split"] == "test"]
    q_tr, d_tr = np.stack(tr["q"].to_numpy()).astype(np.float32), np.stack(tr["d"].to_numpy()).astype(np.float32)
    q_te, d_te = np.stack(te["q"].to_numpy()).astype(np.float32), np.stack(te["d"].to_numpy()).astype(np.float32)
    return {"q_train": q_tr, "d_train": d_tr, "fact_train": tr["fact"].to_numpy(np.int64),
            "q_test": q_te, "fact_test": te["fact"].to_numpy(np.int64),
            "corpus": np.concatenate([d_tr, d_te]),
            "fact_corpus": np.concatenate([tr["fact"].to_numpy(np.int64), te["fact"].to_numpy(np.int64)])}
