"""Shared fixtures: a throw-away copy of the project (conf + a link to src) so end-to-end runs write
their versioned data and their MLflow store (sqlite) under a temporary folder, never into the repo."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MPLBACKEND", "Agg")


@dataclass
class PipelineRun:
    project: Path
    pipeline: str
    exit_code: int
    output: str
    tracking_uri: str
    report_path: Path | None = None  # the newest report version right after this run

    @property
    def report(self) -> dict:
        return json.loads(self.report_path.read_text())


def make_project(dest: Path) -> Path:
    """A project folder with its own conf/, data/ and MLflow store; code comes from the installed package."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "conf", dest / "conf", ignore=shutil.ignore_patterns("local"), dirs_exist_ok=True)
    (dest / "conf" / "local").mkdir(exist_ok=True)
    (dest / "src").mkdir(exist_ok=True)  # the package itself is imported from the (editable) install
    (dest / "data").mkdir(exist_ok=True)
    return dest


def run_kedro(
    project: Path, pipeline: str, env: str = "test", extra: list[str] | None = None, tracking_uri: str | None = None
) -> PipelineRun:
    """Invoke the project's ``kedro run`` command in-process from ``project``."""
    from click.testing import CliRunner
    from kedro.framework.startup import bootstrap_project

    from pipelines.cli import run

    uri = tracking_uri or f"sqlite:///{project / 'mlflow.db'}"
    old_cwd, old_uri = Path.cwd(), os.environ.get("MLFLOW_TRACKING_URI")
    os.chdir(project)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        bootstrap_project(project)
        res = CliRunner().invoke(run, ["--pipeline", pipeline, "--env", env, *(extra or [])], catch_exceptions=True)
    finally:
        os.chdir(old_cwd)
        if old_uri is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old_uri
    out = res.output
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        out += "".join(traceback.format_exception(res.exception))
    reports = project / "data" / "08_reporting" / pipeline / "report.json"
    latest = sorted(reports.glob("*/report.json"))[-1] if reports.is_dir() else None
    return PipelineRun(project, pipeline, res.exit_code, out, uri, latest)


@pytest.fixture(scope="session")
def e2e_project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("project"))


@pytest.fixture
def run_pipeline(e2e_project):
    """``run_pipeline(m, env="test")`` runs a pipeline end to end and asserts it succeeded."""

    def _run(pipeline: str, env: str = "test", extra: list[str] | None = None) -> PipelineRun:
        result = run_kedro(e2e_project, pipeline, env, extra)
        assert result.exit_code == 0, result.output
        return result

    return _run


_E2E_CACHE: dict[str, PipelineRun] = {}


@pytest.fixture
def test_env_run(e2e_project):
    """``test_env_run(m)``: the one ``--env=test`` run of pipeline ``m`` in this test session (run on
    first use, then shared), so the registry smoke test and a method's own report checks cost one run."""

    def _get(pipeline: str) -> PipelineRun:
        if pipeline not in _E2E_CACHE:
            result = run_kedro(e2e_project, pipeline, "test")
            assert result.exit_code == 0, result.output
            _E2E_CACHE[pipeline] = result
        return _E2E_CACHE[pipeline]

    return _get


@pytest.fixture(autouse=True)
def _torch_defaults_unchanged(request):
    """A test (or a module-level statement) that changes torch's default dtype leaks into every later
    test; fail the offender by name instead."""
    import sys

    torch = sys.modules.get("torch")
    before = torch.get_default_dtype() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_default_dtype() != before:
        torch.set_default_dtype(before)
        pytest.fail(f"{request.node.nodeid} changed torch's default dtype and did not restore it")


def pytest_collection_finish(session):
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.get_default_dtype() != torch.float32:
        raise pytest.UsageError(
            "a test module set torch's default dtype at import time; use a fixture that "
            "restores it (see tests/methods/test_prism.py)"
        )
