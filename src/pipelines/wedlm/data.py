"""Seeded synthetic tasks of the WeDLM card (low-entropy `count`, high-entropy `markov`, `reverse`)
and the fixed token layout that keeps EOS at a fixed absolute position (card's EOS pitfall).

Layout of one sequence of length L:  [PAD]* [TAG] prompt-symbols [SEP] | answer-symbols [EOS] [PAD]*
with the prompt left-padded to ``prompt_len`` and the answer of fixed length per regime."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.wedlm.params import Params


class Vocab:
    """Symbols 0..S-1, then SEP, EOS, MASK, PAD and one tag per regime."""

    def __init__(self, n_symbols: int, regimes: list[str]):
        self.n_symbols = n_symbols
        self.sep, self.eos, self.mask, self.pad = n_symbols, n_symbols + 1, n_symbols + 2, n_symbols + 3
        self.tags = {r: n_symbols + 4 + i for i, r in enumerate(sorted(regimes))}
        self.size = n_symbols + 4 + len(self.tags)


def vocab_of(p) -> Vocab:
    return Vocab(p.data.n_symbols, list(p.data.regimes))


def markov_chain(n_symbols: int, sigma: float, temperature: float, seed: int) -> np.ndarray:
    """Order-1 transition matrix P = softmax(G / T), G ~ N(0, sigma²) (fixed by the data seed)."""
    rng = np.random.default_rng([seed, 7])
    g = rng.normal(0.0, sigma, size=(n_symbols, n_symbols)) / temperature
    g -= g.max(1, keepdims=True)
    p = np.exp(g)
    return p / p.sum(1, keepdims=True)


def sample_items(regime: str, n: int, rng: np.random.Generator, p, chain: np.ndarray) -> list[tuple[list, list]]:
    """n (prompt symbols, answer symbols) pairs of one regime (vectorised over the n items)."""
    d, S = p.data, p.data.n_symbols
    a_len = d.answer_len[regime]
    if n == 0:
        return []
    if regime == "reverse":
        prompts = rng.integers(0, S, size=(n, a_len))
        return [(r.tolist(), r[::-1].tolist()) for r in prompts]
    ks = rng.integers(d.min_prompt_terms, d.max_prompt_terms + 1, size=n)
    T = d.max_prompt_terms + a_len
    if regime == "count":
        start = rng.integers(0, S, size=(n, 1))
        stride = rng.choice(np.asarray(d.count_strides), size=(n, 1)) if d.count_strides else d.count_stride
        seq = (start + stride * np.arange(T)[None]) % S
    else:  # markov: the answer continues the chain from the prompt's last symbol
        cdf = np.cumsum(chain, 1)
        seq = np.empty((n, T), dtype=np.int64)
        seq[:, 0] = rng.integers(0, S, size=n)
        for t in range(1, T):
            u = rng.random(n)[:, None]
            seq[:, t] = np.minimum((u > cdf[seq[:, t - 1]]).sum(1), S - 1)
    return [(row[:k].tolist(), row[k : k + a_len].tolist()) for row, k in zip(seq, ks)]


def layout_prompt(regime: str, prompt: list[int], v: Vocab, prompt_len: int) -> list[int]:
    body = [v.tags[regime], *prompt, v.sep]
    if len(body) > prompt_len:
        raise ValueError(f"prompt of {len(prompt)} symbols does not fit data.prompt_len={prompt_len}")
    return [v.pad] * (prompt_len - len(body)) + body


def layout_sequence(
    regime: str, prompt: list[int], answer: list[int], v: Vocab, prompt_len: int, seq_len: int
) -> list[int]:
    seq = layout_prompt(regime, prompt, v, prompt_len) + list(answer) + [v.eos]
    if len(seq) > seq_len:
        raise ValueError(f"sequence of length {len(seq)} does not fit data.seq_len={seq_len}")
    return seq + [v.pad] * (seq_len - len(seq))


SCHEMA = TableSchema(
    "wedlm.file",
    {"regime": "str", "prompt": "array[int]", "answer": "array[int]"},
    no_missing=("regime", "prompt", "answer"),
    row_label="line",
)


def _schema(split: str, path: str, d) -> TableSchema:
    """:data:`SCHEMA` with the bounds of ``p.data``: known regimes, token ids in [0, n_symbols), a prompt of at
    most prompt_len − 2 symbols (the regime tag and the separator take two places)."""
    return SCHEMA.refine(
        dataset=f"wedlm.{split} ({path})",
        allowed={"regime": tuple(d.regimes)},
        ranges={"prompt": (0, d.n_symbols - 1), "answer": (0, d.n_symbols - 1)},
        lengths={"prompt": (None, d.prompt_len - 2)},
    )


def _jsonl_name(path: str, split: str) -> str:
    return f"wedlm.{split} (wedlm.data.{split}_path = {path})"


def jsonl_table(path: str, split: str) -> pd.DataFrame:
    """A user's JSONL file as a table, one row per non-blank line (labelled by its line number), unchecked.
    No file, an empty or a binary one, or a line that is not a JSON object (a cut file) stops the run with
    one line naming the parameter, the file and the line."""
    name = _jsonl_name(path, split)
    text = read_user_file(path, key=f"wedlm.data.{split}_path", kind="txt")
    lines = [(i + 1, line) for i, line in enumerate(text.split("\n")) if line.strip()]
    records = []
    for lineno, line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputDataError(f"dataset '{name}': line {lineno} is not JSON ({exc.msg})") from None
        if not isinstance(r, dict):
            raise InputDataError(f"dataset '{name}': line {lineno} is not a JSON object")
        records.append(r)
    return pd.DataFrame.from_records(records, index=[n for n, _ in lines]) if records else pd.DataFrame()


def read_jsonl(path: str, split: str, p: Params, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """A user's JSONL file as a table (regime, prompt, answer; its row labels are the line numbers),
    checked at the door: columns, kinds, regimes, token range and prompt length (core.schemas), then every
    row's answer length. A bad file stops the run with one line naming the file, the line and the column.
    ``table``: the file as :func:`jsonl_table` read it already."""
    d = p.data
    name = _jsonl_name(path, split)
    table = jsonl_table(path, split) if table is None else table
    df = _schema(split, path, d).check(table)
    for lineno, regime, answer in zip(df.index, df["regime"], df["answer"]):
        if len(answer) != d.answer_len[regime]:
            raise InputDataError(
                f"dataset '{name}': line {lineno}: column 'answer' has {len(answer)} tokens, "
                f"data.answer_len[{regime!r}] = {d.answer_len[regime]}"
            )
    return pd.DataFrame(
        {
            "regime": df["regime"].astype(str),
            "prompt": [list(x) for x in df["prompt"]],
            "answer": [list(x) for x in df["answer"]],
        }
    )


def make_tasks(p: Params) -> tuple[pd.DataFrame, dict]:
    """The test set (one row per item: regime, prompt, answer) and the task tensors: with ``source:
    synthetic`` the Markov chain the items are drawn from; with ``source: file`` the training rows (both
    files checked before any training) and no chain: nothing synthetic is built for the user's data (an
    n_symbols² chain is 8 GB at n_symbols = 32,000), so their markov rows have no true NLL."""
    import torch

    d = p.data
    extra: dict = {}
    if d.source == "file":
        tables = {s: jsonl_table(getattr(d, f"{s}_path"), s) for s in ("test", "train")}  # both read, then checked
        test = read_jsonl(d.test_path, "test", p, tables["test"])
        train = read_jsonl(d.train_path, "train", p, tables["train"])
        v = vocab_of(p)
        extra["train_sequences"] = torch.tensor(
            [
                layout_sequence(r, pr, a, v, d.prompt_len, d.seq_len)
                for r, pr, a in zip(train.regime, train.prompt, train.answer)
            ],
            dtype=torch.long,
        )
    else:
        chain = markov_chain(d.n_symbols, d.markov_sigma, d.markov_temperature, d.seed)
        extra["chain"] = torch.tensor(chain, dtype=torch.float64)
        rng = np.random.default_rng([d.seed, 1])  # the training stream uses the model seeds instead
        frames = []
        for regime in d.regimes:
            items = sample_items(regime, d.n_test, rng, p, chain)
            frames.append(
                pd.DataFrame({"regime": regime, "prompt": [a for a, _ in items], "answer": [b for _, b in items]})
            )
        test = pd.concat(frames, ignore_index=True)
    test["item"] = test.groupby("regime").cumcount()
    return test, extra


def training_batch(regimes: list[str], n: int, rng: np.random.Generator, p, chain: np.ndarray, v: Vocab):
    """A fresh batch of laid-out sequences (regimes drawn uniformly): LongTensor [n, L]."""
    import torch

    which = rng.integers(0, len(regimes), size=n)
    rows = []
    for i, r in enumerate(regimes):
        m = int((which == i).sum())
        for pr, a in sample_items(r, m, rng, p, chain):
            rows.append(layout_sequence(r, pr, a, v, p.data.prompt_len, p.data.seq_len))
    return torch.tensor(rows, dtype=torch.long)
