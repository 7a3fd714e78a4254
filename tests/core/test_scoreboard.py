"""The scoreboard and its regression check on fabricated reports (files and an MLflow store)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipelines.core.scoreboard import (
    NOT_RUN,
    build_scoreboard,
    compare,
    gain,
    infer_headline,
    latest_reports_from_dir,
    latest_reports_from_mlflow,
    main,
    row_from_report,
    to_html,
    to_markdown,
)


def fake_report(
    pipeline: str = "alpha",
    method_mse: float = 0.5,
    holds: bool = True,
    version: str = "2026-01-01T00.00.00.000Z",
    headline: dict | None = None,
    **extra,
) -> dict:
    """A report shaped like build_report's output (+ the context the hooks stamp)."""
    variants = {
        pipeline: {"test_mse": method_mse, "acc": 0.9},
        "linear": {"test_mse": 1.0, "acc": 0.7},
        "mean_baseline": {"test_mse": 2.0, "acc": 0.5},
    }
    g = (1.0 - method_mse) / 1.0
    report = {
        "pipeline": pipeline,
        "env": "base",
        "git_commit": "0123456789abcdef",
        "seeds": [0, 1, 2],
        "params_hash": "h",
        "save_version": version,
        "wall_seconds": 12.5,
        "variants": variants,
        "variants_std": {v: {k: 0.01 for k in row} for v, row in variants.items()},
        "metrics": {f"relative_gain.test_mse.{pipeline}_vs_linear": g},
        "claims": [
            {
                "id": "beats_linear",
                "text": "t",
                "metric": f"relative_gain.test_mse.{pipeline}_vs_linear",
                "op": ">=",
                "threshold": 0.1,
                "value": g,
                "holds": holds,
            },
            {
                "id": "acc_floor",
                "text": "t",
                "metric": f"variants.{pipeline}.acc",
                "op": ">=",
                "threshold": 0.8,
                "value": 0.9,
                "holds": True,
            },
        ],
        "artifacts": [],
        **extra,
    }
    report["claims_held"] = sum(c["holds"] for c in report["claims"])
    report["claims_declared"] = 2
    if headline:
        report["headline"] = headline
    return report


def write_report(root: Path, report: dict) -> Path:
    path = root / report["pipeline"] / "report.json" / report["save_version"] / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
    return path


def test_row_headline_best_baseline_and_gain():
    row = row_from_report(fake_report(method_mse=0.5))
    assert row.status == "ok"
    assert row.headline["metric"] == "test_mse" and row.headline["method"] == "alpha" and row.headline["inferred"]
    assert row.method_value == 0.5 and row.method_std == 0.01
    assert row.best_baseline == "linear" and row.best_baseline_value == 1.0  # min of the lower-is-better metric
    assert row.relative_gain == pytest.approx(0.5)
    assert (row.claims_held, row.claims_declared) == (2, 2)
    # a declared higher-is-better headline picks the max baseline and a signed gain
    row = row_from_report(
        fake_report(headline={"metric": "acc", "method": "alpha", "lower_is_better": False}, paper="Alpha (ICML 2026)")
    )
    assert row.paper == "Alpha (ICML 2026)" and row.best_baseline == "linear"
    assert row.relative_gain == pytest.approx((0.9 - 0.7) / 0.7)
    # a declared list of baselines narrows the best baseline (ablations are not baselines)
    row = row_from_report(
        fake_report(headline={"metric": "test_mse", "method": "alpha", "baselines": ["mean_baseline"]})
    )
    assert row.best_baseline == "mean_baseline" and row.relative_gain == pytest.approx(0.75)
    assert gain(2.0, 1.0, lower_is_better=True) == -1.0 and gain(1.0, 0.0, True) is None


def test_headline_inference_is_tolerant():
    assert infer_headline({"variants": {"a": {"x": 1}}, "claims": []}) is None
    rep = {
        "variants": {"a": {"ece": 0.1}, "b": {"ece": 0.2}},
        "claims": [{"metric": "variants.a.ece", "op": "<=", "threshold": 0.15}],
    }
    assert infer_headline(rep) == {"metric": "ece", "method": "a", "lower_is_better": True, "inferred": True}
    # a report with no claims and no headline still gives a row, without numbers
    row = row_from_report({"pipeline": "z", "variants": {"z": {"m": 1.0}}})
    assert row.status == "ok" and row.method_value is None and row.claims_declared == 0


def test_headline_from_parameters_file(tmp_path):
    (tmp_path / "conf" / "base").mkdir(parents=True)
    (tmp_path / "conf" / "base" / "parameters_alpha.yml").write_text(
        "alpha:\n  paper: Alpha paper\n  headline: {metric: acc, method: linear, lower_is_better: false}\n"
    )
    row = row_from_report(fake_report(), project=tmp_path)
    assert row.paper == "Alpha paper" and row.headline["method"] == "linear" and row.method_value == 0.7
    assert row.best_baseline == "alpha"


def test_latest_report_per_pipeline_and_not_run(tmp_path):
    write_report(tmp_path, fake_report("alpha", 0.9, version="2026-01-01T00.00.00.000Z"))
    write_report(tmp_path, fake_report("alpha", 0.4, version="2026-01-02T00.00.00.000Z"))
    write_report(tmp_path, fake_report("beta", version="2026-01-01T00.00.00.000Z"))
    (tmp_path / "junk" / "report.json").mkdir(parents=True)  # folders named report.json are skipped
    (tmp_path / "other.json").write_text("{}")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "report.json").write_text("{not json")
    reports = latest_reports_from_dir(tmp_path)
    assert set(reports) == {"alpha", "beta"} and reports["alpha"]["variants"]["alpha"]["test_mse"] == 0.4
    board = build_scoreboard(reports, ["alpha", "beta", "gamma"])
    status = {r["pipeline"]: r["status"] for r in board["rows"]}
    assert status == {"alpha": "ok", "beta": "ok", "gamma": NOT_RUN}
    md, page = to_markdown(board), to_html(board)
    assert "| gamma |  | not run |" in md and "+60.0%" in md and "2/2" in md
    assert page.count("<tr") == 4 and "not run" in page and "<script" not in page


def test_regression_hold_to_no_hold_is_flagged_new_pipeline_is_not():
    before = build_scoreboard({"alpha": fake_report("alpha", 0.5)}, ["alpha", "beta"])
    after = build_scoreboard(
        {"alpha": fake_report("alpha", 0.95, holds=False), "beta": fake_report("beta")}, ["alpha", "beta"]
    )
    regressions, notes = compare(after, before)
    assert any("alpha: claim beats_linear held" in r for r in regressions)
    assert not any(r.startswith("beta") for r in regressions)
    assert any(n.startswith("beta: new") for n in notes)
    # identical boards: nothing to report
    assert compare(before, before) == ([], [])
    # a claim that did not hold before and does not hold now is not a regression
    failing = build_scoreboard({"alpha": fake_report("alpha", 0.95, holds=False)}, ["alpha"])
    assert compare(failing, failing)[0] == []


def test_regression_headline_tolerance_and_claim_tolerance():
    ref = build_scoreboard({"alpha": fake_report("alpha", 0.50)}, ["alpha"])
    slightly = build_scoreboard({"alpha": fake_report("alpha", 0.51)}, ["alpha"])  # 2% worse, claims hold
    much = build_scoreboard({"alpha": fake_report("alpha", 0.60)}, ["alpha"])  # 20% worse, claims hold
    better = build_scoreboard({"alpha": fake_report("alpha", 0.30)}, ["alpha"])
    assert compare(slightly, ref)[0] == []
    assert any("headline alpha test_mse" in r for r in compare(much, ref)[0])
    assert compare(much, ref, headline_tolerance=0.25)[0] == []
    assert compare(better, ref)[0] == []
    # a per-claim tolerance on the claim's value (against the op's direction)
    tight = fake_report("alpha", 0.60)
    tight["claims"][0]["tolerance"] = 0.05
    regs = compare(build_scoreboard({"alpha": tight}, ["alpha"]), ref, headline_tolerance=1.0)[0]
    assert regs == [
        "alpha: claim beats_linear value 0.4 is worse than the reference 0.5 by more than its tolerance 0.05"
    ]
    # a report that disappeared is a regression unless allowed
    gone = build_scoreboard({}, ["alpha"])
    assert "alpha: had a report in the reference, now not run" in compare(gone, ref)[0]
    assert compare(gone, ref, allow_missing=True)[0] == []


def test_cli_writes_files_and_exits_nonzero_on_regression(tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_report(good, fake_report("alpha", 0.5))
    write_report(bad, fake_report("alpha", 0.95, holds=False))
    assert main(["--reports", str(good), "--pipelines", "alpha,beta", "--out", str(tmp_path / "ref")]) == 0
    board = json.loads((tmp_path / "ref" / "scoreboard.json").read_text())
    assert [r["status"] for r in board["rows"]] == ["ok", NOT_RUN]
    assert (tmp_path / "ref" / "scoreboard.html").read_text().startswith("<!doctype html>")
    capsys.readouterr()
    code = main(
        [
            "--reports",
            str(bad),
            "--pipelines",
            "alpha,beta",
            "--out",
            str(tmp_path / "now"),
            "--compare-to",
            str(tmp_path / "ref" / "scoreboard.json"),
        ]
    )
    out = capsys.readouterr()
    assert code == 1 and "**regression**: alpha: claim beats_linear held" in out.out
    assert json.loads((tmp_path / "now" / "scoreboard.json").read_text())["compared_to"]["regressions"]
    # a folder of reports works as a reference too; the same reports against themselves pass
    assert main(["--reports", str(bad), "--pipelines", "alpha", "--compare-to", str(bad)]) == 0
    with pytest.raises(SystemExit, match="no such file"):
        main(["--reports", str(bad), "--compare-to", str(tmp_path / "missing.json")])


def test_reads_the_latest_parent_run_from_mlflow(tmp_path, monkeypatch):
    import mlflow

    from pipelines.core.mlflow_logging import log_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # an earlier in-process kedro run may have set a global tracking URI (kedro-mlflow does), which wins
    # over the environment variable: point the fluent API here and restore it afterwards
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        for i, (m, mse, holds) in enumerate([("alpha", 0.5, True), ("alpha", 0.95, False), ("beta", 0.5, True)]):
            exp = mlflow.get_experiment_by_name(m)
            exp_id = exp.experiment_id if exp else mlflow.create_experiment(m, (tmp_path / "art").as_uri())
            with mlflow.start_run(experiment_id=exp_id):
                rep = fake_report(
                    m, mse, holds=holds, version=f"2026-01-0{i + 1}T00.00.00.000Z", env="base" if i < 2 else "test"
                )
                run_id = log_report(rep)
    finally:
        mlflow.set_tracking_uri(previous)
    reports = latest_reports_from_mlflow(uri)
    assert reports["alpha"]["claims"][0]["holds"] is False and reports["beta"]["run_id"] == run_id
    assert set(latest_reports_from_mlflow(uri, "tags.env = 'base'")) == {"alpha"}
    board = build_scoreboard(reports, ["alpha", "beta"])
    assert board["rows"][1]["run_id"] == run_id and math.isclose(board["rows"][0]["method_value"], 0.95)
    # an MLflow filter as the reference: the first alpha run, whose claim held
    regs, _ = compare(
        board,
        build_scoreboard(
            latest_reports_from_mlflow(uri, "tags.save_version = '2026-01-01T00.00.00.000Z'"), ["alpha", "beta"]
        ),
    )
    assert any("beats_linear held" in r for r in regs)
    assert (
        main(
            [
                "--tracking-uri",
                uri,
                "--pipelines",
                "alpha,beta",
                "--compare-to",
                "mlflow:tags.save_version = '2026-01-01T00.00.00.000Z'",
            ]
        )
        == 1
    )


def test_only_default_scale_reports_by_default(tmp_path, capsys):
    """A newer --env=full (or test) report never replaces the default-scale one unless asked for."""
    write_report(tmp_path, fake_report("alpha", 0.5, env="base", version="2026-01-01T00.00.00.000Z"))
    write_report(tmp_path, fake_report("alpha", 0.9, env="full", version="2026-01-02T00.00.00.000Z"))
    assert latest_reports_from_dir(tmp_path, "base")["alpha"]["env"] == "base"
    assert latest_reports_from_dir(tmp_path)["alpha"]["env"] == "full"
    assert main(["--reports", str(tmp_path), "--pipelines", "alpha"]) == 0
    assert "0.5" in capsys.readouterr().out


def test_a_partial_run_is_marked_and_its_wall_time_is_not_the_methods():
    from pipelines.core.hooks import PlatformHooks
    from pipelines.core.scoreboard import row_from_report

    hooks = PlatformHooks()
    for run_params, partial in (({"from_nodes": ["m.train.a"]}, True), ({"node_names": ()}, False)):
        hooks.before_pipeline_run({"env": "test", "run_id": "v", **run_params}, None, None)
        report = {"pipeline": "m", "claims": [], "gates": []}
        hooks._catalog = None
        hooks._ctx["_t0"] -= 12.0
        report.update({k: v for k, v in hooks._ctx.items() if not k.startswith("_")}, wall_seconds=12.0)
        assert report["partial_run"] is partial
        assert row_from_report(report).wall_seconds == (None if partial else 12.0)
