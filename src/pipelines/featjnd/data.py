"""Inputs of `featjnd`: the `digits_canvas` image set (the card's small-scale stand-in for ImageNet/COCO:
sklearn's bundled 8×8 digits pasted on a cluttered canvas, with the digit mask kept for the attribution
test E2), or a user's tensor file (full scale; format in the README)."""

from __future__ import annotations

import numpy as np
import torch

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.featjnd.params import Params

SPLIT_NAMES = ("train", "val", "test")


def _stroke(canvas: np.ndarray, rng: np.random.Generator) -> None:
    """A straight distractor stroke (random length/angle/intensity) drawn into ``canvas`` in place."""
    size = canvas.shape[0]
    r0, c0 = rng.uniform(0, size - 1, 2)
    length, angle = rng.uniform(6, 12), rng.uniform(0, np.pi)
    t = np.linspace(0.0, 1.0, int(2 * length) + 1)
    rr = np.clip(np.round(r0 + t * length * np.sin(angle)), 0, size - 1).astype(int)
    cc = np.clip(np.round(c0 + t * length * np.cos(angle)), 0, size - 1).astype(int)
    canvas[rr, cc] = np.maximum(canvas[rr, cc], rng.uniform(0.5, 1.0))


def render(
    digit: np.ndarray, rng: np.random.Generator, canvas: int, upsample: int, clutter: float, n_strokes: int
) -> tuple[np.ndarray, np.ndarray]:
    """One canvas: uniform clutter, distractor strokes, then the upsampled digit at a random position.

    Returns (image, digit-ink mask), both ``canvas × canvas``."""
    img = rng.uniform(0.0, clutter, (canvas, canvas)) if clutter > 0 else np.zeros((canvas, canvas))
    for _ in range(n_strokes):
        _stroke(img, rng)
    d = np.kron(digit, np.ones((upsample, upsample)))
    s = d.shape[0]
    r, c = rng.integers(0, canvas - s + 1, 2)
    img[r : r + s, c : c + s] = np.maximum(img[r : r + s, c : c + s], d)
    mask = np.zeros((canvas, canvas), dtype=bool)
    mask[r : r + s, c : c + s] = d > 0
    return img, mask


def digits_canvas(
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    test_renders: int = 2,
    canvas: int = 32,
    upsample: int = 2,
    clutter: float = 0.1,
    n_strokes: int = 2,
) -> dict[str, torch.Tensor]:
    """Seeded split of the bundled digits; every test digit is rendered ``test_renders`` times (different
    placement and clutter) to shrink the accuracy SE of the small test set."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = digits.images / 16.0, digits.target
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    parts = {
        "train": order[:n_train],
        "val": order[n_train : n_train + n_val],
        "test": np.repeat(order[n_train + n_val : n_train + n_val + n_test], test_renders),
    }
    out: dict[str, torch.Tensor] = {}
    for split, idx in parts.items():
        rendered = [render(images[i], rng, canvas, upsample, clutter, n_strokes) for i in idx]
        out[f"x_{split}"] = torch.tensor(np.stack([r[0] for r in rendered]), dtype=torch.float32).unsqueeze(1)
        out[f"y_{split}"] = torch.tensor(labels[idx], dtype=torch.long)
        out[f"mask_{split}"] = torch.tensor(np.stack([r[1] for r in rendered]))
    return out


FORMAT = "input format: src/pipelines/featjnd/README.md"
SPLIT_SCHEMAS = {
    s: TableSchema(
        "featjnd.data.path",
        {f"x_{s}": "array[float]", f"y_{s}": "int"},
        finite=(f"x_{s}",),
        ranges={f"y_{s}": (0, None)},
        item="key",
        hint=FORMAT,
    )
    for s in SPLIT_NAMES
}  # one image per row, its class id >= 0


def check_tensor_file(data: object, where: str) -> dict[str, torch.Tensor]:
    """The user's tensor file checked at the door (before any training): a dict with x_{train,val,test}
    (N×C×H×W float, finite, the same C×H×W in every split), y_* (N integer class ids ≥ 0, as many as the
    images; per split :data:`SPLIT_SCHEMAS`) and optionally mask_test (N_test×H×W bool). A bad key raises
    InputDataError (one line in the CLI) naming the dataset and the key; extra keys are ignored."""

    def fail(msg: str) -> None:
        raise InputDataError(f"dataset '{where}': {msg} ({FORMAT})")

    def desc(t: object) -> str:
        return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__

    if not isinstance(data, dict):
        fail(f"expected a dict of tensors, got {type(data).__name__}")
    chw = None
    for split in SPLIT_NAMES:
        SPLIT_SCHEMAS[split].refine(dataset=where).check(data)
        xk, x = f"x_{split}", data[f"x_{split}"]
        if not (isinstance(x, torch.Tensor) and x.dim() == 4):
            fail(f"key '{xk}' should be a float tensor N×C×H×W, got {desc(x)}")
        if min(x.shape[2:]) < 4:
            fail(f"key '{xk}' has images of {x.shape[2]}×{x.shape[3]}; at least 4×4 is needed (two stride-2 convs)")
        if chw is None:
            chw = tuple(x.shape[1:])
        elif tuple(x.shape[1:]) != chw:
            fail(f"key '{xk}' has images of C×H×W {tuple(x.shape[1:])}, x_train has {chw}")
    if "mask_test" in data:
        m, n = data["mask_test"], len(data["x_test"])
        if not (isinstance(m, torch.Tensor) and m.dtype == torch.bool and tuple(m.shape) == (n, *chw[1:])):
            fail(f"key 'mask_test' should be a bool tensor {(n, *chw[1:])}, got {desc(m)}")
    return data


def load_tensor_file(path: str) -> dict[str, torch.Tensor]:
    """A user's data: ``torch.save`` of a dict with x_{train,val,test} (N×C×H×W float), y_* (N long) and
    optionally mask_test (N×H×W bool, the object mask for E2), checked by :func:`check_tensor_file`."""
    where = f"featjnd.data.path ({path})"
    data = check_tensor_file(read_user_file(path, key="featjnd.data.path", kind="pt"), where)
    out = {k: v for k, v in data.items() if k.startswith(("x_", "y_", "mask_"))}
    for split in SPLIT_NAMES:  # the models are float32 and the losses take long class ids
        out[f"x_{split}"], out[f"y_{split}"] = out[f"x_{split}"].float(), torch.as_tensor(out[f"y_{split}"]).long()
    if "mask_test" not in out:  # no object mask: E2's bg/fg ratio is then undefined (NaN)
        x = out["x_test"]
        out["mask_test"] = torch.zeros(x.shape[0], *x.shape[2:], dtype=torch.bool)
    return out


def make_images(p: Params) -> dict[str, dict[str, torch.Tensor]]:
    """Node: one dataset per seed (the split and the renders change with the seed); a user's tensor
    file is loaded and checked once, then shared by every seed."""
    d = p.data
    if d.source == "tensor_file":
        data = load_tensor_file(d.path)
        return {f"seed{seed}": data for seed in p.seeds}
    return {
        f"seed{seed}": digits_canvas(
            seed, d.n_train, d.n_val, d.n_test, d.test_renders, d.canvas, d.upsample, d.clutter, d.n_strokes
        )
        for seed in p.seeds
    }
