"""How a `kedro run` ends, as MLflow records it, and resuming a killed run.

A probe method (written into the package for this module, removed after) has two variants: `a_fast`
finishes at once, `b_slow` waits for a flag file (or fails, by parameter). With it:
- a rejected command (bad parameter, unknown pipeline, unknown env, a claim override) prints one line
  and opens no MLflow run;
- a node failure ends the parent run FAILED; SIGTERM and Ctrl-C (SIGINT) end it KILLED;
- after a run killed in `b_slow`, `--only-missing-outputs` skips `a_fast` and gives the report of an
  uninterrupted run (timings aside).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, make_project, run_kedro

PROBE = "zz_lifecycle_probe"
PKG = ROOT / "src" / "pipelines" / PROBE

PARAMS_PY = """
from typing import Literal
from pydantic import Field
from pipelines.core.params import MethodParams


class Params(MethodParams):
    variants: list[str] = Field(min_length=1)
    mode: Literal["ok", "wait", "fail"] = "ok"
    n: int = Field(default=5, ge=1)
"""

PIPELINE_PY = """
import os
import time

import pandas as pd
from kedro.pipeline import node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.report import build_report
from pipelines.core.variants import variant_node
from pipelines.{m}.params import Params


def make_data(p: Params) -> pd.DataFrame:
    return pd.DataFrame({{"x": [float(i) for i in range(p.n)]}})


def train_variant(df: pd.DataFrame, p: Params, variant: str) -> pd.DataFrame:
    if variant == "b_slow" and p.mode == "fail":
        raise RuntimeError("probe failure in b_slow")
    if variant == "b_slow" and p.mode == "wait":
        flag = os.environ["PROBE_FLAG"]
        open(flag + ".waiting", "w").close()
        for _ in range(1200):
            if os.path.exists(flag):
                break
            time.sleep(0.05)
    scale = {{"a_fast": 1.0, "b_slow": 2.0}}[variant]
    return pd.DataFrame({{"seed": 0, "pred": df["x"] * scale}})


def plots(p: Params, **preds) -> dict:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    for v, d in preds.items():
        ax.plot(d["pred"], label=v)
    return {{"preds": fig}}


def report(p: Params, plots: dict, **preds) -> dict:
    rows = [{{"variant": v, "seed": 0, "total": float(d["pred"].sum())}} for v, d in preds.items()]
    return build_report("{m}", p, rows, {{"ratio": rows[1]["total"] / rows[0]["total"]}}, artifacts=plots)


def create_pipeline(**kwargs):
    variants = method_config("{m}")["variants"]
    preds = {{v: f"predictions_{{v}}" for v in variants}}
    return pipeline([
        node(make_data, "params:{m}", "dataset", name="data.make", tags=["data"]),
        *[variant_node(train_variant, v, ["dataset", "params:{m}"], preds[v]) for v in variants],
        node(plots, {{"p": "params:{m}", **preds}}, "plots", name="evaluate.plots", tags=["evaluate"]),
        node(report, {{"p": "params:{m}", "plots": "plots", **preds}}, "report", name="evaluate.report",
             tags=["evaluate"]),
    ], namespace="{m}", parameters={{"params:{m}": "params:{m}"}})
"""

PARAMS_YML = f"""{PROBE}:
  seeds: [0]
  variants: [a_fast, b_slow]
  claims:
    - id: slow_doubles
      text: b_slow's total is twice a_fast's
      metric: ratio
      op: ">="
      threshold: 2.0
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    PKG.mkdir(exist_ok=True)
    try:
        (PKG / "__init__.py").write_text("")
        (PKG / "params.py").write_text(PARAMS_PY)
        (PKG / "pipeline.py").write_text(PIPELINE_PY.format(m=PROBE))
        project = make_project(tmp_path_factory.mktemp("lifecycle"))
        (project / "conf" / "base" / f"parameters_{PROBE}.yml").write_text(PARAMS_YML)
        yield project
    finally:
        shutil.rmtree(PKG, ignore_errors=True)


def _runs(project: Path, experiment: str = PROBE):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def _parents(project: Path):
    return [r for r in _runs(project) if "mlflow.parentRunId" not in r.data.tags]


def _spawn(project: Path, *args: str, flag: Path | None = None) -> subprocess.Popen:
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
        "KEDRO_DISABLE_TELEMETRY": "true",
        "COLUMNS": "250",
        "PROBE_FLAG": str(flag or project / "flag"),
    }
    # a shell that started us in the background may have set SIGINT to "ignore", which Python would
    # inherit (and then never raise KeyboardInterrupt): give the run the default, as a terminal would
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines", "run", "--pipeline", PROBE, *args],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {path.name} appeared:\n{proc.stdout.read()}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"{path.name} did not appear in {timeout}s")
        time.sleep(0.1)


def _strip(report: dict) -> dict:
    # how it ran, not what it found: the resumed part may run its one remaining node in the driver
    drop = {
        "wall_seconds",
        "save_version",
        "git_commit",
        "resumed_from",
        "wall_seconds_covers",
        "threads",
        "threads_setting",
        "threads_by_node",
        "workers",
    }
    return {k: v for k, v in report.items() if k not in drop}


def _reports(project: Path) -> list[Path]:
    return sorted((project / "data" / "08_reporting" / PROBE / "report.json").glob("*/report.json"))


@pytest.mark.parametrize(
    "extra,expect",
    [
        (["--params", f"{PROBE}.n=true"], f"parameter {PROBE}.n: Input should be a valid integer (got True)"),
        (["--params", f"{PROBE}.mode=sometimes"], f"parameter {PROBE}.mode:"),
        (["--params", f"{PROBE}.claims.0.threshold=0.2"], "claims are declared before a run"),
        (["--params", f"{PROBE}.extra_claims=[]"], "claims are declared before a run"),
        (["--params", f"{PROBE}.variants.0=x"], "addresses one item of a list"),
        (["--env", "nosuchenv"], "env 'nosuchenv' not found"),
    ],
)
def test_rejected_command_is_one_line_and_opens_no_run(probe, extra, expect):
    before = len(_runs(probe))
    res = run_kedro(
        probe, PROBE, env=extra[1] if extra[0] == "--env" else "base", extra=[] if extra[0] == "--env" else extra
    )
    assert res.exit_code != 0
    err = [ln for ln in res.output.splitlines() if "Error" in ln]
    assert err and expect in err[-1], res.output
    assert "Traceback" not in res.output, res.output
    assert len(_runs(probe)) == before


def test_unknown_pipeline_lists_the_registered_ones_and_creates_nothing(probe):
    res = run_kedro(probe, "doesnotexist")
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "pipeline 'doesnotexist' is not registered; registered: " in res.output and "tess" in res.output
    assert _runs(probe, "doesnotexist") == []


def test_list_values_in_params(probe):
    res = run_kedro(probe, PROBE, env="base", extra=["--params", f"{PROBE}.variants=[a_fast,b_slow],{PROBE}.n=3"])
    assert res.exit_code == 0, res.output
    assert res.report["variants"]["a_fast"]["total"] == 3.0


def test_node_failure_marks_the_run_failed(probe):
    res = run_kedro(probe, PROBE, env="base", extra=["--params", f"{PROBE}.mode=fail"])
    assert res.exit_code != 0
    assert _parents(probe)[-1].info.status == "FAILED"


@pytest.mark.parametrize("sig,status,code", [(signal.SIGTERM, "KILLED", 143), (signal.SIGINT, "KILLED", 130)])
def test_signals_mark_the_run_killed(probe, tmp_path, sig, status, code):
    flag = tmp_path / "flag"
    proc = _spawn(probe, "--params", f"{PROBE}.mode=wait", flag=flag)
    try:
        _wait_for(Path(str(flag) + ".waiting"), proc)
        os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, out
    assert "marked KILLED" in out.splitlines()[-1], out
    assert _parents(probe)[-1].info.status == status


def test_killed_run_resumes_with_only_missing_outputs(probe, tmp_path):
    # an uninterrupted reference run with the same parameters (its flag is up from the start)
    ready = tmp_path / "ready"
    ready.touch()
    ref = _spawn(probe, "--params", f"{PROBE}.mode=wait", flag=ready)
    out, _ = ref.communicate(timeout=120)
    assert ref.returncode == 0, out
    reference = json.loads(_reports(probe)[-1].read_text())

    fast = probe / "data" / "02_intermediate" / PROBE / "predictions_a_fast.parquet"
    n_fast = len(list(fast.glob("*")))
    flag = tmp_path / "flag"
    proc = _spawn(probe, "--params", f"{PROBE}.mode=wait", flag=flag)
    try:
        _wait_for(Path(str(flag) + ".waiting"), proc)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    n_reports = len(_reports(probe))
    flag.touch()
    resumed = _spawn(probe, "--only-missing-outputs", "--params", f"{PROBE}.mode=wait", flag=flag)
    out, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, out
    assert len(_reports(probe)) == n_reports + 1
    # the fast variant, saved before the kill, was not run again; the slow one was
    assert "Resuming run" in out, out
    assert f"Skipping 2 nodes with existing outputs: {PROBE}.data.make, {PROBE}.train.a_fast" in out, out
    assert f"Completed node: {PROBE}.train.b_slow" in out, out
    assert len(list(fast.glob("*"))) == n_fast + 1  # the killed run saved it once; resume reused it
    again = json.loads(_reports(probe)[-1].read_text())
    assert _strip(again) == _strip(reference)
