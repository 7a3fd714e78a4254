"""User data validated at the door: a table a user supplies (``--env=full`` inputs) is checked against
its declared columns before any training, and a wrong column, dtype or an empty table stops the run
with one line naming the dataset and the column.

    TEXTS = TableSchema("tess.user_texts", {"window_id": "int", "level": "str", "text": "str"})
    TEXTS.check(df)          # returns df, or raises InputDataError (a DatasetError: one line in the CLI)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from kedro.io import DatasetError

KINDS = ("int", "float", "number", "str", "bool", "datetime", "array", "any")


class InputDataError(DatasetError):
    """A user-supplied table does not match its schema; the message names the dataset and the column."""


def _kind_ok(s: pd.Series, kind: str) -> bool:
    if kind == "any":
        return True
    if kind == "int":
        return pd.api.types.is_integer_dtype(s) and not pd.api.types.is_bool_dtype(s)
    if kind == "float":
        return pd.api.types.is_float_dtype(s)
    if kind == "number":
        return pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
    if kind == "bool":
        return pd.api.types.is_bool_dtype(s)
    if kind == "datetime":
        return pd.api.types.is_datetime64_any_dtype(s)
    if kind == "str":
        return pd.api.types.is_string_dtype(s) and s.map(lambda v: isinstance(v, str)).all()
    if kind == "array":   # a list / array per row (series windows, embeddings)
        return s.map(lambda v: isinstance(v, list | tuple | np.ndarray)).all()
    raise ValueError(f"unknown column kind {kind!r} (one of {KINDS})")


@dataclass(frozen=True)
class TableSchema:
    """Required columns and their kinds; extra columns are allowed; ``min_rows`` rows at least."""

    dataset: str
    columns: Mapping[str, str]
    min_rows: int = 1
    no_missing: tuple[str, ...] = field(default=())   # columns that may not hold NaN / None

    def check(self, df: Any) -> pd.DataFrame:
        if not isinstance(df, pd.DataFrame):
            raise InputDataError(f"dataset '{self.dataset}': expected a table, got {type(df).__name__}")
        if len(df) < self.min_rows:
            raise InputDataError(f"dataset '{self.dataset}': {len(df)} rows, at least {self.min_rows} needed")
        for col, kind in self.columns.items():
            if col not in df.columns:
                have = ", ".join(map(str, df.columns[:12]))
                raise InputDataError(f"dataset '{self.dataset}': column '{col}' is missing (columns: {have})")
            if not _kind_ok(df[col], kind):
                raise InputDataError(f"dataset '{self.dataset}': column '{col}' should be {kind}, "
                                     f"got {df[col].dtype}")
        for col in self.no_missing:
            n = int(df[col].isna().sum())
            if n:
                raise InputDataError(f"dataset '{self.dataset}': column '{col}' has {n} missing value(s)")
        return df


def read_feature_csv(path: str | Path, dataset: str, columns: Mapping[str, str], min_rows: int,
                     hint: str) -> tuple[pd.DataFrame, list[str]]:
    """A user CSV of numeric feature columns ``x_*`` and the named ``columns`` (name → kind), none of them
    with a gap. A missing file (the message ends with ``hint``, in parentheses: what the file should be),
    no ``x_*`` column or a schema miss stops the run with one line naming ``dataset``. Returns the table
    and its feature columns; the method checks the values."""
    path = Path(path)
    if not path.is_file():
        raise InputDataError(f"dataset '{dataset}': {path} not found ({hint})")
    df = pd.read_csv(path)
    feats = [c for c in df.columns if str(c).startswith("x_")]
    if not feats:
        raise InputDataError(f"dataset '{dataset}': no feature column x_* "
                             f"(columns: {', '.join(map(str, df.columns[:12]))})")
    TableSchema(dataset, {**columns, **{c: "number" for c in feats}}, min_rows=min_rows,
                no_missing=(*columns, *feats)).check(df)
    return df, feats


__all__ = ["InputDataError", "KINDS", "TableSchema", "read_feature_csv"]
