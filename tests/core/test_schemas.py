"""core.schemas.TableSchema: every declared check passes a good table and names the dataset and the
column (one line, a DatasetError) on a bad one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from kedro.io import DatasetError

from pipelines.core.schemas import KINDS, InputDataError, TableSchema


def _good() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [0, 1, 2, 3],
            "split": ["train", "train", "test", "test"],
            "y": [0, 1, 2, 1],
            "w": [0.5, 1.0, 2.0, 0.0],
            "q": [np.arange(3.0)] * 4,
            "tok": [[1, 2], [3], [0, 0, 1], [2]],
            "x0": [1.0] * 4,
            "x1": [2.0] * 4,
            "node": [10, 11, 10, 12],
        }
    )


SCHEMA = TableSchema(
    "t.table",
    {"id": "int", "split": "str", "y": "int", "w": "float", "q": "array[float]", "tok": "array[int]", "node": "int"},
    min_rows=2,
    no_missing=("y", r"x\d+"),
    patterns={r"x\d+": "number"},
    finite=("w", "q", r"x\d+"),
    ranges={"y": (0, 2), "w": (0, None), "tok": (0, 3)},
    allowed={"split": ("train", "val", "test")},
    covers={"split": {"train": 2, "test": 1}},
    lengths={"q": 3, "tok": (1, 3)},
    unique=("id", ("split", "y")),
    refs={"node": ("t.nodes", "node")},
)
NODES = {"t.nodes": pd.DataFrame({"node": [10, 11, 12]})}


def _fails(df, match, schema=SCHEMA, tables=NODES):
    with pytest.raises(InputDataError, match=match) as err:
        schema.check(df, tables=tables)
    msg = str(err.value)
    assert isinstance(err.value, DatasetError) and "\n" not in msg and msg.startswith(f"dataset '{schema.dataset}': ")
    return msg


def test_a_good_table_passes_and_is_returned():
    df = _good()
    assert SCHEMA.check(df, tables=NODES) is df
    assert "array[int]" in KINDS and "array[number]" in KINDS


@pytest.mark.parametrize(
    "breaks, match",
    [
        (lambda d: d.iloc[:1], r"1 rows, at least 2 needed"),
        (lambda d: d.drop(columns="y"), r"column 'y' is missing \(columns: id, split, w"),
        (lambda d: d.assign(y=d.y.astype(float)), r"column 'y' should be int, got float64"),
        (
            lambda d: d.assign(split=["train", 1, "test", "test"]),
            r"column 'split' should be str, got object \(first at row 1\)",
        ),
        (lambda d: d.drop(columns=["x0", "x1"]), r"no column matches the pattern 'x\\d\+'"),
        (lambda d: d.assign(x1=["a"] * 4), r"column 'x1' should be number"),
        (lambda d: d.assign(x1=[1.0, None, 2.0, 3.0]), r"column 'x1' has 1 missing value\(s\) \(first at row 1\)"),
        (
            lambda d: d.assign(q=[np.arange(3.0)] * 3 + [np.array([0, np.inf, 1])]),
            r"column 'q' has 1 non-finite value\(s\) \(first at row 3\)",
        ),
        (
            lambda d: d.assign(q=[np.arange(3)] * 4),
            r"column 'q' should be array\[float\], got elements of dtype int64 \(first at row 0\)",
        ),
        (
            lambda d: d.assign(tok=[[1, 2], [3], [0.5], [2]]),
            r"column 'tok' should be array\[int\], got elements of dtype float64 \(first at row 2\)",
        ),
        (
            lambda d: d.assign(tok=[[1, 2], 3, [0], [2]]),
            r"column 'tok' should be array\[int\], got a value of type int \(first at row 1\)",
        ),
        (
            lambda d: d.assign(w=[0.5, -1.0, 2.0, -3.0]),
            r"column 'w' must be >= 0; 2 value\(s\) are not \(first -1.0 at row 1\)",
        ),
        (
            lambda d: d.assign(y=[0, 1, 3, 1]),
            r"column 'y' must be in \[0, 2\]; 1 value\(s\) are not \(first 3 at row 2\)",
        ),
        (
            lambda d: d.assign(tok=[[1, 2], [3], [0, 9, 1], [2]]),
            r"column 'tok' must be in \[0, 3\]; 1 value\(s\) are not \(first 9 at row 2\)",
        ),
        (
            lambda d: d.assign(split=["train", "train", "dev", "test"]),
            r"column 'split' has unknown value\(s\) \['dev'\] \(allowed: 'train', 'val', 'test'; first at row 2\)",
        ),
        (
            lambda d: d.assign(split=["train", "test", "test", "test"], y=[0, 0, 1, 2]),
            r"column 'split' has 1 'train' rows, at least 2 needed",
        ),
        (lambda d: d.assign(split=["train", "train", "val", "val"]), r"column 'split' has no 'test' rows$"),
        (
            lambda d: d.assign(q=[np.arange(3.0)] * 3 + [np.arange(2.0)]),
            r"column 'q' must hold arrays of length 3; 1 row\(s\) do not \(first of length 2 at row 3\)",
        ),
        (
            lambda d: d.assign(tok=[[1, 2], [], [0], [2]]),
            r"column 'tok' must hold arrays of a length in \[1, 3\]; .*at row 1",
        ),
        (lambda d: d.assign(id=[0, 1, 1, 3]), r"column 'id' repeats 1, which must be unique \(first repeat at row 2\)"),
        (lambda d: d.assign(y=[0, 0, 2, 1]), r"columns 'split', 'y' repeat \('train', 0\)"),
        (
            lambda d: d.assign(node=[10, 11, 99, 12]),
            r"column 'node' names 99, which is not in 't\.nodes' column 'node'",
        ),
    ],
)
def test_each_check_names_the_dataset_and_the_column(breaks, match):
    _fails(breaks(_good()), match)


def test_json_kind():
    s = TableSchema("t.csv", {"obs": "json"})
    ok = pd.DataFrame({"obs": ['{"n": 3}', "[1, 2]"]})
    assert s.check(ok) is ok
    _fails(
        ok.assign(obs=['{"n": 3}', '{"n": 3']),
        r"column 'obs' should be json, got text that is not JSON "
        r"\('\{\"n\": 3'\) \(first at row 1\)",
        s,
    )
    _fails(ok.assign(obs=['{"n": 3}', None]), r"column 'obs' should be json, got a value of type (NoneType|float)", s)


def test_not_a_table():
    _fails([1, 2], r"expected a table, got list")


def test_lengths_none_and_length_of_another_column():
    s = TableSchema("t.w", {"x": "array", "y": "array"}, lengths={"x": None, "y": "x"})
    ok = pd.DataFrame({"x": [[1, 2], [3, 4]], "y": [[1, 2], [0, 0]]})
    assert s.check(ok) is ok
    _fails(ok.assign(x=[[1, 2], [3]]), r"column 'x' holds arrays of different lengths \[1, 2\]", s)
    _fails(ok.assign(y=[[1, 2], [0]]), r"column 'y' must hold arrays of the length of column 'x'.*at row 1", s)


def test_refs_need_the_other_table():
    with pytest.raises(ValueError, match="tables="):
        SCHEMA.check(_good())


def test_row_label_item_and_hint_word_the_message():
    s = TableSchema(
        "t.jsonl",
        {"regime": "str"},
        allowed={"regime": ("a",)},
        row_label="line",
        item="field",
        hint="format: README.md",
    )
    df = pd.DataFrame({"regime": ["a", "b"]}, index=[1, 3])
    msg = _fails(
        df,
        r"field 'regime' has unknown value\(s\) \['b'\] \(allowed: 'a'; first at line 3\) "
        r"\(format: README\.md\)$",
        s,
    )
    assert msg.count("dataset") == 1


def test_a_mapping_of_arrays_is_checked_as_a_table():
    s = TableSchema(
        "t.npz", {"x": "array[number]", "y": "int"}, min_rows=2, finite=("x",), ranges={"y": (0, None)}, item="array"
    )
    good = {"x": np.zeros((3, 2, 2)), "y": np.array([0, 1, 0]), "other": np.zeros(7)}
    assert s.check(good) is good
    _fails({"x": good["x"]}, r"array 'y' is missing \(arrays: x\)", s)
    _fails({**good, "y": good["y"][:2]}, r"arrays 'x' \(3 rows\) and 'y' \(2 rows\) differ in length", s)
    _fails({"x": good["x"][:1], "y": good["y"][:1]}, r"arrays 'x', 'y' have 1 rows, at least 2 needed", s)
    _fails({**good, "y": np.array([0.0, 1.0, 0.0])}, r"array 'y' should be int, got float64", s)
    _fails({**good, "y": np.zeros((3, 2), int)}, r"array 'y' should be int, got object", s)
    _fails({**good, "x": np.full((3, 2, 2), "a")}, r"array 'x' should be array\[number\], got elements of dtype <U1", s)
    bad = good["x"].copy()
    bad[2, 1, 1] = np.nan
    _fails({**good, "x": bad}, r"array 'x' has 1 non-finite value\(s\) \(first at row 2\)", s)
    _fails(
        {**good, "y": np.array([0, -1, 0])}, r"array 'y' must be >= 0; 1 value\(s\) are not \(first -1 at row 1\)", s
    )
    _fails({**good, "y": np.int64(3)}, r"array 'y' should hold one value per row, got a scalar", s)


def test_a_mapping_of_tensors():
    torch = pytest.importorskip("torch")
    s = TableSchema("t.pt", {"x": "array[float]", "y": "int"}, ranges={"y": (0, None)}, item="key")
    assert s.check({"x": torch.zeros(2, 1, 4, 4), "y": torch.tensor([0, 1])})
    assert s.check({"x": torch.zeros(2, 3, dtype=torch.bfloat16), "y": torch.tensor([0, 1])})
    _fails({"x": torch.zeros(2, 3), "y": torch.tensor([True, False])}, r"key 'y' should be int, got bool", s)


def test_refine_merges_mappings_and_replaces_the_rest():
    base = TableSchema("t.base", {"y": "int"}, ranges={"y": (0, None)}, no_missing=("y",))
    r = base.refine(dataset="t.base (f.csv)", columns={"x0": "number"}, ranges={"y": (0, 4)}, no_missing=("x0",))
    assert r.columns == {"y": "int", "x0": "number"} and r.ranges == {"y": (0, 4)} and r.no_missing == ("x0",)
    assert r.dataset == "t.base (f.csv)" and base.columns == {"y": "int"} and base.ranges == {"y": (0, None)}


def test_the_old_positional_form_still_works():
    s = TableSchema("t.old", {"a": "str"}, 2, ("a",))
    _fails(pd.DataFrame({"a": ["x", None]}), r"column 'a' should be str", s)
    _fails(pd.DataFrame({"a": ["x"]}), r"1 rows, at least 2 needed", s)
