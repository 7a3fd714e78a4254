"""Report assembly: seed aggregation against numpy, relative gains, claims and markdown tables."""

import numpy as np
import pytest

from pipelines.core.metrics import relative_gain
from pipelines.core.report import aggregate_seeds, build_report, claims_table, params_hash


def test_aggregate_matches_numpy():
    rows = [{"variant": "a", "seed": s, "mse": v} for s, v in enumerate([1.0, 2.0, 4.0])]
    rows += [{"variant": "b", "seed": 0, "mse": 3.0}]
    mean, std, per_seed = aggregate_seeds(rows)
    assert mean["a"]["mse"] == pytest.approx(np.mean([1, 2, 4]))
    assert std["a"]["mse"] == pytest.approx(np.std([1, 2, 4]))
    assert std["b"]["mse"] == 0 and per_seed["a"]["mse"] == [1.0, 2.0, 4.0]


def test_relative_gain_lower_is_better():
    assert relative_gain(baseline=2.0, method=1.5) == pytest.approx(0.25)
    assert relative_gain(baseline=2.0, method=3.0) == pytest.approx(-0.5)
    # higher-is-better: positive still means the method is better; a zero baseline is undefined
    assert relative_gain(method=0.9, baseline=0.6, lower_is_better=False) == pytest.approx(0.5)
    assert np.isnan(relative_gain(method=1.0, baseline=0.0))
    with pytest.raises(TypeError):
        relative_gain(2.0, 1.5)  # keyword-only: the order can never be swapped silently


def test_build_report_evaluates_claims_and_is_json_safe():
    params = {"seeds": [0], "claims": [{"id": "g", "text": "t", "metric": "gain", "op": ">=", "threshold": 0.1}]}
    rep = build_report("m", params, [{"variant": "a", "seed": 0, "mse": float("nan")}], {"gain": 0.2})
    assert rep["claims"][0]["holds"] is True and rep["claims_held"] == 1 and rep["claims_declared"] == 1
    assert rep["variants"]["a"]["mse"] is None  # NaN → null in JSON
    assert rep["params_hash"] == params_hash(params) and len(rep["params_hash"]) == 16
    assert "| g |" in claims_table(rep)


def test_history_series_forms_and_thinning():
    from pipelines.core.report import history_series

    assert history_series([3.0, 2.0, 1.0]) == {"step": [0, 1, 2], "value": [3.0, 2.0, 1.0]}
    assert history_series([(10, 1.0), (20, 0.5)]) == {"step": [10, 20], "value": [1.0, 0.5]}
    assert history_series({"step": np.array([1, 5]), "value": np.array([2.0, 4.0])})["step"] == [1, 5]
    long = history_series(np.arange(5000.0), max_points=100)
    assert len(long["step"]) == 100 and long["step"][0] == 0 and long["step"][-1] == 4999
    assert long["value"] == [float(s) for s in long["step"]]  # thinned, not resampled
    with pytest.raises(ValueError, match="2 steps but 3 values"):
        history_series({"step": [0, 1], "value": [1.0, 2.0, 3.0]})


def test_histories_are_logged_with_steps_to_the_variant_child_runs(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipelines.core.mlflow_logging import log_report

    rep = build_report(
        "alpha",
        {"seeds": [0], "claims": []},
        [{"variant": "a", "seed": 0, "mse": 1.0}],
        histories={"a": {"loss": [4.0, float("nan"), 1.0]}, "run": {"lr": [(0, 0.1), (7, 0.2)]}},
    )
    assert rep["histories"]["a"]["loss"]["value"][1] is None  # JSON-safe, kept in the report
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        exp_id = mlflow.create_experiment("alpha", (tmp_path / "art").as_uri())
        with mlflow.start_run(experiment_id=exp_id) as parent:
            log_report(rep)
        client = MlflowClient(uri)
        child = client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")[0]
        loss = client.get_metric_history(child.info.run_id, "history.loss")
        assert [(m.step, m.value) for m in loss] == [(0, 4.0), (2, 1.0)]  # the NaN point is skipped
        lr = client.get_metric_history(parent.info.run_id, "history.lr")
        assert sorted((m.step, m.value) for m in lr) == [(0, 0.1), (7, 0.2)]
    finally:
        mlflow.set_tracking_uri(previous)
