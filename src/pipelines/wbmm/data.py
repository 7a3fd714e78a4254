"""Inputs of `wbmm`: the benchmark grid (random tensors are drawn, seeded, in the benchmark node) and the
images of the accuracy check: sklearn's bundled digits (8×8, bilinearly upsampled) or a user .npz."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipelines.core.params import ParameterError, parse


def _resize(x: np.ndarray, size: int) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x, dtype=np.float32))
    if t.ndim == 3:  # N×H×W → N×1×H×W
        t = t.unsqueeze(1)
    if t.ndim != 4:
        raise ParameterError(f"parameter wbmm.acc.data_path: images must be N×H×W or N×C×H×W, got {tuple(t.shape)}")
    if t.shape[-2:] != (size, size):
        t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    return t.contiguous()


def make_images(raw: dict) -> dict:
    """Train/test images and labels per seed: ``{"<seed>": {x_train, y_train, x_test, y_test}}``.

    Digits: a stratified split drawn per seed (1257/540 at the default test_size). A user .npz holds
    its own fixed split (x_train, y_train, x_test, y_test), shared by every seed."""
    p = parse("wbmm", raw).acc
    out: dict[str, dict[str, torch.Tensor]] = {}
    if p.data_path:
        path = Path(p.data_path)
        if not path.is_file():
            raise ParameterError(f"parameter wbmm.acc.data_path: no file at {path}")
        with np.load(path) as z:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(z.files)
            if missing:
                raise ParameterError(f"parameter wbmm.acc.data_path: {path} lacks arrays {sorted(missing)}")
            split = {"x_train": _resize(z["x_train"], p.size), "x_test": _resize(z["x_test"], p.size),
                     "y_train": torch.as_tensor(z["y_train"]).long(), "y_test": torch.as_tensor(z["y_test"]).long()}
        if p.train_limit:
            split["x_train"], split["y_train"] = split["x_train"][:p.train_limit], split["y_train"][:p.train_limit]
        return {str(s): split for s in parse("wbmm", raw).seeds}
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = _resize(digits.images / 16.0, p.size)
    y = torch.as_tensor(digits.target).long()
    for seed in parse("wbmm", raw).seeds:
        tr, te = train_test_split(np.arange(len(y)), test_size=p.test_size, stratify=digits.target,
                                  random_state=seed)
        tr, te = torch.as_tensor(tr[:p.train_limit]), torch.as_tensor(te)
        out[str(seed)] = {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}
    return out
