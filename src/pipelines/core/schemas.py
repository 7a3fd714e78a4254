"""User data validated at the door: a table a user supplies (``--env=full`` inputs) is checked against
its declared columns before any training, and a wrong column, dtype or an empty table stops the run
with one line naming the dataset and the column.

    TEXTS = TableSchema("tess.user_texts", {"window_id": "int", "level": "str", "text": "str"})
    TEXTS.check(df)          # returns df, or raises InputDataError (a DatasetError: one line in the CLI)

Besides columns and kinds a schema declares what the values must be (every check is optional):

    TableSchema("m.user_table", {"y": "int", "split": "str", "q": "array[number]"},
                patterns={r"x\\d+": "number"},          # x0, x1, ...: at least one such column
                no_missing=("y", r"x\\d+"),             # a pattern stands for every column it matches
                finite=("q", r"x\\d+"),                 # numeric and finite (array columns: every element)
                ranges={"y": (0, 9)},                  # inclusive; None: unbounded (array columns: elements)
                allowed={"split": ("train", "test")},  # no other value
                covers={"split": ("train", "test")},   # each at least once; {"train": 64}: at least 64 rows
                lengths={"q": None},                   # array lengths: None all equal, n exactly n,
                                                       # (lo, hi) a range, "col" the length of column col
                unique=("id", ("id", "level")),        # a column, or a tuple: a composite key
                refs={"u": ("m.nodes", "node")})       # values of another table: check(df, tables={"m.nodes": nodes})

``check`` also takes a mapping of equal-length arrays (an ``.npz``, a dict of tensors): each declared key
becomes a column, one row per item (an ``N×H×W`` array gives ``N`` rows holding ``H×W`` arrays). Parameters
that a schema depends on are added where the table is read: ``SCHEMA.refine(ranges={"y": (0, k - 1)})``
(mapping fields are merged, the others replaced).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from kedro.io import DatasetError

SCALAR_KINDS = ("int", "float", "number", "str", "json", "bool", "datetime")  # json: a str that parses as JSON
ELEMENT_KINDS = ("int", "float", "number", "bool")  # of array[<kind>]
KINDS = (*SCALAR_KINDS, "array", *(f"array[{k}]" for k in ELEMENT_KINDS), "any")
_ELEMENT_DTYPES = {"int": "iu", "float": "f", "number": "iuf", "bool": "b"}


class InputDataError(DatasetError):
    """A user-supplied table does not match its schema; the message names the dataset and the column."""


def _is_array(v: Any) -> bool:
    return isinstance(v, list | tuple | np.ndarray)


def _kind_ok(s: pd.Series, kind: str) -> bool:
    return _kind_problem(s, kind) is None


def _kind_problem(s: pd.Series, kind: str) -> tuple[str, Any] | None:
    """None if every value of ``s`` is of ``kind``, else (what it got, the label of the first bad row or None)."""
    if kind == "any":
        return None
    if kind in ("int", "float", "number", "bool", "datetime"):
        ok = {
            "int": lambda: pd.api.types.is_integer_dtype(s) and not pd.api.types.is_bool_dtype(s),
            "float": lambda: pd.api.types.is_float_dtype(s),
            "number": lambda: pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s),
            "bool": lambda: pd.api.types.is_bool_dtype(s),
            "datetime": lambda: pd.api.types.is_datetime64_any_dtype(s),
        }[kind]()
        return None if ok else (str(s.dtype), None)
    if kind == "str":
        bad = ~s.map(lambda v: isinstance(v, str)).to_numpy(bool)
        if pd.api.types.is_string_dtype(s) and not bad.any():
            return None
        return str(s.dtype), (s.index[np.argmax(bad)] if bad.any() else None)
    if kind == "json":
        for label, v in s.items():
            if not isinstance(v, str):
                return f"a value of type {type(v).__name__}", label
            try:
                json.loads(v)
            except json.JSONDecodeError:
                return f"text that is not JSON ({v[:60]!r})", label
        return None
    if kind == "array" or (kind.startswith("array[") and kind.endswith("]") and kind[6:-1] in ELEMENT_KINDS):
        for label, v in s.items():
            if not _is_array(v):
                return f"a value of type {type(v).__name__}", label
            if kind != "array":
                a = np.asarray(v)
                if a.size and a.dtype.kind not in _ELEMENT_DTYPES[kind[6:-1]]:
                    return f"elements of dtype {a.dtype}", label
        return None
    raise ValueError(f"unknown column kind {kind!r} (one of {KINDS})")


def _flat(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The values of a column (every element of an array column) and the row position of each."""
    if len(s) and s.map(_is_array).all():
        parts = [np.asarray(v).ravel() for v in s]
        sizes = np.fromiter((len(p) for p in parts), int, len(parts))
        vals = np.concatenate(parts) if parts else np.empty(0)
        return vals, np.repeat(np.arange(len(s)), sizes)
    return s.to_numpy(), np.arange(len(s))


def _numeric(vals: np.ndarray) -> np.ndarray:
    if vals.dtype.kind in "iuf":
        return vals.astype(float, copy=False)
    return pd.to_numeric(pd.Series(vals, dtype=object), errors="coerce").to_numpy(float)


def _bound(lo: Any, hi: Any) -> str:
    if lo is not None and hi is not None:
        return f"in [{lo}, {hi}]"
    return f">= {lo}" if lo is not None else f"<= {hi}"


def _show(values: Collection, n: int = 8) -> str:
    vals = list(values)
    more = f", ... ({len(vals)} values)" if len(vals) > n else ""
    return ", ".join(map(repr, vals[:n])) + more


def _py(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


@dataclass(frozen=True)
class TableSchema:
    """Required columns and their kinds; extra columns are allowed; ``min_rows`` rows at least; and the
    optional value checks of the module docstring. ``item`` is the word for a column in the messages
    ("array", "key" for a file of arrays), ``row_label`` the word for a row ("line" for JSONL, whose row
    labels are line numbers) and ``hint`` is appended to every message (where the input format is told)."""

    dataset: str
    columns: Mapping[str, str] = field(default_factory=dict)
    min_rows: int = 1
    no_missing: tuple[str, ...] = field(default=())  # columns that may not hold NaN / None
    patterns: Mapping[str, str] = field(default_factory=dict)  # regex (full match) -> kind
    finite: tuple[str, ...] = field(default=())
    ranges: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    allowed: Mapping[str, Collection] = field(default_factory=dict)
    covers: Mapping[str, Collection | Mapping[Any, int]] = field(default_factory=dict)
    lengths: Mapping[str, int | tuple[int | None, int | None] | str | None] = field(default_factory=dict)  # arrays
    unique: tuple[str | tuple[str, ...], ...] = field(default=())
    refs: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # column -> (dataset, its column)
    item: str = "column"
    row_label: str = "row"
    hint: str = ""

    def refine(self, **changes: Any) -> TableSchema:
        """A copy with ``changes``: mapping fields are merged into this schema's, the others replaced."""
        for k, v in changes.items():
            old = getattr(self, k)
            if isinstance(old, Mapping):
                changes[k] = {**old, **v}
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------------------------------ checks
    def _fail(self, msg: str) -> None:
        raise InputDataError(f"dataset '{self.dataset}': {msg}" + (f" ({self.hint})" if self.hint else ""))

    def _at(self, df: pd.DataFrame, pos: int) -> str:
        return f"{self.row_label} {_py(df.index[pos])}"

    def _names(self, df: pd.DataFrame, name: str) -> list[str]:
        """A column, or the columns matching a declared pattern."""
        if name in self.patterns:
            return [c for c in df.columns if isinstance(c, str) and re.fullmatch(name, c)]
        return [name]

    def _table(self, data: Mapping) -> pd.DataFrame:
        keys = list(
            dict.fromkeys(
                [
                    *self.columns,
                    *(k for k in data if isinstance(k, str) and any(re.fullmatch(p, k) for p in self.patterns)),
                ]
            )
        )
        for k in self.columns:
            if k not in data:
                self._fail(
                    f"{self.item} '{k}' is missing ({self.item}s: {', '.join(map(str, list(data)[:12])) or 'none'})"
                )
        cols, first = {}, None
        for k in keys:
            v = data[k]
            if hasattr(v, "detach"):  # a torch tensor
                v = v.detach().cpu()
                try:
                    v = v.numpy()
                except (TypeError, RuntimeError):
                    v = v.float().numpy()
            a = np.asarray(v)
            if a.ndim == 0:
                self._fail(f"{self.item} '{k}' should hold one value per row, got a scalar")
            if first is None:
                first = (k, len(a))
            elif len(a) != first[1]:
                self._fail(f"{self.item}s '{first[0]}' ({first[1]} rows) and '{k}' ({len(a)} rows) differ in length")
            cols[k] = list(a) if a.ndim > 1 else a
        df = pd.DataFrame(cols)
        if len(df) < self.min_rows and cols:
            self._fail(
                f"{self.item}s {', '.join(map(repr, cols))} have {len(df)} rows, at least {self.min_rows} needed"
            )
        return df

    def check(self, df: Any, tables: Mapping[str, pd.DataFrame] | None = None) -> Any:
        """``df`` if it satisfies the schema (a mapping of arrays is returned as given), else raises
        :class:`InputDataError` naming the dataset and the column. ``tables``: the tables ``refs`` name."""
        given = df
        if isinstance(df, Mapping):
            df = self._table(df)
            have = ", ".join(map(str, list(given)[:12])) or "none"
        elif not isinstance(df, pd.DataFrame):
            self._fail(f"expected a table, got {type(df).__name__}")
        else:
            have = ", ".join(map(str, df.columns[:12]))
        if len(df) < self.min_rows:
            self._fail(f"{len(df)} rows, at least {self.min_rows} needed")
        kinds = dict(self.columns)
        for col in self.columns:
            if col not in df.columns:
                self._fail(f"{self.item} '{col}' is missing ({self.item}s: {have})")
        for pat, kind in self.patterns.items():
            matched = self._names(df, pat)
            if not matched:
                self._fail(f"no {self.item} matches the pattern '{pat}' ({self.item}s: {have})")
            kinds.update({c: kind for c in matched if c not in kinds})
        for col, kind in kinds.items():
            bad = _kind_problem(df[col], kind)
            if bad is not None:
                got, label = bad
                where = f" (first at {self.row_label} {_py(label)})" if label is not None else ""
                self._fail(f"{self.item} '{col}' should be {kind}, got {got}{where}")
        for col in (c for n in self.no_missing for c in self._names(df, n)):
            miss = df[col].isna().to_numpy(bool)
            if miss.any():
                self._fail(
                    f"{self.item} '{col}' has {int(miss.sum())} missing value(s) "
                    f"(first at {self._at(df, int(np.argmax(miss)))})"
                )
        for col in (c for n in self.finite for c in self._names(df, n)):
            vals, rows = _flat(df[col])
            bad = ~np.isfinite(_numeric(vals))
            if bad.any():
                self._fail(
                    f"{self.item} '{col}' has {int(bad.sum())} non-finite value(s) "
                    f"(first at {self._at(df, rows[np.argmax(bad)])})"
                )
        for name, (lo, hi) in self.ranges.items():
            for col in self._names(df, name):
                vals, rows = _flat(df[col])
                num = _numeric(vals)
                with np.errstate(invalid="ignore"):
                    ok = ~np.isnan(num)
                    ok &= True if lo is None else num >= lo
                    ok &= True if hi is None else num <= hi
                if not ok.all():
                    i = int(np.argmax(~ok))
                    self._fail(
                        f"{self.item} '{col}' must be {_bound(lo, hi)}; {int((~ok).sum())} value(s) are "
                        f"not (first {_py(vals[i])!r} at {self._at(df, rows[i])})"
                    )
        for col, values in self.allowed.items():
            bad = ~df[col].isin(list(values)).to_numpy(bool)
            if bad.any():
                unknown = sorted({str(v) for v in df[col][bad]})
                self._fail(
                    f"{self.item} '{col}' has unknown value(s) {unknown[:3]} (allowed: {_show(values)}; "
                    f"first at {self._at(df, int(np.argmax(bad)))})"
                )
        for col, need in self.covers.items():
            need = need if isinstance(need, Mapping) else dict.fromkeys(need, 1)
            for v, k in need.items():
                n = int((df[col] == v).sum())
                if n < k:
                    self._fail(
                        f"{self.item} '{col}' has {n or 'no'} {v!r} rows" + (f", at least {k} needed" if k > 1 else "")
                    )
        for col, spec in self.lengths.items():
            lens = df[col].map(len).to_numpy(int)
            if spec is None:
                if len(set(lens)) > 1:
                    self._fail(
                        f"{self.item} '{col}' holds arrays of different lengths {sorted(set(lens.tolist()))[:4]}"
                    )
                continue
            if isinstance(spec, str):
                want, what = df[spec].map(len).to_numpy(int), f"the length of {self.item} '{spec}'"
                bad = lens != want
            elif isinstance(spec, tuple):
                lo, hi = spec
                bad = ((lens < lo) if lo is not None else False) | ((lens > hi) if hi is not None else False)
                what = f"a length {_bound(lo, hi)}"
            else:
                bad, what = lens != spec, f"length {spec}"
            bad = np.asarray(bad, bool) & np.ones(len(lens), bool)
            if bad.any():
                i = int(np.argmax(bad))
                self._fail(
                    f"{self.item} '{col}' must hold arrays of {what}; {int(bad.sum())} row(s) do not "
                    f"(first of length {lens[i]} at {self._at(df, i)})"
                )
        for key in self.unique:
            cols = [key] if isinstance(key, str) else list(key)
            dup = df.duplicated(cols).to_numpy(bool)
            if dup.any():
                i = int(np.argmax(dup))
                v = tuple(_py(df[c].iloc[i]) for c in cols)
                what = (
                    f"{self.item} '{key}' repeats {v[0]!r}"
                    if isinstance(key, str)
                    else f"{self.item}s {', '.join(map(repr, cols))} repeat {v!r}"
                )
                self._fail(f"{what}, which must be unique (first repeat at {self._at(df, i)})")
        for col, (other, other_col) in self.refs.items():
            if tables is None or other not in tables:
                raise ValueError(f"TableSchema '{self.dataset}': check needs tables={{'{other}': ...}} for refs")
            bad = ~df[col].isin(set(tables[other][other_col])).to_numpy(bool)
            if bad.any():
                i = int(np.argmax(bad))
                self._fail(
                    f"{self.item} '{col}' names {_py(df[col].iloc[i])!r}, which is not in '{other}' "
                    f"column '{other_col}' ({int(bad.sum())} row(s); first at {self._at(df, i)})"
                )
        return given


def read_feature_csv(
    path: str | Path, dataset: str, columns: Mapping[str, str], min_rows: int, hint: str, key: str | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """A user CSV of numeric feature columns ``x_*`` and the named ``columns`` (name → kind), none of them
    with a gap. A missing file (the message ends with ``hint``, in parentheses: what the file should be),
    no ``x_*`` column or a schema miss stops the run with one line naming ``dataset``. Returns the table
    and its feature columns; the method checks the values. ``key``: the parameter an unreadable file is
    reported under (:func:`read_user_file`; default ``dataset``)."""
    path = Path(path)
    if not path.is_file():
        raise InputDataError(f"dataset '{dataset}': {path} not found ({hint})")
    df = read_user_file(path, key=key or dataset, kind="csv")
    feats = [c for c in df.columns if str(c).startswith("x_")]
    if not feats:
        raise InputDataError(
            f"dataset '{dataset}': no feature column x_* (columns: {', '.join(map(str, df.columns[:12]))})"
        )
    TableSchema(
        dataset, {**columns, **{c: "number" for c in feats}}, min_rows=min_rows, no_missing=(*columns, *feats)
    ).check(df)
    return df, feats


# ------------------------------------------------------------------------------------------ user files
#: file suffix -> kind of :func:`read_user_file`
SUFFIX_KINDS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".json": "json",
    ".jsonl": "jsonl",
    ".npz": "npz",
    ".npy": "npy",
    ".pt": "pt",
    ".pth": "pt",
    ".txt": "txt",
}
FILE_KINDS = ("parquet", "csv", "tsv", "json", "jsonl", "npz", "npy", "pt", "txt")
_KIND_WORDS = {
    "parquet": "a readable parquet file (truncated, or not parquet?)",
    "csv": "a readable CSV file",
    "tsv": "a readable tab-separated file",
    "json": "a readable JSON file (truncated?)",
    "jsonl": "a readable JSON-lines file (truncated?)",
    "npz": "a readable .npz file (truncated, or not np.savez?)",
    "npy": "a readable .npy file (truncated, or not np.save?)",
    "pt": "a torch.save file of tensors (truncated?)",
    "txt": "a readable UTF-8 text file",
}


def user_file_kind(path: str | Path, kind: str | tuple[str, ...] | None = None) -> str:
    """The kind :func:`read_user_file` reads ``path`` as: ``kind`` itself when one is given; with a tuple,
    the kind the suffix names if it is one of them, else the tuple's first; with None, the suffix's kind."""
    if isinstance(kind, str):
        return kind
    by_suffix = SUFFIX_KINDS.get(Path(str(path)).suffix.lower())
    if kind is None:
        return by_suffix or ""
    return by_suffix if by_suffix in kind else kind[0]


def _read_kind(path: Path, kind: str, read_kw: Mapping[str, Any]) -> Any:
    if kind == "parquet":
        return pd.read_parquet(path, **read_kw)
    if kind in ("csv", "tsv"):
        return pd.read_csv(path, **({"sep": "\t"} if kind == "tsv" else {}), **read_kw)
    if kind == "json":
        return json.loads(path.read_text(encoding="utf-8"))
    if kind == "jsonl":
        return pd.read_json(path, lines=True, **read_kw)
    if kind == "npz":
        with np.load(path, allow_pickle=False, **read_kw) as z:  # every array now: a cut file fails here
            return {k: z[k] for k in z.files}
    if kind == "npy":
        return np.load(path, allow_pickle=False, **read_kw)
    if kind == "pt":
        import torch

        return torch.load(path, map_location="cpu", weights_only=True, **read_kw)
    if kind == "txt":
        return path.read_text(encoding="utf-8", errors="strict")
    raise ValueError(f"read_user_file: unknown kind {kind!r} (one of {FILE_KINDS})")


def _first_line(exc: BaseException, n: int = 160) -> str:
    text = " ".join(str(exc).split()) or "no message"
    return f"{type(exc).__name__}: {text[:n]}" + ("..." if len(text) > n else "")


def read_user_file(
    path: str | Path | None,
    *,
    key: str,
    schema: TableSchema | None = None,
    kind: str | tuple[str, ...] | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
    **read_kw: Any,
) -> Any:
    """A file the user names in parameter ``key`` (``"prism.data.path"``), read and, given ``schema``,
    checked. Whatever keeps it from being read (no file, a folder, an empty or cut file, another format)
    raises :class:`InputDataError` in one line naming ``key``, the file and what is wrong, e.g.
    ``dataset 'prism.data.path (data/x.parquet)': not a readable parquet file (truncated, or not parquet?):
    ArrowInvalid: ...``, before anything else runs.

    ``kind``: ``parquet``, ``csv``, ``tsv``, ``json`` (a value), ``jsonl`` (a table), ``npz`` (a dict of
    arrays, all read now), ``npy``, ``pt`` (``torch.save``, weights only) or ``txt``; a tuple picks by the
    suffix (else its first kind), None by the suffix alone (:func:`user_file_kind`). ``read_kw`` go to the
    reader (``dtype=str`` for a CSV); ``tables`` to ``schema.check`` (its ``refs``)."""
    if path is None or str(path) == "":
        raise InputDataError(f"dataset '{key}': no file given")
    p = Path(str(path))
    where = f"dataset '{key} ({p})'"
    k = user_file_kind(p, kind)
    if k not in FILE_KINDS:
        raise InputDataError(
            f"{where}: a file suffix this parameter does not read "
            f"(one of {', '.join(s for s, v in SUFFIX_KINDS.items() if v in FILE_KINDS)})"
        )
    if p.is_dir():
        raise InputDataError(f"{where}: a folder, not a {k} file")
    if not p.is_file():
        raise InputDataError(f"{where}: file not found")
    if p.stat().st_size == 0 and k != "txt":  # an empty text is read: its method says what it lacks
        raise InputDataError(f"{where}: the file is empty (0 bytes), not {_KIND_WORDS[k]}")
    try:
        data = _read_kind(p, k, read_kw)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's input error, in one line
        raise InputDataError(f"{where}: not {_KIND_WORDS[k]}: {_first_line(exc)}") from None
    return data if schema is None else schema.check(data, tables=tables)


__all__ = [
    "FILE_KINDS",
    "InputDataError",
    "KINDS",
    "TableSchema",
    "read_feature_csv",
    "read_user_file",
    "user_file_kind",
]
