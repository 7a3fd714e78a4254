"""Inputs of `featjnd`: the `digits_canvas` image set (the card's small-scale stand-in for ImageNet/COCO:
sklearn's bundled 8×8 digits pasted on a cluttered canvas, with the digit mask kept for the attribution
test E2), or a user's tensor file (full scale; format in the README)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipelines.core.params import ParameterError, parse


def _stroke(canvas: np.ndarray, rng: np.random.Generator) -> None:
    """A straight distractor stroke (random length/angle/intensity) drawn into ``canvas`` in place."""
    size = canvas.shape[0]
    r0, c0 = rng.uniform(0, size - 1, 2)
    length, angle = rng.uniform(6, 12), rng.uniform(0, np.pi)
    t = np.linspace(0.0, 1.0, int(2 * length) + 1)
    rr = np.clip(np.round(r0 + t * length * np.sin(angle)), 0, size - 1).astype(int)
    cc = np.clip(np.round(c0 + t * length * np.cos(angle)), 0, size - 1).astype(int)
    canvas[rr, cc] = np.maximum(canvas[rr, cc], rng.uniform(0.5, 1.0))


def render(digit: np.ndarray, rng: np.random.Generator, canvas: int, upsample: int, clutter: float,
           n_strokes: int) -> tuple[np.ndarray, np.ndarray]:
    """One canvas: uniform clutter, distractor strokes, then the upsampled digit at a random position.

    Returns (image, digit-ink mask), both ``canvas × canvas``."""
    img = rng.uniform(0.0, clutter, (canvas, canvas)) if clutter > 0 else np.zeros((canvas, canvas))
    for _ in range(n_strokes):
        _stroke(img, rng)
    d = np.kron(digit, np.ones((upsample, upsample)))
    s = d.shape[0]
    r, c = rng.integers(0, canvas - s + 1, 2)
    img[r:r + s, c:c + s] = np.maximum(img[r:r + s, c:c + s], d)
    mask = np.zeros((canvas, canvas), dtype=bool)
    mask[r:r + s, c:c + s] = d > 0
    return img, mask


def digits_canvas(seed: int, n_train: int, n_val: int, n_test: int, test_renders: int = 2, canvas: int = 32,
                  upsample: int = 2, clutter: float = 0.1, n_strokes: int = 2) -> dict[str, torch.Tensor]:
    """Seeded split of the bundled digits; every test digit is rendered ``test_renders`` times (different
    placement and clutter) to shrink the accuracy SE of the small test set."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = digits.images / 16.0, digits.target
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    parts = {"train": order[:n_train], "val": order[n_train:n_train + n_val],
             "test": np.repeat(order[n_train + n_val:n_train + n_val + n_test], test_renders)}
    out: dict[str, torch.Tensor] = {}
    for split, idx in parts.items():
        rendered = [render(images[i], rng, canvas, upsample, clutter, n_strokes) for i in idx]
        out[f"x_{split}"] = torch.tensor(np.stack([r[0] for r in rendered]), dtype=torch.float32).unsqueeze(1)
        out[f"y_{split}"] = torch.tensor(labels[idx], dtype=torch.long)
        out[f"mask_{split}"] = torch.tensor(np.stack([r[1] for r in rendered]))
    return out


def load_tensor_file(path: str) -> dict[str, torch.Tensor]:
    """A user's data: ``torch.save`` of a dict with x_{train,val,test} (N×C×H×W float), y_* (N long) and
    optionally mask_test (N×H×W bool, the object mask for E2)."""
    p = Path(path)
    if not p.exists():
        raise ParameterError(f"parameter featjnd.data.path: file '{path}' not found (input format: README)")
    data = torch.load(p, map_location="cpu", weights_only=True)
    for key in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        if key not in data:
            raise ParameterError(f"parameter featjnd.data.path: '{path}' lacks '{key}' (input format: README)")
    out = {k: v for k, v in data.items() if k.startswith(("x_", "y_", "mask_"))}
    if "mask_test" not in out:  # no object mask: E2's bg/fg ratio is then undefined (NaN)
        x = out["x_test"]
        out["mask_test"] = torch.zeros(x.shape[0], *x.shape[2:], dtype=torch.bool)
    return out


def make_images(raw: dict) -> dict[str, dict[str, torch.Tensor]]:
    """Node: one dataset per seed (the split and the renders change with the seed)."""
    p = parse("featjnd", raw)
    d = p.data
    out = {}
    for seed in p.seeds:
        if d.source == "tensor_file":
            out[f"seed{seed}"] = load_tensor_file(d.path)
        else:
            out[f"seed{seed}"] = digits_canvas(seed, d.n_train, d.n_val, d.n_test, d.test_renders, d.canvas,
                                               d.upsample, d.clutter, d.n_strokes)
    return out
