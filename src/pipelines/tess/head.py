"""The `minilm_head` extractor: the small-scale stand-in for the paper's LLM extractor. A multinomial logistic
regression per primitive on frozen MiniLM features of the text, fitted on the TRAIN windows' ground-truth
primitive labels only (full-batch L-BFGS through core.training.fit, L2 penalty, early stopping on the val
windows' cross-entropy).

The features are the mean of the MiniLM embeddings of the text's clauses (split at punctuation; see
``embed.py``), standardised with the train windows' mean and std. A head on the whole-text (mean-pooled
token) embedding was tried first: it stayed near the majority label on cue phrases it had not seen, since
one pooled vector of a ~60-token text mixes four cues and the distractor sentences (README: departures).

The gate downstream is trained on the train windows' extractions and their correctness, so those must look
like extractions of unseen texts: the train windows' extractions are cross-fitted (``head.folds`` folds,
each predicted by a head fitted on the other folds); val and test windows (and the closed-vocabulary test
rendering) are read by the head fitted on all train windows. Test labels are never read."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import torch
from torch import nn

from pipelines.core.api import fit, node_setup
from pipelines.tess.extract import empty_extractions, extraction_rows
from pipelines.tess.lexicon import LABELS, PRIMITIVES
from pipelines.tess.params import Params

log = logging.getLogger(__name__)
SIZES = [len(LABELS[prim]) for prim in PRIMITIVES]


class PrimitiveHead(nn.Module):
    """One linear map from the embedding to the concatenated label logits of the four primitives."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, sum(SIZES))
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(self.linear(x), SIZES, dim=-1))


def head_loss(model: PrimitiveHead, x: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """Σ_k mean cross-entropy of primitive k + l2 · ||W||² (the bias is not penalised)."""
    logits = model(x)
    ce = sum(nn.functional.cross_entropy(z, y[:, k]) for k, z in enumerate(logits))
    return ce + l2 * model.linear.weight.pow(2).sum()


def fit_head(
    x_tr: torch.Tensor,
    y_tr: torch.Tensor,
    x_va: torch.Tensor | None,
    y_va: torch.Tensor | None,
    l2: float,
    steps: int,
    patience: int,
    seed: int,
) -> PrimitiveHead:
    """Full-batch L-BFGS on the penalised cross-entropy; with val data, early stopping on val cross-entropy."""
    model = PrimitiveHead(x_tr.shape[1])
    has_val = x_va is not None and len(x_va) > 0
    val = (lambda m: float(head_loss(m, x_va, y_va, 0.0))) if has_val else None
    fit(
        model,
        [x_tr, y_tr],
        lambda m, x, y: head_loss(m, x, y, l2),
        val_score=val,
        epochs=steps,
        batch_size=None,
        optimizer="lbfgs",
        lr=1.0,
        patience=patience if val else None,
        seed=seed,
        grad_clip=None,
        desc="minilm_head",
        progress=False,
    )
    return model.eval()


@torch.no_grad()
def head_probs(model: PrimitiveHead, x: torch.Tensor) -> dict[str, np.ndarray]:
    return {prim: torch.softmax(z, -1).double().numpy() for prim, z in zip(PRIMITIVES, model(x))}


def label_index(gt: pd.DataFrame, ids: np.ndarray) -> torch.Tensor:
    g = gt.set_index("window_id").loc[ids]
    return torch.tensor(
        np.stack([g[prim].map({lab: i for i, lab in enumerate(LABELS[prim])}).to_numpy() for prim in PRIMITIVES], 1),
        dtype=torch.long,
    )


class Standardise:
    """z-scores with the mean and std of the rows it was built from (the train windows)."""

    def __init__(self, x: torch.Tensor):
        self.mean, self.std = x.mean(0), x.std(0) + 1e-6

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def fold_ids(n: int, folds: int, seed: int) -> np.ndarray:
    """A seeded assignment of n items to ``folds`` folds of (nearly) equal size."""
    return np.random.default_rng(seed).permutation(np.arange(n) % folds)


def extract_minilm_head(emb: dict, gt: pd.DataFrame, windows: pd.DataFrame, p: Params) -> pd.DataFrame:
    """Extractions of every embedded level (and of the closed-vocabulary test rendering, ``seen_<level>``)."""
    node_setup(p)
    h = p.extractor.head
    split = dict(zip(windows["window_id"], windows["split"]))
    parts = []
    for level in [k for k in emb if not k.startswith("seen_")]:
        ids = emb[level]["window_id"].numpy()
        part = np.array([split[w] for w in ids])
        tr, va = np.flatnonzero(part == "train"), np.flatnonzero(part == "val")
        scale = Standardise(emb[level]["clauses"].float()[tr])
        x = scale(emb[level]["clauses"].float())
        y_tr, y_va = label_index(gt, ids[tr]), label_index(gt, ids[va])
        args = (h.l2, h.steps, h.patience)
        full = fit_head(x[tr], y_tr, x[va], y_va, *args, seed=p.data.data_seed)
        probs = head_probs(full, x)  # val / test (train rows replaced below)
        fold = fold_ids(len(tr), min(h.folds, len(tr)), p.data.data_seed)
        for f in np.unique(fold):
            rest, held = tr[fold != f], tr[fold == f]
            m = fit_head(x[rest], y_tr[fold != f], x[va], y_va, *args, seed=p.data.data_seed + 1 + int(f))
            for prim, pr in head_probs(m, x[held]).items():
                probs[prim][held] = pr
        parts.append(extraction_rows(ids, [level] * len(ids), probs, "minilm_head"))
        acc = {
            prim: float((probs[prim][va].argmax(1) == y_va[:, k].numpy()).mean()) if len(va) else float("nan")
            for k, prim in enumerate(PRIMITIVES)
        }
        log.info("tess: minilm_head level %s, val accuracy %s", level, {k: round(v, 3) for k, v in acc.items()})
        seen = emb.get(f"seen_{level}")
        if seen is not None and len(seen["window_id"]):
            parts.append(
                extraction_rows(
                    seen["window_id"].numpy(),
                    [level] * len(seen["window_id"]),
                    head_probs(full, scale(seen["clauses"].float())),
                    "minilm_head",
                    "seen",
                )
            )
    return pd.concat(parts, ignore_index=True) if parts else empty_extractions()
