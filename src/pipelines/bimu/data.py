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
from pipelines.core.api import InputDataError, TableSchema, fit, read_user_file

USER_IMAGES = TableSchema(
    "bimu.user_images",
    {"label": "int", "split": "str"},
    min_rows=20,
    patterns={r"x\d+": "number"},
    no_missing=("label", "split", r"x\d+"),
    allowed={"split": ("train", "test")},
    ranges={"label": (0, None)},
)


def check_user_images(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, label, is_train) of a user table (:data:`USER_IMAGES`): label (int, 0..C−1), split (train/test),
    pixels x0..x{D−1} (numbers without missing values)."""
    USER_IMAGES.check(df)
    cols = [c for c in df.columns if isinstance(c, str) and c.startswith("x") and c[1:].isdigit()]
    cols = sorted(cols, key=lambda c: int(c[1:]))
    return df[cols].to_numpy(np.float32), df["label"].to_numpy().astype(np.int64), (df["split"] == "train").to_numpy()


def _images(p: Params) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if p.data.source == "file":
        x, y, tr = check_user_images(read_user_file(p.data.user_path, key="bimu.data.user_path", kind="csv"))
        return x[tr], y[tr], x[~tr], y[~tr]
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    xtr, xte, ytr, yte = train_test_split(
        d.data.astype(np.float32),
        d.target.astype(np.int64),
        test_size=p.data.test_fraction,
        stratify=d.target,
        random_state=p.data.split_seed,
    )
    return xtr, ytr, xte, yte


def class_weights(n_classes: int, imbalance: float) -> np.ndarray:
    """Stream class frequencies ∝ imbalance^(c / (C − 1))."""
    w = imbalance ** (np.arange(n_classes) / max(n_classes - 1, 1))
    return w / w.sum()


def pretrain_encoder(x: np.ndarray, y: np.ndarray, width: int, steps: int, seed: int):
    """The frozen feature extractor of the active stream: a real-valued D–128–F ReLU MLP with a linear head,
    trained full-batch with Adam (lr 1e−3) on held-out images that the stream never draws, then frozen (the
    stand-in for the paper's pretrained CNN). Returns ``encode(x) -> features`` (numpy)."""
    g = torch.Generator().manual_seed(seed)
    d, c = x.shape[1], int(y.max()) + 1
    enc = torch.nn.Sequential(torch.nn.Linear(d, 128), torch.nn.ReLU(), torch.nn.Linear(128, width), torch.nn.ReLU())
    head = torch.nn.Linear(width, c)
    with torch.no_grad():
        for m in (*enc, head):
            if isinstance(m, torch.nn.Linear):
                bound = m.in_features**-0.5
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 2 * bound - bound)
                m.bias.zero_()
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    # full batch, plain Adam, unclipped: `steps` epochs of one step each
    fit(
        torch.nn.Sequential(enc, head),
        [xt, yt],
        lambda m, xb, yb: torch.nn.functional.cross_entropy(m(xb), yb),
        epochs=steps,
        batch_size=None,
        optimizer="adam",
        lr=1e-3,
        weight_decay=0.0,
        grad_clip=None,
        seed=seed,
        desc="bimu.encoder",
    )
    enc.eval()

    def encode(v: np.ndarray | torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return enc(torch.as_tensor(v, dtype=torch.float32))

    return encode


def make_streams(p: Params) -> dict:
    """Tensors shared by every variant node: the images, per-seed task permutations and sample orders
    (continual), and per-seed domain transforms and the imbalanced stream (active)."""
    xtr, ytr, xte, yte = _images(p)
    mu, sd = xtr.mean(), xtr.std()  # global standardisation (train statistics)
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    n_classes, d = int(max(ytr.max(), yte.max()) + 1), xtr.shape[1]
    c, a = p.continual, p.active
    if c.n_per_task > len(xtr):
        where = f" of {p.data.user_path}" if p.data.source == "file" else ""
        raise InputDataError(
            f"bimu.continual.n_per_task: {c.n_per_task} exceeds the {len(xtr)} training "
            f"images{where}; lower it (--params bimu.continual.n_per_task=...) or give more"
        )
    pi = class_weights(n_classes, a.imbalance)
    pool = np.arange(len(xtr))  # training images the active stream may draw
    encode = None
    if a.features == "frozen":
        if a.n_pretrain >= len(xtr) - n_classes:
            raise ValueError(
                f"bimu.active.n_pretrain: {a.n_pretrain} leaves too few of the {len(xtr)} training "
                "images for the active stream"
            )
        held = np.random.default_rng([p.data.split_seed, 7]).permutation(len(xtr))
        pre, pool = np.sort(held[: a.n_pretrain]), np.sort(held[a.n_pretrain :])
        encode = pretrain_encoder(xtr[pre], ytr[pre], a.feature_dim, a.pretrain_steps, p.data.split_seed)
        f_pre = encode(xtr[pre])
        f_mu, f_sd = f_pre.mean(), f_pre.std()
    perms, orders, dperm, dshift, sidx = [], [], [], [], []
    for s in p.seeds:
        rng = np.random.default_rng([s, 6055])
        # n_tasks trained permutations + one never trained (OOD)
        perms.append(np.stack([rng.permutation(d) for _ in range(c.n_tasks + 1)]))
        orders.append(np.stack([rng.choice(len(xtr), c.n_per_task, replace=False) for _ in range(c.n_tasks)]))
        dperm.append(np.stack([rng.permutation(d) for _ in range(a.n_domains)]))
        dshift.append(
            np.stack(
                [
                    1 + rng.uniform(-a.contrast, a.contrast, a.n_domains),
                    rng.uniform(-a.brightness, a.brightness, a.n_domains),
                ],
                1,
            )
        )
        # stream: per step a class drawn from π, then a training image of that class
        by_class = [pool[ytr[pool] == k] for k in range(n_classes)]
        cls = rng.choice(n_classes, a.n_domains * a.n_per_domain, p=pi)
        sidx.append(np.array([rng.choice(by_class[k]) for k in cls]))
    t = lambda v, dt=torch.float32: torch.as_tensor(np.asarray(v), dtype=dt)  # noqa: E731
    al_x, al_xt = active_inputs(
        t(xtr),
        t(xte),
        t(sidx, torch.long),
        t(dperm, torch.long),
        t(dshift),
        a,
        None if encode is None else lambda v: (encode(v) - f_mu) / f_sd,
    )
    return {
        "x_train": t(xtr),
        "y_train": t(ytr, torch.long),
        "x_test": t(xte),
        "y_test": t(yte, torch.long),
        "n_classes": n_classes,
        "seeds": list(p.seeds),
        "x_range": [float(xtr.min()), float(xtr.max())],
        "task_perms": t(perms, torch.long),
        "task_orders": t(orders, torch.long),
        "domain_perms": t(dperm, torch.long),
        "domain_shift": t(dshift),
        "stream_index": t(sidx, torch.long),
        "class_weights": t(pi),
        "al_x": al_x,
        "al_x_test": al_xt,
    }


def active_inputs(
    xtr: torch.Tensor, xte: torch.Tensor, sidx: torch.Tensor, dperm: torch.Tensor, dshift: torch.Tensor, a, encode=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the active learner reads, per replica: the stream (R, steps, F) and every domain's view of the
    test images (R, n_domains·N, F). Pixels: each domain permutes the pixels, then shifts contrast and
    brightness. Frozen features: each domain shifts contrast and brightness of the images (a frozen encoder
    of permuted pixels would be meaningless; OpenLORIS's factors are illumination, occlusion, size), then
    the frozen encoder maps them to standardised features."""
    r, steps = sidx.shape
    dom = torch.arange(steps) // a.n_per_domain
    xs, xt = [], []
    for i in range(r):
        if encode is None:
            xs.append(domain_view(xtr[sidx[i]], dperm[i][dom], dshift[i][dom].T[..., None]))
            xt.append(torch.cat([domain_view(xte, dperm[i, d], dshift[i, d]) for d in range(a.n_domains)]))
        else:
            sh = dshift[i][dom]
            xs.append(encode(sh[:, :1] * xtr[sidx[i]] + sh[:, 1:]))
            xt.append(torch.cat([encode(dshift[i, d, 0] * xte + dshift[i, d, 1]) for d in range(a.n_domains)]))
    return torch.stack(xs), torch.stack(xt)


def domain_view(x: torch.Tensor, perm: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Images seen in one domain of the active stream: permuted pixels, then contrast and brightness.
    ``perm`` is one permutation (D,) or one per row (N, D)."""
    xp = x[..., perm] if perm.dim() == 1 else x.gather(-1, perm)
    return shift[0] * xp + shift[1]
