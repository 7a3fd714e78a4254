"""The streams of `bimu` (card "small-scale reproduction"): permuted-digits tasks for continual learning and
an imbalanced, domain-shifted stream for active querying, built from sklearn's bundled digits (8×8,
globally standardised) or, in the full env, from a user CSV.

Everything is seeded per replica seed, so seed s sees the same permutations, orders and test sets in every
variant node.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from pipelines.bimu.params import Params
from pipelines.core.schemas import TableSchema

USER_IMAGES = TableSchema("bimu.user_images", {"label": "int", "split": "str"}, min_rows=20,
                          patterns={r"x\d+": "number"}, no_missing=("label", "split", r"x\d+"),
                          allowed={"split": ("train", "test")}, ranges={"label": (0, None)})


def check_user_images(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, label, is_train) of a user table (:data:`USER_IMAGES`): label (int, 0..C−1), split (train/test),
    pixels x0..x{D−1} (numbers without missing values)."""
    USER_IMAGES.check(df)
    cols = [c for c in df.columns if isinstance(c, str) and c.startswith("x") and c[1:].isdigit()]
    cols = sorted(cols, key=lambda c: int(c[1:]))
    return df[cols].to_numpy(np.float32), df["label"].to_numpy().astype(np.int64), (df["split"] == "train").to_numpy()


def _images(p: Params) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if p.data.source == "file":
        x, y, tr = check_user_images(pd.read_csv(p.data.user_path))
        return x[tr], y[tr], x[~tr], y[~tr]
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    xtr, xte, ytr, yte = train_test_split(d.data.astype(np.float32), d.target.astype(np.int64),
                                          test_size=p.data.test_fraction, stratify=d.target,
                                          random_state=p.data.split_seed)
    return xtr, ytr, xte, yte


def class_weights(n_classes: int, imbalance: float) -> np.ndarray:
    """Stream class frequencies ∝ imbalance^(c / (C − 1))."""
    w = imbalance ** (np.arange(n_classes) / max(n_classes - 1, 1))
    return w / w.sum()


def make_streams(p: Params) -> dict:
    """Tensors shared by every variant node: the images, per-seed task permutations and sample orders
    (continual), and per-seed domain transforms and the imbalanced stream (active)."""
    xtr, ytr, xte, yte = _images(p)
    mu, sd = xtr.mean(), xtr.std()              # global standardisation (train statistics)
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    n_classes, d = int(max(ytr.max(), yte.max()) + 1), xtr.shape[1]
    c, a = p.continual, p.active
    if c.n_per_task > len(xtr):
        raise ValueError(f"bimu.continual.n_per_task: {c.n_per_task} exceeds the {len(xtr)} training images")
    pi = class_weights(n_classes, a.imbalance)
    perms, orders, dperm, dshift, sidx = [], [], [], [], []
    for s in p.seeds:
        rng = np.random.default_rng([s, 6055])
        # n_tasks trained permutations + one never trained (OOD)
        perms.append(np.stack([rng.permutation(d) for _ in range(c.n_tasks + 1)]))
        orders.append(np.stack([rng.choice(len(xtr), c.n_per_task, replace=False) for _ in range(c.n_tasks)]))
        dperm.append(np.stack([rng.permutation(d) for _ in range(a.n_domains)]))
        dshift.append(np.stack([1 + rng.uniform(-a.contrast, a.contrast, a.n_domains),
                                rng.uniform(-a.brightness, a.brightness, a.n_domains)], 1))
        # stream: per step a class drawn from π, then a training image of that class
        by_class = [np.flatnonzero(ytr == k) for k in range(n_classes)]
        cls = rng.choice(n_classes, a.n_domains * a.n_per_domain, p=pi)
        sidx.append(np.array([rng.choice(by_class[k]) for k in cls]))
    t = lambda v, dt=torch.float32: torch.as_tensor(np.asarray(v), dtype=dt)  # noqa: E731
    return {
        "x_train": t(xtr), "y_train": t(ytr, torch.long), "x_test": t(xte), "y_test": t(yte, torch.long),
        "n_classes": n_classes, "seeds": list(p.seeds), "x_range": [float(xtr.min()), float(xtr.max())],
        "task_perms": t(perms, torch.long), "task_orders": t(orders, torch.long),
        "domain_perms": t(dperm, torch.long), "domain_shift": t(dshift), "stream_index": t(sidx, torch.long),
        "class_weights": t(pi),
    }


def domain_view(x: torch.Tensor, perm: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Images seen in one domain of the active stream: permuted pixels, then contrast and brightness.
    ``perm`` is one permutation (D,) or one per row (N, D)."""
    xp = x[..., perm] if perm.dim() == 1 else x.gather(-1, perm)
    return shift[0] * xp + shift[1]
