"""Tests of `rankcal`: the calibration estimators and the ranking distributions against brute-force
enumeration and closed forms, the models against independent solvers, bad parameters, and the
end-to-end --env=test run."""
import copy
import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipelines.core.params import ParameterError, parse
from pipelines.rankcal import calibration as C
from pipelines.rankcal import models as M
from pipelines.rankcal import ranking as R

ROOT = Path(__file__).resolve().parents[2]


def base_raw() -> dict:
    return yaml.safe_load((ROOT / "conf" / "base" / "parameters_rankcal.yml").read_text())["rankcal"]


# ----------------------------------------------------------------- brute-force references
def bf_pl_prob(v, ordering):
    """PL probability by the sequential-choice definition."""
    p, left = 1.0, list(range(len(v)))
    for label in ordering:
        p *= v[label] / sum(v[j] for j in left)
        left.remove(label)
    return p


def bf_ece(scores, hits, n_bins):
    """Equal-mass binning written out with loops: edges at score quantiles, a bin is the set of scores
    in [edge_k, edge_{k+1}) (the last bin closed), so equal scores can never be split."""
    scores, hits = list(map(float, scores)), list(map(float, hits))
    inner = sorted(set(np.quantile(scores, np.linspace(0, 1, n_bins + 1)[1:-1]).tolist()))
    bounds = [-np.inf, *inner, np.inf]
    total = 0.0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        members = [i for i, s in enumerate(scores) if lo <= s < hi]
        if members:
            conf = sum(scores[i] for i in members) / len(members)
            acc = sum(hits[i] for i in members) / len(members)
            total += len(members) / len(scores) * abs(acc - conf)
    return total


def bf_marginals(Q_row, m):
    """Pairwise, top-1, top-2 and triple marginals of one table row by enumerating orderings."""
    orders = list(itertools.permutations(range(m)))
    pair = {(i, j): sum(q for q, o in zip(Q_row, orders) if o.index(i) < o.index(j))
            for i, j in itertools.combinations(range(m), 2)}
    top1 = [sum(q for q, o in zip(Q_row, orders) if o[0] == j) for j in range(m)]
    top2 = {t: sum(q for q, o in zip(Q_row, orders) if o[:2] == t) for t in itertools.permutations(range(m), 2)}
    trip = {}
    for A in itertools.combinations(range(m), 3):
        for sub in itertools.permutations(A):
            trip[(A, sub)] = sum(q for q, o in zip(Q_row, orders) if tuple(x for x in o if x in A) == sub)
    return pair, top1, top2, trip


def random_tables(n, m, rng, sharp=2.0):
    Q = rng.dirichlet(np.full(len(R.perms(m)), 1.0 / sharp), size=n)
    y = R.sample_table(Q, rng, 1)[0]
    return Q, y


# ----------------------------------------------------------------- permutation algebra
def test_perm_index_is_lexicographic_rank():
    for m in (2, 3, 4, 5):
        P = R.perms(m)
        assert [tuple(p) for p in P] == list(itertools.permutations(range(m)))
        np.testing.assert_array_equal(R.perm_index(P), np.arange(len(P)))


def test_kendall_matrix_matches_pair_counting():
    m = 4
    orders = list(itertools.permutations(range(m)))
    D = R.kendall_matrix(m)
    for a, b in [(0, 23), (5, 17), (9, 9), (3, 12)]:
        disc = sum((orders[a].index(i) < orders[a].index(j)) != (orders[b].index(i) < orders[b].index(j))
                   for i, j in itertools.combinations(range(m), 2))
        assert D[a, b] == disc


# ----------------------------------------------------------------- Plackett–Luce
@pytest.mark.parametrize("m", [3, 4, 5])
def test_pl_table_sums_to_one_and_matches_enumeration(m):
    rng = np.random.default_rng(m)
    s = rng.normal(size=(3, m)) * 2
    T = np.exp(R.pl_log_table(s))
    np.testing.assert_allclose(T.sum(1), 1.0, atol=1e-12)
    for r in range(3):
        v = np.exp(s[r])
        ref = [bf_pl_prob(v, o) for o in itertools.permutations(range(m))]
        np.testing.assert_allclose(T[r], ref, rtol=1e-10)


def test_pl_closed_forms_pairwise_prefix_and_restriction():
    m = 5
    rng = np.random.default_rng(0)
    s = rng.normal(size=(2, m))
    v = np.exp(s)
    Q = R.pl_table(s)
    pairs, _ = R.pair_lut(m)
    pij = R.pairwise_marginals(Q, m)
    for c, (i, j) in enumerate(pairs):
        np.testing.assert_allclose(pij[:, c], v[:, i] / (v[:, i] + v[:, j]), rtol=1e-10)
    prefixes, lut = R.prefix_lut(m, 2)
    P2 = R.marginal(Q, lut, len(prefixes))
    for k, (a, b) in enumerate(prefixes):
        closed = v[:, a] / v.sum(1) * v[:, b] / (v.sum(1) - v[:, a])
        np.testing.assert_allclose(P2[:, k], closed, rtol=1e-10)
    subsets, slut = R.subset_lut(m, 3)
    for g, A in enumerate(subsets):  # PL restricted to A is PL with the same weights
        PA = R.marginal(Q, slut[g], 6)
        ref = R.pl_table(s[:, list(A)])
        np.testing.assert_allclose(PA, ref, rtol=1e-10)


def test_pl_log_likelihood_is_stable_for_huge_scores():
    s = np.array([[400.0, -300.0, 0.0]])
    ll = R.pl_log_likelihood(s, np.array([[1, 0, 2]]))
    assert np.isfinite(ll).all() and ll[0] < -600


# ----------------------------------------------------------------- Mallows
@pytest.mark.parametrize("m", [3, 4, 5])
def test_mallows_expected_distance_and_theta_mle(m):
    theta = np.array([0.2, 1.0, 3.0])
    T = R.mallows_table(np.zeros(3, dtype=int), theta, m)
    enum = (T * R.kendall_matrix(m)[0]).sum(1)
    np.testing.assert_allclose(R.mallows_expected_distance(theta, m), enum, rtol=1e-9)
    np.testing.assert_allclose(R.mallows_theta_mle(enum, m, 5.0), theta, rtol=1e-6)
    assert R.mallows_theta_mle(np.array([0.0]), m, 5.0)[0] == 5.0  # agreeing neighbours: the cap
    assert R.mallows_theta_mle(np.array([m * (m - 1) / 4]), m, 5.0)[0] == 0.0


def test_repeated_insertion_sampler_matches_mallows_table():
    from pipelines.rankcal.data import sample_mallows

    rng = np.random.default_rng(1)
    centre = np.tile([2, 0, 1], (6000, 1))
    o = sample_mallows(centre, 0.8, rng)
    freq = np.bincount(R.perm_index(o), minlength=6) / len(o)
    ref = R.mallows_table(R.perm_index(centre[:1]), np.array([0.8]), 3)[0]
    np.testing.assert_allclose(freq, ref, atol=0.02)


# ----------------------------------------------------------------- ECE estimators
@pytest.mark.parametrize("m", [3, 4])
def test_ece_estimators_match_brute_force(m):
    rng = np.random.default_rng(10 + m)
    n, nb = 60, 5
    Q, y = random_tables(n, m, rng)
    Q[:10] = Q[0]  # a block of tied predictions: they must share a bin
    orders = list(itertools.permutations(range(m)))
    out, _ = C.calibration_metrics(Q, y, m, n_bins=nb, n_debias=1)
    marg = [bf_marginals(Q[r], m) for r in range(n)]
    yo = [orders[k] for k in y]
    # pairwise: each unordered pair once, averaged over pairs
    ref_pair = np.mean([bf_ece([mg[0][(i, j)] for mg in marg], [o.index(i) < o.index(j) for o in yo], nb)
                        for i, j in itertools.combinations(range(m), 2)])
    assert out["ece_pair"] == pytest.approx(ref_pair, abs=1e-12)
    # full-ranking confidence
    conf = Q.max(1)
    hit = [orders[int(np.argmax(Q[r]))] == yo[r] for r in range(n)]
    assert out["ece_full_conf"] == pytest.approx(bf_ece(conf, hit, nb), abs=1e-12)
    # top-1 confidence and class-wise
    t1 = np.array([mg[1] for mg in marg])
    assert out["ece_top1_conf"] == pytest.approx(
        bf_ece(t1.max(1), [t1[r].argmax() == yo[r][0] for r in range(n)], nb), abs=1e-12)
    assert out["ece_top1_cw"] == pytest.approx(
        np.mean([bf_ece(t1[:, j], [o[0] == j for o in yo], nb) for j in range(m)]), abs=1e-12)
    # ordered top-2 prefix, confidence
    keys = list(itertools.permutations(range(m), 2))
    t2 = np.array([[mg[2][k] for k in keys] for mg in marg])
    assert out["ece_top2_conf"] == pytest.approx(
        bf_ece(t2.max(1), [keys[int(t2[r].argmax())] == yo[r][:2] for r in range(n)], nb), abs=1e-12)
    if m == 4:
        assert out["ece_full_cw"] == pytest.approx(
            np.mean([bf_ece(Q[:, k], [yk == k for yk in y], nb) for k in range(24)]), abs=1e-12)
        refs = []
        for A in itertools.combinations(range(m), 3):
            subs = list(itertools.permutations(A))
            PA = np.array([[mg[3][(A, sub)] for sub in subs] for mg in marg])
            refs.append(bf_ece(PA.max(1), [subs[int(PA[r].argmax())] == tuple(x for x in yo[r] if x in A)
                                           for r in range(n)], nb))
        assert out["ece_triple_conf"] == pytest.approx(np.mean(refs), abs=1e-12)
    else:
        assert "ece_triple_conf" not in out and "ece_full_cw" in out  # |A| = 3 = m is full calibration


def test_tied_scores_share_a_bin():
    # a calibrated constant predictor: one bin, so the ECE is |frequency − q| exactly
    s = np.full(500, 0.3)
    hits = np.zeros(500)
    hits[:150] = 1
    assert C.binned_ece(s, hits[None], 15)[0] == pytest.approx(0.0, abs=1e-15)
    assert len(np.unique(C.bin_ids(np.r_[np.full(300, 0.5), np.linspace(0, 1, 200)], 15)[:300])) == 1


def test_debiasing_removes_the_small_sample_bias_of_a_calibrated_model():
    rng = np.random.default_rng(3)
    vals, dbs = [], []
    for _ in range(8):
        Q = R.pl_table(rng.normal(size=(300, 4)) * 1.5)
        y = R.sample_table(Q, rng, 1)[0]  # outcomes drawn from Q: perfectly calibrated
        out, ci = C.calibration_metrics(Q, y, 4, n_debias=20, n_bootstrap=50, rng=rng)
        vals.append(out["ece_top1_conf"])
        dbs.append(out["ece_top1_conf_db"])
        lo, hi = ci["ece_top1_conf"]
        assert lo <= out["ece_top1_conf"] + 0.02 and hi >= lo
    assert np.mean(vals) > 0.03          # plain binned ECE is biased upwards at n = 300
    assert abs(np.mean(dbs)) < 0.01      # the debiased one is not


def test_miscalibration_is_detected():
    rng = np.random.default_rng(4)
    s = rng.normal(size=(3000, 4)) * 1.5
    y = R.sample_table(R.pl_table(s), rng, 1)[0]
    over, _ = C.calibration_metrics(R.pl_table(3 * s), y, 4, rng=rng)   # over-confident
    right, _ = C.calibration_metrics(R.pl_table(s), y, 4, rng=rng)
    assert over["ece_pair_db"] > 0.05 > 0.01 > right["ece_pair_db"]


# ----------------------------------------------------------------- models vs independent solvers
def test_hunter_mm_matches_direct_map_optimisation():
    from scipy.optimize import minimize

    rng = np.random.default_rng(5)
    m, alpha = 4, 0.5
    neigh = np.stack([R.sample_pl(np.tile(u, (15, 1)), rng) for u in ([1.0, 0.2, -0.5, 0.0], [0, 2.0, 0, -1])])
    v_mm = M.pl_mm(neigh, alpha, 2000)

    def neg_log_post(logv, orders):
        v = np.exp(logv)
        ll = sum(np.log(bf_pl_prob(v, o)) for o in orders)
        return -(ll + np.sum(alpha * logv - alpha * v))  # Gamma(shape 1 + α, rate α) on v

    for r in range(2):
        res = minimize(neg_log_post, np.zeros(m), args=(neigh[r],), method="BFGS", options={"gtol": 1e-9})
        np.testing.assert_allclose(v_mm[r], np.exp(res.x), rtol=1e-4)


def test_mm_keeps_never_winning_label_positive():
    neigh = np.tile(np.array([0, 1, 2]), (1, 15, 1))  # label 2 always last
    v = M.pl_mm(neigh, 0.5, 200)
    assert (v > 0).all() and np.isfinite(np.log(R.pl_table(np.log(v)))).all()


def test_bt_from_consistent_pairwise_recovers_scores():
    rng = np.random.default_rng(6)
    s = rng.normal(size=(5, 4))
    pairs, _ = R.pair_lut(4)
    p = np.stack([1 / (1 + np.exp(-(s[:, i] - s[:, j]))) for i, j in pairs], 1)
    fit = M.bt_from_pairwise(p, 4, l2=1e-9)
    np.testing.assert_allclose(fit - fit.mean(1, keepdims=True), s - s.mean(1, keepdims=True), atol=1e-3)


def test_pl_lin_recovers_a_well_specified_model():
    rng = np.random.default_rng(7)
    W = rng.normal(size=(3, 4))
    x = rng.normal(size=(3000, 3))
    o = R.sample_pl(x @ W, rng)
    W_hat, b_hat = M.fit_pl_lin(x, o, 4, 1e-6)
    # PL is shift-invariant across labels: compare centred weights
    np.testing.assert_allclose(W_hat - W_hat.mean(1, keepdims=True), W - W.mean(1, keepdims=True), atol=0.15)


def test_temperature_fit_undoes_a_known_scaling():
    rng = np.random.default_rng(8)
    s = rng.normal(size=(4000, 4)) * 1.5
    o = R.sample_pl(s, rng)
    assert M.fit_temperature(2.5 * s, o, 0.05, 20) == pytest.approx(2.5, rel=0.08)


# ----------------------------------------------------------------- data and the hierarchy demo
def test_type_a_rankings_have_no_spurious_ties():
    from pipelines.rankcal.data import real_dataset

    x, o = real_dataset("digits5")
    assert o.shape == (901, 5) and (np.sort(o, 1) == np.arange(5)).all()
    x, o = real_dataset("iris")
    assert len({tuple(r) for r in o}) <= 6 and o.shape == (150, 3)


def test_user_csv_format_round_trip_and_errors(tmp_path):
    from pipelines.rankcal.data import make_datasets, unpack

    rng = np.random.default_rng(9)
    orders = [",".join(map(str, rng.permutation(4))) for _ in range(40)]
    import pandas as pd

    pd.DataFrame({"x_0": rng.normal(size=40), "x_1": rng.normal(size=40), "ranking": orders}).to_csv(
        tmp_path / "toy.csv", index=False)
    raw = copy.deepcopy(base_raw())
    raw["seeds"] = [0]
    raw["data"].update(datasets=["file:toy"], user_dir=str(tmp_path))
    raw["rank_disagreement_datasets"] = ["file:toy"]
    df = make_datasets(raw)
    assert (df.split == "test").sum() == 12 and set(df.dataset) == {"file:toy"}
    x, o, m = unpack(df)
    assert m == 4 and x.shape == (40, 2) and {",".join(map(str, r)) for r in o} == set(orders)
    raw["data"]["datasets"] = raw["rank_disagreement_datasets"] = ["file:missing"]
    with pytest.raises(ParameterError, match=r"rankcal\.data\.user_dir"):
        make_datasets(raw)
    raw["data"].update(datasets=["file:toy"], user_dir=None)
    raw["rank_disagreement_datasets"] = ["file:toy"]
    with pytest.raises(ParameterError, match=r"rankcal\.data"):
        parse("rankcal", raw)


def test_hierarchy_counterexamples_match_the_card():
    from pipelines.rankcal.demo import counterexample, population_ece

    P = R.pl_table(np.log([[0.45, 0.35, 0.20]]))[0]
    np.testing.assert_allclose(P, [.286, .164, .242, .108, .112, .088], atol=1.5e-3)
    q_sub = counterexample(P, "q_sub", 0.15, 0.01)
    q_top = counterexample(P, "q_top", 0.15, 0.01)
    np.testing.assert_allclose(q_sub, [.234, .066, .392, .010, .263, .035], atol=2e-3)
    np.testing.assert_allclose(q_top, [.136, .314, .092, .258, .112, .088], atol=2e-3)
    assert population_ece(q_sub, P)["pop_ece_pair"] == pytest.approx(0, abs=1e-9)
    assert population_ece(q_sub, P)["pop_ece_top1_cw"] == pytest.approx(0.10, abs=1e-9)
    assert population_ece(q_top, P)["pop_ece_top1_cw"] == pytest.approx(0, abs=1e-9)
    assert population_ece(q_top, P)["pop_ece_pair"] == pytest.approx(0.10, abs=1e-9)


def test_infeasible_counterexample_names_the_key():
    from pipelines.rankcal.demo import counterexample

    P = R.pl_table(np.log([[0.45, 0.35, 0.20]]))[0]
    with pytest.raises(ValueError, match=r"rankcal\.demo\.margin"):
        counterexample(P, "q_sub", 0.20, 0.01)


# ----------------------------------------------------------------- parameters
@pytest.mark.parametrize("path,value,key", [
    (("demo", "margin"), -0.1, r"rankcal\.demo\.margin"),
    (("data", "datasets"), ["iris", "mnist"], r"rankcal\.data\.datasets"),
    (("models", "variants"), ["neural_pl_ts"], r"rankcal\.models\.variants"),
    (("ece", "n_bins"), 0, r"rankcal\.ece\.n_bins"),
    (("models", "knn_k"), "many", r"rankcal\.models\.knn_k"),
])
def test_bad_parameter_names_the_key(path, value, key):
    raw = copy.deepcopy(base_raw())
    raw[path[0]][path[1]] = value
    with pytest.raises(ParameterError, match=key):
        parse("rankcal", raw)


@pytest.mark.parametrize("key,value,pattern", [
    ("plot_seed", 7, r"plot_seed: 7"),
    ("rank_disagreement_datasets", ["glass"], r"rank_disagreement_datasets: \['glass'\]"),
])
def test_inconsistent_parameters_name_the_key(key, value, pattern):
    raw = copy.deepcopy(base_raw())
    raw[key] = value
    with pytest.raises(ParameterError, match=pattern):
        parse("rankcal", raw)


def test_base_parameters_are_valid_and_claims_declared():
    p = parse("rankcal", base_raw())
    assert len(p.claims) >= 10 and p.seeds == [0, 1, 2]


@pytest.mark.e2e
def test_end_to_end(run_pipeline):
    result = run_pipeline("rankcal")
    report = result.report
    assert report["env"] == "test"
    v = report["variants"]
    for model in ("pl_lin", "ib_pl", "ib_mallows", "rpc_bt", "rankings_as_classes", "neural_pl",
                  "neural_pl_ts", "uniform"):
        assert f"pl_truth.{model}" in v
        assert "ece_pair_db" in v[f"pl_truth.{model}"] and "ece_top1_conf_db" in v[f"pl_truth.{model}"]
    assert {"demo.q_sub", "demo.q_top", "demo.truth"} <= set(v)
    assert [c["id"] for c in report["claims"]] == [c["id"] for c in base_raw()["claims"]]
    assert "rlhf.spearman_acc_neg_ece_pair_db" in report["metrics"]
    assert {"reliability_pl_truth.png", "hierarchy_demo.png", "rlhf_accuracy_vs_ece.png"} <= set(report["artifacts"])
    # the counterexamples are flagged even at the test env's n = 3000
    assert v["demo.q_top"]["ece_pair_db"] > 0.05 > v["demo.q_sub"]["ece_pair_db"]
