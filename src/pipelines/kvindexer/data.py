"""Seeded RULER-mini prompts for `kvindexer`: needles hidden in a random haystack, a question in the last
chunk, a 4-token answer.

Token layout (``Vocab``): ``<pad> <bos> <eos> [KEY] [VAL] [Q] [ANS]``, then the key, value and filler
vocabularies. A needle is ``[KEY] k [VAL] v1 .. v4`` (four distinct values); the context is ``<bos>`` and
``N - 1`` haystack tokens with the needles inserted at uniform depths; the question is ``[Q] k [ANS]`` and
the answer ``v1 .. v4``.

Tasks: ``niah_single`` (one needle), ``niah_multikey`` (4 needles with distinct keys, one asked),
``niah_multivalue`` (4 one-value needles sharing a key; the answer lists their values in order) and ``vt``
(variable tracking: ``[KEY] k1 [VAL] v1..v4`` and later ``[KEY] k2 [VAL] k1``; asking ``k2`` needs two hops).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipelines.core.api import TableSchema
from pipelines.kvindexer.params import Params

KEY, VAL, Q, ANS = 3, 4, 5, 6
N_SPECIAL = 7
PROMPTS = TableSchema(
    "kvindexer.user_prompts",
    {
        "task": "str",
        "context": "array",
        "question": "array",
        "answer": "array",
        "needle_pos": "array",
        "depth": "number",
    },
    no_missing=("depth",),
)


@dataclass(frozen=True)
class Vocab:
    n_keys: int
    n_values: int
    n_filler: int

    @property
    def key0(self) -> int:
        return N_SPECIAL

    @property
    def val0(self) -> int:
        return N_SPECIAL + self.n_keys

    @property
    def fill0(self) -> int:
        return N_SPECIAL + self.n_keys + self.n_values

    @property
    def size(self) -> int:
        return self.fill0 + self.n_filler


def vocab_of(p: Params) -> Vocab:
    return Vocab(p.data.n_keys, p.data.n_values, p.data.n_filler)


def _place(rng: np.random.Generator, n_ctx: int, needles: list[list[int]], v: Vocab):
    """Context of ``n_ctx`` tokens: <bos>, haystack, the needles (in order) at random depths.
    Returns (tokens, [start position of each needle], [depth of each needle in [0, 1]])."""
    total = sum(map(len, needles))
    n_fill = n_ctx - 1 - total
    if n_fill < 0:
        raise ValueError(f"context of {n_ctx} tokens cannot hold {total} needle tokens")
    gaps = np.sort(rng.integers(0, n_fill + 1, size=len(needles)))
    filler = rng.integers(v.fill0, v.fill0 + v.n_filler, size=n_fill)
    out, starts, depths, f = [1], [], [], 0
    for g, nd in zip(gaps, needles):
        out.extend(filler[f:g].tolist())
        f = g
        starts.append(len(out))
        depths.append(float(g) / max(n_fill, 1))
        out.extend(nd)
    out.extend(filler[f:].tolist())
    return out, starts, depths


def _values(rng, v: Vocab, k: int) -> list[int]:
    return (v.val0 + rng.choice(v.n_values, size=k, replace=False)).tolist()


def _needle_values(rng, v: Vocab, n_needles: int, k: int, distinct: bool) -> list[list[int]]:
    """The values of ``n_needles`` needles of ``k`` distinct values each; ``distinct``: no value is shared
    between needles either, so the value that follows another is unambiguous in the whole context."""
    if not distinct:
        return [_values(rng, v, k) for _ in range(n_needles)]
    flat = _values(rng, v, n_needles * k)
    return [flat[i * k : (i + 1) * k] for i in range(n_needles)]


def make_prompt(
    task: str, rng: np.random.Generator, n_ctx: int, v: Vocab, n_vals: int = 4, n_multi: int = 4, distinct: bool = False
) -> dict:
    """One prompt of ``task``: context, question, answer, positions of the asked needle's tokens, depth.
    ``distinct``: the needles of ``niah_multikey`` share no value."""
    if task == "niah_single":
        k = int(v.key0 + rng.integers(v.n_keys))
        vals = _values(rng, v, n_vals)
        ctx, starts, depths = _place(rng, n_ctx, [[KEY, k, VAL, *vals]], v)
        pos = list(range(starts[0], starts[0] + 3 + n_vals))
        return dict(context=ctx, question=[Q, k, ANS], answer=vals, needle_pos=pos, depth=depths[0])
    if task == "niah_multikey":
        keys = (v.key0 + rng.choice(v.n_keys, size=n_multi, replace=False)).tolist()
        vals = _needle_values(rng, v, n_multi, n_vals, distinct)
        ctx, starts, depths = _place(rng, n_ctx, [[KEY, k, VAL, *vs] for k, vs in zip(keys, vals)], v)
        a = int(rng.integers(n_multi))
        pos = list(range(starts[a], starts[a] + 3 + n_vals))
        return dict(context=ctx, question=[Q, keys[a], ANS], answer=vals[a], needle_pos=pos, depth=depths[a])
    if task == "niah_multivalue":
        k = int(v.key0 + rng.integers(v.n_keys))
        vals = _values(rng, v, n_vals)
        ctx, starts, depths = _place(rng, n_ctx, [[KEY, k, VAL, x] for x in vals], v)
        pos = [s + j for s in starts for j in range(4)]
        return dict(context=ctx, question=[Q, k, ANS], answer=vals, needle_pos=pos, depth=float(np.mean(depths)))
    if task == "vt":
        k1, k2 = (v.key0 + rng.choice(v.n_keys, size=2, replace=False)).tolist()
        vals = _values(rng, v, n_vals)
        ctx, starts, depths = _place(rng, n_ctx, [[KEY, k1, VAL, *vals], [KEY, k2, VAL, k1]], v)
        pos = list(range(starts[0], starts[0] + 3 + n_vals)) + list(range(starts[1], starts[1] + 4))
        return dict(context=ctx, question=[Q, k2, ANS], answer=vals, needle_pos=pos, depth=depths[0])
    raise ValueError(f"unknown task {task!r}")


def training_sequence(
    rng: np.random.Generator,
    n_ctx: int,
    v: Vocab,
    multi: bool,
    n_vals: int = 4,
    n_multi: int = 4,
    distinct: bool = False,
) -> list[int]:
    """A base-model training sequence: one needle and its question, or ``n_multi`` needles followed by a
    question for every key in turn (dense supervision: every token after the context is a target)."""
    if not multi:
        pr = make_prompt("niah_single", rng, n_ctx, v, n_vals)
        return pr["context"] + pr["question"] + pr["answer"]
    keys = (v.key0 + rng.choice(v.n_keys, size=n_multi, replace=False)).tolist()
    vals = _needle_values(rng, v, n_multi, n_vals, distinct)
    ctx, _, _ = _place(rng, n_ctx, [[KEY, k, VAL, *vs] for k, vs in zip(keys, vals)], v)
    tail = []
    for a in rng.permutation(n_multi):
        tail += [Q, keys[a], ANS, *vals[a]]
    return ctx + tail


def make_prompts(p: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``kv_train`` (indexer / memory training prompts, ``niah_single``, per seed) and ``kv_eval`` (every
    task of ``eval.tasks``, per seed), or the user's prompt table (``data.source: file``)."""
    v, d = vocab_of(p), p.data
    train_rows, eval_rows = [], []
    for seed in p.seeds:
        rng = np.random.default_rng([seed, 11])
        for i in range(d.n_train):
            train_rows.append(
                {
                    "seed": seed,
                    "task": "niah_single",
                    "idx": i,
                    **make_prompt("niah_single", rng, d.context_len, v, d.n_values_per_needle, d.n_needles_multi),
                }
            )
        if d.source == "synthetic":
            for t_i, task in enumerate(p.eval.tasks):
                rng = np.random.default_rng([seed, 23, t_i])
                for i in range(d.n_eval):
                    eval_rows.append(
                        {
                            "seed": seed,
                            "task": task,
                            "idx": i,
                            **make_prompt(
                                task,
                                rng,
                                d.context_len,
                                v,
                                d.n_values_per_needle,
                                d.n_needles_multi,
                                d.multikey_distinct_values,
                            ),
                        }
                    )
    train = pd.DataFrame(train_rows)
    if d.source == "file":
        ev = load_user_prompts(d.eval_path, p)
        eval_df = pd.concat([ev.assign(seed=s, idx=np.arange(len(ev))) for s in p.seeds], ignore_index=True)
    else:
        eval_df = pd.DataFrame(eval_rows)
    return train, eval_df


def load_user_prompts(path: str, p: Params) -> pd.DataFrame:
    """A parquet table of prompts in this vocabulary (README, "Input format"), checked at the door."""
    from pipelines.core.api import InputDataError, read_user_file

    df = read_user_file(path, key="kvindexer.data.eval_path", schema=PROMPTS, kind="parquet")
    v, n = vocab_of(p), p.data.context_len
    for i, r in df.iterrows():
        if len(r["context"]) != n:
            raise InputDataError(
                f"dataset 'kvindexer.user_prompts', column 'context': row {i} has "
                f"{len(r['context'])} tokens, expected data.context_len={n}"
            )
        for col in ("context", "question", "answer"):
            arr = np.asarray(r[col])
            if arr.min() < 0 or arr.max() >= v.size:
                raise InputDataError(
                    f"dataset 'kvindexer.user_prompts', column '{col}': row {i} has a token id outside [0, {v.size})"
                )
    return df[list(PROMPTS.columns)].reset_index(drop=True)
