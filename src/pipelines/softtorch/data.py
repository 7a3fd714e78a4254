"""Data of `softtorch`: "learn to sort digits" sequences from sklearn's bundled digits (two 8×8 digit
images side by side make an 8×16 image of a number 00–99; a sequence holds `seq_len` distinct numbers).
Train and test sequences draw their images from disjoint halves of the image pool (seeded)."""

import numpy as np
import torch

from pipelines.core.api import TableSchema, read_user_file
from pipelines.softtorch.params import Params

DIGITS_CSV = TableSchema(
    "softtorch.digits.user_csv",
    {"label": "int"},
    min_rows=20,
    no_missing=("label",),
    ranges={"label": (0, 9)},
    covers={"label": tuple(range(10))},
)  # pixels p0..p{h·w−1}


def load_user_digits(path: str, shape: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A user CSV of single-digit images: ``label`` (int 0–9, each digit present) and ``p0`` … ``p{h·w−1}``
    (numbers, any scale: each image is divided by the table's max), checked with :data:`DIGITS_CSV`."""

    h, w = shape
    px_cols = tuple(f"p{i}" for i in range(h * w))
    schema = DIGITS_CSV.refine(columns=dict.fromkeys(px_cols, "number"), no_missing=("label", *px_cols))
    df = read_user_file(path, key="softtorch.digits.user_csv", schema=schema, kind="csv")
    px = df[[f"p{i}" for i in range(h * w)]].to_numpy(np.float32)
    return (px / max(float(px.max()), 1e-12)).reshape(-1, h, w), df["label"].to_numpy()


def _sequences(images_by_digit, n_seq, seq_len, rng):
    h, w = next(iter(images_by_digit.values())).shape[1:]
    xs = np.empty((n_seq, seq_len, h, 2 * w), np.float32)
    ys = np.empty((n_seq, seq_len), np.int64)
    for s in range(n_seq):
        nums = rng.choice(100, size=seq_len, replace=False)
        ys[s] = nums
        for j, num in enumerate(nums):
            a, b = divmod(int(num), 10)
            ia = images_by_digit[a][rng.integers(len(images_by_digit[a]))]
            ib = images_by_digit[b][rng.integers(len(images_by_digit[b]))]
            xs[s, j] = np.concatenate([ia, ib], axis=1)
    return xs, ys


def make_digit_sequences(p: Params) -> dict:
    """{seed: {x_train, y_train, x_test, y_test}} for every seed that trains a sorter."""
    from sklearn.datasets import load_digits

    out = {}
    if not p.digits.enabled:
        return out
    if p.digits.user_csv:
        imgs, target = load_user_digits(p.digits.user_csv, p.digits.image_shape)
    else:
        d = load_digits()
        imgs, target = (d.images / 16.0).astype(np.float32), d.target
    for seed in p.digit_seeds():
        rng = np.random.default_rng(1000 + seed)
        perm = rng.permutation(len(imgs))
        half = len(imgs) // 2
        pools = {}
        for split, idx in (("train", perm[:half]), ("test", perm[half:])):
            pools[split] = {k: imgs[idx][target[idx] == k] for k in range(10)}
        xtr, ytr = _sequences(pools["train"], p.digits.n_train, p.digits.seq_len, rng)
        xte, yte = _sequences(pools["test"], p.digits.n_test, p.digits.seq_len, rng)
        out[str(seed)] = {
            "x_train": torch.from_numpy(xtr),
            "y_train": torch.from_numpy(ytr),
            "x_test": torch.from_numpy(xte),
            "y_test": torch.from_numpy(yte),
        }
    return out
