"""Tests of `rankcal`: the calibration estimators and the ranking distributions against brute-force
enumeration and closed forms (ties up to rounding included), the models against independent solvers,
one train node per variant, bad parameters, claims that name unplanned datasets, and bad user files.
The end-to-end --env=test run is covered by tests/methods/test_all_pipelines.py (its report is checked
here through the shared ``test_env_run`` fixture)."""

import copy
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.rankcal import calibration as C
from pipelines.rankcal import models as M
from pipelines.rankcal import ranking as R
from pipelines.rankcal.params import Params
from tests.core.test_metrics import bf_ece  # loop-written, tie-aware reference of core's ECE

ROOT = Path(__file__).resolve().parents[2]


def env_raw(env: str = "base") -> dict:
    """conf/base's rankcal parameters, deep-merged with ``env``'s (lists replaced, as Kedro does)."""

    def merge(a, b):
        return {
            k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
            for k, v in {**a, **b}.items()
        }

    raw = yaml.safe_load((ROOT / "conf" / "base" / "parameters_rankcal.yml").read_text())["rankcal"]
    if env != "base":
        raw = merge(raw, yaml.safe_load((ROOT / "conf" / env / "parameters_rankcal.yml").read_text())["rankcal"])
    return raw


def base_raw() -> dict:
    return env_raw("base")


def parse(raw: dict) -> Params:
    return validate(Params, raw, "rankcal")


# ----------------------------------------------------------------- brute-force references
def bf_pl_prob(v, ordering):
    """PL probability by the sequential-choice definition."""
    p, left = 1.0, list(range(len(v)))
    for label in ordering:
        p *= v[label] / sum(v[j] for j in left)
        left.remove(label)
    return p


def bf_marginals(Q_row, m):
    """Pairwise, top-1, top-2 and triple marginals of one table row by enumerating orderings."""
    orders = list(itertools.permutations(range(m)))
    pair = {
        (i, j): sum(q for q, o in zip(Q_row, orders) if o.index(i) < o.index(j))
        for i, j in itertools.combinations(range(m), 2)
    }
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
        disc = sum(
            (orders[a].index(i) < orders[a].index(j)) != (orders[b].index(i) < orders[b].index(j))
            for i, j in itertools.combinations(range(m), 2)
        )
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
    ref_pair = np.mean(
        [
            bf_ece([mg[0][(i, j)] for mg in marg], [o.index(i) < o.index(j) for o in yo], nb)
            for i, j in itertools.combinations(range(m), 2)
        ]
    )
    assert out["ece_pair"] == pytest.approx(ref_pair, abs=1e-12)
    # full-ranking confidence
    conf = Q.max(1)
    hit = [orders[int(np.argmax(Q[r]))] == yo[r] for r in range(n)]
    assert out["ece_full_conf"] == pytest.approx(bf_ece(conf, hit, nb), abs=1e-12)
    # top-1 confidence and class-wise
    t1 = np.array([mg[1] for mg in marg])
    assert out["ece_top1_conf"] == pytest.approx(
        bf_ece(t1.max(1), [t1[r].argmax() == yo[r][0] for r in range(n)], nb), abs=1e-12
    )
    assert out["ece_top1_cw"] == pytest.approx(
        np.mean([bf_ece(t1[:, j], [o[0] == j for o in yo], nb) for j in range(m)]), abs=1e-12
    )
    # ordered top-2 prefix, confidence
    keys = list(itertools.permutations(range(m), 2))
    t2 = np.array([[mg[2][k] for k in keys] for mg in marg])
    assert out["ece_top2_conf"] == pytest.approx(
        bf_ece(t2.max(1), [keys[int(t2[r].argmax())] == yo[r][:2] for r in range(n)], nb), abs=1e-12
    )
    if m == 4:
        assert out["ece_full_cw"] == pytest.approx(
            np.mean([bf_ece(Q[:, k], [yk == k for yk in y], nb) for k in range(24)]), abs=1e-12
        )
        refs = []
        for A in itertools.combinations(range(m), 3):
            subs = list(itertools.permutations(A))
            PA = np.array([[mg[3][(A, sub)] for sub in subs] for mg in marg])
            refs.append(
                bf_ece(
                    PA.max(1), [subs[int(PA[r].argmax())] == tuple(x for x in yo[r] if x in A) for r in range(n)], nb
                )
            )
        assert out["ece_triple_conf"] == pytest.approx(np.mean(refs), abs=1e-12)
    else:
        assert "ece_triple_conf" not in out and "ece_full_cw" in out  # |A| = 3 = m is full calibration


def test_tied_scores_share_a_bin():
    from pipelines.core.metrics import binned_ece, equal_mass_bins

    # a calibrated constant predictor: one bin, so the ECE is |frequency − q| exactly
    s = np.full(500, 0.3)
    hits = np.zeros(500)
    hits[:150] = 1
    assert binned_ece(s, hits[None], 15)[0] == pytest.approx(0.0, abs=1e-15)
    assert len(np.unique(equal_mass_bins(np.r_[np.full(300, 0.5), np.linspace(0, 1, 200)], 15)[:300])) == 1


# Near ties: scores that are mathematically equal but come out one rounding step apart. Each test first
# checks that the scores really differ bitwise (else it would test nothing), then that the estimator
# treats them as one tied score: a constant predictor has one bin, so its ECE is |hit rate − q| exactly.
def _hits_on_the_larger_copies(scores: np.ndarray) -> np.ndarray:
    """Hits exactly on the rows whose score is the larger bitwise copy: splitting the tied scores at
    a quantile edge would then separate hits from misses and inflate the ECE."""
    levels = np.unique(scores)[1:]  # hits on the copies from one level up: the most even split
    hi = min((scores >= lv for lv in levels), key=lambda h: abs(h.mean() - 0.5))
    assert 0.05 < hi.mean() < 0.95, "need both bitwise copies in quantity"
    return hi


def test_ib_mallows_rows_with_the_same_theta_share_a_bin():
    m, n = 4, 400
    rng = np.random.default_rng(11)
    centres = R.perms(m)[rng.integers(0, 24, n)]
    neigh = np.repeat(centres[:, None, :], 15, axis=1)  # all neighbours agree: θ = the cap for every row
    Q, theta = M.ib_mallows_table(neigh, m, 5.0)
    assert np.all(theta == theta[0])
    g = C.notion_groups(Q, m, "top1_conf")
    scores, first = g.scores[0], g.target[0]
    assert len(np.unique(scores)) > 1 and np.ptp(scores) < 1e-15  # one rounding step apart
    np.testing.assert_array_equal(first, centres[:, 0])  # the centre's first label is the mode
    hit = _hits_on_the_larger_copies(scores)
    # observed ranking: the centre (its first label hits) or the centre with its top two swapped (misses)
    swapped = centres.copy()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]
    y = R.perm_index(np.where(hit[:, None], centres, swapped))
    out, _ = C.calibration_metrics(Q, y, m, n_bins=15, n_debias=0)
    assert out["ece_top1_conf"] == pytest.approx(abs(hit.mean() - scores.mean()), abs=1e-12)
    assert out["ece_top1_conf_db"] == out["ece_top1_conf"]


def test_uniform_predictor_top2_prefix_is_the_lowest_and_scores_tie():
    m, n = 5, 300
    prefixes, lut = R.prefix_lut(m, 2)
    # uniform up to rounding, as float32 storage or a BLAS summation order leaves it (which one depends on
    # the BLAS kernel and its threads, so the rounding is written out): the orderings that start with
    # (0, 1) one step below 1/120
    Q = np.full((n, 120), 1 / 120)
    Q[:, lut == 0] = np.nextafter(1 / 120, 0)
    marg = R.marginal(Q, lut, len(prefixes))
    assert (marg[:, 0] < marg.max(1)).all() and np.ptp(marg) < 1e-15  # 0.049999999999999996 vs 0.05
    assert (marg.argmax(1) != 0).all()  # a plain argmax misses (0, 1)
    g = C.notion_groups(Q, m, "top2_conf")
    assert prefixes[0] == (0, 1) and (g.target == 0).all()  # ties → the lowest prefix, (0, 1)
    rng = np.random.default_rng(12)
    y = rng.integers(0, 120, n)
    out, _ = C.calibration_metrics(Q, y, m, n_bins=15, n_debias=0)
    freq = (lut[y] == 0).mean()
    assert out["ece_top2_conf"] == pytest.approx(abs(freq - g.scores.mean()), abs=1e-12)
    assert out["ece_top1_conf"] == pytest.approx(abs((R.perms(m)[y, 0] == 0).mean() - 0.2), abs=1e-12)
    assert C.proper_scores(Q, y, m)["top1_acc"] == pytest.approx((R.perms(m)[y, 0] == 0).mean())


def test_float32_storage_then_renormalised_keeps_ties():
    m, n = 4, 360
    rng = np.random.default_rng(13)
    # IB-Mallows tables at the θ cap (probabilities from 1 down to e^-30 of the mode), other centres
    Q = R.mallows_table(rng.integers(0, 24, n), np.full(n, 5.0), m)
    Q = Q.astype(np.float32).astype(np.float64)  # stored as float32 ...
    Q /= Q.sum(1, keepdims=True)  # ... and renormalised: sums in other orders
    conf = Q.max(1)
    assert len(np.unique(conf)) > 1 and np.ptp(conf) < 1e-14
    hit = _hits_on_the_larger_copies(conf)
    mode = Q.argmax(1)
    y = np.where(hit, mode, (mode + 1) % 24)
    out, _ = C.calibration_metrics(Q, y, m, n_bins=15, n_debias=0)
    assert out["ece_full_conf"] == pytest.approx(abs(hit.mean() - conf.mean()), abs=1e-12)


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


def _user_raw(tmp_path, names=("toy",)) -> dict:
    raw = copy.deepcopy(base_raw())
    raw["seeds"] = [0]
    raw["data"].update(datasets=[f"file:{n}" for n in names], user_dir=str(tmp_path))
    raw["rank_disagreement_datasets"] = [f"file:{names[0]}"]
    raw["claims"] = []  # the default claims name pl_truth / mallows_truth
    return raw


def _toy_csv(tmp_path, n=40, name="toy"):
    rng = np.random.default_rng(9)
    orders = [",".join(map(str, rng.permutation(4))) for _ in range(n)]
    df = pd.DataFrame({"x_0": rng.normal(size=n), "x_1": rng.normal(size=n), "ranking": orders})
    df.to_csv(tmp_path / f"{name}.csv", index=False)
    return df


def test_user_csv_format_round_trip(tmp_path):
    from pipelines.rankcal.data import make_datasets, unpack

    orders = set(_toy_csv(tmp_path)["ranking"])
    df = make_datasets(parse(_user_raw(tmp_path)))
    assert (df.split == "test").sum() == 12 and set(df.dataset) == {"file:toy"}
    x, o, m = unpack(df)
    assert m == 4 and x.shape == (40, 2) and {",".join(map(str, r)) for r in o} == orders


@pytest.mark.parametrize(
    "mutate,pattern",
    [
        (lambda df: df.drop(columns="ranking"), r"dataset 'file:toy': column 'ranking' is missing"),
        (lambda df: df.drop(columns=["x_0", "x_1"]), r"dataset 'file:toy': no feature column x_\*"),
        (lambda df: df.assign(x_1="abc"), r"dataset 'file:toy': column 'x_1' should be number"),
        (lambda df: df.iloc[:0], r"dataset 'file:toy': 0 rows"),
        (
            lambda df: df.assign(ranking=["0,1,1,3"] + list(df.ranking[1:])),
            r"dataset 'file:toy': column 'ranking', row 0: '0,1,1,3' is not an ordering",
        ),
        (
            lambda df: df.assign(ranking=["a,b,c,d"] + list(df.ranking[1:])),
            r"dataset 'file:toy': column 'ranking' holds 'a,b,c,d'",
        ),
        (
            lambda df: df.assign(ranking=[",".join(map(str, range(7)))] * len(df)),
            r"dataset 'file:toy': column 'ranking' has m = 7 labels",
        ),
    ],
)
def test_bad_user_file_stops_with_one_line_naming_dataset_and_column(tmp_path, mutate, pattern):
    from pipelines.rankcal.data import make_datasets

    mutate(_toy_csv(tmp_path)).to_csv(tmp_path / "toy.csv", index=False)
    with pytest.raises(InputDataError, match=pattern) as exc:
        make_datasets(parse(_user_raw(tmp_path)))
    assert "\n" not in str(exc.value)


def test_missing_user_file_and_missing_user_dir(tmp_path):
    from pipelines.rankcal.data import make_datasets

    with pytest.raises(InputDataError, match=r"dataset 'file:missing': .*missing\.csv not found"):
        make_datasets(parse(_user_raw(tmp_path, ("missing",))))
    raw = _user_raw(tmp_path)
    raw["data"]["user_dir"] = None
    with pytest.raises(ParameterError, match=r"rankcal\.data"):
        parse(raw)


def test_hierarchy_counterexamples_match_the_card():
    from pipelines.rankcal.demo import counterexample, population_calibration_error

    P = R.pl_table(np.log([[0.45, 0.35, 0.20]]))[0]
    np.testing.assert_allclose(P, [0.286, 0.164, 0.242, 0.108, 0.112, 0.088], atol=1.5e-3)
    q_sub = counterexample(P, "q_sub", 0.15, 0.01)
    q_top = counterexample(P, "q_top", 0.15, 0.01)
    np.testing.assert_allclose(q_sub, [0.234, 0.066, 0.392, 0.010, 0.263, 0.035], atol=2e-3)
    np.testing.assert_allclose(q_top, [0.136, 0.314, 0.092, 0.258, 0.112, 0.088], atol=2e-3)
    assert population_calibration_error(q_sub, P)["pop_ece_pair"] == pytest.approx(0, abs=1e-9)
    assert population_calibration_error(q_sub, P)["pop_ece_top1_cw"] == pytest.approx(0.10, abs=1e-9)
    assert population_calibration_error(q_top, P)["pop_ece_top1_cw"] == pytest.approx(0, abs=1e-9)
    assert population_calibration_error(q_top, P)["pop_ece_pair"] == pytest.approx(0.10, abs=1e-9)


def test_infeasible_counterexample_names_the_key():
    from pipelines.rankcal.demo import counterexample

    P = R.pl_table(np.log([[0.45, 0.35, 0.20]]))[0]
    with pytest.raises(ValueError, match=r"rankcal\.demo\.margin"):
        counterexample(P, "q_sub", 0.20, 0.01)


# ----------------------------------------------------------------- parameters
@pytest.mark.parametrize(
    "path,value,key",
    [
        (("demo", "margin"), -0.1, r"rankcal\.demo\.margin"),
        (("data", "datasets"), ["iris", "mnist"], r"rankcal\.data\.datasets"),
        (("models", "variants"), ["neural_pl_ts"], r"rankcal\.models\.variants"),
        (("ece", "n_bins"), 0, r"rankcal\.ece\.n_bins"),
        (("models", "knn_k"), "many", r"rankcal\.models\.knn_k"),
    ],
)
def test_bad_parameter_names_the_key(path, value, key):
    raw = copy.deepcopy(base_raw())
    raw[path[0]][path[1]] = value
    with pytest.raises(ParameterError, match=key):
        parse(raw)


@pytest.mark.parametrize(
    "key,value,pattern",
    [
        ("plot_seed", 7, r"plot_seed: 7"),
        ("rank_disagreement_datasets", ["glass"], r"rank_disagreement_datasets: \['glass'\]"),
    ],
)
def test_inconsistent_parameters_name_the_key(key, value, pattern):
    raw = copy.deepcopy(base_raw())
    raw[key] = value
    with pytest.raises(ParameterError, match=pattern):
        parse(raw)


# ----------------------------------------------------------------- claims must name planned variants
@pytest.mark.parametrize(
    "edit,pattern",
    [
        (
            lambda r: r["models"].update(variants=["pl_lin", "ib_pl", "rpc_bt", "neural_pl", "neural_pl_ts"]),
            r"claim 'ib_mallows_calibrated_on_mallows': .*names model 'ib_mallows', which is not in models\.variants",
        ),
        (
            lambda r: r["claims"].append(
                {
                    "id": "x",
                    "text": "t",
                    "metric": "variants.digits5.rankings_as_classes.nll",
                    "op": "<=",
                    "threshold": 1.0,
                }
            ),
            r"claim 'x': .*m <= models\.rac_max_m = 4",
        ),
        (
            lambda r: r["claims"].append(
                {"id": "x", "text": "t", "metric": "variants.demo.q_mid.ece_pair_db", "op": "<=", "threshold": 1.0}
            ),
            r"claim 'x': .*demo predictor 'q_mid'",
        ),
    ],
)
def test_claims_naming_models_the_run_does_not_fit_are_refused(edit, pattern):
    raw = copy.deepcopy(base_raw())
    edit(raw)
    with pytest.raises(ParameterError, match=r"^parameter rankcal: Value error, " + pattern) as exc:
        parse(raw)
    assert "\n" not in str(exc.value) and "parameters_rankcal.yml" in str(exc.value)


@pytest.mark.parametrize(
    "edit,pattern",
    [
        (
            lambda r: r["data"].update(datasets=["diabetes"]) or r.update(rank_disagreement_datasets=["diabetes"]),
            r"claim 'pl_lin_calibrated_when_well_specified': metric 'variants\.pl_truth\.pl_lin\.max_ece_db' "
            r"names variant 'pl_truth', which this run does not plan",
        ),
        (
            lambda r: (
                r["data"].update(datasets=["iris", "wine", "pl_truth"]) or r.update(rank_disagreement_datasets=["iris"])
            ),
            r"claim 'pl_lin_miscalibrated_when_misspecified': .*names variant 'mallows_truth'",
        ),
        (
            lambda r: r["rlhf"].update(enabled=False),
            r"gate 'reward_models_learn': metric 'rlhf\.best_accuracy' is produced by no variant or derived-metric",
        ),
        (
            lambda r: r["claims"].append(
                {"id": "x", "text": "t", "metric": "rank_disagreement.iris", "op": "<=", "threshold": 1.0}
            ),
            r"claim 'x': metric 'rank_disagreement\.iris' is "
            r"produced by no variant",
        ),
    ],
)
def test_claims_naming_unplanned_datasets_or_studies_are_refused_before_the_run(edit, pattern):
    from pipelines.rankcal.spec import SPEC

    raw = copy.deepcopy(base_raw())
    edit(raw)
    with pytest.raises(ParameterError, match=pattern) as exc:
        SPEC.check(parse(raw))
    assert "\n" not in str(exc.value)


def test_dataset_list_override_that_keeps_the_claimed_datasets_is_valid():
    raw = copy.deepcopy(base_raw())
    raw["data"]["datasets"] = ["iris", "wine", "pl_truth", "mallows_truth"]
    raw["rank_disagreement_datasets"] = ["iris", "wine"]
    assert parse(raw).data.datasets == ["iris", "wine", "pl_truth", "mallows_truth"]


@pytest.mark.e2e
def test_cli_refuses_a_run_whose_claims_name_datasets_it_does_not_run(e2e_project):
    from tests.conftest import run_kedro

    res = run_kedro(
        e2e_project,
        "rankcal",
        "test",
        ["--params", "rankcal.data.datasets=[diabetes],rankcal.rank_disagreement_datasets=[diabetes]"],
    )
    assert res.exit_code != 0
    assert "claim 'pl_lin_calibrated_when_well_specified'" in res.output and "'pl_truth'" in res.output
    assert "Traceback" not in res.output and "Running node" not in res.output


# ----------------------------------------------------------------- one node per dataset
def _pipeline_for(monkeypatch, raw: dict):
    from pipelines.core.registry import load_pipeline

    monkeypatch.setattr("pipelines.core.registry.method_config", lambda method, *a, **k: raw)
    return load_pipeline("rankcal")


def test_one_train_node_per_dataset_the_demo_and_each_reward_model(monkeypatch):
    raw = copy.deepcopy(base_raw())
    raw["data"]["datasets"] = [*raw["data"]["datasets"], "file:toy"]
    raw["data"]["user_dir"] = "nowhere"
    pipe = _pipeline_for(monkeypatch, raw)
    names = {n.name for n in pipe.only_nodes_with_tags("train").nodes}
    assert names == {"rankcal.train.demo", "rankcal.train.file_toy"} | {
        f"rankcal.train.{d}" for d in base_raw()["data"]["datasets"]
    } | {f"rankcal.train.rm_{r['name']}" for r in raw["rlhf"]["models"]}
    assert {n.name for n in pipe.nodes} - names == {
        "rankcal.data.label_rankings",
        "rankcal.evaluate.plots",
        "rankcal.evaluate.report",
    }


def test_pipeline_follows_the_planned_datasets_and_study(monkeypatch):
    raw = copy.deepcopy(base_raw())
    raw["data"]["datasets"] = ["pl_truth"]
    raw["rank_disagreement_datasets"] = ["pl_truth"]
    raw["rlhf"]["enabled"] = False
    raw["claims"], raw["gates"] = [], []
    names = {n.name for n in _pipeline_for(monkeypatch, raw).only_nodes_with_tags("train").nodes}
    assert names == {"rankcal.train.pl_truth", "rankcal.train.demo"}


def _small() -> Params:
    raw = copy.deepcopy(env_raw("test"))
    raw["data"]["datasets"] = ["pl_truth", "mallows_truth"]
    raw["rank_disagreement_datasets"] = ["pl_truth"]
    return parse(raw)


def test_model_fits_are_deterministic_and_temperature_scaling_reads_neural_pl():
    from pipelines.rankcal.data import make_datasets
    from pipelines.rankcal.train import fit_dataset

    p = _small()
    df = make_datasets(p)
    d = df[(df.dataset == "pl_truth") & (df.seed == 0)]
    a, b = fit_dataset(d, p, 0), fit_dataset(d, p, 0)
    assert list(a) == p.models.variants
    for model in a:
        for key, t in a[model].items():
            assert torch_equal(t, b[model][key]), (model, key)
    e, t = a["neural_pl"], a["neural_pl_ts"]
    T = float(t["temperature"])
    assert T != 1.0 and len(e["scores_hold"]) == 40  # 20% of the 200 training rows held out
    np.testing.assert_allclose(t["Q"].numpy(), R.pl_table(e["scores"].numpy() / T), rtol=1e-12)
    assert t["Q"].dtype == e["Q"].dtype and str(t["Q"].dtype) == "torch.float64"


def test_dataset_node_reports_every_model_as_its_own_variant():
    from pipelines.rankcal.data import make_datasets
    from pipelines.rankcal.train import train_variant

    p = _small()
    table, arts = train_variant(make_datasets(p), p, variant="pl_truth")
    assert list(dict.fromkeys(table["variant"])) == [f"pl_truth.{m}" for m in p.models.variants]
    assert table["value"].notna().all() and table["step"].isna().all()
    temps = table[table.metric == "temperature"]
    assert set(temps["variant"]) == {"pl_truth.neural_pl_ts"}
    assert set(arts["Q"]) == set(p.models.variants) and arts["m"] == 4 and len(arts["y"]) == 150
    assert set(arts["bootstrap"]) == {f"pl_truth.{m}" for m in p.models.variants}


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_report_of_the_test_env_run(test_env_run):
    report = test_env_run("rankcal").report
    v = report["variants"]
    for model in base_raw()["models"]["variants"]:
        assert "ece_pair_db" in v[f"pl_truth.{model}"] and "ece_top1_conf_db" in v[f"pl_truth.{model}"]
    assert {"demo.q_sub", "demo.q_top", "demo.truth"} <= set(v)
    assert [c["id"] for c in report["claims"]] == [c["id"] for c in base_raw()["claims"]]
    assert [g["id"] for g in report["gates"]] == ["estimators_pass_the_truth", "reward_models_learn"]
    assert "rlhf.spearman_acc_neg_ece_pair_db" in report["metrics"]
    assert set(report["bootstrap_ci"]["ci"]) == {
        f"{d}.{m}" for d in ("pl_truth", "mallows_truth") for m in base_raw()["models"]["variants"]
    } | {f"linnerud.{m}" for m in base_raw()["models"]["variants"]}
    assert {"reliability_pl_truth.png", "hierarchy_demo.png", "rlhf_accuracy_vs_ece.png"} <= set(report["artifacts"])
    # the counterexamples are flagged even at the test env's n = 3000
    assert v["demo.q_top"]["ece_pair_db"] > 0.05 > v["demo.q_sub"]["ece_pair_db"]
