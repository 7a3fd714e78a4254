"""Tests of `hobit`: the batch objective against brute force (monotone submodular on every small ground
set, checked exhaustively; the all-members ablation is not), greedy against the brute-force optimum and
against a naive greedy, the epoch re-ordering's invariants, the score graph against a dense top-M, the
retrieval metrics against sklearn, InfoNCE against a numpy log-sum-exp, and bad input (the end-to-end
--env=test run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.hobit import batching as B
from pipelines.hobit.params import Params

RAW = {
    "seeds": [0],
    "threads": 1,
    "data": {"n_topics": 3, "n_subtopics": 2, "n_facts": 16, "n_test_facts": 16, "n_val_facts": 8},
    "model": {"batch_size": 8, "epochs": 2},
    "graph": {"knn_m": 8, "refresh_every": 1},
    "baselines": {"b3_k": 3, "walk_k": 3},
    "variants": {
        "hobit": {"batcher": "hobit"},
        "random": {"batcher": "random"},
        "ance": {"batcher": "random", "mining": True},
    },
    "checks": {"n_instances": 2, "ground": 4},
}


def naive_F(a_fwd, a_rev, S, phi):
    """F_A(S) written from the card's formula term by term: a_fwd[i][j] = a_ij (anchor i, member j),
    a_rev[j][i] = a_ji (member j as query, anchor i as document)."""
    total = 0.0
    for i in range(len(a_fwd)):
        total += phi(sum(a_fwd[i][j] for j in S))
    for j in S:
        total += phi(sum(a_rev[j][i] for i in range(len(a_fwd))))
    return total


def naive_all_members(w, Bset, phi):
    return sum(phi(sum((w[i][j] + w[j][i]) / 2 for j in Bset if j != i)) for i in Bset)


def subsets(n):
    return [frozenset(c) for r in range(n + 1) for c in itertools.combinations(range(n), r)]


def weights(rng, rows, cols):
    return np.exp(rng.normal(-1, 1.5, (rows, cols))) * (rng.random((rows, cols)) < 0.7)


# ------------------------------------------------------------------------------- objective (card)
def test_anchor_objective_matches_the_formula():
    rng = np.random.default_rng(1)
    for phi_name, phi in (("log", math.log1p), ("linear", lambda z: z)):
        W, R = weights(rng, 3, 6), weights(rng, 6, 3)
        v = R.sum(1)
        for S in subsets(6):
            assert B.anchor_objective(W, v, S, phi_name) == pytest.approx(naive_F(W, R, S, phi), rel=1e-12, abs=1e-12)


def test_default_objective_is_monotone_submodular_exhaustively():
    """Every S ⊆ T ⊆ V (|V| = 6) and x ∉ T, on 40 random instances: F(S+x) − F(S) ≥ F(T+x) − F(T) ≥ 0."""
    rng = np.random.default_rng(2)
    V = range(6)
    checked = 0
    for _ in range(40):
        W, R = weights(rng, 3, 6), weights(rng, 6, 3)
        F = {S: naive_F(W, R, S, math.log1p) for S in subsets(6)}
        for T in F:
            for S in (s for s in F if s <= T):
                for x in V:
                    if x in T:
                        continue
                    gs, gt = F[S | {x}] - F[S], F[T | {x}] - F[T]
                    assert gt >= -1e-12
                    assert gs >= gt - 1e-12, (S, T, x)
                    checked += 1
    assert checked > 40 * 600


def test_all_members_objective_is_not_submodular():
    rng = np.random.default_rng(3)
    bad = 0
    for _ in range(10):
        w = weights(rng, 6, 6)
        F = {S: naive_all_members(w, S, math.log1p) for S in subsets(6)}
        for S in F:
            assert B.all_members_objective(w, S) == pytest.approx(F[S], abs=1e-12)
        for T in F:
            for S in (s for s in F if s < T):
                for x in set(range(6)) - T:
                    bad += F[S | {x}] - F[S] < F[T | {x}] - F[T] - 1e-12
    assert bad > 0


def _entries(W):
    r, c = np.nonzero(W)
    return r, c, W[r, c]


def test_greedy_reaches_one_minus_1_over_e_of_brute_force_and_equals_naive_greedy():
    rng = np.random.default_rng(4)
    ratios = []
    for _ in range(60):
        W, R = weights(rng, 3, 8), weights(rng, 8, 3)
        v = R.sum(1)
        chosen, value = B.greedy_members(*_entries(W), v, 3, 3)
        # naive greedy on the independent formula (first maximiser on ties)
        S = []
        for _ in range(3):
            gains = [
                naive_F(W, R, S + [c], math.log1p) - naive_F(W, R, S, math.log1p) if c not in S else -1
                for c in range(8)
            ]
            S.append(int(np.argmax(gains)))
        assert chosen == S
        assert value == pytest.approx(naive_F(W, R, chosen, math.log1p))
        best = max(naive_F(W, R, list(c), math.log1p) for c in itertools.combinations(range(8), 3))
        ratios.append(value / best)
    assert min(ratios) >= 1 - 1 / math.e
    assert max(ratios) <= 1 + 1e-12


def test_all_members_greedy_equals_naive_greedy():
    """The ablation's incremental greedy (sparse rows added as members join) picks what a naive greedy on
    the all-members formula picks."""
    rng = np.random.default_rng(6)
    n_a, P = 3, 7
    for _ in range(20):
        a = weights(rng, n_a + P, n_a + P)
        np.fill_diagonal(a, 0)
        w = (a + a.T) / 2
        A = list(range(n_a))
        r, c = np.meshgrid(np.arange(n_a), np.arange(P), indexing="ij")
        r, c = r.ravel(), c.ravel()
        t0 = np.array([w[i, A].sum() for i in A])
        chosen, value = B.greedy_all_members(r, c, w[r, n_a + c], t0, P, 3, lambda k: (np.arange(P), w[n_a + k, n_a:]))
        S = []
        for _ in range(3):
            gains = [
                naive_all_members(a, A + [n_a + x for x in S + [k]], math.log1p)
                - naive_all_members(a, A + [n_a + x for x in S], math.log1p)
                if k not in S
                else -1
                for k in range(P)
            ]
            S.append(int(np.argmax(gains)))
        assert chosen == S
        assert value == pytest.approx(naive_all_members(a, A + [n_a + x for x in S], math.log1p))


def test_greedy_skips_conflicting_members():
    rng = np.random.default_rng(5)
    W, v = weights(rng, 2, 6) + 0.1, np.full(6, 0.5)
    conflict = {0: [1, 2], 1: [0], 2: [0], 3: [], 4: [5], 5: [4]}
    chosen, _ = B.greedy_members(*_entries(W), v, 2, 4, conflicts=lambda c: np.array(conflict[c], int))
    for a, b in itertools.combinations(chosen, 2):
        assert b not in conflict[a]


# ----------------------------------------------------------------------------------------- graph
def _graph(n=40, m=10, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, 5, generator=g), dim=1)
    d = torch.nn.functional.normalize(q + 0.5 * torch.randn(n, 5, generator=g), dim=1)
    return q, d, B.knn_graph(q, d, 0.1, m, chunk=7)


def test_knn_graph_matches_dense_top_m():
    q, d, g = _graph()
    S = (q @ d.T).numpy() / 0.1
    np.fill_diagonal(S, -np.inf)
    ref = np.argsort(-S, axis=1, kind="stable")[:, :10]
    np.testing.assert_allclose(g.s, np.take_along_axis(S, ref, 1), rtol=1e-5)
    assert np.array_equal(np.sort(g.idx, 1), np.sort(ref, 1))
    np.testing.assert_allclose(g.s_pos, np.diag((q @ d.T).numpy()) / 0.1, rtol=1e-5)


def test_hobit_graph_weights_and_symmetric_filter():
    q, d, g = _graph()
    groups = np.arange(40) // 2  # pairs (0,1), (2,3), ... are known duplicates
    delta = 0.5
    h = B.hobit_graph(g, delta, 30.0, groups)
    S = (q @ d.T).double().numpy() / 0.1
    plausible = S >= np.diag(S)[:, None] - delta  # plausible[i, j]: d_j a plausible positive for q_i
    contra = {(i, j) for i in range(40) for j in g.idx[i] if plausible[i, j] or plausible[j, i]}
    contra |= {(i, j) for i in range(40) for j in range(40) if i != j and groups[i] == groups[j]}
    contra |= {(j, i) for i, j in contra}
    for i in range(40):
        assert set(h.contra.row(i)) == {j for (a, j) in contra if a == i}
        for k, j in enumerate(g.idx[i]):
            want = 0.0 if (i, j) in contra else math.exp(g.s[i, k] - g.s_pos[i])
            assert h.a[i, k] == pytest.approx(want)
    # reverse lists hold a_ci for every query c whose list holds i
    for i in range(40):
        got = dict(zip(h.rev.row(i), h.rev.row_data(i)))
        want = {c: h.a[c, k] for c in range(40) for k in range(10) if g.idx[c, k] == i}
        assert got.keys() == want.keys() and all(got[c] == pytest.approx(want[c]) for c in want)
    assert B.hobit_graph(g, None, 30.0).contra.indices.size == 0


def test_hobit_epoch_partitions_filters_and_reports_F():
    _, _, g = _graph(n=64, m=12, seed=1)
    groups = np.arange(64) // 2
    h = B.hobit_graph(g, None, 30.0, groups)
    batches, F, forced = B.hobit_epoch(h, 8, np.random.default_rng(0))
    allx = np.concatenate(batches)
    assert len(batches) == 8 and all(len(b) == 8 for b in batches)
    assert len(np.unique(allx)) == 64
    assert forced == 0
    for bt in batches:  # no batch holds both members of a duplicate pair
        assert len(np.unique(groups[bt])) == len(bt)
    # F of each batch, recomputed densely from a for its anchors (first half) and members (second half)
    dense = np.zeros((64, 64))
    for i in range(64):
        dense[i, g.idx[i]] = h.a[i]
    for bt, f in zip(batches, F):
        A, S = bt[:4], bt[4:]
        want = np.log1p(dense[np.ix_(A, S)].sum(1)).sum() + np.log1p(dense[np.ix_(S, A)].sum(1)).sum()
        assert f == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_hobit_epoch_all_members_ablation_reports_its_objective():
    _, _, g = _graph(n=48, m=10, seed=2)
    h = B.hobit_graph(g, None, 30.0, np.arange(48) // 2)
    batches, F, _ = B.hobit_epoch(h, 8, np.random.default_rng(1), objective="all_members")
    dense = np.zeros((48, 48))
    for i in range(48):
        dense[i, g.idx[i]] = h.a[i]
    assert len(np.unique(np.concatenate(batches))) == 48
    for bt, f in zip(batches, F):
        assert f == pytest.approx(B.all_members_objective(dense, bt), rel=1e-9)


def test_score_filter_matches_dense_brute_force_in_both_directions():
    """The score filter against a brute force on the dense N×N scores: (i, j) is contradictory when d_j is a
    plausible positive for q_i (S_ij ≥ S_ii − δ) or d_i one for q_j (S_ji ≥ S_jj − δ). N = 60, M = 10, with a
    near-duplicate pair (0, 1); many reverse contradictions have i outside j's top-M."""
    import torch

    n, m, tau, delta = 60, 10, 0.1, 0.5
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(n, 5, generator=gen), dim=1)
    d = torch.nn.functional.normalize(q + 0.5 * torch.randn(n, 5, generator=gen), dim=1)
    q[1] = torch.nn.functional.normalize(q[0] + 0.01 * torch.randn(5, generator=gen), dim=0)
    d[1] = torch.nn.functional.normalize(d[0] + 0.01 * torch.randn(5, generator=gen), dim=0)
    g = B.knn_graph(q, d, tau, m, chunk=7)
    h = B.hobit_graph(g, delta, 30.0)

    S = (q @ d.T).double().numpy() / tau
    margin = S - np.diag(S)[:, None] + delta
    np.fill_diagonal(margin, 1.0)
    assert np.abs(margin).min() > 1e-4  # no pair on the threshold (float32 rounding)
    plausible = margin >= 0
    np.fill_diagonal(plausible, False)
    dense = plausible | plausible.T
    fwd = np.zeros((n, n), bool)  # fwd[i, j]: j in i's top-M
    fwd[np.repeat(np.arange(n), m), g.idx.ravel()] = True
    edge = fwd | fwd.T
    reverse_only = fwd & ~fwd.T & plausible.T & ~plausible  # d_i plausible for q_j, i outside j's top-M
    assert reverse_only.any()  # the instance exercises the reverse test
    for i in range(n):
        for k, j in enumerate(g.idx[i]):
            want = 0.0 if dense[i, j] else math.exp(S[i, j] - S[i, i])
            assert h.a[i, k] == pytest.approx(want, rel=1e-5), (i, j)
        # the sparse filter sees the pairs of the graph (either direction), the brute force every pair
        assert set(h.contra.row(i)) == set(np.flatnonzero(dense[i] & edge[i])), i


@pytest.mark.parametrize("make", ["random", "cluster", "walk"])
def test_baseline_batchers_partition(make):
    rng = np.random.default_rng(0)
    _, _, g = _graph(n=50, m=6)
    if make == "random":
        batches = B.random_batches(50, 8, rng)
    elif make == "cluster":
        batches = B.cluster_batches(rng.integers(0, 5, 50), 8, rng)
    else:
        batches = B.walk_batches(g.idx[:, :3], 8, 0.2, rng)
    allx = np.concatenate(batches)
    assert len(batches) == 6 and all(len(b) == 8 for b in batches) and len(np.unique(allx)) == 48


def test_mined_negatives_come_from_the_rank_window():
    _, _, g = _graph(n=30, m=10)
    mined = B.mine_negatives(g, 3, 6, np.random.default_rng(0))
    for i in range(30):
        assert mined[i] in set(g.idx[i, 2:6]) and mined[i] != i


def test_false_negative_counts():
    facts = np.array([0, 0, 1, 2, 2, 2, 3, 4])
    pairs, rate = B.false_negatives([np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7])], facts)
    assert pairs == pytest.approx((1 + 1) / 2)  # (0,1) in batch 1; (4,5) in batch 2
    assert rate == pytest.approx(4 / 8)  # queries 0, 1, 4, 5


# ------------------------------------------------------------------------------- loss and metrics
def test_infonce_matches_numpy_logsumexp():
    import torch

    from pipelines.hobit.model import DualEncoder, infonce

    torch.manual_seed(0)
    m = DualEncoder(4, 5, 8, 3)
    q, d, neg = torch.randn(6, 4), torch.randn(6, 5), torch.randn(6, 5)
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[2, 4] = True
    loss, extras = infonce(m, 0.1, q, d, neg, mask)
    with torch.no_grad():
        zq, docs = m.encode_q(q).numpy(), torch.cat([m.encode_d(d), m.encode_d(neg)]).numpy()
    logits = zq @ docs.T / 0.1
    logits[2, 10] = -np.inf
    mx = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - mx).sum(1)) + mx[:, 0]
    assert float(loss) == pytest.approx(float(np.mean(lse - logits[np.arange(6), np.arange(6)])), rel=1e-5)
    cos = logits * 0.1
    cos[np.arange(6), np.arange(6)] = -np.inf
    assert float(extras["hardness"]) == pytest.approx(
        float(np.mean(cos.max(1) - np.diag(logits[:, :6] * 0.1))), rel=1e-5
    )


def test_retrieval_metrics_match_sklearn_and_by_hand():
    from sklearn.metrics import ndcg_score

    from pipelines.hobit.retrieval import retrieval_metrics

    rng = np.random.default_rng(0)
    scores = rng.normal(size=(20, 50))
    rel = np.zeros((20, 50), bool)
    rel[np.arange(20), rng.integers(0, 50, 20)] = True
    rel[3, 7] = rel[3, 8] = True  # a query with several relevant documents
    m = retrieval_metrics(scores, rel, (1, 10))
    order = np.argsort(-scores, 1)
    recall10 = np.mean([rel[i, order[i, :10]].sum() / rel[i].sum() for i in range(20)])
    recall1 = np.mean([rel[i, order[i, 0]] / rel[i].sum() for i in range(20)])
    mrr = np.mean([next((1 / (r + 1) for r in range(10) if rel[i, order[i, r]]), 0.0) for i in range(20)])
    assert m["recall_at_10"] == pytest.approx(recall10)
    assert m["recall_at_1"] == pytest.approx(recall1)
    assert m["mrr_at_10"] == pytest.approx(mrr)
    assert m["ndcg_at_10"] == pytest.approx(ndcg_score(rel.astype(float), scores, k=10))


def test_chunked_encoder_evaluation_matches_dense_metrics():
    import torch

    from pipelines.hobit.model import DualEncoder
    from pipelines.hobit.retrieval import evaluate_encoder, retrieval_metrics

    rng = np.random.default_rng(1)
    torch.manual_seed(0)
    model = DualEncoder(4, 4, 8, 3)
    arrays = {
        "q_test": rng.normal(size=(30, 4)).astype(np.float32),
        "corpus": rng.normal(size=(80, 4)).astype(np.float32),
        "fact_test": np.arange(30),
        "fact_corpus": np.r_[np.arange(30), np.arange(5), rng.integers(100, 200, 45)],
    }
    got = evaluate_encoder(model, arrays, torch.device("cpu"))
    with torch.no_grad():
        qe, ce = model.encode_q(torch.tensor(arrays["q_test"])), model.encode_d(torch.tensor(arrays["corpus"]))
        scores = (qe @ ce.T).numpy()
    want = retrieval_metrics(scores, arrays["fact_test"][:, None] == arrays["fact_corpus"][None, :])
    assert got == pytest.approx(want)


# ------------------------------------------------------------------------------------ the variants
def test_variants_share_epoch_zero_and_step_count():
    import torch

    from pipelines.hobit.data import make_pairs, seed_arrays
    from pipelines.hobit.model import DualEncoder
    from pipelines.hobit.train import EpochBatcher, train_variant

    p = Params.model_validate(RAW)
    pairs = make_pairs(p)
    arr = seed_arrays(pairs, 0)
    q, d = torch.tensor(arr["q_train"]), torch.tensor(arr["d_train"])
    model = DualEncoder(q.shape[1], d.shape[1], 8, 4)
    first = {}
    for v in p.variants:
        eb = EpochBatcher(p.variants[v], p, model, q, d, arr["fact_train"], 0, lambda: 0.0)
        eb.build(0)
        first[v] = np.concatenate(eb.batches)
    assert all(np.array_equal(first["hobit"], x) for x in first.values())
    steps = {}
    for v in ("hobit", "ance"):
        table, arts = train_variant(pairs, p, v)
        steps[v] = float(table.loc[(table["metric"] == "steps") & table["step"].isna(), "value"].iloc[0])
        assert (
            set(arts["encoders"]) == {"0"}
            and len(arts["batches"]["example"]) == p.model.epochs * (len(q) // p.model.batch_size) * p.model.batch_size
        )
    assert steps["hobit"] == steps["ance"] == p.model.epochs * (len(q) // p.model.batch_size)


# -------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "patch, key",
    [
        ({"variants": {"hobit": {"batcher": "shuffle"}}}, r"hobit\.variants\.hobit\.batcher"),
        ({"model": {"batch_size": 7}}, r"hobit\.model\.batch_size"),
        ({"hobit": {"delta_cos": -0.1}}, r"hobit\.hobit\.delta_cos"),
        ({"graph": {"knn_m": True}}, r"hobit\.graph\.knn_m"),
        ({"data": {"n_topics": 1, "n_subtopics": 1, "n_facts": 8, "n_test_facts": 8}}, r"hobit\.data.*n_test_facts"),
        ({"variants": {"hobit": {"batcher": "hobit", "phi": "sqrt"}}}, r"hobit\.variants\.hobit\.phi"),
    ],
)
def test_bad_parameter_names_the_key(patch, key):
    with pytest.raises(ParameterError, match=key):
        validate(Params, {**RAW, **patch}, "hobit")


def test_claim_on_a_missing_variant_is_rejected():
    from pipelines.hobit.spec import SPEC

    claim = {"id": "x", "text": "x", "metric": "diff.recall_at_1.hobit_minus_kmeans", "op": ">=", "threshold": 0}
    with pytest.raises(ParameterError, match="hobit_minus_kmeans"):
        SPEC.check(validate(Params, {**RAW, "claims": [claim]}, "hobit"))


def _user_table():
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "split": ["train"] * 6 + ["test"] * 2,
            "fact": [0, 0, 1, 2, 3, 4, 5, 6],
            "q": list(rng.normal(size=(8, 4))),
            "d": list(rng.normal(size=(8, 4))),
        }
    )


def test_user_pairs_load(tmp_path):
    from pipelines.hobit.data import make_pairs, seed_arrays

    path = tmp_path / "pairs.parquet"
    _user_table().to_parquet(path)
    p = Params.model_validate({**RAW, "data": {"user_path": str(path)}})
    df = make_pairs(p)
    assert len(df) == 8 and set(df["split"]) == {"train", "val", "test"}  # val carved from train
    arr = seed_arrays(df, 0)
    assert len(arr["q_train"]) + len(arr["q_val"]) == 6 and len(arr["q_val"]) >= 1 and len(arr["corpus"]) == 8
    assert np.array_equal(np.sort(arr["fact_corpus"]), [0, 0, 1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize(
    "mutate, column",
    [
        (lambda df: df.drop(columns="fact"), "fact"),
        (lambda df: df.assign(split=["train"] * 7 + ["valid"]), "split"),
        (lambda df: df.assign(q=[np.zeros(4)] * 7 + [np.zeros(3)]), "q"),
        (lambda df: df.assign(d=[np.full(4, np.nan)] * 8), "d"),
    ],
)
def test_bad_user_file_names_dataset_and_column(tmp_path, mutate, column):
    from pipelines.hobit.data import make_pairs

    path = tmp_path / "pairs.parquet"
    mutate(_user_table()).to_parquet(path)
    p = Params.model_validate({**RAW, "data": {"user_path": str(path)}})
    with pytest.raises(InputDataError, match=rf"hobit\.data\.user_path.*column '{column}'"):
        make_pairs(p)


@pytest.mark.parametrize(
    "metric",
    [
        "diff.recall_at_1.random_minus_ance",
        "diff.recall_at_1.hobit_minus_best_heuristic",
        "variants.kmeans.recall_at_1",
        "speedup.hobit",
    ],
)
def test_claim_on_an_unplanned_metric_is_rejected(metric):
    """The declared differences are exactly the planned pairs: a claim on any other stops before the run."""
    from pipelines.hobit.spec import SPEC

    claim = {"id": "x", "text": "x", "metric": metric, "op": ">=", "threshold": 0}
    with pytest.raises(ParameterError, match="claim 'x'"):
        SPEC.check(validate(Params, {**RAW, "claims": [claim]}, "hobit"))


def test_report_has_every_planned_claim_metric():
    from pipelines.core.spec import Results, SeedValues, compute_derived
    from pipelines.hobit.checks import objective_checks
    from pipelines.hobit.spec import SPEC

    raw = {
        **RAW,
        "seeds": [0, 1],
        "variants": {
            **RAW["variants"],
            "kmeans": {"batcher": "kmeans"},
            "hobit_nofilter": {"batcher": "hobit", "filter": "none"},
        },
    }
    p = Params.model_validate(raw)
    tables = {
        v: Results(v)
        .add(0, recall_at_1=i / 10, mrr_at_10=i / 9, fn_per_batch=float(i), val_late_rise=i / 100)
        .add(1, recall_at_1=i / 10 + 0.01, mrr_at_10=i / 9, fn_per_batch=float(i), val_late_rise=i / 50)
        .table()
        for i, v in enumerate(p.variants)
    }
    values = SeedValues(tables)
    checks = objective_checks(p)
    point, per_seed = compute_derived(SPEC, p, values, list(p.variants), {"checks": checks})
    assert SPEC.extra(p, values, {}, checks)["best_heuristic"] == "kmeans"
    assert per_seed["diff.recall_at_1.hobit_minus_best_heuristic"] == {0: pytest.approx(-0.3), 1: pytest.approx(-0.3)}
    assert per_seed["diff.fn_per_batch.hobit_nofilter_minus_hobit"] == {0: 4.0, 1: 4.0}
    assert point["greedy.min_ratio_to_brute_force"] == checks["greedy.min_ratio_to_brute_force"]
    last = len(p.variants) - 1  # the convergence gate reads the worst variant's seed mean
    assert point["convergence.max_val_late_rise"] == pytest.approx((last / 100 + last / 50) / 2)
    assert set(point) | set(per_seed) == SPEC.derived_names(p, list(p.variants))


def test_missing_user_file_names_the_dataset(tmp_path):
    from pipelines.hobit.data import make_pairs

    p = Params.model_validate({**RAW, "data": {"user_path": str(tmp_path / "nope.parquet")}})
    with pytest.raises(InputDataError, match=r"hobit\.data\.user_path .*nope\.parquet.*file not found"):
        make_pairs(p)


# ------------------------------------------------------------- validation split and convergence (issue 22)
def test_validation_facts_are_held_out_and_in_the_corpus():
    from pipelines.hobit.data import make_pairs, seed_arrays

    p = Params.model_validate(RAW)
    df = make_pairs(p)
    facts = {s: set(df.loc[df["split"] == s, "fact"]) for s in ("train", "val", "test")}
    assert len(facts["val"]) == 8 and len(facts["test"]) == 16
    assert not facts["val"] & facts["train"] and not facts["val"] & facts["test"]
    arr = seed_arrays(df, 0)
    assert len(arr["q_val"]) == 8 and set(arr["fact_val"]) <= set(arr["fact_corpus"])
    assert len(arr["corpus"]) == len(df)  # train + val + test documents


def test_user_pairs_without_val_get_a_carved_validation_split():
    from pipelines.hobit.data import carve_val

    df = pd.DataFrame({"split": ["train"] * 8 + ["test"] * 2, "fact": [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]})
    out = carve_val(df, 100)
    val = set(out.loc[out["split"] == "val", "fact"])
    assert len(val) == 7 // 4 and set(out.loc[out["split"] == "test", "fact"]) == {7, 8}
    assert all((out.loc[out["fact"] == f, "split"] == "val").all() for f in val)  # duplicates move together


def test_late_rise_is_the_fitted_rise_over_the_last_window():
    from pipelines.hobit.train import late_rise

    assert late_rise([0.3] * 10, 0.2) == pytest.approx(0.0)
    ramp = list(np.linspace(0.0, 0.9, 10))  # +0.1 per epoch
    assert late_rise(ramp, 0.2) == pytest.approx(0.2)  # the last 2 of 10 epochs: from epoch 7 to 9
    rng = np.random.default_rng(0)
    noisy = list(0.4 + 0.02 * rng.standard_normal(30))
    y = np.asarray(noisy[23:])
    assert late_rise(noisy, 0.2) == pytest.approx(np.polyfit(np.arange(7), y, 1)[0] * 6)


def test_early_stopping_reads_validation_and_stops():
    from pipelines.hobit.data import make_pairs
    from pipelines.hobit.train import train_variant

    raw = {**RAW, "model": {**RAW["model"], "epochs": 12, "patience": 1, "lr": 0.05}}
    p = Params.model_validate(raw)
    table, _ = train_variant(make_pairs(p), p, "random")
    final = table[table["step"].isna()].set_index("metric")["value"]
    curve = table[(table["metric"] == "val_recall_at_1") & table["step"].notna()]["value"].to_numpy()
    assert final["epochs_run"] == len(curve) and final["val_recall_at_1"] == pytest.approx(curve.max())
    assert final["best_epoch"] == int(np.argmax(curve))
    assert final["steps"] == final["epochs_run"] * (final["steps"] / final["epochs_run"])
