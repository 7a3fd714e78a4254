"""Tests of `bimu`: the Bernoulli mean-field KL and its gradient against brute force and autograd, BiMU's
update against its limit cases (relaxation off = the plain online step; the relaxation term is the KL
gradient; the asymmetric step sizes), the fused backward against autograd, the query controller, the
streams, and bad input (the end-to-end --env=test run is covered by tests/methods/test_all_pipelines.py)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipelines.bimu.params import Params
from pipelines.core.params import ParameterError, validate

ROOT = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((ROOT / "conf/base/parameters_bimu.yml").read_text())["bimu"]
HP = dict(lm=161.3, eta=4.9, eta_max=0.0023, kappa=3.76, n_mem=700.0)


def raw(**over) -> dict:
    r = {**BASE, "seeds": [0], "claims": [], "gates": []}
    r["continual"] = {**BASE["continual"], "n_tasks": 3, "n_per_task": 20}
    r["active"] = {**BASE["active"], "n_per_domain": 20, "eval_every": 10}
    r.update(over)
    return r


# ------------------------------------------------------------------ KL of the Bernoulli mean field
def test_bernoulli_kl_matches_brute_force_and_autograd():
    from pipelines.bimu.model import bernoulli_kl, bernoulli_kl_grad

    g = torch.Generator().manual_seed(0)
    lam = (torch.randn(50, generator=g, dtype=torch.float64) * 2).requires_grad_()
    lam0 = torch.randn(50, generator=g, dtype=torch.float64)
    # brute force over w ∈ {−1, +1} with q(w = +1) = sigmoid(2λ)
    p, p0 = torch.sigmoid(2 * lam), torch.sigmoid(2 * lam0)
    ref = (p * torch.log(p / p0) + (1 - p) * torch.log((1 - p) / (1 - p0))).sum()
    kl = bernoulli_kl(lam, lam0)
    torch.testing.assert_close(kl, ref, rtol=1e-10, atol=1e-10)
    (auto,) = torch.autograd.grad(ref, lam)
    torch.testing.assert_close(bernoulli_kl_grad(lam.detach(), lam0), auto, rtol=1e-9, atol=1e-12)
    assert float(bernoulli_kl(lam0, lam0)) == pytest.approx(0, abs=1e-12)


def test_bimu_relaxation_term_is_the_kl_gradient():
    """With no data gradient BiMU's step is −(κ/N) ∇KL(q ‖ p₀) over its step-size denominator."""
    from pipelines.bimu.model import bernoulli_kl_grad, bimu_delta

    lam = torch.linspace(-4, 4, 41, dtype=torch.float64)
    d = bimu_delta(lam, torch.zeros_like(lam), **HP)
    s = HP["kappa"] * (1 - torch.tanh(lam) ** 2)
    torch.testing.assert_close(d, -(HP["kappa"] / HP["n_mem"]) * bernoulli_kl_grad(lam) / (s + 1 / HP["eta_max"]))
    assert torch.all(d * lam <= 0)  # pulls toward the prior λ₀ = 0
    assert abs(float(d[0])) < abs(float(d[15]))  # and fades for confident (saturated) weights


# ------------------------------------------------------------------ BiMU's update: limit cases
def test_relaxation_off_is_the_plain_online_update():
    from pipelines.bimu.model import bimu_delta, online_delta

    g = torch.Generator().manual_seed(1)
    lam, grad = torch.randn(200, generator=g) * 3, torch.randn(200, generator=g)
    lr = HP["eta"] * HP["eta_max"] * HP["lm"]
    torch.testing.assert_close(bimu_delta(lam, grad, **HP, relaxation=False), online_delta(lam, grad, lr=lr))
    # and as a limit of the full rule: κ → 0 and |ℓ_m g| η_max → 0 leave the same step (relative error → 0)
    small = grad * 1e-6
    full = bimu_delta(lam.double(), small.double(), **{**HP, "kappa": 0.0})
    torch.testing.assert_close(full, online_delta(lam, small, lr=lr).double(), rtol=1e-5, atol=0)


def test_bimu_step_is_asymmetric_and_bounded():
    from pipelines.bimu.model import bimu_delta

    lam = torch.tensor([12.0], dtype=torch.float64)  # confident w = +1 (tanh λ ≈ 1, s ≈ 0)
    hp = {**HP}
    for g in (1e2, 1e4, 1e6):  # gradients pushing toward a flip
        flip = -float(bimu_delta(lam, torch.tensor([g / HP["lm"]], dtype=torch.float64), **hp))
        assert 0 < flip <= HP["eta"] / 4 + 1e-9
    assert -float(bimu_delta(lam, torch.tensor([1e6 / HP["lm"]], dtype=torch.float64), **hp)) == pytest.approx(
        HP["eta"] / 4, rel=1e-3
    )
    g = -50.0  # reinforcing: ≈ η η_max ℓ_m |g|, unbounded
    up = float(bimu_delta(lam, torch.tensor([g / HP["lm"]], dtype=torch.float64), **hp))
    assert up == pytest.approx(HP["eta"] * HP["eta_max"] * 50, rel=1e-6)
    # an uncertain weight (λ = 0): the step never exceeds η/2 whatever the gradient
    zero = torch.zeros(1, dtype=torch.float64)
    big = abs(float(bimu_delta(zero, torch.tensor([1e9], dtype=torch.float64), **hp)))
    assert big == pytest.approx(HP["eta"] / 2, rel=1e-3)


def test_bayesbinn_update_official_form():
    from pipelines.bimu.model import bayesbinn_delta

    lam = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    grad = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    ref = -0.5 * (grad / (1 - torch.tanh(lam) ** 2 + 1e-7) + 0.1 * lam)
    torch.testing.assert_close(bayesbinn_delta(lam, grad, lr=0.5, prior_strength=0.1), ref)


def test_rule_skips_replicas_without_gradient():
    """No label queried → no update at all, forgetting term included."""
    import functools

    from pipelines.bimu.model import LambdaRule, bimu_delta

    lam = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 3.0]]))
    lam.grad = torch.tensor([[0.0, 0.0], [0.1, -0.2]])
    opt = LambdaRule([lam], functools.partial(bimu_delta, **HP))
    before = lam.detach().clone()
    opt.step()
    assert torch.equal(lam.detach()[0], before[0])
    torch.testing.assert_close(lam.detach()[1], before[1] + bimu_delta(before[1], lam.grad[1], **HP))


def test_mesu_update_forgets_toward_the_prior():
    """Without data MESU's σ has the prior σ_p as its fixed point and μ contracts toward μ_p; with a
    gradient the mean moves by −η_μ σ² g (the variance-scaled step of the Bayesian learning rule)."""
    from pipelines.bimu.model import mesu_delta

    hp = dict(lr_mu=1.6, lr_sigma=2.1, sigma_prior=0.3, n_mem=50.0)
    mu, sig = torch.tensor([1.0, -0.5]), torch.tensor([0.05, 0.6])
    for _ in range(3000):
        dm, ds = mesu_delta(mu, sig, torch.zeros(2), torch.zeros(2), **hp)
        mu, sig = mu + dm, sig + ds
    torch.testing.assert_close(sig, torch.full((2,), 0.3), atol=1e-3, rtol=0)
    assert torch.all(mu.abs() < torch.tensor([1.0, 0.5]))
    dm, _ = mesu_delta(torch.zeros(1), torch.tensor([0.3]), torch.tensor([2.0]), torch.zeros(1), **hp)
    assert float(dm) == pytest.approx(-1.6 * 0.09 * 2.0)


def test_meta_adam_is_adam_without_metaplasticity_and_attenuates_flips():
    from pipelines.bimu.model import MetaAdam

    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(4, 6, generator=g)
    grads = [torch.randn(4, 6, generator=g) for _ in range(5)]
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ours, ref = MetaAdam([a], lr=0.01, m=0.0), torch.optim.Adam([b], lr=0.01)
    for gr in grads:
        a.grad, b.grad = gr.clone(), gr.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    # m > 0: a first step toward zero is Adam's (−lr·sign g) times 1 − tanh²(m W); away from zero unchanged
    w = torch.nn.Parameter(torch.tensor([2.0, 2.0]))
    w.grad = torch.tensor([1.0, -1.0])
    MetaAdam([w], lr=0.1, m=1.3).step()
    att = 1 - float(np.tanh(1.3 * 2.0)) ** 2
    torch.testing.assert_close(w.detach(), torch.tensor([2.0 - 0.1 * att, 2.1]), rtol=1e-5, atol=1e-6)


def test_ste_sign_forward_and_gradient():
    from pipelines.bimu.model import ste_sign

    w = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.5], requires_grad=True)
    out = ste_sign(w)
    assert out.tolist() == [-1, -1, 1, 1, 1]
    out.sum().backward()
    assert w.grad.tolist() == [0, 1, 1, 1, 0]


# ------------------------------------------------------------------ the network
def test_fused_backward_matches_autograd():
    from pipelines.bimu.model import NoiseBlocks, relaxed_loss, relaxed_loss_autograd

    gens = [torch.Generator().manual_seed(s) for s in (0, 1, 2)]
    r, k, h, d, c = 3, 4, 16, 12, 5
    lam1 = (torch.randn(r, h, d, dtype=torch.float64) * 0.5).requires_grad_()
    lam2 = (torch.randn(r, c, h, dtype=torch.float64) * 0.5).requires_grad_()
    x, y = torch.randn(r, d, dtype=torch.float64) * 2, torch.tensor([0, 3, 4])
    n1, n2 = NoiseBlocks((r, k, h, d), (r, k, c, h), 4, gens)(2)
    n1, n2 = n1.double(), n2.double()
    wts = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    fused = relaxed_loss(lam1, lam2, x, y, n1, n2, 0.7)
    g_f = torch.autograd.grad((fused * wts).sum(), (lam1, lam2))
    ref = relaxed_loss_autograd(lam1, lam2, x, y, n1, n2, 0.7)
    g_r = torch.autograd.grad((ref * wts).sum(), (lam1, lam2))
    torch.testing.assert_close(fused, ref)
    for a, b in zip(g_f, g_r):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert float(g_f[0].abs().sum()) > 0  # the gate's surrogate passes gradient


def test_gate_surrogate_window():
    from pipelines.bimu.model import gate_surrogate

    z = torch.tensor([-2.0, -1.4, -0.6, -0.4, 0.0, 0.4, 0.6, 1.0, 1.4, 1.6])
    assert gate_surrogate(z).tolist() == [0, -1, -1, 0, 0, 0, 1, 1, 1, 0]


def test_hard_samples_follow_the_bernoulli_posterior():
    """With one input pixel of 1 and LayerNorm, the class score order reveals the sampled weight signs:
    the empirical P(w = +1) must match sigmoid(2λ)."""
    from pipelines.bimu.model import _rand

    lam = torch.tensor([[-1.0, 0.0, 0.3, 2.0]])
    k = 20000
    w = torch.where(
        _rand((1, k, 4), [torch.Generator().manual_seed(0)]) < torch.sigmoid(2 * lam).unsqueeze(1), 1.0, -1.0
    )
    np.testing.assert_allclose(w.mean(1)[0].numpy(), torch.tanh(lam)[0].numpy(), atol=0.02)


def test_uncertainty_scores():
    from pipelines.bimu.model import uncertainty

    agree = torch.tensor([[[0.9, 0.1]], [[0.9, 0.1]]])  # K = 2 identical samples, N = 1
    u = uncertainty(agree)
    assert float(u["epistemic"]) == pytest.approx(0, abs=1e-7) and float(u["vr"]) == 0
    split = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # two confident samples that disagree
    u = uncertainty(split)
    assert float(u["epistemic"]) == pytest.approx(1.0, abs=1e-6)  # 1 bit of mutual information
    assert float(u["aleatoric"]) == pytest.approx(0, abs=1e-6) and float(u["vr"]) == pytest.approx(0.5)


def _pairwise_auc(id_score, ood_score):
    """P(OOD scores higher) + ½ P(tie) over every (ID, OOD) pair; a pair with a NaN counts 0 (a miss)."""
    wins = [
        0.0 if np.isnan(a) or np.isnan(b) else float(b > a) + 0.5 * float(b == a) for a in id_score for b in ood_score
    ]
    return float(np.mean(wins))


def test_ood_auc_matches_sklearn_and_counts_a_nan_score_as_a_miss():
    from sklearn.metrics import roc_auc_score

    from pipelines.bimu.train import _auc

    rng = np.random.default_rng(0)
    id_s, ood_s = rng.random(30), rng.random(25) + 0.3
    id_s[:4] = ood_s[:4] = 0.5  # ties
    labels = np.r_[np.zeros(30), np.ones(25)]
    assert _auc(id_s, ood_s) == pytest.approx(roc_auc_score(labels, np.r_[id_s, ood_s]), abs=1e-12)
    assert _auc(id_s, ood_s) == pytest.approx(_pairwise_auc(id_s, ood_s), abs=1e-12)
    for nan_id, nan_ood in ((3, 0), (0, 2), (3, 2), (30, 25)):
        a, b = id_s.copy(), ood_s.copy()
        a[rng.choice(30, nan_id, replace=False)] = np.nan
        b[rng.choice(25, nan_ood, replace=False)] = np.nan
        assert _auc(a, b) == pytest.approx(_pairwise_auc(a, b), abs=1e-12), (nan_id, nan_ood)
    assert _auc(id_s, np.full(25, np.nan)) == 0.0


# ------------------------------------------------------------------ querying and streams
def test_budget_threshold():
    from pipelines.bimu.train import budget_threshold

    assert budget_threshold(0.0, 0.2, 0.1, 10) == 0.0  # under budget: query everything
    assert budget_threshold(0.25, 0.2, 0.1, 10) == pytest.approx(round(10 * (0.2 + 0.05**0.1)) / 10)
    assert budget_threshold(0.9, 0.2, 0.1, 10) == 1.0  # far over budget: only full disagreement
    assert budget_threshold(0.2, 0.2, 0.1, 10) == pytest.approx(0.2)
    # γ = 1: the threshold moves by the error itself; k = None: a continuous score, no rounding
    assert budget_threshold(0.3, 0.2, 1.0, 10) == pytest.approx(0.3)
    assert budget_threshold(0.23, 0.2, 1.0, None) == pytest.approx(0.23)


def test_streams_are_permuted_tasks_and_imbalanced():
    from pipelines.bimu.data import class_weights, make_streams

    p = Params.model_validate(raw(seeds=[0, 1]))
    s = make_streams(p)
    assert s["task_perms"].shape == (2, 4, 64) and s["task_orders"].shape == (2, 3, 20)
    for perms in s["task_perms"]:
        assert all(sorted(q.tolist()) == list(range(64)) for q in perms)
        assert len({tuple(q.tolist()) for q in perms}) == 4  # the OOD permutation is new
    assert abs(float(s["x_train"].mean())) < 1e-4 and float(s["x_train"].std()) == pytest.approx(1, abs=1e-3)
    w = class_weights(10, 0.2)
    assert w[0] / w[-1] == pytest.approx(5.0) and w.sum() == pytest.approx(1)
    counts = np.bincount(s["y_train"][s["stream_index"][0]].numpy(), minlength=10)
    assert counts[:3].sum() > counts[-3:].sum()
    # the same seed gets the same stream whatever other seeds run
    s0 = make_streams(Params.model_validate(raw(seeds=[1])))
    assert torch.equal(s0["task_perms"][0], s["task_perms"][1])


def test_continual_stream_and_seed_independence():
    """A replica's result does not depend on the replicas beside it; the stream's task t is the training
    images under permutation t (checked through the saved λ snapshots and accuracy matrix shapes)."""
    from pipelines.bimu.data import make_streams
    from pipelines.bimu.train import train_variant

    both, both_arts = train_variant(
        make_streams(Params.model_validate(raw(seeds=[0, 1]))), Params.model_validate(raw(seeds=[0, 1])), variant="bimu"
    )
    one, one_arts = train_variant(
        make_streams(Params.model_validate(raw(seeds=[1]))), Params.model_validate(raw(seeds=[1])), variant="bimu"
    )
    torch.testing.assert_close(
        both_arts["posterior_by_task"][:, 1], one_arts["posterior_by_task"][:, 0], rtol=1e-4, atol=1e-5
    )
    assert np.asarray(both_arts["acc_matrix"]).shape == (3, 3, 2)
    final = both[both["step"].isna() & (both["seed"] == 0)].set_index("metric")["value"]
    assert 0 <= final["frac_saturated"] <= 1 and 0 < final["mean_bernoulli_var"] <= 1
    # per-task quantities are histories over the task index, one per seed
    hist = both[both["step"].notna() & (both["metric"] == "acc_current_task")]
    assert sorted(hist["step"].unique()) == [1, 2, 3] and set(hist["seed"]) == {0, 1}


def test_active_variants_respect_the_budget():
    from pipelines.bimu.data import make_streams
    from pipelines.bimu.train import train_variant

    p = Params.model_validate(raw(active={**BASE["active"], "n_per_domain": 100, "eval_every": 50}))
    s = make_streams(p)
    out = {}
    for v in ("al_all", "al_vr", "al_epistemic"):
        table, _ = train_variant(s, p, variant=v)
        out[v] = table[table["step"].isna()].set_index("metric")["value"]
    assert out["al_all"]["n_labels"] == 200 and out["al_all"]["query_rate"] == 1
    assert 0.1 <= out["al_vr"]["query_rate"] <= 0.35  # tracks the 20% budget
    assert 0.1 <= out["al_epistemic"]["query_rate"] <= 0.35


# ------------------------------------------------------------------ pipeline shape and bad input
def test_bad_parameter_names_the_key():
    bad = raw(bimu={**BASE["bimu"], "eta_max": -1.0})
    with pytest.raises(ParameterError, match=r"bimu\.bimu\.eta_max"):
        validate(Params, bad, "bimu")
    with pytest.raises(ParameterError, match=r"bimu\.variants"):
        validate(Params, raw(variants=["bimu", "vcl"]), "bimu")
    with pytest.raises(ParameterError, match=r"bimu\.active\.budget"):
        validate(Params, raw(active={**BASE["active"], "budget": 1.5}), "bimu")


def test_claim_on_an_unplanned_variant_is_rejected():
    claims = [{"id": "x", "text": "x", "metric": "diff.bal_acc.al_vr_vs_al_random", "op": ">=", "threshold": 0}]
    from pipelines.core.spec import load_spec

    p = validate(Params, raw(variants=["bimu", "al_vr"], claims=claims), "bimu")
    with pytest.raises(ParameterError, match="al_random"):
        load_spec("bimu").check(p)


def test_derived_comparisons_are_per_seed_and_paired():
    """The ratios keep their guard against a zero denominator; label savings read random querying's
    labels-to-accuracy curve of the same seed."""
    from pipelines.bimu.evaluate import labels_to_reach
    from pipelines.core.spec import Results, SeedValues, compute_derived, load_spec

    def t(v, **per_seed):
        r = Results(v)
        for s, vals in per_seed.items():
            r.add(int(s[1:]), **vals)
            if v in ("bimu", "bayesbinn"):
                r.add(int(s[1:]), acc_mean_last5=0.5, acc_mean_seen=0.5, ood_auc_epistemic_min=0.9)
        return r

    bimu = t(
        "bimu",
        s0={"frac_saturated": 0.1, "mean_bernoulli_var": 0.4},
        s1={"frac_saturated": 0.2, "mean_bernoulli_var": 0.3},
    )
    bb = t(
        "bayesbinn",
        s0={"frac_saturated": 0.0, "mean_bernoulli_var": 0.2},
        s1={"frac_saturated": 0.4, "mean_bernoulli_var": 0.3},
    )
    vr = t("al_vr", s0={"bal_acc": 0.3, "n_labels": 10}, s1={"bal_acc": 0.5, "n_labels": 20})
    rnd = Results("al_random")
    for s, acc in ((0, [0.1, 0.35, 0.4]), (1, [0.2, 0.3, 0.4])):
        rnd.add(s, bal_acc=acc[-1], n_labels=60)
        rnd.history(s, "bal_acc", acc, steps=[10, 20, 30])
        rnd.history(s, "n_labels", [20, 40, 60], steps=[10, 20, 30])
    values = SeedValues({r.variant: r.table() for r in (bimu, bb, vr, rnd)})
    p = validate(Params, raw(variants=["bimu", "bayesbinn", "al_vr", "al_random"]), "bimu")
    _, per_seed = compute_derived(load_spec("bimu"), p, values, values.variants, {})
    assert per_seed["ratio.frac_saturated.bimu_vs_bayesbinn"] == pytest.approx({0: 0.1 / 1e-12, 1: 0.5})
    assert per_seed["ratio.mean_bernoulli_var.bimu_vs_bayesbinn"] == pytest.approx({0: 2.0, 1: 1.0})
    # seed 0 reaches VR's 0.3 after 40 labels (VR used 10); seed 1 never reaches 0.5: its total, 60
    assert per_seed["label_savings_x.bal_acc.al_vr_vs_al_random"] == pytest.approx({0: 4.0, 1: 3.0})
    assert per_seed["diff.bal_acc.al_vr_vs_al_random"] == pytest.approx({0: -0.1, 1: 0.1})
    assert labels_to_reach({"bal_acc": [[0.1, 0.3], [0.5, 0.5]], "n_labels": [[5, 7], [9, 11]]}, 0.4) == 10


def test_bad_user_file_names_dataset_and_column(tmp_path):
    from pipelines.bimu.data import check_user_images, make_streams
    from pipelines.core.schemas import InputDataError

    good = pd.DataFrame(
        {"label": [0, 1] * 20, "split": ["train", "test"] * 20, **{f"x{i}": np.arange(40.0) + i for i in range(4)}}
    )
    x, y, tr = check_user_images(good)
    assert x.shape == (40, 4) and tr.sum() == 20
    with pytest.raises(InputDataError, match=r"bimu\.user_images.*'label'"):
        check_user_images(good.drop(columns="label"))
    with pytest.raises(InputDataError, match=r"bimu\.user_images.*'split'"):
        check_user_images(good.assign(split=["train", "valid"] * 20))
    with pytest.raises(InputDataError, match=r"bimu\.user_images.*'x2'"):
        check_user_images(good.assign(x2=["a"] * 40))
    path = tmp_path / "imgs.csv"
    good.drop(columns="x0").assign(label=good["label"].astype(float)).to_csv(path, index=False)
    p = Params.model_validate(raw(data={**BASE["data"], "source": "file", "user_path": str(path)}))
    with pytest.raises(InputDataError, match=r"bimu\.user_images.*'label'"):
        make_streams(p)


def test_frozen_feature_stream_never_draws_pretraining_images():
    """Issue 22: the active learner reads a frozen encoder's features; the encoder's pretraining images are
    held out of the stream, and the active variants use active.lm."""
    from pipelines.bimu.data import make_streams
    from pipelines.bimu.train import update_rule

    act = {
        **BASE["active"],
        "features": "frozen",
        "n_pretrain": 400,
        "feature_dim": 16,
        "pretrain_steps": 20,
        "n_per_domain": 30,
        "lm": 640.0,
    }
    p = Params.model_validate(raw(seeds=[0, 1], active=act))
    s = make_streams(p)
    held = np.random.default_rng([p.data.split_seed, 7]).permutation(len(s["x_train"]))[:400]
    assert not set(s["stream_index"].flatten().tolist()) & set(held.tolist())
    assert s["al_x"].shape == (2, 60, 16) and s["al_x_test"].shape == (2, 2 * len(s["x_test"]), 16)
    assert abs(float(s["al_x"].mean())) < 1.0  # standardised with pretraining statistics
    assert update_rule(p, "al_vr")[1].keywords["lm"] == 640.0 and update_rule(p, "bimu")[1].keywords["lm"] == 161.3
    pix = make_streams(
        Params.model_validate(raw(seeds=[0], active={**BASE["active"], "features": "pixels", "n_per_domain": 20}))
    )
    assert pix["al_x"].shape == (1, 40, 64)  # pixels: the permuted, shifted images
