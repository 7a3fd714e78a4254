"""The head's two tuning choices re-read on the VALIDATION split only (README, "Which split each tuning
choice read"): the features (mean of clause embeddings vs the whole-text embedding) and the L2 penalty,
each fitted on the train windows and scored by the val windows' cross-entropy and macro accuracy.

    python -m pipelines.tess.tuning_probe     # after `kedro run --pipeline=tess` (or its data nodes)

It reads the newest saved ``tess.text_emb_tensors``, ``tess.primitives_gt`` and ``tess.windows``; test
windows are never scored."""

from __future__ import annotations

import glob

import numpy as np
import pandas as pd
import torch
import yaml

from pipelines.core.api import validate
from pipelines.tess.head import Standardise, fit_head, head_loss, head_probs, label_index
from pipelines.tess.lexicon import PRIMITIVES
from pipelines.tess.params import Params

FEATURES, L2_GRID = ("clauses", "sent"), (0.001, 0.01, 0.03, 0.1)


def _newest(pattern: str) -> str:
    found = sorted(glob.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no saved version matches {pattern}: run the tess data nodes first")
    return found[-1]


def val_table(emb: dict, gt: pd.DataFrame, windows: pd.DataFrame, p: Params, levels=("A", "D")) -> pd.DataFrame:
    """One row per (level, features, l2): val cross-entropy and macro accuracy of a head fitted on train."""
    split = dict(zip(windows["window_id"], windows["split"]))
    h, rows = p.extractor.head, []
    for level in levels:
        ids = emb[level]["window_id"].numpy()
        part = np.array([split[w] for w in ids])
        tr, va = np.flatnonzero(part == "train"), np.flatnonzero(part == "val")
        y_tr, y_va = label_index(gt, ids[tr]), label_index(gt, ids[va])
        for feat in FEATURES:
            x_all = emb[level][feat].float()
            x = Standardise(x_all[tr])(x_all)
            for l2 in L2_GRID:
                m = fit_head(x[tr], y_tr, x[va], y_va, l2, h.steps, h.patience, seed=p.data.data_seed)
                probs = head_probs(m, x[va])
                acc = float(
                    np.mean([(probs[k].argmax(1) == y_va[:, i].numpy()).mean() for i, k in enumerate(PRIMITIVES)])
                )
                rows.append(
                    {
                        "level": level,
                        "features": feat,
                        "l2": l2,
                        "val_ce": float(head_loss(m, x[va], y_va, 0.0)),
                        "val_macro_acc": acc,
                    }
                )
    return pd.DataFrame(rows)


def main() -> None:
    raw = yaml.safe_load(open("conf/base/parameters_tess.yml"))["tess"]
    p = validate(Params, raw, "tess")
    emb = torch.load(_newest("data/05_model_input/tess/text_emb.pt/*/text_emb.pt"), weights_only=False)
    gt = pd.read_parquet(_newest("data/02_intermediate/tess/primitives_gt.parquet/*/primitives_gt.parquet"))
    win = pd.read_parquet(_newest("data/02_intermediate/tess/windows.parquet/*/windows.parquet"))
    print(val_table(emb, gt, win, p).to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
