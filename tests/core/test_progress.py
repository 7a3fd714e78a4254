"""What a run prints: a progress report on stderr (steps, heartbeats, the report's path and counts),
nothing on stdout, Kedro's per-dataset lines only with -v; `kedro registry list --json` is JSON."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from pipelines.core import progress
from tests.conftest import ROOT


def _kedro(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "true"}
    return subprocess.run(
        [sys.executable, "-m", "kedro", *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600
    )


def test_registry_list_json_is_the_only_thing_on_stdout():
    from pipelines.core.registry import discover_methods

    res = _kedro("registry", "list", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == discover_methods()
    assert "\x1b[" not in res.stderr  # no colour codes from the plugins' warnings
    assert "Add type hints to the `predict`" not in res.stderr


def test_heartbeat_names_the_step_and_its_note(monkeypatch, caplog):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.1)
    hooks = progress.ProgressHooks()
    node = SimpleNamespace(name="m.train.x")
    hooks.before_pipeline_run(
        {"pipeline_names": ["m"], "env": "test", "run_id": "v1"}, SimpleNamespace(nodes=[node]), None
    )
    with caplog.at_level(logging.INFO, logger="pipelines.progress"):
        hooks.before_node_run(node)
        progress.note(("epoch", 3, 10))
        time.sleep(0.45)
        hooks.after_node_run(node, {})
    lines = [r.getMessage() for r in caplog.records if not r.getMessage().startswith("m: ")]
    beats = [x for x in lines if "running for" in x]
    assert beats and all("m.train.x" in b for b in beats)
    assert any("epoch 3/10 (30%)" in b for b in beats)
    assert lines[0].startswith("[1/1] m.train.x") and lines[-1].startswith("m.train.x done in")
    n = len(caplog.records)
    time.sleep(0.3)  # the heartbeat stopped with the step
    assert len(caplog.records) == n


def test_a_run_without_the_report_node_says_so(caplog):
    hooks = progress.ProgressHooks()
    node = SimpleNamespace(name="m.train.x")
    hooks.before_pipeline_run({"pipeline_names": ["m"]}, SimpleNamespace(nodes=[node]), None)
    with caplog.at_level(logging.INFO, logger="pipelines.progress"):
        hooks.before_node_run(node)
        hooks.after_node_run(node, {})
        hooks.after_pipeline_run({})
    assert "no report was written by this run" in caplog.records[-1].getMessage()


def test_summary_line_counts():
    r = {
        "gates": [{"passed": True}, {"passed": False}],
        "verdicts": {"holds": 2, "fails": 1, "inconclusive": 0, "untested": 3},
    }
    assert progress.summary_line(r) == "gates 1/2 passed; claims 2 held, 1 failed, 0 inconclusive, 3 untested (of 6)"


def test_fit_reports_its_step_to_the_heartbeat():
    import torch

    from pipelines.core.training import fit

    model = torch.nn.Linear(2, 1)
    x, y = torch.randn(32, 2), torch.randn(32, 1)
    progress.note(None)
    fit(model, (x, y), lambda m, a, b: ((m(a) - b) ** 2).mean(), epochs=3, batch_size=8, desc="lin")
    assert progress._state["note"] == ("lin step", 12, 12)


@pytest.mark.e2e
def test_a_run_prints_progress_and_its_summary(test_env_run):
    run = test_env_run("credal_dro")
    out, report = run.output, run.report
    assert "Loading data from" not in out and "Saving data to" not in out  # -v shows those
    n = out.count("credal_dro.train.")
    assert n and "[1/" in out
    assert progress.summary_line(report) in out
    assert f"report: {run.report_path}" in out
    assert "\x1b[" not in out


@pytest.mark.e2e
def test_verbose_shows_dataset_io(e2e_project):
    from tests.conftest import run_kedro

    res = run_kedro(e2e_project, "hypospace", extra=["-v"])
    assert res.exit_code == 0, res.output
    assert "Loading data from" in res.output and "Saving data to" in res.output
