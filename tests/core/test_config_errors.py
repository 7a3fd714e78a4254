"""A config file that is not valid YAML is named in one line, ``<file>:<line>:<col>: <problem>``: by
``kedro run`` and ``kedro sweep`` before anything starts (no MLflow run), and by the project's config loader."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import make_project, run_kedro

LINE = re.compile(r"^(?P<file>\S+\.yml):(?P<line>\d+):(?P<col>\d+): \S.*$")


def _break(project: Path, rel: str, text: str) -> Path:
    path = project / "conf" / rel
    path.write_text(path.read_text() + text)
    return path


def _no_mlflow_run(project: Path) -> None:
    db = project / "mlflow.db"
    if db.exists():
        import sqlite3

        with sqlite3.connect(db) as con:
            assert con.execute("select count(*) from runs").fetchone()[0] == 0


@pytest.mark.parametrize(
    "rel, text",
    [
        # an unclosed flow list in the env's parameters: the parser stops on the next line
        ("test/parameters_mesa.yml", "mesa_extra:\n  a: [1, 2\n  b: 3\n"),
        # a tab where YAML wants spaces, in conf/base's catalog
        ("base/catalog.yml", "\nbroken:\n\ttype: x\n"),
        # a key given twice (OmegaConf refuses duplicates)
        ("test/runner.yml", "\ndup_key: 1\ndup_key: 2\n"),
    ],
)
def test_run_names_broken_yaml_in_one_line(tmp_path, rel, text):
    project = make_project(tmp_path / "p")
    path = _break(project, rel, text)
    n_lines = len(path.read_text().splitlines())
    res = run_kedro(project, "mesa", "test")
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    m = LINE.match(lines[0])
    assert m, lines[0]
    assert Path(m["file"]).resolve() == path.resolve()
    assert n_lines - 3 <= int(m["line"]) <= n_lines + 1 and int(m["col"]) >= 1  # 1-based, near the edit
    assert "Traceback" not in res.output
    _no_mlflow_run(project)


def test_sweep_names_broken_yaml_in_one_line(tmp_path):
    from click.testing import CliRunner

    from pipelines.core.sweep import sweep

    project = make_project(tmp_path / "p")
    path = _break(project, "test/parameters_mesa.yml", "mesa_extra: {a: 1\n")
    old = Path.cwd()
    os.chdir(project)
    try:
        res = CliRunner().invoke(sweep, ["--pipeline", "mesa", "--env", "test", "--grid", "mesa.seeds=[0],[1]"])
    finally:
        os.chdir(old)
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and LINE.match(lines[0]), res.output
    assert Path(LINE.match(lines[0])["file"]).resolve() == path.resolve()
    assert not (project / "data" / "08_reporting" / "mesa" / "sweeps").exists()
    _no_mlflow_run(project)


def test_loader_names_the_file(tmp_path):
    from pipelines.core.config import (
        CONFIG_LOADER_ARGS,
        CONFIG_LOADER_CLASS,
        ConfigFileError,
    )

    (tmp_path / "base").mkdir()
    (tmp_path / "test").mkdir()
    (tmp_path / "base" / "parameters_x.yml").write_text("x:\n  a: 1\n")
    bad = tmp_path / "test" / "parameters_x.yml"
    bad.write_text("x:\n  a: 2\n  b: [3\n")
    loader = CONFIG_LOADER_CLASS(conf_source=str(tmp_path), env="test", **CONFIG_LOADER_ARGS)
    with pytest.raises(ConfigFileError) as err:
        loader["parameters"]
    assert err.value.format_message().startswith(f"{bad}:4:1: ")
