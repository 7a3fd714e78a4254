"""The training pool of `mts`: a few real digits (sklearn's bundled 8×8 digits) plus a synthetic pool of
controlled quality (good / off-manifold / label-noise / cross-class mixup), a clean real meta set and a
real test set; or a user table (--env=full)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import TableSchema, read_user_file
from pipelines.mts.params import QUALITIES, Params

N_PIX = 64
XCOLS = [f"x{i}" for i in range(N_PIX)]
USER_POOL = TableSchema(
    "mts.pool (data.path)",
    {"y": "int", "is_syn": "bool", "split": "str"},
    min_rows=10,
    patterns={"x.*": "number"},
    allowed={"split": ("train", "meta", "test")},
)  # features x0, x1, ...


def _shift(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each 8×8 image moved by a random (dy, dx) ∈ {−1, 0, 1}², zero fill; vectorised by offset."""
    n = len(img)
    pad = np.zeros((n, 10, 10))
    pad[:, 1:9, 1:9] = img.reshape(n, 8, 8)
    dy, dx = rng.integers(-1, 2, n), rng.integers(-1, 2, n)
    out = np.empty((n, 8, 8))
    for a in (-1, 0, 1):
        for b in (-1, 0, 1):
            m = (dy == a) & (dx == b)
            out[m] = pad[m, 1 - a : 9 - a, 1 - b : 9 - b]
    return out.reshape(n, N_PIX)


def _box_blur(img: np.ndarray) -> np.ndarray:
    n = len(img)
    pad = np.pad(img.reshape(n, 8, 8), ((0, 0), (1, 1), (1, 1)))
    out = sum(pad[:, i : i + 8, j : j + 8] for i in range(3) for j in range(3)) / 9.0
    return out.reshape(n, N_PIX)


def synth_pool(x_gen: np.ndarray, y_gen: np.ndarray, p: Params, rng: np.random.Generator) -> pd.DataFrame:
    """The "generator": held-out real digits turned into samples of each quality type (all vectorised)."""
    d = p.data
    fr = np.array([getattr(d.mix, q) for q in QUALITIES], float)
    if fr.sum() <= 0:
        raise ValueError("mts.data.mix: the quality fractions sum to 0")
    counts = np.floor(fr / fr.sum() * d.n_syn).astype(int)
    counts[0] += d.n_syn - counts.sum()
    xs, ys, qs = [], [], []

    def good(n):
        i = rng.integers(0, len(x_gen), n)
        x = np.clip(_shift(x_gen[i], rng) + rng.normal(0, d.good_noise, (n, N_PIX)), 0, 1)
        return x, y_gen[i]

    n_good, n_off, n_lab, n_mix = counts
    x, y = good(n_good)
    xs.append(x), ys.append(y)
    qs += ["good"] * n_good
    x, y = good(n_off)
    xs.append(np.clip(_box_blur(x) + rng.normal(0, d.off_noise, (n_off, N_PIX)), 0, 1)), ys.append(y)
    qs += ["off_manifold"] * n_off
    x, y = good(n_lab)
    xs.append(x), ys.append((y + rng.integers(1, 10, n_lab)) % 10)  # another class's label
    qs += ["label_noise"] * n_lab
    xa, ya = good(n_mix)
    # a partner of another class for each majority image
    yb_target = (ya + rng.integers(1, 10, n_mix)) % 10
    xb = np.empty_like(xa)
    for c in range(10):
        m = yb_target == c
        pool = np.flatnonzero(y_gen == c)
        xb[m] = x_gen[rng.choice(pool, m.sum())] if m.any() else xb[m]
    lam = rng.uniform(d.mixup_low, d.mixup_high, (n_mix, 1))
    xs.append(lam * xa + (1 - lam) * xb), ys.append(yb_target)  # labelled with the minority class
    qs += ["mixup"] * n_mix
    df = pd.DataFrame(np.concatenate(xs), columns=XCOLS)
    df["y"], df["is_syn"], df["quality"] = np.concatenate(ys).astype(int), True, qs
    return df


def _digits_pool(p: Params, seed: int) -> pd.DataFrame:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = p.data
    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    idx = np.arange(len(y))
    rest, test = train_test_split(idx, test_size=d.n_test, stratify=y, random_state=seed)
    rest, meta = train_test_split(rest, test_size=d.n_meta, stratify=y[rest], random_state=seed)
    gen, train = train_test_split(rest, test_size=d.n_real_train, stratify=y[rest], random_state=seed)
    parts = []
    for split, ids in (("train", train), ("meta", meta), ("test", test)):
        df = pd.DataFrame(x[ids], columns=XCOLS)
        df["y"], df["is_syn"], df["quality"], df["split"] = y[ids].astype(int), False, "real", split
        parts.append(df)
    syn = synth_pool(x[gen], y[gen], p, np.random.default_rng([seed, 1]))
    syn["split"] = "train"
    parts.append(syn)
    return pd.concat(parts, ignore_index=True)


def _user_pool(p: Params, seed: int) -> pd.DataFrame:
    from pathlib import Path

    path = Path(p.data.path)
    df = read_user_file(path, key="mts.data.path", schema=USER_POOL, kind=("csv", "parquet"))
    xcols = [c for c in df.columns if str(c).startswith("x")]
    if "quality" not in df:
        df = df.assign(quality=np.where(df["is_syn"], "unknown", "real"))
    out = df[xcols + ["y", "is_syn", "quality", "split"]].copy()
    out.columns = [f"x{i}" for i in range(len(xcols))] + ["y", "is_syn", "quality", "split"]
    return out


def make_pool(p: Params) -> pd.DataFrame:
    """One table for all seeds: x0..x63, y, is_syn, quality, split (train / meta / test), seed."""
    frames = []
    for seed in p.seeds:
        df = _digits_pool(p, seed) if p.data.source == "digits" else _user_pool(p, seed)
        df["seed"] = seed
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
