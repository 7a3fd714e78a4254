"""Tracking on a real server: ``mlflow server`` on PostgreSQL with proxied artifacts (tests/core/conftest.py),
the way a team runs it (docker/compose.yml), not the embedded sqlite store.

- Two real pipelines at ``--env=test``: one parent run per ``kedro run``, one child per variant, the
  parameters, the claim and verdict metrics, the report and the plots as artifacts, every run FINISHED.
- The server killed mid-run (a probe method whose slow variant waits for a flag file while the server is
  killed): one warning line, the pipeline finishes and saves its report, the command exits non-zero with one
  final line naming what was not logged and ``kedro report log``. With the server back (same database),
  ``kedro report log`` logs one parent with its children, parameters and plots and ends the run that lost
  the server FAILED; without the relog, the next ``kedro run`` ends it KILLED (its process is gone).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, make_project, run_kedro
from tests.core import test_run_lifecycle as lifecycle

pytestmark = pytest.mark.e2e

PIPELINES = ("trsp", "hypospace")  # two of the quickest --env=test pipelines
PROBE = "zz_tracking_probe"
PKG = ROOT / "src" / "pipelines" / PROBE
WARNING = "MLflow tracking failed while logging"


def _client(url: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=url)


def _runs(url: str, experiment: str, filter_string: str = ""):
    client = _client(url)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, order_by=["attributes.start_time ASC"])


def _parents(url: str, experiment: str, filter_string: str = ""):
    return [r for r in _runs(url, experiment, filter_string) if "mlflow.parentRunId" not in r.data.tags]


def _artifacts(url: str, run_id: str, path: str | None = None) -> list[str]:
    return sorted(f.path for f in _client(url).list_artifacts(run_id, path))


@pytest.fixture(autouse=True)
def _forget_the_server_uri():
    """An in-process run leaves mlflow's process-wide tracking URI on this server: later tests must not
    log to it."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    import mlflow

    mlflow.set_tracking_uri(None)
    if before is not None:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("tracking_server"))


@pytest.mark.parametrize("m", PIPELINES)
def test_pipeline_logs_parent_children_metrics_and_artifacts_to_the_server(m, project, tracking_server):
    url = tracking_server.url
    result = run_kedro(project, m, "test", tracking_uri=url)
    assert result.exit_code == 0, result.output
    assert WARNING not in result.output
    report = result.report
    version = report["save_version"]
    parents = _parents(url, m, f"tags.save_version = '{version}'")
    assert len(parents) == 1, [p.info.run_id for p in parents]
    parent = parents[0]
    children = [r for r in _runs(url, m) if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(c.data.tags["variant"] for c in children) == sorted(report["variants"])
    assert {r.info.status for r in [parent, *children]} == {"FINISHED"}
    tags, metrics = parent.data.tags, parent.data.metrics
    assert tags["env"] == "test" and tags["pipeline"] == m and tags["params_hash"] == report["params_hash"]
    assert tags["process.pid"] and tags["process.host"]
    assert any(k.startswith(f"{m}.") for k in parent.data.params), sorted(parent.data.params)[:5]
    for verdict, n in report["verdicts"].items():
        assert metrics[f"claims_{verdict}"] == n
    for claim in report["claims"]:
        assert metrics[f"claim.{claim['id']}"] == float(claim["holds"])
    headline = report["headline"]["metric"]
    method = report["headline"]["method"]
    by_variant = {c.data.tags["variant"]: c for c in children}
    if headline in report["variants"][method]:
        assert by_variant[method].data.metrics[headline] == pytest.approx(report["variants"][method][headline])
    artifacts = _artifacts(url, parent.info.run_id)
    assert "report.json" in artifacts
    plots = _artifacts(url, parent.info.run_id, "plots")
    assert sorted(Path(p).name for p in plots) == sorted(f"{Path(a).stem}.png" for a in report["artifacts"])


# ------------------------------------------------------------------------------------ the server lost
@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A two-variant method (tests/core/test_run_lifecycle.py's probe, under its own name): ``b_slow``
    waits for a flag file, so the server can be killed while the run is certainly in flight."""
    PKG.mkdir(exist_ok=True)
    try:
        (PKG / "__init__.py").write_text("")
        (PKG / "params.py").write_text(lifecycle.PARAMS_PY)
        (PKG / "pipeline.py").write_text(lifecycle.PIPELINE_PY.format(m=PROBE))
        project = make_project(tmp_path_factory.mktemp("tracking_probe"))
        (project / "conf" / "base" / f"parameters_{PROBE}.yml").write_text(
            lifecycle.PARAMS_YML.replace(lifecycle.PROBE, PROBE)
        )
        yield project
    finally:
        shutil.rmtree(PKG, ignore_errors=True)


def _env(url: str, flag: Path, experiment: str) -> dict[str, str]:
    return {
        **os.environ,
        "MLFLOW_TRACKING_URI": url,
        "MLFLOW_EXPERIMENT_NAME": experiment,
        "KEDRO_DISABLE_TELEMETRY": "true",
        "COLUMNS": "250",
        "PROBE_FLAG": str(flag),
        "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")] if p),
    }


def _kedro(project: Path, url: str, experiment: str, *args: str, flag: Path | None = None) -> subprocess.Popen:
    """``kedro <args>`` (the project's CLI) in ``project``, against ``url``, logging to ``experiment``."""
    flag = flag or project / "flag"
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines", *args],
        cwd=project,
        env=_env(url, flag, experiment),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"still running after {timeout:.0f} s:\n{out}") from None
    return out


def _run_losing_the_server(project: Path, server, experiment: str, tmp_path: Path):
    """Start the probe, wait until its parent run is on the server and ``b_slow`` is in flight, kill the
    server, let the run finish. Returns (exit code, output, the lost parent run's id, seconds from the kill
    to the warning line)."""
    flag = tmp_path / "flag"
    proc = _kedro(
        project, server.url, experiment, "run", "--pipeline", PROBE, "--params", f"{PROBE}.mode=wait", flag=flag
    )
    lines: list[tuple[float, str]] = []  # (when it was read, line): the warning's delay is measured
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), ln) for ln in proc.stdout), daemon=True)
    reader.start()
    deadline, parent = time.monotonic() + 150, None
    try:
        while parent is None or not Path(str(flag) + ".waiting").exists():
            if proc.poll() is not None:
                reader.join(10)
                raise AssertionError("the run ended before the server was killed:\n" + "".join(ln for _, ln in lines))
            if time.monotonic() > deadline:
                raise AssertionError("no parent run with its save version on the server within 150 s")
            if parent is None:
                found = [
                    r
                    for r in _parents(server.url, experiment)
                    if r.info.status == "RUNNING" and "save_version" in r.data.tags
                ]
                parent = found[-1].info.run_id if found else None
            time.sleep(0.2)
        server.kill()
        t0 = time.monotonic()
        flag.touch()
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(
                "the run did not finish within 180 s of the server's loss:\n" + "".join(ln for _, ln in lines)
            ) from None
        reader.join(30)
        warned = [t for t, ln in lines if WARNING in ln]
        return proc.returncode, "".join(ln for _, ln in lines), parent, (warned[0] - t0) if warned else None
    finally:
        flag.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _check_lost_run_output(project: Path, code: int, out: str, seconds: float | None) -> Path:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code != 0, out
    assert sum(WARNING in ln for ln in lines) == 1, out
    assert seconds < 60, f"the warning came {seconds:.0f} s after the server was killed:\n{out}"
    last = lines[-1]
    assert "MLflow tracking lost" in last and "not logged:" in last and "kedro report log" in last, out
    assert "the report and its variant runs" in last, last
    report = project / last.split("kedro report log ", 1)[1].rstrip("`").split()[0]  # relative to the run's cwd
    assert report.is_file(), last
    return report


def test_server_killed_mid_run_then_report_log_logs_it_and_ends_the_lost_run(probe, tracking_server, tmp_path):
    exp = f"{PROBE}_relog"
    code, out, lost, seconds = _run_losing_the_server(probe, tracking_server, exp, tmp_path)
    report = _check_lost_run_output(probe, code, out, seconds)

    tracking_server.start()  # same database: the lost run is there, still RUNNING
    url = tracking_server.url
    assert _client(url).get_run(lost).info.status == "RUNNING"
    relog = _kedro(probe, url, exp, "report", "log", str(report))
    out = _finish(relog, 90)
    assert relog.returncode == 0, out
    assert f"ended its earlier run {lost} FAILED" in out, out

    logged = _parents(url, exp, "tags.relogged_from != ''")
    assert len(logged) == 1, out
    new = logged[0]
    children = [r for r in _runs(url, exp) if r.data.tags.get("mlflow.parentRunId") == new.info.run_id]
    assert sorted(c.data.tags["variant"] for c in children) == ["a_fast", "b_slow"]
    assert {r.info.status for r in [new, *children]} == {"FINISHED"}
    assert new.data.params.get(f"{PROBE}.mode") == "wait"
    assert new.data.metrics["claims_holds"] + new.data.metrics["claims_fails"] == 1
    assert "report.json" in _artifacts(url, new.info.run_id)
    assert [Path(p).name for p in _artifacts(url, new.info.run_id, "plots")] == ["preds.png"]
    old = _client(url).get_run(lost)
    assert old.info.status == "FAILED" and old.data.tags["relogged_as"] == new.info.run_id


def test_server_killed_mid_run_then_the_next_run_ends_the_lost_run_killed(
    probe, tracking_server, tmp_path, monkeypatch
):
    exp = f"{PROBE}_next_run"
    code, out, lost, seconds = _run_losing_the_server(probe, tracking_server, exp, tmp_path)
    _check_lost_run_output(probe, code, out, seconds)

    tracking_server.start()
    url = tracking_server.url
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", exp)
    nxt = run_kedro(probe, PROBE, "base", tracking_uri=url)  # in this process: the lost run's is gone
    assert nxt.exit_code == 0, nxt.output
    old = _client(url).get_run(lost)
    assert old.info.status == "KILLED" and "was gone" in old.data.tags["ended_by"], old.data.tags
    assert [r.info.status for r in _parents(url, exp)] == ["KILLED", "FINISHED"]
