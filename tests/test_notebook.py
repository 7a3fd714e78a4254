"""notebooks/compare_runs.ipynb runs top to bottom against the sqlite store of a TESS ``--env=test`` run
(nbclient, a real kernel), and is committed without outputs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_kedro

NOTEBOOK = ROOT / "notebooks" / "compare_runs.ipynb"
ARTIFACTS = ROOT / "test-artifacts"
PIPELINE = "tess"


def tess_store(project: Path) -> str:
    """The tracking URI of ``project``'s store holding a finished TESS ``--env=test`` run (run once per
    session; reuses the run of tests/methods/test_tess.py when that ran first in the same project)."""
    from pipelines.core.registry import discover_methods
    from pipelines.core.scoreboard import parent_runs

    if PIPELINE not in discover_methods():
        pytest.skip(f"the {PIPELINE} pipeline is not registered (src/pipelines/{PIPELINE})")
    if not (project / "conf" / "base" / f"parameters_{PIPELINE}.yml").is_file():
        pytest.skip(f"conf/base/parameters_{PIPELINE}.yml was added after the test project was made")
    uri = f"sqlite:///{project / 'mlflow.db'}"
    if not ((project / "mlflow.db").is_file() and parent_runs(uri, "tags.env = 'test'", [PIPELINE])):
        import mlflow

        while mlflow.active_run():  # an earlier in-process `kedro run` can leave its parent run active
            mlflow.end_run()
        result = run_kedro(project, PIPELINE, "test")
        assert result.exit_code == 0, result.output
    return uri


def test_notebook_is_committed_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "the notebook has no code"
    assert all(c.outputs == [] and c.execution_count is None for c in code), "strip outputs before committing"


@pytest.mark.e2e
def test_notebook_runs_top_to_bottom_against_a_test_store(e2e_project, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    uri = tess_store(e2e_project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the kernel inherits the environment
    monkeypatch.setenv("PIPELINE", PIPELINE)
    monkeypatch.setenv("RUN_FILTER", "tags.env = 'test'")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    try:
        client.execute()  # raises CellExecutionError naming the failing cell
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        nbformat.write(nb, ARTIFACTS / "compare_runs.executed.ipynb")

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
    text = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "| claim | metric |" in text  # the claims table
    summary = ast.literal_eval(nb.cells[-1].outputs[-1]["data"]["text/plain"])
    assert summary["pipeline"] == PIPELINE and summary["runs"] >= 1
    assert summary["headline"].startswith(PIPELINE) and summary["variants"] >= 2
    assert summary["best_baseline"] and isinstance(summary["method_value"], float)


@pytest.mark.e2e
def test_notebook_runs_for_every_method(e2e_project, test_env_run, monkeypatch):
    """The same notebook against every registered method's ``--env=test`` run (one kernel, the notebook
    re-run per method with ``PIPELINE`` set): every method has a headline to plot and a claims table."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from pipelines.core.registry import discover_methods

    methods = discover_methods()
    for m in methods:
        test_env_run(m)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{e2e_project / 'mlflow.db'}")
    monkeypatch.setenv("RUN_FILTER", "tags.env = 'test'")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    failed = {}
    with client.setup_kernel():
        for m in methods:
            setup = nbformat.v4.new_code_cell(f"import os; os.environ['PIPELINE'] = {m!r}")
            cells = [setup, *(nbformat.v4.new_code_cell(c.source) for c in code)]
            try:
                for i, cell in enumerate(cells):
                    client.execute_cell(cell, i)
            except nbclient.exceptions.CellExecutionError as exc:
                failed[m] = str(exc).strip().splitlines()[-1]
                continue
            summary = ast.literal_eval(cells[-1].outputs[-1]["data"]["text/plain"])
            if summary["pipeline"] != m or summary["runs"] < 1:
                failed[m] = f"summary {summary}"
    assert not failed, failed
