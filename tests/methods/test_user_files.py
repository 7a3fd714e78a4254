"""Unreadable user files, over the registry: every file a method declares (``Params.USER_FILES``), cut in
half (or empty), stops the method's data stage with one line naming the parameter and the file, whichever
of the method's files it is (the others hold a readable file of the right kind)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest

from pipelines.core.registry import discover_methods, has_spec
from pipelines.core.schemas import InputDataError, TableSchema, read_user_file
from tests.methods.test_all_pipelines import _deep_merge, _raw

METHODS = discover_methods()
# files read by a data node that needs the outputs of an earlier one (built from the other files)
NOT_FIRST_STAGE = {("tess", "data.texts_path"): "read by render_texts after the windows are checked"}


def _user_files(m: str) -> dict[str, str]:
    from pipelines.core.params import schema_for

    return dict(schema_for(m).USER_FILES)


CASES = [(m, key) for m in METHODS for key in _user_files(m)]


def _frame(n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"a": rng.normal(size=n), "b": [f"row {i}" for i in range(n)]})


def _write_good(path, kind: str) -> None:
    """A readable file of ``kind`` (not the method's schema: only the file under test must fail to read)."""
    if kind == "parquet":
        _frame().to_parquet(path)
    elif kind == "csv":
        _frame().to_csv(path, index=False)
    elif kind == "npz":
        np.savez(path, a=np.zeros((50, 8, 8)))
    elif kind == "pt":
        import torch

        torch.save({"a": torch.zeros(200, 8)}, path)
    elif kind == "jsonl":
        path.write_text("".join(json.dumps({"a": i, "b": f"row {i}"}) + "\n" for i in range(200)))
    else:
        raise AssertionError(f"no writer for kind {kind!r}")


def _write_cut(path, kind: str) -> None:
    """A file of ``kind`` cut in half (a CSV: empty, since pandas reads a cut CSV as a shorter table)."""
    if kind == "csv":
        path.write_bytes(b"")
        return
    _write_good(path, kind)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _set(raw: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    for k in head:
        if not isinstance(raw.get(k), dict):
            raw[k] = {}
        raw = raw[k]
    raw[last] = value


def _params(m: str, files: dict[str, str]):
    from pipelines.core.params import schema_for, validate

    cls = schema_for(m)
    raw = copy.deepcopy(_deep_merge(_raw("base", m), _raw("test", m)))
    for key, value in {**cls.USER_FILE_SETTINGS, **files}.items():
        _set(raw, key, value)
    return validate(cls, raw, m)


def _data_stage_error(m: str, p, key: str, path: str) -> str | None:
    """Run the method's data nodes that take only the params, in order, until one stops with an
    InputDataError naming ``key`` and ``path`` (returned). Another InputDataError (a readable stand-in
    file of a node that does not read ``key`` fails its schema) moves on to the next node; every error
    seen must be one line. None if no node names the file."""
    from pipelines.core.spec import load_spec

    for d in load_spec(m).data:
        inputs = [d.inputs] if isinstance(d.inputs, str) else list(d.inputs)
        if inputs != ["params"] or "gpu" in (d.tags or ()):
            continue
        try:
            d.func(p)
        except InputDataError as exc:
            msg = str(exc)
            assert "\n" not in msg, msg
            if f"{m}.{key}" in msg and path in msg:
                return msg
            if path in msg:  # the node read the cut file: it must name the parameter too
                raise AssertionError(f"node data.{d.name}: {msg}") from None
    return None


@pytest.mark.parametrize(("m", "key"), CASES, ids=[f"{m}.{k}" for m, k in CASES])
def test_a_cut_user_file_stops_the_data_stage_in_one_line(m, key, tmp_path):
    if (m, key) in NOT_FIRST_STAGE:
        pytest.skip(NOT_FIRST_STAGE[(m, key)])
    assert has_spec(m)
    kinds = _user_files(m)
    files = {}
    for k, kind in kinds.items():
        path = tmp_path / f"{k.replace('.', '_')}.{kind}"
        (_write_cut if k == key else _write_good)(path, kind)
        files[k] = str(path)
    msg = _data_stage_error(m, _params(m, files), key, files[key])
    assert msg is not None, f"{m}: no data node stopped on the cut file of {m}.{key} ({files[key]})"


def test_every_documented_path_parameter_is_declared():
    """A ``*_path`` / ``path`` / ``*_file`` / ``*_csv`` / ``user_*`` parameter in conf/base or conf/full (the own-data env) is a user file
    the method declares in ``USER_FILES`` (or a model file it saves itself: ``init_path``, ``cache_*``)."""
    missing = []
    for m in METHODS:
        declared = set(_user_files(m))

        def walk(raw, prefix=()):
            for k, v in (raw or {}).items():
                dotted = ".".join((*prefix, k))
                if isinstance(v, dict):
                    yield from walk(v, (*prefix, k))
                elif (
                    (k == "path" or k.endswith(("_path", "_file", "_csv")) or k.startswith("user_"))
                    and not k.startswith(("init", "cache"))
                    and not k.endswith("_dir")
                ):  # a folder
                    yield dotted

        for dotted in walk(_deep_merge(_raw("base", m), _raw("full", m))):
            if dotted not in declared:
                missing.append(f"{m}.{dotted}")
    assert missing == [], f"user-file parameters not in their method's USER_FILES: {missing}"


# -------------------------------------------------------------------------------------- the core reader
@pytest.mark.parametrize("kind", ["parquet", "npz", "pt", "jsonl"])
def test_read_user_file_names_key_and_file_for_a_cut_file(kind, tmp_path):
    path = tmp_path / f"x.{kind}"
    _write_cut(path, kind)
    with pytest.raises(InputDataError, match=rf"^dataset 'm\.data\.path \({path}\)': not a ") as err:
        read_user_file(path, key="m.data.path")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "file not found"),
        (b"", "the file is empty \\(0 bytes\\)"),
        (b"\n\n", "not a readable CSV file: EmptyDataError"),
    ],
)
def test_read_user_file_missing_or_empty(content, why, tmp_path):
    path = tmp_path / "x.csv"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputDataError, match=rf"^dataset 'm\.path \(.*x\.csv\)': {why}"):
        read_user_file(path, key="m.path")


def test_read_user_file_kinds_and_schema(tmp_path):
    df = _frame(10)
    df.to_parquet(tmp_path / "t.parquet")
    df.to_csv(tmp_path / "t.csv", index=False)
    pd.testing.assert_frame_equal(read_user_file(tmp_path / "t.parquet", key="k"), df)
    pd.testing.assert_frame_equal(read_user_file(tmp_path / "t.csv", key="k", kind=("parquet", "csv")), df)
    # a tuple: the suffix's kind if it is one of them, else the first
    (tmp_path / "t.dat").write_bytes((tmp_path / "t.parquet").read_bytes())
    pd.testing.assert_frame_equal(read_user_file(tmp_path / "t.dat", key="k", kind=("parquet", "csv")), df)
    with pytest.raises(InputDataError, match=r"t\.dat\)': a file suffix"):
        read_user_file(tmp_path / "t.dat", key="k")
    with pytest.raises(InputDataError, match=r"a folder, not a csv file"):
        read_user_file(tmp_path, key="k", kind="csv")
    np.savez(tmp_path / "a.npz", x=np.arange(3))
    assert read_user_file(tmp_path / "a.npz", key="k")["x"].tolist() == [0, 1, 2]
    schema = TableSchema("m.table", {"a": "number", "c": "int"})
    with pytest.raises(InputDataError, match=r"^dataset 'm\.table': column 'c' is missing"):
        read_user_file(tmp_path / "t.parquet", key="k", schema=schema)


def test_a_cut_file_on_the_command_line_is_one_line(tmp_path):
    """`kedro run --pipeline=prism --env=test --params prism.data.path=<cut parquet>`: one Error line, no
    traceback."""
    from tests.conftest import make_project, run_kedro

    project = make_project(tmp_path / "p")
    cut = tmp_path / "cut.parquet"
    _write_cut(cut, "parquet")
    res = run_kedro(project, "prism", "test", ["--params", f"prism.data.path={cut}"])
    assert res.exit_code != 0
    errors = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert len(errors) == 1, res.output
    assert f"prism.data.path ({cut})" in errors[0] and "not a readable parquet file (truncated" in errors[0]
    assert "Traceback" not in res.output


def _validated(m: str, key: str, value):
    from pipelines.core.params import schema_for, validate

    raw = copy.deepcopy(_deep_merge(_raw("base", m), _raw("test", m)))
    _set(raw, key, value)
    return validate(schema_for(m), raw, m)


def test_a_cut_init_state_dict_is_one_line(tmp_path):
    """``model.init_path`` (a state dict the user gives instead of training: kvindexer, wedlm) goes through
    the same reader: a cut file stops the node in one line naming the key and the file."""
    from pipelines.kvindexer.train import train_base
    from pipelines.wedlm.data import make_tasks
    from pipelines.wedlm.params import trained_variants
    from pipelines.wedlm.train import train_variant

    cut = tmp_path / "init.pt"
    _write_cut(cut, "pt")
    p = _validated("kvindexer", "model.init_path", str(cut))
    with pytest.raises(InputDataError, match=rf"^dataset 'kvindexer\.model\.init_path \({cut}\)': not a torch\.save"):
        train_base(p)
    p = _validated("wedlm", "model.init_path", str(cut))
    test, tasks = make_tasks(p)
    with pytest.raises(InputDataError, match=rf"^dataset 'wedlm\.model\.init_path \({cut}\)': not a torch\.save"):
        train_variant(tasks, test, p, trained_variants(p)[0])
