"""Extraction of the four primitives from text (paper §4: structured extraction + confidence).

Backends return, per text and primitive, a distribution p(label); confidence is the margin
log p(top1) − log p(top2). ``minilm_head`` (default, ``head.py``) is a classifier head on frozen MiniLM sentence
embeddings fitted on the train windows' labels; ``lexicon`` is a pure cue-lexicon scorer with intensifiers,
hedges and negation; ``prototype`` compares MiniLM sentence embeddings with label descriptions; ``llm`` asks
an OpenAI-compatible endpoint (see ``llm.py``)."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

from pipelines.tess.lexicon import (
    DEFAULT,
    HEDGES,
    INTENSIFIERS,
    LABELS,
    LAG_GROUPS,
    MAX_LABELS,
    NEGATIONS,
    PRIMITIVES,
    known_phrases,
)
from pipelines.tess.params import Params

TOKEN = re.compile(r"[a-z]+")
BASE_WEIGHT = 3.0
PRIOR = 1.0


@lru_cache(maxsize=8)
def cue_table(overlap: float) -> list[tuple[tuple[str, ...], str, str]]:
    """(tokens, primitive, group) for every phrase the extractor knows, longest first."""
    known = known_phrases(overlap)
    prim_of = {lab: prim for prim in ("shift", "vol", "shape") for lab in LABELS[prim]}
    rows = []
    for group, phrases in known.items():
        prim = "shift" if group.startswith("DIR-") else prim_of.get(group, "lag")
        for ph in phrases:
            rows.append((tuple(TOKEN.findall(ph.lower())), prim, group))
    return sorted(rows, key=lambda r: -len(r[0]))


@lru_cache(maxsize=8)
def cue_index(overlap: float) -> dict[str, list[tuple[tuple[str, ...], str, str]]]:
    """Cues by their first token (longest first), so scoring a text is one left-to-right pass."""
    index: dict[str, list] = {}
    for row in cue_table(overlap):
        index.setdefault(row[0][0], []).append(row)
    return index


def _group_labels(prim: str, group: str, negated: bool) -> dict[str, float]:
    """How one matched cue spreads its weight over the primitive's labels."""
    if prim == "shift":
        if group.startswith("DIR-"):
            d = group[4:]
            target = {"up": ["MILD-RISE", "STRONG-RISE"], "down": ["MILD-DROP", "STRONG-DROP"], "flat": ["STABLE"]}[d]
            if negated:
                target = ["STABLE"]
            return {t: 1.0 / len(target) for t in target}
        return {"STABLE" if negated else group: 1.0}
    if prim == "vol":
        return {"SAME" if negated else group: 1.0}
    if prim == "shape":
        return {} if negated else {group: 1.0}
    flip = {"FADE": "PERSIST", "PERSIST": "FADE"}
    g = flip.get(group, group) if negated else group
    return {lab: 1.0 for lab, groups in LAG_GROUPS.items() if g in groups}


def lexicon_scores(text: str, overlap: float) -> dict[str, np.ndarray]:
    """Per primitive, label scores = Σ cue weights (× intensifier 1.5, × hedge 0.5 within 2 tokens before, negation within 3
    tokens before the cue flips it or maps it to the neutral label) + a prior on the default label."""
    toks = TOKEN.findall(text.lower())
    scores = {prim: np.zeros(len(LABELS[prim])) for prim in PRIMITIVES}
    for prim in PRIMITIVES:
        scores[prim][LABELS[prim].index(DEFAULT[prim])] += PRIOR
    by_first = cue_index(overlap)
    i = 0
    while i < len(toks):
        match = next(
            (
                (cue, prim, group)
                for cue, prim, group in by_first.get(toks[i], ())
                if tuple(toks[i : i + len(cue)]) == cue
            ),
            None,
        )  # longest cue first
        if match is None:
            i += 1
            continue
        cue, prim, group = match
        n = len(cue)
        w = BASE_WEIGHT
        if any(t in INTENSIFIERS for t in toks[max(0, i - 2) : i + n + 1]):
            w *= 1.5
        if any(t in HEDGES for t in toks[max(0, i - 2) : i]):
            w *= 0.5
        negated = any(t in NEGATIONS for t in toks[max(0, i - 3) : i])
        for lab, share in _group_labels(prim, group, negated).items():
            scores[prim][LABELS[prim].index(lab)] += w * share
        i += n
    return scores


def _softmax(z: np.ndarray, tau: float) -> np.ndarray:
    z = z / tau
    e = np.exp(z - z.max())
    return e / e.sum()


def summarise(probs: np.ndarray) -> tuple[int, float, float]:
    """(top label index, margin log p1 − log p2, entropy) of one distribution."""
    order = np.argsort(-probs, kind="stable")
    p1, p2 = probs[order[0]], probs[order[1]] if len(probs) > 1 else 1e-12
    margin = float(np.log(max(p1, 1e-12)) - np.log(max(p2, 1e-12)))
    ent = float(-(probs * np.log(np.clip(probs, 1e-12, None))).sum())
    return int(order[0]), margin, ent


EXTRACTION_COLUMNS = ["window_id", "level", "rendering", "primitive", "backend", "probs", "label", "margin", "entropy"]


def empty_extractions() -> pd.DataFrame:
    return pd.DataFrame(columns=EXTRACTION_COLUMNS)


def extraction_rows(
    window_ids, levels, probs_by_prim: dict[str, np.ndarray], backend: str, rendering: str = "open"
) -> pd.DataFrame:
    """Long table: one row per (window, level, primitive) with probs padded to MAX_LABELS; ``rendering`` is
    ``open`` for ``texts`` and ``seen`` for the closed-vocabulary test rendering ``texts_seen``."""
    rows = []
    for prim in PRIMITIVES:
        P = probs_by_prim[prim]
        for wid, lvl, pr in zip(window_ids, levels, P):
            top, margin, ent = summarise(pr)
            padded = np.zeros(MAX_LABELS, "float32")
            padded[: len(pr)] = pr
            rows.append(
                {
                    "window_id": int(wid),
                    "level": lvl,
                    "rendering": rendering,
                    "primitive": prim,
                    "backend": backend,
                    "probs": padded,
                    "label": LABELS[prim][top],
                    "margin": margin,
                    "entropy": ent,
                }
            )
    return pd.DataFrame(rows, columns=EXTRACTION_COLUMNS)


def lexicon_table(texts: pd.DataFrame, overlap: float, temperature: float, rendering: str) -> pd.DataFrame:
    if len(texts) == 0:
        return empty_extractions()
    probs = {prim: [] for prim in PRIMITIVES}
    for text in texts["text"]:
        sc = lexicon_scores(text, overlap)
        for prim in PRIMITIVES:
            probs[prim].append(_softmax(sc[prim], temperature))
    return extraction_rows(
        texts["window_id"], texts["level"], {k: np.array(v) for k, v in probs.items()}, "lexicon", rendering
    )


def extract_lexicon(texts: pd.DataFrame, texts_seen: pd.DataFrame, p: Params) -> pd.DataFrame:
    """The cue-lexicon extractor on both renderings (a pure function of each text)."""
    args = (p.data.lexicon_overlap, p.extractor.temperature)
    parts = [lexicon_table(texts, *args, "open"), lexicon_table(texts_seen, *args, "seen")]
    return pd.concat([t for t in parts if len(t)], ignore_index=True)


# ------------------------------------------------------------------------------------------- prototype
PROTOTYPES = {
    "STRONG-RISE": "the value will rise sharply",
    "MILD-RISE": "the value will rise slightly",
    "STABLE": "the value will stay flat",
    "MILD-DROP": "the value will fall slightly",
    "STRONG-DROP": "the value will fall sharply",
    "MUCH-CALMER": "fluctuations will become much calmer",
    "CALMER": "fluctuations will become a bit calmer",
    "SAME": "fluctuations will stay as usual",
    "CHOPPIER": "fluctuations will become a bit more volatile",
    "MUCH-CHOPPIER": "fluctuations will become much more volatile",
    "ASCEND": "the path will climb steadily",
    "DESCEND": "the path will decline steadily",
    "PEAK": "the path will rise to a peak and come back down",
    "TROUGH": "the path will dip and then recover",
    "OSCILLATE": "the path will go up and down repeatedly",
    "EARLY-FADE": "the change happens right away and is temporary",
    "EARLY-PERSIST": "the change happens right away and lasts",
    "MID-FADE": "the change happens midway and is temporary",
    "MID-PERSIST": "the change happens midway and lasts",
    "LATE": "the change happens near the end",
    "DIFFUSE": "the change has no clear timing",
}


def prototype_probs(sentence_emb: np.ndarray, proto_emb: dict[str, np.ndarray], tau: float) -> dict[str, np.ndarray]:
    """p = softmax(cos(text, label prototypes) / tau), per primitive; embeddings are L2-normalised."""
    out = {}
    for prim in PRIMITIVES:
        P = np.stack([proto_emb[lab] for lab in LABELS[prim]])
        cos = sentence_emb @ P.T
        z = cos / tau
        z = z - z.max(1, keepdims=True)
        e = np.exp(z)
        out[prim] = e / e.sum(1, keepdims=True)
    return out
