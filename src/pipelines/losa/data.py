"""Seeded long-context retrieval data (LongBench / RULER-like, the card's small-scale stand-in): a context
of filler tokens with key→value records scattered in it, a question listing query keys, and an answer
block holding their values (padded to one diffusion block). Or a user table (``data.source: file``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipelines.core.api import TableSchema, read_user_file
from pipelines.losa.params import Params

PAD, BOS, EOS, MASK, SEP = 0, 1, 2, 3, 4
N_SPECIAL = 5
USER_TABLE = TableSchema(
    "losa.user_table",
    {"prompt": "str", "answer": "str", "split": "str"},
    min_rows=2,
    no_missing=("prompt", "answer", "split"),
)


@dataclass(frozen=True)
class Vocab:
    """Token id layout: specials, then filler, key and value symbols (disjoint ranges)."""

    n_filler: int
    n_key: int
    n_value: int

    @property
    def filler0(self) -> int:
        return N_SPECIAL

    @property
    def key0(self) -> int:
        return N_SPECIAL + self.n_filler

    @property
    def value0(self) -> int:
        return self.key0 + self.n_key

    @property
    def size(self) -> int:
        return self.value0 + self.n_value


def vocab_of(p: Params) -> Vocab:
    d = p.data
    return Vocab(d.n_filler_symbols, d.n_key_symbols, d.n_value_symbols)


def prefix_len_of(p: Params) -> int:
    d = p.data
    return 1 + d.context_len + 1 + d.n_query_keys * d.key_len


def retrieval_samples(p: Params, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` sequences [BOS, context (N), SEP, query keys | answer block (B)] as [n, prefix + B], in the
    smallest integer type the vocabulary fits (int16 below 2¹⁵ ids, as :func:`make_tasks` stores them): at
    the full env's 200,000 × 4,112 an int64 array alone is 6.1 GiB."""
    d, v = p.data, vocab_of(p)
    rec = d.key_len + d.value_len
    n_prefix = prefix_len_of(p)
    out = np.full((n, n_prefix + d.block_size), PAD, dtype=np.int16 if v.size < 2**15 else np.int32)
    out[:, 0] = BOS
    # the filler in blocks of an even number of rows (the same draws as one (n, context_len) call, without
    # its int64 temporary: 6 GiB at the full env's 200,000 × 4,064)
    step = max(2, ((1 << 22) // max(d.context_len, 1)) & ~1)
    for i in range(0, n, step):
        m = min(step, n - i)
        out[i : i + m, 1 : 1 + d.context_len] = v.filler0 + rng.integers(0, d.n_filler_symbols, size=(m, d.context_len))
    out[:, 1 + d.context_len] = SEP
    free = d.context_len - d.n_records * rec
    for i in range(n):
        # distinct keys (as tuples of key symbols), values drawn freely
        keys: set[tuple[int, ...]] = set()
        while len(keys) < d.n_records:
            keys.add(tuple(rng.integers(0, d.n_key_symbols, size=d.key_len).tolist()))
        key_arr = v.key0 + np.array(sorted(keys, key=lambda _: rng.random()), dtype=np.int64)
        val_arr = v.value0 + rng.integers(0, d.n_value_symbols, size=(d.n_records, d.value_len))
        # non-overlapping record positions: sorted gap picks, shifted by the records before them
        starts = np.sort(rng.choice(free + d.n_records, size=d.n_records, replace=False))
        starts = starts + np.arange(d.n_records) * (rec - 1)
        for r in range(d.n_records):
            s = 1 + starts[r]
            out[i, s : s + d.key_len] = key_arr[r]
            out[i, s + d.key_len : s + rec] = val_arr[r]
        ask = rng.choice(d.n_records, size=d.n_query_keys, replace=False)
        q0 = 2 + d.context_len
        out[i, q0:n_prefix] = key_arr[ask].reshape(-1)
        out[i, n_prefix : n_prefix + d.n_query_keys * d.value_len] = val_arr[ask].reshape(-1)
    return out


def _user_tasks(p: Params) -> dict:
    """A user table: one row per sample, ``prompt`` and ``answer`` as whitespace-separated symbols,
    ``split`` in {train, eval}; prompts are left-padded with PAD to the longest, answers right-padded to
    the block size (an answer longer than a block is an error naming the row)."""
    from pipelines.core.api import InputDataError

    path = str(p.data.path)
    df = read_user_file(path, key="losa.data.path", schema=USER_TABLE, kind=("csv", "parquet"))
    bad = sorted(set(df["split"]) - {"train", "eval"})
    if bad:
        raise InputDataError(f"dataset 'losa.user_table': column 'split' has values {bad} (use train / eval)")
    symbols = sorted({s for col in ("prompt", "answer") for t in df[col] for s in t.split()})
    stoi = {s: N_SPECIAL + i for i, s in enumerate(symbols)}
    prompts = [[stoi[s] for s in t.split()] for t in df["prompt"]]
    answers = [[stoi[s] for s in t.split()] for t in df["answer"]]
    B = p.data.block_size
    long = [i for i, a in enumerate(answers) if len(a) > B]
    if long:
        raise InputDataError(
            f"dataset 'losa.user_table': column 'answer' row {long[0]} has more than block_size={B} symbols"
        )
    n_prefix = 1 + max(map(len, prompts))
    seq = np.full((len(df), n_prefix + B), PAD, dtype=np.int64)
    for i, (pr, a) in enumerate(zip(prompts, answers)):
        seq[i, n_prefix - len(pr) - 1] = BOS
        seq[i, n_prefix - len(pr) : n_prefix] = pr
        seq[i, n_prefix : n_prefix + len(a)] = a
    split = df["split"].to_numpy()
    if not (split == "train").any() or not (split == "eval").any():
        raise InputDataError("dataset 'losa.user_table': column 'split' needs both train and eval rows")
    ev = seq[split == "eval"]
    return {
        "train": seq[split == "train"],
        **{f"eval_seed{s}": ev for s in p.seeds},
        "vocab_size": N_SPECIAL + len(symbols),
        "n_prefix": n_prefix,
        "n_value_tokens": None,
    }


def make_tasks(p: Params) -> dict:
    """``data.tasks``: the training set (``data.world_seed``) and one eval set per run seed, as tensors
    {"train": int16 [n_train, L], "eval_seed<s>": int16 [n_eval, L], "meta": [vocab size, prefix len]}."""
    if p.data.source == "file":
        t = _user_tasks(p)
    else:
        t = {
            "train": retrieval_samples(p, p.data.n_train, np.random.default_rng([p.data.world_seed, 0])),
            **{
                f"eval_seed{s}": retrieval_samples(p, p.data.n_eval, np.random.default_rng([p.data.world_seed, 1, s]))
                for s in p.seeds
            },
            "vocab_size": vocab_of(p).size,
            "n_prefix": prefix_len_of(p),
        }
    meta = torch.tensor([t.pop("vocab_size"), t.pop("n_prefix")], dtype=torch.long)
    t.pop("n_value_tokens", None)
    dtype = torch.int16 if int(meta[0]) < 2**15 else torch.int32
    return {**{k: torch.as_tensor(a).to(dtype) for k, a in t.items()}, "meta": meta}
