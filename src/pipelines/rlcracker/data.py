"""The corpus `rlcracker` runs on: a seeded synthetic "language with synonyms" (meaning = the concept
sequence; each concept has several surface tokens with a Zipf-like human preference), or a user corpus
plus a lexicon mapping each word to its meaning class (`--env=full`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import TableSchema, read_user_file
from pipelines.rlcracker.params import Params

SPLITS = ("train", "wm_train", "test")
CORPUS = TableSchema(
    "rlcracker.wm_corpus",
    {"split": "str", "question": "str", "answer": "str"},
    min_rows=4,
    no_missing=("split", "question", "answer"),
    allowed={"split": SPLITS},
    covers={"split": SPLITS},
)
LEXICON = TableSchema(
    "rlcracker.lexicon", {"token": "str", "concept": "str"}, min_rows=2, no_missing=("token", "concept")
)


def token_name(concept: int, synonym: int) -> str:
    return f"c{concept:03d}s{synonym}"


def synthetic_language(p: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(lexicon, corpus). A question is a topic and two seed concepts; its answer continues a
    topic-conditioned Markov chain over concepts (logits N(0, std²)) from the second seed for
    ``answer_len`` concepts, each written with a synonym drawn from that concept's preference."""
    d = p.data
    rng = np.random.default_rng(d.seed)
    C, S = d.n_concepts, d.n_synonyms
    base = np.asarray(d.synonym_pref, float) / np.sum(d.synonym_pref)
    pref = np.stack([base[rng.permutation(S)] for _ in range(C)])  # [C, S]
    logits = rng.normal(0.0, d.transition_logit_std, size=(d.n_topics, C, C))
    trans = np.exp(logits - logits.max(-1, keepdims=True))
    trans /= trans.sum(-1, keepdims=True)
    lexicon = pd.DataFrame(
        {
            "token": [token_name(c, s) for c in range(C) for s in range(S)],
            "concept": [f"c{c:03d}" for c in range(C) for _ in range(S)],
            "pref": pref.reshape(-1),
        }
    )

    cum_pref, cum_trans = pref.cumsum(-1), trans.cumsum(-1)

    def draw(cum: np.ndarray) -> int:  # inverse-CDF sampling (rng.choice(p=...) is slow per call)
        return min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(cum) - 1)

    def word(c: int) -> str:
        return token_name(c, draw(cum_pref[c]))

    rows = []
    counts = {"train": d.n_lm_train, "wm_train": d.n_wm_train, "test": d.n_test}
    for split in SPLITS:
        for _ in range(counts[split]):
            topic = int(rng.integers(d.n_topics))
            seeds = rng.integers(C, size=2)
            chain, c = [], int(seeds[1])
            for _ in range(d.answer_len):
                c = draw(cum_trans[topic, c])
                chain.append(c)
            rows.append(
                {
                    "split": split,
                    "question": " ".join([f"t{topic}", word(seeds[0]), word(seeds[1])]),
                    "answer": " ".join(word(c) for c in chain),
                }
            )
    return lexicon, pd.DataFrame(rows)


def load_corpus(p: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """data.corpus: (lexicon, corpus), synthetic or read from the user's files and checked."""
    if p.data.source == "synthetic":
        return synthetic_language(p)
    corpus = read_user_file(p.data.corpus_path, key="rlcracker.data.corpus_path", kind="parquet")
    lexicon = read_user_file(p.data.lexicon_path, key="rlcracker.data.lexicon_path", kind="parquet")
    corpus, lexicon = CORPUS.check(corpus), LEXICON.check(lexicon)
    return lexicon.reset_index(drop=True), corpus.reset_index(drop=True)
