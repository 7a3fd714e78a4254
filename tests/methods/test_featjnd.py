"""Tests of `featjnd`: the measurement mechanics against independent references (numpy / scipy / closed
form), the model split, the data, bad parameters, and the end-to-end --env=test run."""
import math

import numpy as np
import pytest
import torch

from pipelines.core.params import ParameterError, parse
from pipelines.featjnd import ops


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
    maps = {"jnd": j * z, "gauss": z, "shuffled": ops.shuffle_spatial(j, g) * z,
            "shuffled_all": ops.shuffle_all(j, g) * z, "inverse": z / j}
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
        allocs = {"featjnd": jnd, "perm_step": ops.permute_steps(jnd, g), "uniform_step": torch.full_like(jnd, d0),
                  "sal_inv": ops.steps_from_weights(ops.token_weights(sal, "rms"), d0),
                  "geomean": ops.steps_from_weights(ops.token_weights(j, "geomean"), d0)}
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
                assert bool(pooled[i, r, c]) == bool(mask[i, 2 * r:2 * r + 2, 2 * c:2 * c + 2].any())
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
    assert torch.equal(a["y_test"][0::2], a["y_test"][1::2])          # each test digit rendered twice
    assert not torch.equal(a["x_test"][0::2], a["x_test"][1::2])     # ... differently
    m = a["mask_test"]
    assert m.any(dim=(1, 2)).all() and (m.float().mean() < 0.3)
    assert (a["x_test"][:, 0][m] > 0).all()


# ------------------------------------------------------------------ parameters

BASE = {"seeds": [0], "data": {}, "backbone": {}, "estimator": {}, "evaluation": {}}


@pytest.mark.parametrize("patch, key", [
    ({"estimator": {"rho": 1.5}}, r"featjnd\.estimator\.rho"),
    ({"estimator": {"noise_dist": "laplace"}}, r"featjnd\.estimator\.noise_dist"),
    ({"evaluation": {"snr_db": []}}, r"featjnd\.evaluation\.snr_db"),
    ({"evaluation": {"quant_steps": [2, -1]}}, r"featjnd\.evaluation"),
    ({"data": {"n_train": 1700}}, r"featjnd\.data.*n_train"),
    ({"data": {"source": "tensor_file"}}, r"featjnd\.data.*path"),
    ({"backbone": {"widths": [8, 8]}}, r"featjnd\.backbone\.widths"),
    ({"estimator": {"hiden": 8}}, r"featjnd\.estimator\.hiden: unknown key"),
])
def test_bad_parameter_names_the_key(patch, key):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for k, v in patch.items():
        raw[k] = {**raw[k], **v}
    with pytest.raises(ParameterError, match=key):
        parse("featjnd", raw)


def test_missing_tensor_file_is_reported_with_its_key(tmp_path):
    from pipelines.featjnd.data import make_images

    raw = {**BASE, "data": {"source": "tensor_file", "path": str(tmp_path / "nope.pt")}}
    with pytest.raises(ParameterError, match=r"featjnd\.data\.path"):
        make_images(raw)


def test_tensor_file_input_round_trips(tmp_path):
    from pipelines.featjnd.data import digits_canvas, make_images

    data = digits_canvas(0, 20, 10, 10, test_renders=1)
    user = {k: v for k, v in data.items() if k != "mask_test"}
    torch.save(user, tmp_path / "images.pt")
    out = make_images({**BASE, "seeds": [0, 1], "data": {"source": "tensor_file", "path": str(tmp_path / "images.pt")}})
    assert set(out) == {"seed0", "seed1"}
    assert torch.equal(out["seed1"]["x_test"], data["x_test"])
    assert out["seed0"]["mask_test"].shape == (10, 32, 32) and not out["seed0"]["mask_test"].any()


# ------------------------------------------------------------------ end to end

@pytest.mark.e2e
def test_end_to_end(run_pipeline):
    result = run_pipeline("featjnd")
    report = result.report
    assert report["env"] == "test"
    assert set(report["variants"]) == {"featjnd", "gauss", "shuffled", "shuffled_all", "inverse", "sal_inv",
                                       "perm_step", "uniform_step"}
    assert len(report["claims"]) == 24
    for name in ("jnd_maps_s1", "jnd_maps_s2", "acc_vs_snr_s1", "qacc_vs_budget_s2"):
        assert f"{name}.png" in report["artifacts"]
    plots = list((result.project / "data" / "08_reporting" / "featjnd" / "plots").rglob("jnd_maps_s1.png"))
    assert plots and plots[-1].stat().st_size > 1000
    row = report["variants"]["featjnd"]
    assert {"s1_acc_snr0", "s2_qacc_D2_dither", "s1_jnd_bgfg_ratio", "s2_flip_rate_at_J_test"} <= set(row)
