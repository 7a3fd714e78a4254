"""Tests of `featjnd`: the measurement mechanics against independent references (numpy / scipy / mpmath /
closed form), the model split, the data, bad parameters and bad input files, and the pipeline's variant
nodes (the end-to-end --env=test run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import math

import numpy as np
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.featjnd import ops
from pipelines.featjnd.params import Params


def _feat(seed=0, shape=(6, 5, 4, 4)):
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(shape, generator=g, dtype=torch.float64)), g


# ------------------------------------------------------------------ E1: matched strength


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matched_strength_has_equal_energy_and_snr(dtype):
    f, g = _feat()
    f = f.to(dtype) + 0.1
    j = torch.exp(3 * torch.randn(f.shape, generator=g, dtype=torch.float64)).to(dtype)  # wild dynamic range
    z = torch.randn(f.shape, generator=g, dtype=torch.float64).to(dtype)
    maps = {
        "jnd": j * z,
        "gauss": z,
        "shuffled": ops.shuffle_spatial(j, g) * z,
        "shuffled_all": ops.shuffle_all(j, g) * z,
        "inverse": z / j,
    }
    fn = f.double().numpy().reshape(len(f), -1)
    for snr in (20.0, 10.0, 0.0, -5.0):
        target = (fn**2).sum(1) * 10 ** (-snr / 10)  # independent reference in numpy float64
        for name, d in maps.items():
            delta = ops.match_energy(d, f, snr)
            assert delta.dtype == dtype
            energy = (delta.double().numpy().reshape(len(f), -1) ** 2).sum(1)
            np.testing.assert_allclose(energy, target, rtol=1e-6, err_msg=name)
            np.testing.assert_allclose(ops.snr_db(f, delta).numpy(), snr, atol=1e-6 * max(1, abs(snr)) + 5e-6)
            # the direction is only rescaled, never reshaped
            a, b = delta.double().flatten(1), d.double().flatten(1)
            cos = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
            np.testing.assert_allclose(cos.numpy(), 1.0, atol=1e-6)


def _mp_norm(x: torch.Tensor) -> list:
    """Exact-input ℓ2 norm of each sample in mpmath (every float32/float64 value is exact as an mpf)."""
    import mpmath

    return [mpmath.sqrt(mpmath.fsum(mpmath.mpf(float(v)) ** 2 for v in row)) for row in x.double().flatten(1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("f_mag, d_mag", [(1e-30, 1e-30), (1e30, 1e30), (1e30, 1e-30), (1e-30, 1e30), (1.0, 1e-30)])
def test_match_energy_any_dynamic_range_against_mpmath(dtype, f_mag, d_mag):
    """Energies of 1e-60 / 1e60 underflow / overflow float32 squares: the SNR must still be exact, checked
    against an mpmath reference computed from the very same input values."""
    import mpmath

    mpmath.mp.dps = 40
    g = torch.Generator().manual_seed(11)
    f = (f_mag * (torch.rand((3, 4, 3, 3), generator=g, dtype=torch.float64) + 0.05)).to(dtype)
    j = torch.exp(2 * torch.randn(f.shape, generator=g, dtype=torch.float64))
    d = (d_mag * j * torch.randn(f.shape, generator=g, dtype=torch.float64)).to(dtype)
    assert torch.isfinite(f).all() and torch.isfinite(d).all() and (f != 0).any() and (d != 0).all()
    fn, dn = _mp_norm(f), _mp_norm(d)
    rtol = 1e-6 if dtype == torch.float32 else 1e-12
    for snr in (20.0, 0.0, -5.0):
        delta = ops.match_energy(d, f, snr)
        assert delta.dtype == dtype and torch.isfinite(delta).all()
        for i in range(len(f)):
            scale = fn[i] / dn[i] * mpmath.power(10, mpmath.mpf(-snr) / 20)
            ref = np.array([float(mpmath.mpf(float(v)) * scale) for v in d[i].double().flatten()])
            np.testing.assert_allclose(
                delta[i].double().flatten().numpy(), ref, rtol=rtol, atol=rtol * np.abs(ref).max()
            )  # float32 subnormals round coarser
            got = 20 * mpmath.log10(fn[i] / _mp_norm(delta[i : i + 1])[0])
            assert abs(float(got) - snr) < 1e-6, (i, float(got))
        # the float64 helper agrees with mpmath, and snr_db too
        np.testing.assert_allclose(ops.norms64(f).numpy(), [float(x) for x in fn], rtol=1e-13)
        np.testing.assert_allclose(ops.snr_db(f, delta).numpy(), snr, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_match_energy_refuses_a_zero_direction_naming_the_sample(dtype):
    g = torch.Generator().manual_seed(12)
    f = torch.rand((4, 3, 2, 2), generator=g, dtype=torch.float64).to(dtype)
    j = torch.rand(f.shape, generator=g, dtype=torch.float64).to(dtype) + 0.1
    j[2] = 0.0  # e.g. a J map that underflowed to 0 on one image
    z = torch.randn(f.shape, generator=g, dtype=torch.float64).to(dtype)
    with pytest.raises(ValueError, match=r"direction of sample 2 is all zeros"):
        ops.match_energy(j * z, f, 0.0)
    d = (j + 0.1) * z
    d[1, 0, 0, 1] = float("inf")  # 1/J of a zero J: inf (and inf·0 = NaN elsewhere)
    with pytest.raises(ValueError, match=r"direction of sample 1 has non-finite"):
        ops.match_energy(d, f, 0.0)
    d[1, 0, 0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"sample 1 has non-finite"):
        ops.match_energy(d, f, 0.0)


def test_match_energy_refuses_a_delta_the_dtype_cannot_hold():
    f = torch.full((2, 1, 2, 2), 1.0, dtype=torch.float32)
    f[1] = 1e38  # δ at −20 dB has entries of 1e39 > float32's max 3.4e38
    d = torch.ones_like(f)
    with pytest.raises(ValueError, match=r"sample 1 .*not representable in torch.float32"):
        ops.match_energy(d, f, -20.0)
    assert torch.isfinite(ops.match_energy(d.double(), f.double(), -20.0)).all()
    tiny = torch.full((1, 1, 2, 2), 1e-44)  # a float32 subnormal: δ at +20 dB (1e-45) flushes to zero
    with pytest.raises(ValueError, match=r"sample 0 .*not representable"):
        ops.match_energy(torch.ones_like(tiny), tiny, 20.0)


def test_match_energy_of_a_zero_feature_is_a_zero_distortion():
    f = torch.zeros((2, 1, 2, 2))
    f[0] = 1.0
    delta = ops.match_energy(torch.ones_like(f), f, 0.0)
    assert torch.equal(delta[1], torch.zeros_like(delta[1]))
    assert ops.snr_db(f[:1], delta[:1]).item() == pytest.approx(0.0, abs=1e-6)


def test_shuffles_keep_the_right_multisets():
    f, g = _feat(1)
    j = torch.rand(f.shape, generator=g, dtype=torch.float64)
    s = ops.shuffle_spatial(j, g)
    # per channel: same values, different placement
    torch.testing.assert_close(s.flatten(2).sort(-1).values, j.flatten(2).sort(-1).values)
    assert not torch.equal(s, j)
    a = ops.shuffle_all(j, g)
    torch.testing.assert_close(a.flatten(1).sort(-1).values, j.flatten(1).sort(-1).values)
    assert not torch.allclose(a.flatten(2).sort(-1).values, j.flatten(2).sort(-1).values)


# ------------------------------------------------------------------ E3: quantization at the same budget


def test_quantizer_noise_budget_equal_across_allocations():
    f, g = _feat(2, (8, 16, 5, 5))
    j = torch.exp(torch.randn(f.shape, generator=g, dtype=torch.float64))
    sal = torch.rand(f.shape, generator=g, dtype=torch.float64) + 0.01
    for d0 in (2.0, 3.0, 4.0):
        jnd = ops.steps_from_weights(ops.token_weights(j, "mean"), d0)
        allocs = {
            "featjnd": jnd,
            "perm_step": ops.permute_steps(jnd, g),
            "uniform_step": torch.full_like(jnd, d0),
            "sal_inv": ops.steps_from_weights(ops.token_weights(sal, "rms"), d0),
            "geomean": ops.steps_from_weights(ops.token_weights(j, "geomean"), d0),
        }
        c = f.shape[1]
        for name, steps in allocs.items():
            budget = (c * steps.numpy() ** 2 / 12).sum(1)  # Σ_t C·Δ_t²/12 per image
            np.testing.assert_allclose(budget, c * d0**2 / 12 * steps.shape[1], rtol=1e-6, err_msg=name)
        # the permutation reuses FeatJND's exact step multiset of each image
        torch.testing.assert_close(allocs["perm_step"].sort(-1).values, jnd.sort(-1).values, rtol=0, atol=0)
        assert not torch.equal(allocs["perm_step"], jnd)


def test_quantizer_matches_numpy_reference_and_dither_error_is_uniform():
    g = torch.Generator().manual_seed(3)
    f = 3 * torch.rand((64, 4, 8, 8), generator=g, dtype=torch.float64)
    steps = 0.2 + torch.rand((64, 64), generator=g, dtype=torch.float64)
    fq, sym = ops.quantize(f, steps, clip=10.0)
    d = steps.numpy().reshape(64, 1, 8, 8)
    np.testing.assert_allclose(fq.numpy(), d * np.round(f.numpy() / d), rtol=1e-12)
    # clipping is applied before the step, identically for every allocation
    fq_clip, _ = ops.quantize(f, steps, clip=1.0)
    np.testing.assert_allclose(fq_clip.numpy(), d * np.round(np.clip(f.numpy(), -1, 1) / d), rtol=1e-12)
    # dithered: error uniform on [−Δ/2, Δ/2], mean 0, variance Δ²/12, independent of the signal
    u = torch.rand(f.shape, generator=g, dtype=torch.float64) - 0.5
    fq_d, _ = ops.quantize(f, steps, clip=10.0, dither=u)
    err = ((fq_d - f) / torch.as_tensor(d)).numpy().ravel()
    assert np.abs(err).max() <= 0.5 + 1e-9
    assert abs(err.mean()) < 0.01 and abs(err.var() - 1 / 12) < 0.003
    assert abs(np.corrcoef(err, f.numpy().ravel())[0, 1]) < 0.03
    assert sym.dtype == f.dtype and torch.equal(sym, torch.round(sym))


def test_entropy_bits_matches_scipy():
    from scipy.stats import entropy

    sym = torch.tensor([0, 0, 1, 2, 2, 2, -3, 7, 7, 0], dtype=torch.float64)
    _, counts = np.unique(sym.numpy(), return_counts=True)
    assert ops.entropy_bits(sym) == pytest.approx(entropy(counts, base=2), rel=1e-12)
    assert ops.entropy_bits(torch.zeros(50)) == 0.0


# ------------------------------------------------------------------ E2: attribution statistics


def test_spearman_matches_scipy_with_ties():
    from scipy.stats import spearmanr

    g = torch.Generator().manual_seed(4)
    a = torch.randint(0, 6, (5, 40), generator=g).double()  # many ties
    b = a + torch.randn((5, 40), generator=g, dtype=torch.float64)
    ours = ops.spearman(a, b).numpy()
    ref = [spearmanr(a[i].numpy(), b[i].numpy()).statistic for i in range(5)]
    np.testing.assert_allclose(ours, ref, rtol=1e-10)


def test_bg_fg_ratio_and_pooled_mask_brute_force():
    g = torch.Generator().manual_seed(5)
    m = torch.rand((3, 4, 4), generator=g, dtype=torch.float64) + 0.1
    mask = torch.zeros((3, 8, 8), dtype=torch.bool)
    mask[0, 1, 1] = mask[1, 2:6, 2:6] = mask[2, 7, 0] = True
    pooled = ops.pooled_mask(mask, (4, 4))
    for i in range(3):
        for r in range(4):
            for c in range(4):
                assert bool(pooled[i, r, c]) == bool(mask[i, 2 * r : 2 * r + 2, 2 * c : 2 * c + 2].any())
        inside = [m[i, r, c].item() for r in range(4) for c in range(4) if pooled[i, r, c]]
        outside = [m[i, r, c].item() for r in range(4) for c in range(4) if not pooled[i, r, c]]
        assert ops.bg_fg_ratio(m, pooled)[i].item() == pytest.approx(np.mean(outside) / np.mean(inside))


# ------------------------------------------------------------------ estimator pieces


def test_kl_matches_reference():
    from pipelines.featjnd.model import kl_clean_noisy

    g = torch.Generator().manual_seed(6)
    a, b = torch.randn((7, 10), generator=g), torch.randn((7, 10), generator=g)
    p, q = torch.softmax(a, -1).numpy(), torch.softmax(b, -1).numpy()
    ref = (p * np.log(p / q)).sum(-1)
    np.testing.assert_allclose(kl_clean_noisy(a, b).numpy(), ref, rtol=1e-5)
    assert torch.allclose(kl_clean_noisy(a, a), torch.zeros(7), atol=1e-6)


def test_calibration_recovers_closed_form_scale():
    """Head predicts class 0 iff f > 0; f = 1, J = 1, z ~ N(0,1): flip iff 1 + s·z < 0, so
    Pr[flip] = Φ(−1/s) and the scale for ρ = 5% is s = 1/Φ⁻¹(0.95) ≈ 0.608."""
    from scipy.stats import norm

    from pipelines.featjnd.model import calibrate_scale, flip_rate

    def head(t):
        v = t.reshape(len(t), 1)
        return torch.cat([v, torch.zeros_like(v)], 1)

    n = 40000
    fn, j, std = torch.ones(n, 1, 1, 1), torch.ones(n, 1, 1, 1), torch.ones(1, 1, 1)
    g = torch.Generator().manual_seed(7)
    draws = [torch.randn((n, 1, 1, 1), generator=g)]
    s = calibrate_scale(j, fn, std, head, 0.05, 30, draws)
    assert s == pytest.approx(1 / norm.ppf(0.95), rel=0.02)
    assert flip_rate(s * j, fn, std, head, draws) == pytest.approx(0.05, abs=0.004)


def test_uniform_noise_has_unit_variance():
    from pipelines.featjnd.model import sample_noise

    z = sample_noise((200000,), "uniform", torch.Generator().manual_seed(8))
    assert abs(z.mean().item()) < 0.01 and z.var().item() == pytest.approx(1.0, rel=0.01)
    assert z.abs().max().item() <= math.sqrt(3) + 1e-6


def test_split_points_compose_to_the_full_network():
    from pipelines.featjnd.model import JNDEstimator, SmallCNN

    torch.manual_seed(0)
    model = SmallCNN(widths=(4, 8, 16, 16)).eval()
    x = torch.rand(3, 1, 32, 32)
    f1, f2 = model.encode(x, "s1"), model.encode(x, "s2")
    assert f1.shape == (3, 8, 16, 16) and f2.shape == (3, 16, 8, 8)
    assert (f1 >= 0).all() and (f2 >= 0).all()  # taken after the activation
    torch.testing.assert_close(model.head(f1, "s1"), model(x))
    torch.testing.assert_close(model.head(f2, "s2"), model(x))
    est = JNDEstimator(8, hidden=4, j_max=10.0)
    j = est(100 * torch.randn(3, 8, 16, 16))
    assert j.shape == f1.shape and (j > 0).all() and (j <= 10.0).all()


def test_digits_canvas_is_seeded_and_masks_the_digit():
    from pipelines.featjnd.data import digits_canvas

    a = digits_canvas(0, 30, 10, 10, test_renders=2)
    b = digits_canvas(0, 30, 10, 10, test_renders=2)
    c = digits_canvas(1, 30, 10, 10, test_renders=2)
    assert torch.equal(a["x_train"], b["x_train"]) and not torch.equal(a["x_train"], c["x_train"])
    assert a["x_train"].shape == (30, 1, 32, 32) and a["x_test"].shape == (20, 1, 32, 32)
    assert torch.equal(a["y_test"][0::2], a["y_test"][1::2])  # each test digit rendered twice
    assert not torch.equal(a["x_test"][0::2], a["x_test"][1::2])  # ... differently
    m = a["mask_test"]
    assert m.any(dim=(1, 2)).all() and (m.float().mean() < 0.3)
    assert (a["x_test"][:, 0][m] > 0).all()


# ------------------------------------------------------------------ estimator training (core's fit)


def test_estimator_dual_ascent_runs_once_per_step_and_is_deterministic():
    """μ is updated after every primal step by log μ += η(flip − ρ)/ρ: with no clipping, μ at the end of an
    epoch is μ_init·exp(η·Σ(flip − ρ)/ρ) over that epoch's steps. Rerunning the node gives the same fit."""
    from pipelines.featjnd.data import make_images
    from pipelines.featjnd.train import train_backbone, train_estimator

    p = Params.model_validate(
        {
            **BASE,
            "data": {"n_train": 60, "n_val": 20, "n_test": 20, "test_renders": 1},
            "backbone": {"widths": [4, 8, 8, 8], "epochs": 1},
            "estimator": {
                "hidden": 4,
                "epochs": 2,
                "batch_size": 16,
                "calib_steps": 3,
                "calib_draws": 1,
                "eta": 0.01,
                "mu_init": 2.0,
            },
        }
    )
    images = make_images(p)
    backbones = train_backbone(images, p)
    a = train_estimator(images, backbones, p, variant="estimator_s2")["seed0"]
    b = train_estimator(images, backbones, p, variant="estimator_s2")["seed0"]
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"]) and a["scale"] == b["scale"]
    h = a["history"].double()
    steps = math.ceil(60 / 16)
    log_mu = math.log(2.0)
    for epoch in range(2):
        log_mu += 0.01 * steps * (h[epoch, 2].item() - p.estimator.rho) / p.estimator.rho
        assert h[epoch, 3].item() == pytest.approx(math.exp(log_mu), rel=1e-5)
    assert 0 <= a["flip_rate_val"] <= 1 and a["state"]["scale"].item() == pytest.approx(a["scale"])


# ------------------------------------------------------------------ pipeline: one node per split


def test_one_train_node_per_split_after_the_shared_backbone(monkeypatch):
    from kedro.validation.type_extractor import TypeExtractor

    from pipelines.core.registry import load_pipeline, method_config

    pipe = load_pipeline("featjnd")
    variants = method_config("featjnd")["variants"]
    assert variants == ["estimator_s1", "estimator_s2"]
    assert {n.name for n in pipe.only_nodes_with_tags("train").nodes} == {f"featjnd.train.{v}" for v in variants}
    assert {"featjnd.data.make_images", "featjnd.data.backbone"} <= {n.name for n in pipe.nodes}
    # `kedro run --nodes=featjnd.train.estimator_s1` refits and measures that variant alone, from the saved inputs
    one = pipe.only_nodes("featjnd.train.estimator_s1")
    assert one.inputs() == {"featjnd.images_tensors", "featjnd.backbone_model", "params:featjnd"}
    assert one.outputs() == {"featjnd.results_estimator_s1", "featjnd.estimator_s1_artifacts_tensors"}
    assert TypeExtractor({"featjnd": pipe}).extract_types_from_pipelines() == {"featjnd": Params}
    raw = {**method_config("featjnd"), "variants": ["estimator_s2"]}
    raw["claims"] = [c for c in raw["claims"] if "s1" not in c["metric"]]
    raw["gates"] = [{**g, "metric": g["metric"].replace("s1_", "s2_")} for g in raw["gates"]]
    monkeypatch.setattr("pipelines.core.registry.method_config", lambda m, *a, **k: raw)
    small = load_pipeline("featjnd")
    assert {n.name for n in small.only_nodes_with_tags("train").nodes} == {"featjnd.train.estimator_s2"}


def test_derived_gaps_are_paired_per_seed_and_extremes_keep_the_seed_mean():
    from pipelines.core.spec import Results, SeedValues
    from pipelines.featjnd.evaluate import derived_metrics, derived_names

    p = Params.model_validate(
        {
            **BASE,
            "seeds": [0, 1, 2],
            "variants": ["estimator_s1"],
            "evaluation": {"snr_db": [0.0, -5.0], "quant_steps": [9.0], "quant_steps_by_split": {"s1": [1.75, 2.0]}},
        }
    )
    acc = {
        "featjnd": [0.9, 0.8, 0.7],
        "gauss": [0.85, 0.8, 0.6],
        "shuffled": [0.88, 0.7, 0.69],
        "shuffled_all": [0.86, 0.79, 0.61],
        "inverse": [0.5, 0.5, 0.5],
        "sal_inv": [0.6, 0.6, 0.6],
        "perm_step": [0.1, 0.2, 0.3],
        "uniform_step": [0.3, 0.2, 0.1],
    }
    tables = {}
    for v, xs in acc.items():
        r = Results(v)
        for seed, x in enumerate(xs):
            r.add(
                seed,
                s1_acc_snr0=x,
                s1_acc_snrm5=x - 0.1,
                s1_auc_acc_vs_snr=x - 0.05,
                s1_qacc_mean=x,
                s1_qacc_mean_dither=x,
                s1_jnd_bgfg_ratio=1.0 + 0.01 * seed,
                s1_acc_clean=0.95,
                s1_qacc_D1p75=x + 0.1,
                s1_qacc_D2=x,
            )  # S1 budgets from quant_steps_by_split, not quant_steps
        tables[v] = r.table()
    out = derived_metrics(SeedValues(tables), p)
    assert set(out) == set(derived_names(p, ["estimator_s1"]))
    gap = out["gap_pts.s1_acc_snr0.featjnd_vs_gauss"]
    assert gap == pytest.approx({0: 5.0, 1: 0.0, 2: 10.0})
    shuffled = out["min_gap_pts.s1_acc_snr_le0.featjnd_vs_shuffled"]
    assert shuffled.value == pytest.approx(np.mean([2.0, 10.0, 1.0]))
    assert shuffled.lo < shuffled.value < shuffled.hi
    dev = out["abs_dev_from_1.s1_jnd_bgfg_ratio.shuffled"]
    assert dev.value == pytest.approx(0.01) and dev.lo == 0.0 and dev.hi > 0.01
    # headroom gates of the S1 plain-rounding claims: the uniform step's worst budget and its loss vs clean
    worst = out["min_qacc.s1_qacc.uniform_step"]
    assert worst.value == pytest.approx(0.2) and worst.lo < 0.2 < worst.hi
    assert out["qloss_pts.s1_qacc_mean.uniform_step"] == pytest.approx({0: 65.0, 1: 75.0, 2: 85.0})


# ------------------------------------------------------------------ parameters

BASE = {
    "seeds": [0],
    "data": {},
    "backbone": {},
    "variants": ["estimator_s1", "estimator_s2"],
    "estimator": {},
    "evaluation": {},
}
CLAIM_S2 = {"id": "c", "text": "t", "metric": "gap_pts.s2_acc_snr0.featjnd_vs_gauss", "op": ">=", "threshold": 5}


@pytest.mark.parametrize(
    "patch, key",
    [
        ({"estimator": {"rho": 1.5}}, r"featjnd\.estimator\.rho"),
        ({"estimator": {"noise_dist": "laplace"}}, r"featjnd\.estimator\.noise_dist"),
        ({"evaluation": {"snr_db": []}}, r"featjnd\.evaluation\.snr_db"),
        ({"evaluation": {"quant_steps": [2, -1]}}, r"featjnd\.evaluation"),
        ({"evaluation": {"quant_steps_by_split": {"s1": [2, 0]}}}, r"featjnd\.evaluation.*quant_steps_by_split"),
        ({"evaluation": {"quant_steps_by_split": {"s3": [2]}}}, r"featjnd\.evaluation\.quant_steps_by_split"),
        ({"data": {"n_train": 1700}}, r"featjnd\.data.*n_train"),
        ({"data": {"source": "tensor_file"}}, r"featjnd\.data.*path"),
        ({"backbone": {"widths": [8, 8]}}, r"featjnd\.backbone\.widths"),
        ({"backbone": {"epochs": True}}, r"featjnd\.backbone\.epochs: .*integer"),
        ({"estimator": {"hiden": 8}}, r"featjnd\.estimator\.hiden: unknown key"),
        ({"threads": True}, r"featjnd\.threads"),
        ({"variants": []}, r"featjnd\.variants"),
        ({"variants": ["estimator_s3"]}, r"featjnd\.variants"),
        ({"variants": ["estimator_s1"], "claims": [CLAIM_S2]}, r"featjnd\.variants: .*claim 'c' reads split s2"),
    ],
)
def test_bad_parameter_names_the_key(patch, key):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for k, v in patch.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) else v
    with pytest.raises(ParameterError, match=key):
        validate(Params, raw, "featjnd")


def test_default_parameters_parse():
    p = validate(Params, {**BASE, "claims": [CLAIM_S2]}, "featjnd")
    assert p.threads == "auto" and p.variants == ["estimator_s1", "estimator_s2"]


# ------------------------------------------------------------------ the user's tensor file (--env=full)


def _tensor_params(path) -> Params:
    return Params.model_validate({**BASE, "seeds": [0, 1], "data": {"source": "tensor_file", "path": str(path)}})


def test_tensor_file_input_round_trips(tmp_path):
    from pipelines.featjnd.data import digits_canvas, make_images

    data = digits_canvas(0, 20, 10, 10, test_renders=1)
    user = {k: v for k, v in data.items() if k != "mask_test"}
    user["x_val"] = user["x_val"].double()  # any float dtype and integer labels are accepted
    user["y_val"] = user["y_val"].int()
    torch.save(user, tmp_path / "images.pt")
    out = make_images(_tensor_params(tmp_path / "images.pt"))
    assert set(out) == {"seed0", "seed1"}
    assert torch.equal(out["seed1"]["x_test"], data["x_test"])
    assert out["seed0"]["x_val"].dtype == torch.float32 and out["seed0"]["y_val"].dtype == torch.long
    assert out["seed0"]["mask_test"].shape == (10, 32, 32) and not out["seed0"]["mask_test"].any()


def _bad(mutate):
    def make(tmp_path):
        from pipelines.featjnd.data import digits_canvas

        data = digits_canvas(0, 20, 10, 10, test_renders=1)
        data = mutate(data)
        if isinstance(data, bytes):
            (tmp_path / "images.pt").write_bytes(data)
        else:
            torch.save(data, tmp_path / "images.pt")

    return make


def _set(key, value):
    def f(d):
        d[key] = value(d) if callable(value) else value
        return d

    return f


def _drop(key):
    def f(d):
        del d[key]
        return d

    return f


def _nan(d):
    d["x_test"][3, 0, 5, 5] = float("nan")
    return d


@pytest.mark.parametrize(
    "make, msg",
    [
        (_bad(lambda d: torch.zeros(3)), r"expected a dict of tensors, got Tensor"),
        (_bad(lambda d: b"not a torch file"), r"not a torch.save file"),
        (_bad(_drop("y_val")), r"key 'y_val' is missing"),
        (
            _bad(_set("x_train", lambda d: d["x_train"][:, 0])),
            r"key 'x_train' should be a float tensor N×C×H×W, got torch.float32 \(20, 32, 32\)",
        ),
        (
            _bad(_set("x_train", lambda d: d["x_train"][:0])),
            r"keys 'x_train' \(0 rows\) and 'y_train' \(20 rows\) differ in length",
        ),
        (
            _bad(_set("x_val", lambda d: (255 * d["x_val"]).to(torch.uint8))),
            r"key 'x_val' should be array\[float\], got elements of dtype uint8",
        ),
        (
            _bad(_set("x_val", lambda d: d["x_val"].repeat(1, 3, 1, 1))),
            r"key 'x_val' has images of C×H×W \(3, 32, 32\)",
        ),
        (_bad(_set("x_test", lambda d: d["x_test"][:, :, :3, :3])), r"key 'x_test' has images of 3×3"),
        (_bad(_nan), r"key 'x_test' has 1 non-finite"),
        (_bad(_set("y_test", lambda d: d["y_test"].float())), r"key 'y_test' should be int, got float32"),
        (_bad(_set("y_test", lambda d: d["y_test"] > 4)), r"key 'y_test' should be int, got bool"),
        (
            _bad(_set("y_train", lambda d: d["y_train"][:-1])),
            r"keys 'x_train' \(20 rows\) and 'y_train' \(19 rows\) differ in length",
        ),
        (_bad(_set("y_train", lambda d: d["y_train"] - 5)), r"key 'y_train' must be >= 0; \d+ value\(s\) are not"),
        (_bad(_set("mask_test", lambda d: d["mask_test"][:, :16])), r"key 'mask_test' should be a bool tensor"),
        (_bad(_set("mask_test", lambda d: d["mask_test"].float())), r"key 'mask_test' should be a bool tensor"),
    ],
)
def test_bad_tensor_file_stops_at_the_door_naming_the_key(tmp_path, make, msg):
    from kedro.io import DatasetError

    from pipelines.featjnd.data import make_images

    make(tmp_path)
    with pytest.raises(InputDataError, match=r"dataset 'featjnd\.data\.path \(.*images\.pt\)': " + msg) as exc:
        make_images(_tensor_params(tmp_path / "images.pt"))
    assert isinstance(exc.value, DatasetError) and "\n" not in str(exc.value)  # one line in the CLI


def test_missing_tensor_file_is_reported_with_its_key(tmp_path):
    from pipelines.featjnd.data import make_images

    with pytest.raises(InputDataError, match=r"featjnd\.data\.path .*nope\.pt.*file not found"):
        make_images(_tensor_params(tmp_path / "nope.pt"))


# ------------------------------------------------------------------ the report of the --env=test run


@pytest.mark.e2e
def test_report_content(test_env_run):
    report = test_env_run("featjnd").report
    assert set(report["variants"]) == {
        "featjnd",
        "gauss",
        "shuffled",
        "shuffled_all",
        "inverse",
        "sal_inv",
        "perm_step",
        "uniform_step",
    }
    assert len(report["claims"]) == 24
    assert set(report["artifacts"]) == {
        f"{k}_{sp}.png" for k in ("jnd_maps", "acc_vs_snr", "qacc_vs_budget") for sp in ("s1", "s2")
    } | {"estimator_training.png"}
    row = report["variants"]["featjnd"]
    assert {"s1_acc_snr0", "s2_qacc_D2_dither", "s1_jnd_bgfg_ratio", "s2_flip_rate_at_J_test"} <= set(row)
    # the controls are energy-matched to the method: same clean accuracy, every SNR measured
    for v in ("gauss", "shuffled", "inverse", "sal_inv"):
        assert report["variants"][v]["s1_acc_clean"] == row["s1_acc_clean"]
