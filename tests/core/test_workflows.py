"""The CI workflows parse and do what docs/comparison.md says; the nightly matrix source lists exactly
the registered pipelines."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    wf = yaml.safe_load((WORKFLOWS / name).read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as True
    return wf


def run_lines(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


def test_workflows_match_githubs_schema():
    """The vendored GitHub workflow schema of check-jsonschema (offline)."""
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    if exe is None:
        pytest.skip("check-jsonschema is not installed (dev extra)")
    res = subprocess.run(
        [exe, "--builtin-schema", "vendor.github-workflows", *map(str, sorted(WORKFLOWS.glob("*.yml")))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_ci_runs_the_readme_test_command_on_push_and_pull_request():
    wf = load("ci.yml")
    assert {"push", "pull_request"} <= set(wf["on"])
    steps = run_lines(wf["jobs"]["test"])
    assert 'pip install -e ".[dev]"' in steps
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^\s*((?:python -m )?pytest\b[^\n#]*)", readme, flags=re.M)
    command = commands[0].strip() if commands else "pytest"
    assert command in steps or command.replace("pytest", "python -m pytest", 1) in steps, (command, steps)


def test_nightly_matrix_from_the_registry_then_scoreboard():
    wf = load("nightly.yml")
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"] and "push" not in wf["on"]
    jobs = wf["jobs"]
    assert "kedro registry list --json" in run_lines(jobs["list"])
    assert jobs["list"]["outputs"]["pipelines"] == "${{ steps.list.outputs.pipelines }}"
    run = jobs["run"]
    assert run["needs"] == "list" and run["strategy"]["fail-fast"] is False
    assert run["strategy"]["matrix"]["pipeline"] == "${{ fromJSON(needs.list.outputs.pipelines) }}"
    assert "kedro run --pipeline=${{ matrix.pipeline }}" in run_lines(run)
    assert "--env" not in run_lines(run)  # default scale
    upload = [s for s in run["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert upload and upload[0]["if"] == "always()"
    assert (
        "data/08_reporting/${{ matrix.pipeline }}/" in upload[0]["with"]["path"]
        and "mlflow.db" in upload[0]["with"]["path"]
    )
    board = jobs["scoreboard"]
    assert set(board["needs"]) == {"list", "run"} and board["if"].startswith("always()")
    text = run_lines(board)
    assert (
        "python -m pipelines.core.scoreboard --reports runs" in text and "--compare-to previous/scoreboard.json" in text
    )
    assert "GITHUB_STEP_SUMMARY" in text and "--status success" in text and "-n scoreboard" in text
    assert board["steps"][-1]["run"].rstrip().endswith("exit 1")  # fails on regression, after uploading
    assert wf["permissions"]["actions"] == "read"


def test_matrix_source_lists_exactly_the_registered_pipelines():
    """`kedro registry list --json` (the command the nightly runs) against the folders themselves."""
    expected = sorted(
        {
            p.parent.name
            for p in (ROOT / "src" / "pipelines").glob("*/*.py")
            if p.name in ("pipeline.py", "spec.py")
            and p.parent.name != "core"
            and (p.parent / "__init__.py").is_file()
            and not p.parent.name.startswith(("_", "."))
        }
    )
    kedro = Path(sys.executable).with_name("kedro")
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "true"}
    res = subprocess.run(
        [str(kedro), "registry", "list", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    listed = json.loads(res.stdout.strip().splitlines()[-1])  # what the workflow's `tail -n 1` takes
    assert listed == expected
    assert "core" not in listed and "__default__" not in listed
    from pipelines.core.registry import LazyPipelines

    assert sorted(set(LazyPipelines()) - {"__default__"}) == expected


@pytest.mark.e2e
def test_kedro_viz_build_writes_a_static_site_with_every_pipeline(tmp_path):
    """`kedro viz build` (documented in the README) succeeds for the project."""
    pytest.importorskip("kedro_viz", reason="kedro-viz is not installed (dev extra)")
    from tests.conftest import make_project

    project = make_project(tmp_path / "project")
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "true", "MPLBACKEND": "Agg"}
    res = subprocess.run(
        [str(Path(sys.executable).with_name("kedro")), "viz", "build"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (project / "build" / "index.html").is_file()
    main = json.loads((project / "build" / "api" / "main").read_text())
    from pipelines.core.registry import discover_methods

    assert set(discover_methods()) <= {p["id"] for p in main["pipelines"]}
    assert main["nodes"], "the default pipeline has no nodes"
