"""The claims evaluator: holds / does not hold / missing metric (an error) / NaN never holds."""

import math

import pytest

from pipelines.core.claims import ClaimError, evaluate_claims, flat_metrics

VARIANTS = {"tess": {"test_mse": 0.5}, "patchtst": {"test_mse": 0.8}}
METRICS = {"relative_gain.test_mse.tess_vs_patchtst": 0.375, "nan_metric": math.nan}


def claim(metric, op, threshold, id="c"):
    return {"id": id, "text": "t", "metric": metric, "op": op, "threshold": threshold}


@pytest.mark.parametrize(
    "op,threshold,holds",
    [
        (">=", 0.375, True),
        (">", 0.375, False),
        ("<=", 0.375, True),
        ("<", 0.375, False),
        (">=", 0.5, False),
        ("<", 0.5, True),
    ],
)
def test_ops_on_derived_metric(op, threshold, holds):
    [c] = evaluate_claims(
        [claim("relative_gain.test_mse.tess_vs_patchtst", op, threshold)], flat_metrics(VARIANTS, METRICS)
    )
    assert c["holds"] is holds and c["value"] == 0.375 and c["threshold"] == threshold


def test_variant_metric_path():
    [c] = evaluate_claims([claim("variants.tess.test_mse", "<", 0.6)], flat_metrics(VARIANTS, METRICS))
    assert c["holds"] is True and c["value"] == 0.5


def test_missing_metric_is_an_error_naming_claim_and_metric():
    with pytest.raises(ClaimError, match=r"claim 'gap': metric 'variants\.tess\.test_mae' is not in the report"):
        evaluate_claims([claim("variants.tess.test_mae", "<", 1, id="gap")], flat_metrics(VARIANTS, METRICS))


def test_nan_value_never_holds():
    [c] = evaluate_claims([claim("nan_metric", "<", 1e9)], flat_metrics(VARIANTS, METRICS))
    assert c["holds"] is False and c["value"] is None


def test_unknown_op_rejected():
    with pytest.raises(ClaimError, match="op"):
        evaluate_claims([claim("nan_metric", "==", 1)], METRICS)


@pytest.mark.parametrize("lo,hi,verdict", [(1.2, 1.5, "holds"), (0.8, 0.95, "fails"), (0.9, 1.3, "inconclusive")])
def test_claims_on_an_interval(lo, hi, verdict):
    vals = {"speedup": (lo + hi) / 2, "speedup.ci_low": lo, "speedup.ci_high": hi}
    [c] = evaluate_claims([claim("speedup", ">=", 1.0)], vals)
    assert c["verdict"] == verdict and c["holds"] is (verdict == "holds") and c["ci"] == [lo, hi]


def test_claim_on_an_unbounded_interval_is_inconclusive():
    vals = {"speedup": 1.4, "speedup.ci_low": -math.inf, "speedup.ci_high": math.inf}
    [c] = evaluate_claims([claim("speedup", ">=", 1.0)], vals)
    assert c["verdict"] == "inconclusive" and c["holds"] is False
