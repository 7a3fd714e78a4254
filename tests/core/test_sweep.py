"""``kedro sweep``: grid parsing (bracket-aware, YAML values, reproducible sampling), the summary files
from a hand-made sweep, and end to end on rankcal --env=test in a throw-away project: a 2 x 2 grid run
locally (4 concurrent points on the embedded sqlite store: 4 parent runs, tagged) and on a local Ray
instance, a point with a bad value failing alone, and --resume rerunning only what did not finish ok."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core import sweep as sw
from pipelines.core import versions
from tests.conftest import make_project

GRID_A = "rankcal.ece.n_bins=10,15"
GRID_B = "rankcal.models.neural.steps=30,40"


# ============================================================================================ parsing
def test_split_is_bracket_and_quote_aware():
    assert sw.split_top_level("0.6,0.75,0.85") == ["0.6", "0.75", "0.85"]
    assert sw.split_top_level("[0],[1, 2],{a: 1, b: [3,4]}") == ["[0]", "[1, 2]", "{a: 1, b: [3,4]}"]
    assert sw.split_top_level("'a,b',\"c,d\",e") == ["'a,b'", '"c,d"', "e"]
    for bad in ("[0,1", "0]", "[0}", "'open"):
        with pytest.raises(sw.GridError):
            sw.split_top_level(bad)


def test_grid_values_are_yaml_and_kept_as_written():
    key, values = sw.parse_grid("rankcal.seeds=[0],[0, 1],[2]")
    assert key == "rankcal.seeds" and values == ["[0]", "[0, 1]", "[2]"]
    assert [sw.parse_value(v) for v in values] == [[0], [0, 1], [2]]
    assert sw.parse_value("0.6") == 0.6 and sw.parse_value("true") is True and sw.parse_value("-3") == -3
    assert sw.parse_value("pl_truth") == "pl_truth"
    for bad in ("rankcal.seeds", "=1,2", "rankcal.x=1,,2", "rankcal.x=1,1", "rank cal.x=1", "m.x=[1,2"):
        with pytest.raises(sw.GridError):
            sw.parse_grid(bad)
    assert sw.parse_assignments("a.b=1, c=[1,2],d=x", "--params") == {"a.b": "1", "c": "[1,2]", "d": "x"}
    assert sw.parse_assignments("address=ray://head:10001", "--runner-params") == {"address": "ray://head:10001"}


def test_cartesian_product_and_reproducible_sample():
    pts = sw.expand_grid([("m.a", ["1", "2"]), ("m.b", ["[0]", "[1]", "[2]"])])
    assert len(pts) == 6 and pts[0] == {"m.a": "1", "m.b": "[0]"} and pts[5] == {"m.a": "2", "m.b": "[2]"}
    with pytest.raises(sw.GridError, match="more than once"):
        sw.expand_grid([("m.a", ["1"]), ("m.a", ["2"])])
    one, again = sw.sample_points(100, 7, seed=3), sw.sample_points(100, 7, seed=3)
    assert one == again and len(one) == 7 and one == sorted(one) and len(set(one)) == 7
    assert sw.sample_points(100, 7, seed=4) != one
    assert sw.sample_points(5, 9, seed=0) == sw.sample_points(5, None, seed=0) == [0, 1, 2, 3, 4]


def test_sweep_id_and_error_line():
    sid = sw.new_sweep_id("rankcal")
    assert re.fullmatch(r"rankcal-\d{8}T\d{6}-[0-9a-f]{4}", sid) and sw.pipeline_of(sid) == "rankcal"
    assert sw.pipeline_of("my-method-20260101T000000-abcd") == "my-method"
    with pytest.raises(sw.GridError):
        sw.pipeline_of("rankcal-latest")
    err = "INFO something\nError: first\nmore\nError: parameter rankcal.ece.n_bins: must be > 0\n\n"
    assert sw.error_line(err, 1) == "Error: parameter rankcal.ece.n_bins: must be > 0"
    tb = "Traceback (most recent call last):\n  File 'x'\n╰──────╯\nValueError: boom\n"
    assert sw.error_line(tb, 1) == "ValueError: boom"
    assert sw.error_line("", 137) == "exit code 137"


def test_resume_selects_what_did_not_finish_ok():
    doc = {
        "points": [
            {"index": i, "status": s}
            for i, s in enumerate([sw.OK, sw.FAILED, sw.INTERRUPTED, sw.PENDING, "running", sw.OK])
        ]
    }
    assert sw.resume_todo(doc) == [1, 2, 3, 4]


def test_a_point_reads_back_its_own_dataset_versions(tmp_path):
    """Guard 1: Kedro loads an unpinned versioned dataset at the newest version on disk, so a concurrent
    point that saved the same dataset later would be what this point reads; pinned, it reads its own."""
    from kedro.io import DataCatalog, Version
    from kedro_datasets.json import JSONDataset

    def catalog(save_version: str) -> DataCatalog:
        return DataCatalog(
            {"m.metrics": JSONDataset(filepath=str(tmp_path / "metrics.json"), version=Version(None, save_version))}
        )

    mine, other = catalog("2026-01-01T00.00.00.000Z"), catalog("2026-01-01T00.00.00.001Z")
    assert versions.pin_own_version(mine, "m.metrics", {})
    mine.save("m.metrics", {"point": "mine"})
    other.save("m.metrics", {"point": "other"})  # a newer version, written meanwhile
    assert mine.load("m.metrics") == {"point": "mine"}
    plain = catalog("2026-01-01T00.00.00.000Z")  # what Kedro alone does: the newest version
    assert plain.load("m.metrics") == {"point": "other"}
    assert not versions.pin_own_version(mine, "m.metrics", {"m.metrics": "x"})  # a version the run pinned itself


def test_no_two_point_sessions_share_a_millisecond(tmp_path, monkeypatch):
    """Guard 2: the save version is the session's start in ms; sessions are created under a file lock."""
    from concurrent.futures import ThreadPoolExecutor

    from kedro.io.core import generate_timestamp

    class Session:
        @classmethod
        def create(cls):
            return generate_timestamp()

    monkeypatch.setenv(versions.SESSION_LOCK_ENV, str(tmp_path / "sessions.lock"))
    unique = versions.unique_session_class(Session)
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: unique.create(), range(24)))
    assert len(set(ids)) == 24
    assert versions.unique_session_class(unique) is unique  # never wrapped (and locked) twice


def test_a_raced_point_is_discarded(tmp_path):
    log = (
        "WARNING  .../kedro/io/core.py:1049: UserWarning: Save version '2026-12-01T10.58.21.648Z' did not match\n"
        "         load version '2026-12-01T10.58.21.880Z' for pipelines.core.datasets.TableDataset(filepath=\n"
        "         PurePosixPath('/p/data/02_intermediate/m/datasets.parquet'), protocol='file')"
    )
    assert sw.base._RACE.search(" ".join(log.split()))
    report = tmp_path / "data" / "08_reporting" / "m" / "report.json" / "V" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text("{}")
    p = {"index": 3, "attempts": 1, "status": "ok", "report": str(report.relative_to(tmp_path)), "claims": [{}]}
    sw.driver._discard({}, p, None, tmp_path, tmp_path / "sweep", "Error: raced")
    assert p["status"] == "failed" and p["claims"] == [] and not report.parent.exists()
    assert (tmp_path / "sweep" / "discarded" / "point-3.attempt-1.report.json").is_file()


def _fake_doc() -> dict:
    def claims(a: bool, b: bool) -> list[dict]:
        return [{"id": "c_one", "value": 0.1, "holds": a}, {"id": "c_two", "value": 2.0, "holds": b}]

    pts = [
        {
            "index": 0,
            "overrides": {"m.a": "1"},
            "status": "ok",
            "run_id": "r0",
            "wall_seconds": 3.0,
            "claims": claims(True, False),
            "claims_held": 1,
            "claims_declared": 2,
            "headline": {"metric": "mse", "method": "m", "value": 0.5},
        },
        {
            "index": 1,
            "overrides": {"m.a": "2"},
            "status": "ok",
            "run_id": "r1",
            "wall_seconds": 3.5,
            "claims": claims(True, True),
            "claims_held": 2,
            "claims_declared": 2,
            "headline": {"metric": "mse", "method": "m", "value": 0.4},
        },
        {
            "index": 2,
            "overrides": {"m.a": "-1"},
            "status": "failed",
            "error": "Error: parameter m.a: > 0",
            "wall_seconds": 1.0,
        },
    ]
    return {
        "sweep_id": "m-20260101T000000-abcd",
        "pipeline": "m",
        "env": "test",
        "experiment": "m",
        "grid": [{"key": "m.a", "values": ["1", "2", "-1"]}],
        "params": {},
        "points": pts,
    }


def test_summary_files_from_a_sweep(tmp_path):
    import pandas as pd

    doc = _fake_doc()
    rates = sw.hold_rates(doc)
    assert rates["c_one"] == {"held": 2, "n": 2, "rate": 1.0} and rates["c_two"]["rate"] == 0.5
    paths = sw.write_summary(doc, tmp_path)
    assert [p.name for p in paths] == ["summary.parquet", "summary.md", "heatmap.png", "sweep.json"]
    df = pd.read_parquet(tmp_path / "summary.parquet")
    assert list(df["status"]) == ["ok", "ok", "failed"] and list(df["m.a"]) == ["1", "2", "-1"]
    assert df["claim.c_two.holds"].tolist()[:2] == [False, True] and pd.isna(df["claim.c_two.holds"][2])
    assert df["headline"].tolist()[:2] == [0.5, 0.4] and df["error"][2] == "Error: parameter m.a: > 0"
    md = (tmp_path / "summary.md").read_text()
    assert "| c_two | 1/2 | 50% | ✗ | ✓ | – |" in md and "Error: parameter m.a: > 0" in md
    assert (tmp_path / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "sweep.json").read_text())["sweep_id"] == doc["sweep_id"]


def test_usage_errors_stop_before_anything_runs(tmp_path, monkeypatch):
    from click.testing import CliRunner

    project = make_project(tmp_path / "p")
    monkeypatch.chdir(project)
    cases = [
        ([], "--pipeline is required"),
        (["--pipeline=rankcal"], "at least one --grid"),
        (["--pipeline=rankcal", "--grid", "rankcal.seeds=[0"], "unclosed bracket"),
        (["--pipeline=rankcal", "--grid", GRID_A, "--params", "rankcal.ece.n_bins=5"], "both swept"),
        (["--pipeline=rankcal", "--grid", GRID_A, "--runner-params", "adress=local"], "unknown key"),
        (["--resume", "rankcal-20260101T000000-abcd", "--grid", GRID_A], "--resume reruns"),
        (["--pipeline=nope", "--grid", GRID_A], "not registered"),
    ]
    for args, msg in cases:
        res = CliRunner().invoke(sw.sweep, args)
        assert res.exit_code != 0 and msg in res.output, (args, res.output)
    assert not (project / "data" / "08_reporting").exists()


# ============================================================================================ end to end
def _sweep(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
        "KEDRO_DISABLE_TELEMETRY": "true",
        "OMP_WAIT_POLICY": "PASSIVE",
        "MPLBACKEND": "Agg",
    }
    env.pop("MLFLOW_EXPERIMENT_NAME", None)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "pipelines", "sweep", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _sweep_doc(project: Path) -> dict:
    (path,) = (project / "data" / "08_reporting" / "rankcal" / "sweeps").glob("*/sweep.json")
    return json.loads(path.read_text())


def _runs(project: Path, sweep_id: str, role: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rankcal")
    return client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.role = '{role}'")


def _check_2x2(project: Path, res: subprocess.CompletedProcess) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    doc = _sweep_doc(project)
    sid = doc["sweep_id"]
    assert [p["status"] for p in doc["points"]] == ["ok"] * 4, out[-6000:]
    parents = _runs(project, sid, "parent")
    assert len(parents) == 4  # no run lost to the concurrent sqlite writers
    assert {r.info.run_id for r in parents} == {p["run_id"] for p in doc["points"]}
    by_run = {p["run_id"]: p for p in doc["points"]}
    for r in parents:
        p = by_run[r.info.run_id]
        assert r.data.tags["sweep.rankcal.ece.n_bins"] == p["overrides"]["rankcal.ece.n_bins"]
        assert r.data.tags["sweep.rankcal.models.neural.steps"] == p["overrides"]["rankcal.models.neural.steps"]
        assert r.data.tags["sweep_point"] == str(p["index"]) and r.data.tags["save_version"] == p["save_version"]
    assert {tuple(p["overrides"].values()) for p in doc["points"]} == {
        ("10", "30"),
        ("10", "40"),
        ("15", "30"),
        ("15", "40"),
    }
    reports = [json.loads((project / p["report"]).read_text()) for p in doc["points"]]
    assert len({r["params_hash"] for r in reports}) == 4 and {r["save_version"] for r in reports} == {
        p["save_version"] for p in doc["points"]
    }
    logs = project / "data" / "08_reporting" / "rankcal" / "sweeps" / sid / "logs"
    for log in logs.glob("*.log"):  # no point read back another point's data
        assert "did not match load version" not in log.read_text(), log.name
    (sweep_run,) = _runs(project, sid, "sweep")
    assert sweep_run.info.run_name == f"sweep-{sid}"
    assert any(k.startswith("hold_rate.") for k in sweep_run.data.metrics)

    import pandas as pd

    out_dir = project / "data" / "08_reporting" / "rankcal" / "sweeps" / sid
    df = pd.read_parquet(out_dir / "summary.parquet")
    assert len(df) == 4 and set(df["status"]) == {"ok"} and df["run_id"].notna().all()
    holds = [c for c in df.columns if c.startswith("claim.") and c.endswith(".holds")]
    assert holds and df[holds].notna().all().all()
    assert (out_dir / "heatmap.png").stat().st_size > 1000 and "## Claim robustness" in (
        out_dir / "summary.md"
    ).read_text()
    assert "| point | ece.n_bins | models.neural.steps | status |" in res.stdout and "summary: " in res.stdout


@pytest.mark.e2e
def test_local_2x2_four_concurrent_points(tmp_path):
    project = make_project(tmp_path / "project")
    res = _sweep(project, "--pipeline=rankcal", "--env=test", "--grid", GRID_A, "--grid", GRID_B, "--max-parallel", "4")
    _check_2x2(project, res)
    assert "local, 4 at once" in res.stdout


@pytest.mark.e2e
@pytest.mark.ray
def test_ray_local_2x2(tmp_path):
    pytest.importorskip("ray")
    project = make_project(tmp_path / "project")
    res = _sweep(
        project,
        "--pipeline=rankcal",
        "--env=test",
        "--grid",
        GRID_A,
        "--grid",
        GRID_B,
        "--runner-params",
        "address=local",
    )
    _check_2x2(project, res)
    assert "Ray at local" in res.stdout


@pytest.mark.e2e
def test_bad_value_fails_alone_and_resume_reruns_only_it(tmp_path):
    project = make_project(tmp_path / "project")
    res = _sweep(project, "--pipeline=rankcal", "--env=test", "--grid", "rankcal.ece.n_bins=10,-3")
    assert res.returncode != 0
    doc = _sweep_doc(project)
    ok, bad = doc["points"]
    assert ok["status"] == "ok" and ok["run_id"] and bad["status"] == "failed"
    assert bad["error"].startswith("Error:") and "n_bins" in bad["error"], bad["error"]
    assert bad["error"] in res.stdout and f"kedro sweep --resume {doc['sweep_id']}" in res.stderr
    assert len(_runs(project, doc["sweep_id"], "parent")) == 1

    again = _sweep(project, "--resume", doc["sweep_id"])
    assert again.returncode != 0
    assert "1 of 2 point(s)" in again.stdout, again.stdout
    after = _sweep_doc(project)
    assert after["points"][0] == ok  # the ok point was not touched
    assert after["points"][1]["attempts"] == 2 and after["points"][1]["status"] == "failed"
    logs = sorted(
        p.name
        for p in (project / "data" / "08_reporting" / "rankcal" / "sweeps" / doc["sweep_id"] / "logs").glob(
            "*.stderr.log"
        )
    )
    assert logs == ["point-0.attempt-1.stderr.log", "point-1.attempt-1.stderr.log", "point-1.attempt-2.stderr.log"]
    assert len(_runs(project, doc["sweep_id"], "sweep")) == 1  # the sweep's run is reused
