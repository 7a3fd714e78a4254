"""The default corpus `ghost_synthlm` (`topic`): each sequence has a latent topic z; every token comes with
probability ``topic_prob`` from z's Zipf unigram (over a topic-specific permutation of the vocabulary),
otherwise from a shared order-1 Markov table (``n_successors`` successors per token, Dirichlet weights).
Inferring z needs evidence accumulated over many tokens, which the SSM state holds and a short conv cannot,
so the state matters. Or a user's token sequences (full env): a parquet table, one row per sequence."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import TableSchema, read_user_file
from pipelines.ghost.params import Params

SPLITS = ("train", "val", "calib", "test")
USER_CORPUS = TableSchema(
    "ghost.user_corpus",
    {"split": "str", "tokens": "array[int]"},
    min_rows=4,
    no_missing=("split", "tokens"),
    allowed={"split": SPLITS},
    covers={"split": SPLITS},
)


def topic_world(p: Params) -> dict[str, np.ndarray]:
    """The fixed generative world: topic unigrams [Z, V], Markov successors [V, k] and their weights."""
    d = p.data
    rng = np.random.default_rng(d.world_seed)
    V = d.vocab_size
    zipf = 1.0 / np.arange(1, V + 1) ** d.zipf_alpha
    zipf /= zipf.sum()
    unigram = np.zeros((d.n_topics, V))
    for z in range(d.n_topics):
        unigram[z, rng.permutation(V)] = zipf
    succ = np.stack([rng.choice(V, d.n_successors, replace=False) for _ in range(V)])
    weights = rng.dirichlet(np.full(d.n_successors, d.dirichlet), size=V)
    return {"unigram": unigram, "succ": succ, "weights": weights}


def sample_topic_sequences(
    world: dict[str, np.ndarray], n: int, seq_len: int, topic_prob: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [n, seq_len], topics [n]); vectorised over sequences, a loop over positions."""
    unigram, succ, weights = world["unigram"], world["succ"], world["weights"]
    Z, V = unigram.shape
    z = rng.integers(0, Z, n)
    topic_tok = np.empty((n, seq_len), dtype=np.int64)
    for k in range(Z):
        rows = np.flatnonzero(z == k)
        if len(rows):
            topic_tok[rows] = rng.choice(V, size=(len(rows), seq_len), p=unigram[k])
    use_topic = rng.random((n, seq_len)) < topic_prob
    cdf = np.cumsum(weights, 1)
    cdf[:, -1] = 1.0
    u = rng.random((n, seq_len))
    tok = np.empty((n, seq_len), dtype=np.int64)
    tok[:, 0] = np.where(use_topic[:, 0], topic_tok[:, 0], rng.integers(0, V, n))
    for t in range(1, seq_len):
        prev = tok[:, t - 1]
        j = (u[:, t, None] > cdf[prev]).sum(1)
        tok[:, t] = np.where(use_topic[:, t], topic_tok[:, t], succ[prev, j])
    return tok, z


def markov_mqar_sequences(
    p: Params, n: int, rng: np.random.Generator, world_rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The old mix (sweeps only): a share ``1 − mqar_fraction`` of order-2 Markov sequences (``n_successors``
    successors per context pair, Dirichlet weights), the rest multi-query associative recall: ``mqar_pairs``
    key-value pairs (keys from [0, mqar_pairs) shuffled, values from the next ``mqar_values`` tokens), then
    queries "key value" of those pairs. Returns (tokens, mask of the value positions of the queries)."""
    d = p.data
    V, L, k = d.vocab_size, d.seq_len, d.n_successors
    succ = world_rng.integers(0, V, (V, V, k))
    cdf = np.cumsum(world_rng.dirichlet(np.full(k, d.dirichlet), size=(V, V)), -1)
    cdf[..., -1] = 1.0
    tok = np.empty((n, L), dtype=np.int64)
    tok[:, :2] = rng.integers(0, V, (n, 2))
    u = rng.random((n, L))
    for t in range(2, L):
        j = (u[:, t, None] > cdf[tok[:, t - 2], tok[:, t - 1]]).sum(1)
        tok[:, t] = succ[tok[:, t - 2], tok[:, t - 1], j]
    mask = np.zeros((n, L), dtype=bool)
    P, K = d.mqar_pairs, d.mqar_values
    for i in np.flatnonzero(rng.random(n) < d.mqar_fraction):
        keys = rng.permutation(P)
        vals = P + rng.integers(0, K, P)
        tok[i, : 2 * P : 2], tok[i, 1 : 2 * P : 2] = keys, vals
        q = rng.integers(0, P, (L - 2 * P) // 2)
        tok[i, 2 * P : 2 * P + 2 * len(q) : 2] = keys[q]
        tok[i, 2 * P + 1 : 2 * P + 2 * len(q) : 2] = vals[q]
        mask[i, 2 * P + 1 : 2 * P + 2 * len(q) : 2] = True
    return tok, mask


def make_corpus(p: Params) -> dict[str, torch.Tensor]:
    """``{split: tokens [n, seq_len] (long), "topics_<split>": [n]}`` for train / val / calib / test (and,
    for ``markov_mqar``, ``mqar_mask_<split>``: the positions of queried values)."""
    d = p.data
    if d.source == "file":
        return load_user_corpus(read_user_file(d.user_file, key="ghost.data.user_file", kind="parquet"), p)
    if d.kind == "markov_mqar":
        out = {}
        sizes = {"train": d.n_train, "val": d.n_val, "calib": d.n_calib, "test": d.n_test}
        for i, split in enumerate(SPLITS):
            tok, mask = markov_mqar_sequences(
                p, sizes[split], np.random.default_rng([d.world_seed, i + 1]), np.random.default_rng(d.world_seed)
            )
            out[split] = torch.from_numpy(tok)
            out[f"topics_{split}"] = torch.zeros(sizes[split], dtype=torch.long)
            out[f"mqar_mask_{split}"] = torch.from_numpy(mask)
        return out
    world = topic_world(p)
    out: dict[str, torch.Tensor] = {}
    sizes = {"train": d.n_train, "val": d.n_val, "calib": d.n_calib, "test": d.n_test}
    for i, split in enumerate(SPLITS):
        rng = np.random.default_rng([d.world_seed, i + 1])
        tok, z = sample_topic_sequences(world, sizes[split], d.seq_len, d.topic_prob, rng)
        out[split] = torch.from_numpy(tok)
        out[f"topics_{split}"] = torch.from_numpy(z)
    return out


def load_user_corpus(df: pd.DataFrame, p: Params, name: str = "ghost.user_corpus") -> dict[str, torch.Tensor]:
    """A user's token table: column ``split`` (train / val / calib / test), column ``tokens`` (a list of
    ints in [0, vocab_size), all of length ``data.seq_len``). Errors name the dataset and the column."""
    d = p.data
    USER_CORPUS.refine(dataset=name, lengths={"tokens": d.seq_len}, ranges={"tokens": (0, d.vocab_size - 1)}).check(df)
    out: dict[str, torch.Tensor] = {}
    for split in SPLITS:
        rows = df[df["split"] == split]["tokens"].tolist()
        arr = np.asarray([np.asarray(r) for r in rows])
        out[split] = torch.from_numpy(arr.astype(np.int64))
        out[f"topics_{split}"] = torch.zeros(len(rows), dtype=torch.long)  # unknown: no OOD split
    return out
