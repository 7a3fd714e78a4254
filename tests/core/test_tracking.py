"""core.tracking: which runs a later `kedro run` ends KILLED (their owning process is gone), the guard that
turns MLflow off after the first failure, and the bounded HTTP retries."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from pipelines.core import tracking


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_process_gone_decides_by_pid_and_start_time():
    me = tracking.process_tags()
    assert me["process.pid"] == str(os.getpid()) and me["process.started"]
    assert not tracking.process_gone(me)  # alive
    assert tracking.process_gone({**me, "process.pid": str(_dead_pid())})  # no such pid
    reused = float(me["process.started"]) - 3600
    assert tracking.process_gone({**me, "process.started": f"{reused:.2f}"})  # pid now another process
    assert not tracking.process_gone({**me, "process.host": "elsewhere", "process.pid": str(_dead_pid())})


def test_reap_dead_runs_ends_only_gone_processes_runs_killed(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("m", artifact_location=(tmp_path / "a").as_uri())
    me = tracking.process_tags()
    runs = {
        "alive": me,
        "dead": {**me, "process.pid": str(_dead_pid())},
        "reused": {**me, "process.started": f"{float(me['process.started']) - 3600:.2f}"},
        "other_host": {**me, "process.host": socket.gethostname() + "-x", "process.pid": str(_dead_pid())},
        "untagged": {},
    }
    ids = {k: client.create_run(exp, tags=t, run_name=k).info.run_id for k, t in runs.items()}
    child = client.create_run(exp, tags={"mlflow.parentRunId": ids["dead"]}).info.run_id
    killed = tracking.reap_dead_runs(uri)
    assert sorted(killed) == sorted([ids["dead"], ids["reused"]])
    status = {k: client.get_run(i).info.status for k, i in ids.items()}
    assert status == {
        "alive": "RUNNING",
        "dead": "KILLED",
        "reused": "KILLED",
        "other_host": "RUNNING",
        "untagged": "RUNNING",
    }
    assert client.get_run(child).info.status == "KILLED"
    assert "was gone" in client.get_run(ids["dead"]).data.tags["ended_by"]


def test_guard_warns_once_and_skips_the_rest(caplog):
    tracking.reset()
    calls = []

    def boom():
        calls.append(1)
        raise ConnectionError("HTTPConnectionPool: Failed to establish a new connection: Connection refused")

    try:
        assert tracking.guarded("parameters", boom) is None
        assert tracking.guarded("plots", boom) is None
        assert calls == [1]  # never asked again once lost
        assert tracking.unlogged() == ["parameters", "plots"]
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "connection refused" in warnings[0].getMessage()
        tracking.note_report("data/r.json")
        line = tracking.summary_line()
        assert "not logged: parameters, plots" in line and "kedro report log data/r.json" in line
    finally:
        tracking.reset()
    assert tracking.summary_line() is None


def test_http_bounds_only_where_unset():
    env = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "300"}
    set_ = tracking.bound_http_requests(env)
    assert env["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300" and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in set_
    assert env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"


def test_relog_finds_the_plots_where_the_versioned_plots_dataset_saves_them(tmp_path):
    """FiguresDataset (versioned) writes data/08_reporting/<m>/plots/<version>/plots/*.png; a relog logs them."""
    import json

    from mlflow.tracking import MlflowClient

    from pipelines.core.mlflow_logging import relog_report

    version = "2026-01-01T00.00.00.000Z"
    base = tmp_path / "data" / "08_reporting" / "m"
    report = base / "report.json" / version / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text(
        json.dumps(
            {"pipeline": "m", "save_version": version, "variants": {"a": {"x": 1.0}}, "claims": [], "metrics": {}}
        )
    )
    (report.parent / "params.json").write_text(json.dumps({"m.n": "3"}))
    plots = base / "plots" / version / "plots"
    plots.mkdir(parents=True)
    (plots / "curve.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = relog_report(report, uri)
    assert done["plots"] == 1 and done["variants"] == 1 and done["params"] == 1
    client = MlflowClient(tracking_uri=uri)
    assert [f.path for f in client.list_artifacts(done["run_id"], "plots")] == ["plots/curve.png"]
