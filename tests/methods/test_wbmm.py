"""Tests of `wbmm`: the mechanism against a reference, bad input, the end-to-end --env=test run."""
import numpy as np
import pytest

from pipelines.core.params import ParameterError, parse


def test_ridge_matches_sklearn(tmp_path):
    from sklearn.linear_model import Ridge

    from pipelines.wbmm.data import make_data
    from pipelines.wbmm.train import train_variants

    raw = {"seeds": [0], "data": {"n_train": 60, "n_test": 40, "n_features": 3, "noise": 0.1}, "ridge_alpha": 2.0}
    df = make_data(raw)
    preds = train_variants(df, raw)
    tr, te = df[df.split == "train"], df[df.split == "test"]
    ref = Ridge(alpha=2.0, fit_intercept=False).fit(tr[["x0", "x1", "x2"]], tr["y"]).predict(te[["x0", "x1", "x2"]])
    np.testing.assert_allclose(preds[preds.variant == "ridge"]["pred"], ref, rtol=1e-8)


def test_bad_parameter_names_the_key():
    with pytest.raises(ParameterError, match=r"wbmm\.ridge_alpha"):
        parse("wbmm", {"seeds": [0], "data": {"n_train": 60, "n_test": 40, "n_features": 3, "noise": 0.1},
                       "ridge_alpha": -1})


@pytest.mark.e2e
def test_end_to_end(run_pipeline):
    result = run_pipeline("wbmm")
    report = result.report
    assert set(report["variants"]) == {"ridge", "mean_baseline"}
    assert [c["id"] for c in report["claims"]] == ["beats_mean_baseline"]
    assert report["env"] == "test"
