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
    assert rep["variants"]["a"]["mse"] is None          # NaN → null in JSON
    assert rep["params_hash"] == params_hash(params) and len(rep["params_hash"]) == 16
    assert "| g |" in claims_table(rep)
