"""Inputs of `engram`: sklearn's bundled digits (or a user CSV) with a constant 1 appended (bias
absorption, the paper's y = Wx convention), one seeded stratified train/test split per seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.core.api import InputDataError, read_feature_csv
from pipelines.engram.params import Params


def read_user_table(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A user dataset: a CSV with an integer column ``label`` (classes 0..C−1, C ≥ 2) and numeric feature
    columns ``x_*`` (already scaled as the user wants). Checked before any training: a missing file or
    column, a wrong dtype, a gap or a bad label stops the run with one line naming dataset and column."""
    ds = "engram.user_table"
    df, feats = read_feature_csv(
        path,
        ds,
        {"label": "int"},
        min_rows=4,
        hint="data.path: a CSV with columns label, x_*; see src/pipelines/engram/README.md",
        key="engram.data.path",
    )
    y = df["label"].to_numpy(np.int64)
    classes = np.unique(y)
    if classes[0] != 0 or not np.array_equal(classes, np.arange(len(classes))) or len(classes) < 2:
        raise InputDataError(
            f"dataset '{ds}': column 'label' must hold the classes 0..C-1 (C >= 2), got {classes[:12].tolist()}"
        )
    if np.bincount(y).min() < 2:
        raise InputDataError(f"dataset '{ds}': column 'label': every class needs >= 2 rows for a stratified split")
    return df[feats].to_numpy(np.float64), y


def load_source(p: Params) -> tuple[np.ndarray, np.ndarray]:
    if p.data.source == "file":
        return read_user_table(p.data.path)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data / 16.0, d.target.astype(np.int64)


def make_dataset(p: Params) -> dict:
    """``{"n_classes", "n_features", "seeds": {seed: {x_train, y_train, x_test, y_test}}}`` (float32 inputs
    with the constant 1 as their last column). Classes named by the parameters must exist."""
    import torch
    from sklearn.model_selection import train_test_split

    x, y = load_source(p)
    n_classes = int(y.max()) + 1
    named = {"unlearn.classes": p.unlearn.classes, "engram.arithmetic_pair": p.engram.arithmetic_pair}
    for key, cls in named.items():
        bad = [c for c in cls if c >= n_classes]
        if bad:
            raise InputDataError(
                f"parameter engram.{key}: classes {bad} do not exist (the data have {n_classes} classes)"
            )
    if p.data.limit is not None and p.data.limit < len(y):
        x, _, y, _ = train_test_split(x, y, train_size=p.data.limit, stratify=y, random_state=12345)
    x1 = np.hstack([x, np.ones((len(x), 1))]).astype(np.float32)
    out = {}
    for seed in p.seeds:
        xtr, xte, ytr, yte = train_test_split(x1, y, test_size=p.data.test_fraction, stratify=y, random_state=seed)
        out[str(seed)] = {
            "x_train": torch.from_numpy(xtr),
            "y_train": torch.from_numpy(ytr),
            "x_test": torch.from_numpy(xte),
            "y_test": torch.from_numpy(yte),
        }
    return {"n_classes": n_classes, "n_features": x1.shape[1], "seeds": out}
