"""The network inputs of `ntk_feynman`: seeded vectors x in R^n0 scaled to ||x||^2 / n0 = sq_norm, or a
user's CSV of input vectors (full env), checked before any sampling."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.ntk_feynman.params import Params

INPUTS = TableSchema("ntk_feynman.data.inputs_path")  # columns x_0..x_{n0-1}: numeric, finite


def input_schema(n0: int) -> TableSchema:
    cols = tuple(f"x_{j}" for j in range(n0))
    return INPUTS.refine(columns=dict.fromkeys(cols, "number"), no_missing=cols, finite=cols)


def check_inputs(df: pd.DataFrame, n0: int) -> np.ndarray:
    """A user's input table (one input per row, columns x_0..x_{n0-1}) as an (m, n0) float array."""
    input_schema(n0).check(df)
    X = df[[f"x_{j}" for j in range(n0)]].to_numpy(float)
    zero = (X**2).sum(1) == 0
    if zero.any():
        raise InputDataError(
            f"dataset 'ntk_feynman.data.inputs_path': row {int(np.argmax(zero))} is the zero vector "
            "(its kernel is C_b at every layer: nothing to measure)"
        )
    return X


def make_inputs(p: Params) -> dict:
    """``{"x": [[...], ...], "n0", "sq_norm": [...], "pair": [x_a, x_b] or None, "source"}``: the inputs every
    variant reads (``pair``: the two inputs of the two-input kernel extension; x_a is input 0)."""
    d = p.data
    if d.inputs_path:
        X = check_inputs(read_user_file(d.inputs_path, key="ntk_feynman.data.inputs_path", kind="csv"), d.n0)
        source = d.inputs_path
    else:
        rng = np.random.default_rng(d.input_seed)
        X = rng.normal(size=(d.n_inputs, d.n0))
        X *= np.sqrt(d.sq_norm * d.n0 / (X**2).sum(1, keepdims=True))
        source = f"seeded normal (seed {d.input_seed})"
    pair = None
    if d.inputs_path and d.pair_cosine is not None and len(X) >= 2:
        pair = X[:2]
    elif d.pair_cosine is not None and not d.inputs_path:
        # the second input: same norm as the first, at the given cosine (a seeded orthogonal direction)
        rng = np.random.default_rng(d.input_seed + 1)
        v = rng.normal(size=d.n0)
        v -= (v @ X[0]) / (X[0] @ X[0]) * X[0]
        v *= np.linalg.norm(X[0]) / np.linalg.norm(v)
        pair = np.stack([X[0], d.pair_cosine * X[0] + np.sqrt(1 - d.pair_cosine**2) * v])
    out = {
        "x": X.tolist(),
        "n0": int(X.shape[1]),
        "sq_norm": ((X**2).sum(1) / X.shape[1]).tolist(),
        "pair": None if pair is None else pair.tolist(),
        "source": source,
    }
    if p.multi is not None:
        out["multi"] = multi_inputs(X, p).tolist()
    return out


def multi_inputs(X: np.ndarray, p: Params) -> np.ndarray:
    """The M inputs of the ``multi`` block: the CSV's first n_inputs rows, or the first input and n_inputs - 1
    more at the block's cosines and norm ratios (multi.inputs_with_cosines, its own seed)."""
    from pipelines.ntk_feynman.multi import inputs_with_cosines

    m = p.multi
    if p.data.inputs_path:
        if len(X) < m.n_inputs:
            raise InputDataError(
                f"dataset 'ntk_feynman.data.inputs_path': multi.n_inputs = {m.n_inputs} needs "
                f"that many rows, the file has {len(X)}"
            )
        return X[: m.n_inputs]
    return inputs_with_cosines(X[0], m.cosine_matrix(), m.norm_ratios, m.input_seed)
