"""Tests of `engram`: the closed-form estimator against independent references (numpy least squares and
pinv, autograd for the natural-gradient step), its constraints to numerical precision, the linear
arithmetic on a trained MLP (compose then erase returns W; erase{a,b} = W − E_a − E_b; the composition of
every engram equals W on the data's span), the iterative baselines' budget and lr rule, the results
table and the derived metrics declared on it, bad parameters and bad user tables. The end-to-end --env=test run is covered for every
pipeline by tests/methods/test_all_pipelines.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.engram import estimator as est
from pipelines.engram.model import build_mlp, layer_inputs, logits, weights_of
from pipelines.engram.params import Params

RAW = {
    "seeds": [0],
    "threads": 1,
    "data": {"limit": 200},
    "model": {"hidden": [16, 12], "epochs": 3, "batch_size": 32, "lr": 0.1},
    "engram": {"alpha_points": 3, "n_compose": 2, "timing_repeats": 1},
    "unlearn": {"classes": [3], "steps": 6, "batch_size": 16, "lrs": [0.01, 0.1]},
    "variants": ["engram", "retrain", "grad_ascent"],
}


def params(**over) -> Params:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in RAW.items()}
    for k, v in over.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    return validate(Params, raw, "engram")


def rank_deficient_data(n: int = 240, d: int = 9, C: int = 4, seed: int = 0):
    """Inputs with two dead coordinates (as after ReLU / constant-zero pixels) and a constant 1, so Σ_R is
    singular with a clean spectral gap; labels 0..C−1."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x[:, 2] = 0.0
    x[:, 5] = 0.0
    x[:, -1] = 1.0
    y = rng.integers(0, C, size=n)
    return torch.from_numpy(x), torch.from_numpy(y)


# ------------------------------------------------------------------------------ estimator vs references
def test_engram_is_the_minimum_norm_least_squares_solution():
    """E_S = argmin_E Σ_{x∈R} ‖E x − 1[x∈S] W x‖² (minimum norm), solved independently by numpy.lstsq."""
    x, y = rank_deficient_data()
    W = torch.from_numpy(np.random.default_rng(1).normal(size=(5, x.shape[1])))
    covs = est.class_covariances([W], x, y, 4)
    pinvs, ranks = est.total_pinvs(covs, 1e-10)
    assert ranks == [x.shape[1] - 2]
    for S in ([0], [1, 3], [0, 1, 2, 3]):
        E = est.engram([W], covs, S, pinvs)[0].numpy()
        target = (x.numpy() @ W.numpy().T) * np.isin(y.numpy(), S)[:, None]
        ref = np.linalg.lstsq(x.numpy(), target, rcond=None)[0].T
        np.testing.assert_allclose(E, ref, atol=1e-10, rtol=0)


def test_engram_satisfies_its_constraints_to_numerical_precision():
    """Normal equations E_S Σ_R = W Σ_S, no component outside range(Σ_R), engrams of a partition add up
    to W Σ_R Σ_R⁺, and disjoint subsets add (E_{S∪T} = E_S + E_T)."""
    x, y = rank_deficient_data(seed=3)
    W = torch.from_numpy(np.random.default_rng(4).normal(size=(6, x.shape[1])))
    covs = est.class_covariances([W], x, y, 4)
    pinvs, _ = est.total_pinvs(covs, 1e-10)
    sig_r = covs[0].sum(0)
    P = sig_r @ pinvs[0]
    for S in ([2], [0, 3]):
        E = est.engram([W], covs, S, pinvs)[0]
        torch.testing.assert_close(E @ sig_r, W @ est.subset_cov(covs[0], S), atol=1e-9, rtol=0)
        torch.testing.assert_close(E @ (torch.eye(len(P), dtype=P.dtype) - P), torch.zeros_like(E), atol=1e-10, rtol=0)
    parts = [est.engram([W], covs, [c], pinvs)[0] for c in range(4)]
    torch.testing.assert_close(sum(parts), W @ P, atol=1e-10, rtol=0)
    torch.testing.assert_close(est.engram([W], covs, [0, 3], pinvs)[0], parts[0] + parts[3], atol=1e-10, rtol=0)
    # the dead input coordinates get no weight at all
    assert float(parts[1][:, [2, 5]].abs().max()) <= 1e-12
    # class_engrams (all classes at once) agrees with the per-subset formula
    torch.testing.assert_close(est.class_engrams([W], covs, pinvs)[0][1], parts[1], atol=1e-12, rtol=0)


def test_engram_is_one_natural_gradient_step_from_zero():
    """Autograd gradient of ½ Σ_R ‖E x − 1[x∈S] W x‖² at E = 0, preconditioned by the K-FAC input factor
    Σ_R⁺ (one step, lr 1), lands on E_S."""
    x, y = rank_deficient_data(seed=5)
    W = torch.from_numpy(np.random.default_rng(6).normal(size=(3, x.shape[1])))
    S = [1, 2]
    covs = est.class_covariances([W], x, y, 4)
    pinvs, _ = est.total_pinvs(covs, 1e-10)
    E0 = torch.zeros_like(W, requires_grad=True)
    inside = torch.isin(y, torch.tensor(S)).double()[:, None]
    loss = 0.5 * ((x @ E0.T - inside * (x @ W.T)) ** 2).sum()
    (grad,) = torch.autograd.grad(loss, E0)
    torch.testing.assert_close(E0.detach() - grad @ pinvs[0], est.engram([W], covs, S, pinvs)[0], atol=1e-9, rtol=0)


def test_psd_pinv_matches_numpy_and_drops_near_null_directions():
    rng = np.random.default_rng(7)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    lam = np.array([10.0, 3.0, 1.0, 1e-3, 1e-7, 0.0])
    sigma = (q * lam) @ q.T
    for rcond, rank in ((1e-6, 4), (1e-2, 3), (1e-12, 5)):
        pinv, r = est.psd_pinv(torch.from_numpy(sigma), rcond)
        assert r == rank
        ref = np.linalg.pinv(sigma, rcond=rcond, hermitian=True)
        np.testing.assert_allclose(pinv.numpy(), ref, atol=1e-8 * max(1.0, np.abs(ref).max()))
    zero, r0 = est.psd_pinv(torch.zeros(3, 3, dtype=torch.float64), 1e-6)
    assert r0 == 0 and float(zero.abs().max()) == 0.0


def test_random_edit_has_the_engram_norm_per_layer_and_pc_projector_is_a_projector():
    gen = torch.Generator().manual_seed(0)
    eng = [torch.randn(4, 5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64) * 7]
    rnd = est.random_like(eng, gen)
    for a, b in zip(rnd, eng, strict=True):
        assert a.shape == b.shape and abs(float(a.norm() - b.norm())) < 1e-12
    x, _ = rank_deficient_data()
    sig = [x[:, :5].T @ x[:, :5], x[:, :4].T @ x[:, :4]]
    rnd_data = est.random_like(eng, gen, sig)
    for a, b, s_ in zip(rnd_data, eng, sig, strict=True):  # equal energy on the data: Σ_x ‖R x‖² = Σ_x ‖E x‖²
        ref = float(torch.trace(b @ s_ @ b.T))
        assert abs(float(torch.trace(a @ s_ @ a.T)) - ref) < 1e-8 * ref
    energy2 = est.data_energy(eng, [s_[None] for s_ in sig]) ** 2  # against the data directly
    assert abs(energy2 - sum(float(((x[:, : e.shape[1]] @ e.T) ** 2).sum()) for e in eng)) < 1e-8 * energy2
    P = est.class_pc_projector(x.T @ x, 3)
    torch.testing.assert_close(P @ P, P, atol=1e-12, rtol=0)
    assert round(float(torch.trace(P))) == 3


def test_estimator_accepts_float32_and_matches_the_float64_result():
    """Every estimator function fed float32 tensors (weights, covariances, pinvs, engrams, Σ) computes in
    float64 and returns float64: the same result as the float64 call on the same (exactly widened) values."""
    x, y = rank_deficient_data(seed=8)
    W = [torch.from_numpy(np.random.default_rng(9).normal(size=(5, x.shape[1])))]
    W32, x32 = [w.float() for w in W], x.float()
    covs32 = [c.float() for c in est.class_covariances(W32, x32, y, 4)]
    covs64 = [c.double() for c in covs32]
    pinvs32, ranks32 = est.total_pinvs(covs32, 1e-10)
    pinvs64, ranks64 = est.total_pinvs(covs64, 1e-10)
    assert ranks32 == ranks64

    def same(got, want):
        got, want = (list(v) if isinstance(v, list) else [v] for v in (got, want))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == torch.float64
            torch.testing.assert_close(g, w, atol=0, rtol=0)

    p32 = [pr.float() for pr in pinvs64]
    W64, p64 = [w.double() for w in W32], [pr.double() for pr in p32]
    same(est.engram(W32, covs32, [1, 2], p32), est.engram(W64, covs64, [1, 2], p64))
    same(est.class_engrams(W32, covs32, p32), est.class_engrams(W64, covs64, p64))
    same(pinvs32, pinvs64)
    e32 = [e.float() for e in est.class_engrams(W64, covs64, pinvs64)[0]]
    e64 = [e.double() for e in e32]
    same(est.cosine_matrix(torch.stack(e32)), est.cosine_matrix(torch.stack(e64)))
    same(est.class_pc_projector(covs32[0][0], 3), est.class_pc_projector(covs64[0][0], 3))
    assert est.data_energy(W32, covs64) == est.data_energy(W64, covs64)
    assert est.data_energy(W64, covs32) == est.data_energy(W64, covs64)
    sig32 = [covs32[0].sum(0)]
    sig64 = [s_.double() for s_ in sig32]
    for sigmas in (None, (sig32, sig64)):
        r32 = est.random_like(W32, torch.Generator().manual_seed(1), None if sigmas is None else sigmas[0])
        r64 = est.random_like(W64, torch.Generator().manual_seed(1), None if sigmas is None else sigmas[1])
        same(r32, r64)


# ------------------------------------------------------------------------- arithmetic on a trained MLP
@pytest.fixture(scope="module")
def trained():
    from pipelines.engram.data import make_dataset
    from pipelines.engram.train import covariances, train_original, train_variant

    p = params()
    data = make_dataset(p)
    original = train_original(data, p)
    covs = covariances(data, original, p)
    _, detail = train_variant(data, original, covs, p, variant="original")
    net = build_mlp(data["n_features"], p.model.hidden, data["n_classes"])
    net.load_state_dict(original["states"]["0"])
    return p, data, original, pd.DataFrame(detail), covs, weights_of(net)


def test_compose_then_erase_returns_the_original_weights(trained):
    p, data, _, _, covs, W = trained
    pinvs, _ = est.total_pinvs(covs["0"], 1e-6)
    for S in ([3], [1, 4, 7]):
        E = est.engram(W, covs["0"], S, pinvs)
        back = est.erase(est.add(W, E), E)
        for a, b in zip(back, W, strict=True):
            assert float((a - b).abs().max()) <= 1e-12 * max(1.0, float(b.abs().max()))
        # composing then erasing the same engram from the zero network returns the zero network
        zero = est.erase(est.compose([E]), E)
        assert max(float(z.abs().max()) for z in zero) <= 1e-12


def test_erase_pair_equals_two_erases_and_add_back_equals_single_erase(trained):
    p, data, _, _, covs, W = trained
    x = data["seeds"]["0"]["x_test"]
    pinvs, _ = est.total_pinvs(covs["0"], 1e-6)
    E3, E7 = est.engram(W, covs["0"], [3], pinvs), est.engram(W, covs["0"], [7], pinvs)
    pair = est.erase(W, est.engram(W, covs["0"], [3, 7], pinvs))
    seq = est.erase(est.erase(W, E3), E7)
    assert float((logits(pair, x) - logits(seq, x)).abs().max()) < 1e-9
    back = est.add(seq, E7)
    assert float((logits(back, x) - logits(est.erase(W, E3), x)).abs().max()) < 1e-9


def test_composing_every_engram_is_the_original_network_on_the_training_span(trained):
    """W_ℓ Σ_R Σ_R⁺ acts as W_ℓ on every training input, so layer by layer the composed network sees the
    original's layer inputs and returns the original's logits on the training set."""
    p, data, _, _, covs, W = trained
    x = data["seeds"]["0"]["x_train"]
    pinvs, _ = est.total_pinvs(covs["0"], 1e-12)
    C = data["n_classes"]
    full = est.compose(est.engram(W, covs["0"], [c], pinvs) for c in range(C))
    ref = logits(W, x)
    assert float((logits(full, x) - ref).abs().max()) <= 1e-6 * float(ref.abs().max())


def test_covariances_come_from_the_original_model_and_add_up(trained):
    p, data, _, _, covs, W = trained
    d = data["seeds"]["0"]
    inputs, _ = layer_inputs(W, d["x_train"].double())
    for h, cov in zip(inputs, covs["0"], strict=True):
        torch.testing.assert_close(cov.sum(0), h.T @ h, atol=1e-9, rtol=1e-12)
    # bias absorption: the constant-1 input's second moment per class is that class's count
    counts = torch.bincount(d["y_train"], minlength=data["n_classes"]).double()
    torch.testing.assert_close(covs["0"][0][:, -1, -1], counts)


def test_engram_variant_table_reports_exact_identities(trained):
    from pipelines.engram.train import train_variant

    p, data, states, _, covs, _ = trained
    table, detail = train_variant(data, states, covs, p, variant="engram")
    df = pd.DataFrame(detail)
    s = df[df.kind == "summary"].set_index("metric").value
    # the results table carries the summary metrics, the per-class ones and the α-sweep curve
    final = table[table.step.isna()].set_index("metric").value
    assert final["forget_acc"] == s["forget_acc"] and final["edit_time_s"] == s["edit_time_s"]
    assert {f"forget_acc_class{c}" for c in range(data["n_classes"])} <= set(final.index)
    assert set(table.variant) == {"engram"}
    alpha = table[table.metric == "alpha_forget_acc"]
    assert alpha.step.tolist() == sorted(alpha.step.tolist()) and alpha.step.iloc[0] == 0
    assert s["arithmetic_max_logit_diff"] < 1e-9 and s["restore_vs_erase_a_max_logit_diff"] < 1e-9
    assert s["roundtrip_max_abs_weight_diff"] < 1e-12
    assert 0 <= s["forget_acc"] <= 1 and s["edit_time_s"] > 0
    # α = 0 is the original network: its forget accuracy is the mean per-class accuracy of the original
    a0 = df[(df.kind == "alpha") & (df.edit == "0") & (df.metric == "forget_acc")].value.iloc[0]
    orig = trained[3]
    base = orig[(orig.kind == "class_acc")].value.mean()
    assert abs(a0 - base) < 1e-12


def test_iterative_baselines_share_the_budget_and_choose_lr_on_training_data(trained, monkeypatch):
    from pipelines.engram import train as T

    p, data, _, _, _, W = trained
    seen = []
    real_fit = T.fit

    def spy(*args, **kw):
        seen.append((kw["steps"], kw["lr"]))
        return real_fit(*args, **kw)

    monkeypatch.setattr(T, "fit", spy)
    split = T._split(data, 0)
    for v in ("grad_ascent", "neggrad_plus", "finetune_retain"):
        res = T.unlearn_one(v, W, data, split, 3, p, 0, curves=True)
        assert res["lr"] in p.unlearn.lrs and res["curve"][0][0] == 0
    assert seen == [(p.unlearn.steps, lr) for _ in range(3) for lr in p.unlearn.lrs]


def test_forget_retain_is_sample_weighted():
    from pipelines.engram.train import forget_retain

    acc = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    counts = torch.tensor([10.0, 30.0, 10.0], dtype=torch.float64)
    assert forget_retain(acc, counts, 2) == (0.0, (10 + 15) / 40)


# ------------------------------------------------------------------------------ pipeline and bad input
@pytest.mark.parametrize(
    "over,key",
    [
        ({"engram": {"rcond": -1.0}}, r"engram\.engram\.rcond"),
        ({"engram": {"arithmetic_pair": [3, 3]}}, r"engram\.engram\.arithmetic_pair"),
        ({"unlearn": {"lrs": []}}, r"engram\.unlearn\.lrs"),
        ({"unlearn": {"classes": [1, 1]}}, r"engram\.unlearn\.classes"),
        ({"model": {"epochs": True}}, r"engram\.model\.epochs"),
        ({"variants": ["engram", "sisa"]}, r"engram\.variants\.1"),
        ({"plot_seed": 4}, r"engram\.plot_seed"),
        ({"data": {"source": "file"}}, r"engram\.data"),
        ({"unlearn": {"step": 5}}, r"engram\.unlearn\.step\b"),
    ],
)
def test_bad_parameter_names_the_key(over, key):
    with pytest.raises(ParameterError, match=key):
        params(**over)


def test_class_missing_from_the_data_names_the_key():
    from pipelines.engram.data import make_dataset

    with pytest.raises(InputDataError, match=r"engram\.unlearn\.classes.*\[12\]"):
        make_dataset(params(unlearn={"classes": [3, 12]}))


def _write(tmp_path, df: pd.DataFrame):
    path = tmp_path / "user.csv"
    df.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    "df,match",
    [
        (
            pd.DataFrame({"x_0": [0.1, 0.2, 0.3, 0.4], "y": [0, 1, 0, 1]}),
            r"'engram\.user_table'.*column 'label' is missing",
        ),
        (
            pd.DataFrame({"label": [0, 1, 0, 1], "x_0": ["a", "b", "c", "d"]}),
            r"'engram\.user_table'.*column 'x_0' should be number",
        ),
        (
            pd.DataFrame({"label": [1, 2, 1, 2], "x_0": [0.1, 0.2, 0.3, 0.4]}),
            r"'engram\.user_table'.*column 'label' must hold",
        ),
        (pd.DataFrame({"label": [0, 1, 0, 1]}), r"'engram\.user_table'.*no feature column"),
    ],
)
def test_bad_user_table_names_dataset_and_column(tmp_path, df, match):
    from pipelines.engram.data import make_dataset

    p = params(data={"source": "file", "path": str(_write(tmp_path, df)), "limit": None})
    with pytest.raises(InputDataError, match=match):
        make_dataset(p)


def test_user_table_is_read_with_the_constant_appended(tmp_path):
    from pipelines.engram.data import make_dataset

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"label": np.repeat([0, 1, 2, 3], 10), **{f"x_{i}": rng.normal(size=40) for i in range(3)}})
    p = params(
        data={"source": "file", "path": str(_write(tmp_path, df)), "limit": None}, engram={"arithmetic_pair": [0, 1]}
    )
    out = make_dataset(p)
    assert out["n_classes"] == 4 and out["n_features"] == 4
    assert bool((out["seeds"]["0"]["x_train"][:, -1] == 1).all())


def test_claim_on_a_variant_not_planned_names_the_claim():
    from pipelines.engram.spec import SPEC

    claim = {
        "id": "x_vs_random",
        "text": "t",
        "metric": "control.forget_acc.random_edit_minus_engram",
        "op": ">=",
        "threshold": 0.5,
    }
    with pytest.raises(ParameterError, match=r"claim 'x_vs_random'.*control\.forget_acc"):
        SPEC.check(params(claims=[claim]))
    SPEC.check(params(claims=[claim], variants=["engram", "random_edit"]))  # planned: accepted
    with pytest.raises(ParameterError, match=r"'neggrad_plus'"):
        params(claims=[{**claim, "metric": "variants.neggrad_plus.forget_acc"}])
    # the original model is always planned (train.original)
    SPEC.check(params(claims=[{**claim, "metric": "variants.original.test_acc"}]))


def test_derived_metrics_are_per_seed_and_paired():
    """Speed-ups are per-seed ratios, the control a per-seed difference, the common-class metrics per-seed
    means over the classes every variant forgot, gaps to retraining paired by seed."""
    from pipelines.core.spec import Results, SeedValues, compute_derived
    from pipelines.engram.spec import SPEC

    p = params(seeds=[0, 1], variants=["engram", "random_edit", "retrain", "grad_ascent"])
    t = {"engram": (0.01, 0.02), "random_edit": (0.01, 0.01), "retrain": (1.0, 3.0), "grad_ascent": (2.0, 1.0)}
    tables = {"original": Results("original").add(0, test_acc=0.9).add(1, test_acc=0.9).table()}
    for v, ts in t.items():
        r = Results(v)
        for s, x in enumerate(ts):
            classes = range(10) if v in ("engram", "random_edit") else (3, 5)
            r.add(
                s,
                edit_time_s=x,
                forget_acc=0.1 * (s + 1) if v == "engram" else 0.8,
                **{f"forget_acc_class{c}": 0.01 * c + s for c in classes},
                **{f"retain_acc_class{c}": 0.9 for c in classes},
            )
        tables[v] = r.table()
    values = SeedValues(tables)
    point, per_seed = compute_derived(SPEC, p, values, list(tables), {})
    assert per_seed["speedup.edit_time.engram_vs_retrain"] == {0: 100.0, 1: 150.0}
    # the fastest iterative variant by its mean time (retrain 2.0 s vs grad_ascent 1.5 s), paired per seed
    assert per_seed["speedup.edit_time.engram_vs_fastest_iterative"] == pytest.approx({0: 200.0, 1: 50.0})
    assert per_seed["control.forget_acc.random_edit_minus_engram"] == pytest.approx({0: 0.7, 1: 0.6})
    assert point["common.n_classes"] == 2.0
    assert per_seed["common.engram.forget_acc"] == pytest.approx({0: 0.04, 1: 1.04})
    assert per_seed["gap_to_retrain.forget_acc.engram"] == pytest.approx({0: 0.0, 1: 0.0})
    assert "common.original.forget_acc" not in per_seed
