"""The method spec: the long results table, per-seed paired derived metrics, seed intervals, gates and
untested claims, and the checks that run before any node."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.core.claims import evaluate_claims, evaluate_gates, verdict_counts
from pipelines.core.params import MethodParams, ParameterError
from pipelines.core.report import build_report, claims_table, gates_table
from pipelines.core.spec import Diff, Fn, Gain, Method, Ratio, Results, SeedValues, Train
from pipelines.core.stats import Estimate, t_interval


def test_t_interval_matches_scipy():
    from scipy import stats

    x = [0.31, 0.29, 0.35, 0.30, 0.33]
    est = t_interval(x)
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert est.value == pytest.approx(np.mean(x)) and est.n == 5
    assert (est.lo, est.hi) == (pytest.approx(lo), pytest.approx(hi))
    assert not t_interval([1.0]).has_interval  # one seed: a point
    assert math.isnan(t_interval([1.0, float("nan")]).value)  # a diverged seed is never dropped


def _values() -> SeedValues:
    a, b, c = Results("a"), Results("b"), Results("c")
    for s, (xa, xb, xc) in enumerate([(1.0, 2.0, 2.5), (1.2, 2.1, 2.0), (0.9, 2.3, 2.4)]):
        a.add(s, mse=xa)
        b.add(s, mse=xb)
        c.add(s, mse=xc)
    a.history(0, "loss", [3.0, 2.0, 1.0], steps=[0, 10, 20])
    return SeedValues({"a": a.table(), "b": b.table(), "c": c.table()})


def test_results_table_is_long_and_histories_are_kept_apart():
    v = _values()
    assert list(v.table.columns) == ["variant", "seed", "metric", "value", "step"]
    assert v.per_seed("a", "mse") == {0: 1.0, 1: 1.2, 2: 0.9}
    assert not v.has("a", "loss")  # a history is not a final value
    assert v.history("a", "loss") == {"step": [0, 10, 20], "value": [3.0, 2.0, 1.0]}
    with pytest.raises(KeyError, match="variant 'b' produced no metric 'acc'"):
        v.per_seed("b", "acc")


def test_gain_is_paired_per_seed_and_best_of_picks_by_mean():
    v = _values()
    planned = ["a", "b", "c"]
    g = Gain("mse", "a", best_of=("b", "c"), label="base", lower_is_better=True).compute(v, None, planned, {})
    # mean(b) = 2.133 < mean(c) = 2.3: b is the best baseline; gain = b − a per seed
    assert g == {"gain.mse.a_vs_best_base": pytest.approx({0: 1.0, 1: 0.9, 2: 1.4})}
    r = Gain("mse", "a", "b", lower_is_better=True, relative=True).compute(v, None, planned, {})
    assert r["relative_gain.mse.a_vs_b"][1] == pytest.approx((2.1 - 1.2) / 2.1)
    assert Diff("mse", "a", "b").compute(v, None, planned, {})["diff.mse.a_minus_b"][0] == pytest.approx(-1.0)
    assert Ratio("mse", "a", "b").compute(v, None, planned, {})["ratio.mse.a_over_b"][2] == pytest.approx(0.9 / 2.3)
    assert Gain("mse", "a", "b").compute(v, None, ["a"], {}) == {}  # b not planned: inactive
    with pytest.raises(TypeError, match="exactly one"):
        Gain("mse", "a")


def test_paired_interval_is_narrower_than_unpaired_when_seeds_share_noise():
    """Seed noise common to both variants cancels in the paired differences."""
    rng = np.random.default_rng(0)
    common = rng.normal(0, 1.0, 6)
    a, b = Results("a"), Results("b")
    for s in range(6):
        a.add(s, acc=0.8 + common[s] + rng.normal(0, 0.01))
        b.add(s, acc=0.7 + common[s] + rng.normal(0, 0.01))
    v = SeedValues({"a": a.table(), "b": b.table()})
    d = Gain("acc", "a", "b").compute(v, None, ["a", "b"], {})["gain.acc.a_vs_b"]
    est = t_interval(list(d.values()))
    assert est.lo > 0.05 and est.hi < 0.15  # decided; unpaired would straddle 0
    ua, ub = t_interval(list(v.per_seed("a", "acc").values())), t_interval(list(v.per_seed("b", "acc").values()))
    assert ua.lo < ub.hi


def test_verdicts_from_intervals_gates_and_untested():
    values = {"x": 0.5, "y": 0.5, "z": 2.0, "gate_m": 0.4}
    iv = {"x": Estimate(0.5, 0.4, 0.6, 3), "y": Estimate(0.5, 0.1, 0.9, 3)}
    gates = evaluate_gates([{"id": "learns", "text": "", "metric": "gate_m", "op": ">=", "threshold": 0.9}], values, iv)
    assert gates[0]["passed"] is False and gates[0]["point"]
    claims = [
        {"id": "c1", "text": "", "metric": "x", "op": ">=", "threshold": 0.3, "requires": []},
        {"id": "c2", "text": "", "metric": "y", "op": ">=", "threshold": 0.3, "requires": []},
        {"id": "c3", "text": "", "metric": "x", "op": ">=", "threshold": 0.7, "requires": []},
        {"id": "c4", "text": "", "metric": "z", "op": ">=", "threshold": 1.0, "requires": []},
        {"id": "c5", "text": "", "metric": "x", "op": ">=", "threshold": 0.3},
    ]  # every gate
    out = {c["id"]: c for c in evaluate_claims(claims, values, iv, gates)}
    assert [out[k]["verdict"] for k in ("c1", "c2", "c3", "c4", "c5")] == [
        "holds",
        "inconclusive",
        "fails",
        "holds",
        "untested",
    ]
    assert out["c4"]["point"] and out["c1"]["ci"] == [0.4, 0.6] and out["c1"]["n_seeds"] == 3
    assert out["c5"]["untested_by"] == ["learns"] and out["c5"]["measured_verdict"] == "holds"
    assert out["c5"]["holds"] is False
    assert verdict_counts(out.values()) == {"holds": 2, "fails": 1, "inconclusive": 1, "untested": 1}


class _P(MethodParams):
    variants: list[str]


def _spec(derived=()) -> Method:
    return Method(name="toy", params=_P, train=Train(lambda p, variant: None), derived=derived)


def _p(**kw) -> _P:
    base = {
        "seeds": [0, 1],
        "variants": ["a", "b"],
        "claims": [{"id": "beats_b", "text": "", "metric": "gain.mse.a_vs_b", "op": ">=", "threshold": 0.0}],
    }
    base.update(kw)
    return _P.model_validate(base)


def test_check_names_the_claim_before_any_node_runs():
    spec = _spec([Gain("mse", "a", "b", lower_is_better=True)])
    assert spec.check(_p()) == ["a", "b"]
    with pytest.raises(ParameterError, match="claim 'beats_b'.*gain.mse.a_vs_b.*no variant or derived"):
        _spec([]).check(_p())
    with pytest.raises(ParameterError, match="claim 'beats_b'"):
        spec.check(_p(variants=["a"]))  # the declaration needs b
    bad = _p(
        variants=["a", "b", "c"],
        claims=[{"id": "on_c", "text": "", "metric": "variants.c.mse", "op": "<=", "threshold": 1}],
    )
    only_ab = Method(name="toy", params=_P, train=spec.train, variants=lambda p: ["a", "b"])
    with pytest.raises(ParameterError, match="claim 'on_c'.*variant 'c'"):
        only_ab.check(bad)
    with pytest.raises(ParameterError, match=r"listed twice"):
        spec.check(_p(variants=["a", "a"]))
    fn = Fn(lambda values, p: {}, ["gap"])
    gated = _p(gates=[{"id": "g", "text": "", "metric": "nope", "op": ">=", "threshold": 0}])
    with pytest.raises(ParameterError, match="gate 'g'"):
        _spec([fn, Gain("mse", "a", "b")]).check(gated)


def test_requires_names_declared_gates():
    with pytest.raises(Exception, match="requires unknown gate"):
        _p(claims=[{"id": "c", "text": "", "metric": "m", "op": ">=", "threshold": 0, "requires": ["nope"]}])


def test_report_carries_intervals_gates_and_counts():
    rows = [{"variant": "a", "seed": s, "acc": x} for s, x in enumerate([0.9, 0.92, 0.91])]
    params = {
        "seeds": [0, 1, 2],
        "gates": [{"id": "learns", "text": "", "metric": "variants.a.acc", "op": ">=", "threshold": 0.95}],
        "claims": [
            {"id": "good", "text": "", "metric": "variants.a.acc", "op": ">=", "threshold": 0.5},
            {"id": "free", "text": "", "metric": "gap", "op": ">=", "threshold": 0.0, "requires": []},
        ],
    }
    r = build_report("toy", params, rows, derived_per_seed={"gap": {0: 0.1, 1: 0.2, 2: 0.15}})
    assert r["variants_ci"]["a"]["acc"][0] < 0.91 < r["variants_ci"]["a"]["acc"][1]
    assert r["gates"][0]["passed"] is False and r["gates_passed"] is False
    assert [c["verdict"] for c in r["claims"]] == ["untested", "holds"]
    assert r["verdicts"] == {"holds": 1, "fails": 0, "inconclusive": 0, "untested": 1}
    assert r["metrics"]["gap"] == pytest.approx(0.15) and "gap" in r["metrics_ci"]
    assert "untested (learns)" in claims_table(r) and "NO: claims untested" in gates_table(r)


def test_named_streams_are_stable_distinct_and_independent():
    from pipelines.core.streams import np_rng, rng, stream_seed

    assert stream_seed(0, "noise") == stream_seed(0, "noise") != stream_seed(0, "init") != stream_seed(1, "init")
    import hashlib

    ref = int.from_bytes(hashlib.sha256(b"3/noise").digest()[:8], "little") & ((1 << 63) - 1)
    assert stream_seed(3, "noise") == ref  # a documented derivation, not Python's salted hash()
    a, b = np_rng(0, "noise").normal(size=20000), np_rng(0, "init").normal(size=20000)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03
    assert rng(5, "x").initial_seed() == stream_seed(5, "x")
    with pytest.raises(ValueError, match="needs a name"):
        stream_seed(0, "")


def test_json_records_turn_numpy_scalars_into_python_ones():
    import json

    import numpy as np
    import pandas as pd

    from pipelines.core.spec import json_records

    df = pd.DataFrame(
        {"a": np.array([1, 2], dtype=np.int64), "b": [np.float32(0.5), np.nan], "c": np.array([True, False])}
    )
    recs = json_records(df)
    assert recs[:1] == json_records(df.to_dict("records"))[:1]
    assert [type(recs[0][k]) for k in "abc"] == [int, float, bool]
    assert json.loads(json.dumps(recs[:1])) == [{"a": 1, "b": 0.5, "c": True}]
