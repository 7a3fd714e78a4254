"""Data of `adamspike`: fn64, 64 equispaced x ∈ [-π, π] with y = sin 2x + 0.5 cos 3x (the card's small
regression task), or a user table of (x, y) under ``mlp.data_path``, checked before any training."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.adamspike.params import Params
from pipelines.core.api import TableSchema, read_user_file


def fn64(n_points: int = 64) -> pd.DataFrame:
    x = np.linspace(-np.pi, np.pi, n_points)
    return pd.DataFrame({"x": x, "y": np.sin(2 * x) + 0.5 * np.cos(3 * x)})


USER_TABLE = TableSchema(
    "adamspike.user_data", {"x": "number", "y": "number"}, min_rows=4, no_missing=("x", "y"), finite=("x", "y")
)


def load_user_table(path: str) -> pd.DataFrame:
    """A .parquet or .csv with numeric, finite columns ``x`` and ``y`` (one row per training point)."""
    name = f"{USER_TABLE.dataset} ({path})"
    df = read_user_file(
        path, key="adamspike.mlp.data_path", schema=USER_TABLE.refine(dataset=name), kind=("csv", "parquet")
    )
    return pd.DataFrame({"x": df["x"].astype(float), "y": df["y"].astype(float)})


def make_data(p: Params) -> pd.DataFrame:
    return load_user_table(p.mlp.data_path) if p.mlp.data_path else fn64(p.mlp.n_points)
