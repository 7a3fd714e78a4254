"""Inputs of `wbmm`: the benchmark grid (random tensors are drawn, seeded, in the benchmark node) and the
images of the accuracy check: sklearn's bundled digits (8×8, bilinearly upsampled) or a user .npz, which
is checked (arrays, columns, dtypes, sizes) before any training."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.wbmm.ops import unfold_buffer_mb
from pipelines.wbmm.params import Params

SPLITS = ("train", "test")


def make_grid(p: Params) -> pd.DataFrame:
    """One row per measurement of the benchmark: (dtype, batch, channels, size, op, param, mode)."""
    b_ = p.bench
    rows = []
    for dtype, b, c, h in itertools.product(b_.dtypes, b_.batch, b_.channels, b_.sizes):
        ops = [("dw", k) for k in b_.dw_kernels] + [("wbmm", w) for w in b_.windows]
        ops += [("unfold", k) for k in b_.unfold_kernels if unfold_buffer_mb(b, c, h, k) <= b_.unfold_max_mb]
        ops += [("attn", w) for w in b_.attn_windows]
        for (op, param), mode in itertools.product(ops, b_.modes):
            rows.append({"dtype": dtype, "batch": b, "channels": c, "size": h, "op": op, "param": param, "mode": mode})
        # the two parts of WBMM's forward the paper's cost discussion separates
        for w in b_.windows:
            for op in ("wbmm_build_m", "wbmm_reshape"):
                rows.append({"dtype": dtype, "batch": b, "channels": c, "size": h, "op": op, "param": w, "mode": "fwd"})
    return pd.DataFrame(rows)


def _resize(t: torch.Tensor, size: int) -> torch.Tensor:
    if t.ndim == 3:  # N×H×W → N×1×H×W
        t = t.unsqueeze(1)
    if t.shape[-2:] != (size, size):
        t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    return t.contiguous()


SPLIT_SCHEMAS = {
    s: TableSchema(
        "wbmm.acc.data_path",
        {f"x_{s}": "array[number]", f"y_{s}": "int"},
        min_rows=2 if s == "train" else 1,
        no_missing=(f"y_{s}",),
        finite=(f"x_{s}",),
        ranges={f"y_{s}": (0, None)},
        item="array",
    )
    for s in SPLITS
}  # labels 0..K-1: K is their max + 1


def check_npz(arrays: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """The user's images, checked per split as a table (``x``: one numeric, finite image per row, ``y``: an
    integer label >= 0, as many as images) with :data:`SPLIT_SCHEMAS`, plus what a table schema cannot say
    (image rank, one image shape in both splits). Raises :class:`InputDataError` naming the dataset and the
    array."""
    out = {}
    for s in SPLITS:
        SPLIT_SCHEMAS[s].refine(dataset=name).check(arrays)
        x, y = np.asarray(arrays[f"x_{s}"]), np.asarray(arrays[f"y_{s}"])
        if x.ndim not in (3, 4):
            raise InputDataError(
                f"dataset '{name}': array 'x_{s}' should be N×H×W or N×C×H×W images, got shape {x.shape}"
            )
        out[f"x_{s}"], out[f"y_{s}"] = x, y
    if out["x_train"].shape[1:] != out["x_test"].shape[1:]:
        raise InputDataError(
            f"dataset '{name}': 'x_train' images are {out['x_train'].shape[1:]} but 'x_test' {out['x_test'].shape[1:]}"
        )
    return out


def load_npz(path: str, size: int, train_limit: int | None) -> dict[str, torch.Tensor]:
    name = f"wbmm.acc.data_path ({path})"
    a = check_npz(read_user_file(path, key="wbmm.acc.data_path", kind="npz"), name)
    split = {f"x_{s}": _resize(torch.as_tensor(a[f"x_{s}"].astype(np.float32)), size) for s in SPLITS}
    split.update({f"y_{s}": torch.as_tensor(a[f"y_{s}"].astype(np.int64)) for s in SPLITS})
    if train_limit:
        split["x_train"], split["y_train"] = split["x_train"][:train_limit], split["y_train"][:train_limit]
    return split


def make_images(p: Params) -> dict:
    """Train/test images and labels per seed: ``{"<seed>": {x_train, y_train, x_test, y_test}}``.

    Digits: a stratified split drawn per seed (1257/540 at the default test_size). A user .npz holds
    its own fixed split (x_train, y_train, x_test, y_test), shared by every seed."""
    a = p.acc
    if a.data_path:
        split = load_npz(a.data_path, a.size, a.train_limit)
        return {str(s): split for s in p.seeds}
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = _resize(torch.as_tensor(digits.images / 16.0, dtype=torch.float32), a.size)
    y = torch.as_tensor(digits.target).long()
    out: dict[str, dict[str, torch.Tensor]] = {}
    for seed in p.seeds:
        tr, te = train_test_split(np.arange(len(y)), test_size=a.test_size, stratify=digits.target, random_state=seed)
        tr, te = torch.as_tensor(tr[: a.train_limit]), torch.as_tensor(te)
        out[str(seed)] = {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}
    return out
