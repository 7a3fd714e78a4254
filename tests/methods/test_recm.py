"""Tests of `recm`: the projector and the hooks against independent references (brute-force group
averaging, autograd on an explicit dense map, an exactly symmetric data set), the RECM rule's limit case
(zero symmetry gap: θ → ~0 and the deployed net is equivariant to numerical precision), the symmetry-gap
estimators, and bad input (the end-to-end --env=test run is covered by tests/methods/test_all_pipelines.py)."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.recm.params import Params

RAW = {
    "seeds": [0],
    "threads": 1,
    "data": {"eps": [0.0, 0.5], "n_train": 512, "n_test": 128},
    "train": {"steps": 20},
    "variants": {"recm": {"kind": "recm"}, "strict": {"kind": "strict"}},
}


def params(**over) -> Params:
    raw = copy.deepcopy(RAW)
    for k, v in over.items():
        if isinstance(v, dict):
            raw.setdefault(k, {}).update(v)
        else:
            raw[k] = v
    return Params.model_validate(raw)


# --------------------------------------------------------------------------- projector and hooks
def brute_force_reynolds(M: torch.Tensor, c_out: int, c_in: int, L: int) -> torch.Tensor:
    """(1/|G|) Σ_g ρ_out(g)⁻¹ M ρ_in(g) with explicit permutation matrices of the cyclic shifts."""
    out = torch.zeros_like(M)
    for k in range(L):
        S = torch.roll(torch.eye(L, dtype=M.dtype), k, dims=0)  # S x = roll(x, k)
        R_in, R_out = torch.block_diag(*[S] * c_in), torch.block_diag(*[S] * c_out)
        out += R_out.T @ M @ R_in
    return out / L


def test_reynolds_matches_brute_force_group_average_and_is_a_projector():
    from pipelines.recm.model import perp_inner, reynolds

    torch.manual_seed(0)
    c_out, c_in, L = 3, 2, 6
    A, B = torch.randn(c_out * L, c_in * L, dtype=torch.float64), torch.randn(c_out * L, c_in * L, dtype=torch.float64)
    P = reynolds(A, c_out, c_in, L)
    torch.testing.assert_close(P, brute_force_reynolds(A, c_out, c_in, L))
    torch.testing.assert_close(reynolds(P, c_out, c_in, L), P)  # idempotent
    ref = ((A - reynolds(A, c_out, c_in, L)) * (B - reynolds(B, c_out, c_in, L))).sum()
    torch.testing.assert_close(perp_inner(A, B, c_out, c_in, L), ref)  # orthogonal projector


def test_conv_is_in_the_range_of_the_projector_and_matches_the_layer():
    from pipelines.recm.model import RelaxedLayer, conv_as_dense, reynolds

    torch.manual_seed(1)
    layer = RelaxedLayer(3, 4, 10, 5, theta0=0.0)
    W = conv_as_dense(layer.E.detach(), 10)
    torch.testing.assert_close(reynolds(W, 4, 3, 10), W, atol=1e-6, rtol=1e-6)
    h = torch.randn(7, 3, 10)
    with torch.no_grad():
        z = layer(h) - layer.bias.view(1, -1, 1)
    torch.testing.assert_close(z.reshape(7, -1), h.reshape(7, -1) @ W.T, atol=1e-5, rtol=1e-5)


def test_dense_grad_from_the_hook_equals_autograd_on_the_effective_map():
    """G = Σ δ hᵀ (pre-activation hook) is ∂L/∂W_eff, checked against autograd on an explicit dense map."""
    from pipelines.recm.model import RelaxedLayer

    torch.manual_seed(2)
    layer = RelaxedLayer(2, 3, 8, 3, theta0=0.3, u_init="random")
    layer.track = True
    h, tgt = torch.randn(5, 2, 8), torch.randn(5, 3, 8)
    ((torch.tanh(layer(h)) - tgt) ** 2).sum().backward()
    W = layer.effective_dense().detach().requires_grad_(True)
    z = (h.reshape(5, -1) @ W.T).view(5, 3, 8) + layer.bias.detach().view(1, -1, 1)
    ((torch.tanh(z) - tgt) ** 2).sum().backward()
    torch.testing.assert_close(layer.dense_grad(), W.grad, atol=1e-5, rtol=1e-5)


def test_strict_net_is_equivariant_and_its_gradient_is_equivariant_on_shift_closed_data():
    """An equivariant net on a data set closed under every shift: equiv_error ≈ 0 and the full-data
    dense-map gradient of every layer lies in the equivariant subspace (P⊥G = 0)."""
    from pipelines.recm.model import RelaxedNet, equivariance_error, perp, perp_inner, shift

    torch.manual_seed(3)
    net = RelaxedNet(c_in=2, channels=4, hidden=2, L=8, kernel=3, theta0=0.0).double()
    x0, y0 = torch.randn(6, 2, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    assert equivariance_error(net, x0) < 1e-28
    x = torch.cat([shift(x0, k) for k in range(8)])
    y = torch.cat([shift(y0, k) for k in range(8)])
    net.set_track(True)
    ((net(x) - y) ** 2).mean().backward()
    for layer in net.layers:
        G = layer.dense_grad()
        # perp_inner is a difference of two sums (<G, G> - <P G, P G>): its floor is float64's eps * |G|^2
        # (2.2e-16 relative), so "zero" is a few hundred eps; the projection itself has no cancellation
        assert float(perp_inner(G, G, layer.c_out, layer.c_in, layer.L)) < 1e-13 * float((G**2).sum())
        assert float(perp(G, layer.c_out, layer.c_in, layer.L).norm()) < 1e-12 * float(G.norm())


# --------------------------------------------------------------------------- symmetry-gap estimators
def test_symmetry_gap_is_zero_on_exactly_symmetric_data_and_positive_otherwise():
    from pipelines.recm.data import arrays, make_data, symmetry_gap_linear

    p = params()
    df = make_data(p)
    g0 = symmetry_gap_linear(*arrays(df, 0.0, "train"), *arrays(df, 0.0, "test"))
    g5 = symmetry_gap_linear(*arrays(df, 0.5, "train"), *arrays(df, 0.5, "test"))
    assert g0["symmetry_gap_linear"] < 1e-12
    assert g5["symmetry_gap_linear"] > 0.01


def test_circulant_least_squares_recovers_a_known_circulant_map():
    """Independent reference: targets made by an explicit circular convolution (np.roll) are fitted
    exactly by the circulant design, and the gap is 0."""
    from pipelines.recm.data import symmetry_gap_linear

    rng = np.random.default_rng(0)
    L, n = 8, 200
    w = rng.normal(size=(2, L))

    def f(x):
        return sum(w[c, d] * np.roll(x[:, c], -d, axis=-1) for c in range(2) for d in range(L)) + 0.3

    xtr, xte = rng.normal(size=(n, 2, L)), rng.normal(size=(50, 2, L))
    g = symmetry_gap_linear(xtr, f(xtr), xte, f(xte))
    assert g["linear_circulant_rel_mse"] < 1e-20 and g["symmetry_gap_linear"] < 1e-12


def test_layer_gap_is_zero_on_shift_closed_data():
    from pipelines.recm.evaluate import layer_gap
    from pipelines.recm.model import RelaxedNet

    torch.manual_seed(4)
    net = RelaxedNet(c_in=2, channels=4, hidden=1, L=8, kernel=3, theta0=0.0)
    rng = np.random.default_rng(1)
    x0, y0 = rng.normal(size=(8, 2, 8)), rng.normal(size=(8, 8))
    # each half (and each batch of 8) holds one sample in all its 8 shifts: exactly symmetric batches
    x = np.concatenate([np.stack([np.roll(x0[i], k, -1) for k in range(8)]) for i in range(8)])
    y = np.concatenate([np.stack([np.roll(y0[i], k, -1) for k in range(8)]) for i in range(8)])
    assert max(layer_gap(net, x, y, batch_size=8)) < 1e-3


# --------------------------------------------------------------------------- the RECM rule: limit case
def test_recm_at_zero_gap_relaxation_vanishes_and_net_is_equivariant():
    """Zero symmetry gap (ε = 0, the training set closed under every shift, so even its empirical
    distribution is symmetric): every θ_ℓ decays to ~0, the branches are dropped and the deployed net's
    equivariance error is at numerical precision. At ε = 0.5 the same rule keeps the layers relaxed."""
    from pipelines.recm.data import arrays, make_data
    from pipelines.recm.train import train_one

    torch.set_num_threads(1)
    p = params(
        data={"eps": [0.0, 0.5], "n_train": 2048, "n_test": 128},
        model={"channels": 4, "hidden": 2},
        train={"steps": 600, "equiv_test_inputs": 32},
        recm={"alpha": 0.02},
    )
    df = make_data(p)
    x, y = arrays(df, 0.0, "train")
    x, y = x[:64], y[:64]
    xs = np.concatenate([np.roll(x, k, -1) for k in range(32)])
    ys = np.concatenate([np.roll(y, k, -1) for k in range(32)])
    r0, hist, _ = train_one(xs, ys, *arrays(df, 0.0, "test"), p, p.variants["recm"], seed=0, device=torch.device("cpu"))
    assert hist["theta_l0"]["value"][0] == pytest.approx(1.0, abs=0.05)
    assert r0["max_final_theta"] < 1e-3, r0
    assert r0["n_layers_snapped"] == 3
    assert r0["equiv_error"] < 1e-12
    r5, _, _ = train_one(
        *arrays(df, 0.5, "train"), *arrays(df, 0.5, "test"), p, p.variants["recm"], seed=0, device=torch.device("cpu")
    )
    assert r5["max_final_theta"] > 0.05 and r5["equiv_error"] > 1e-4


def test_single_ema_statistic_has_a_noise_floor_the_two_ema_one_does_not():
    """Zero gap (shift-closed training set): the single-EMA statistic ‖P⊥M‖/n keeps a minibatch-noise
    floor, the debiased two-EMA one goes to ~0; the other rules run and return valid relaxations."""
    from pipelines.recm.data import arrays, make_data
    from pipelines.recm.train import train_one

    torch.set_num_threads(1)
    rules = ("two_ema", "single_ema", "grad_at_eq", "branch_violation")
    raw = copy.deepcopy(RAW)
    raw.update(
        data={"eps": [0.0], "n_train": 64, "n_test": 64},
        model={"channels": 4, "hidden": 1},
        train={"steps": 300, "equiv_test_inputs": 8},
        recm={"alpha": 0.02},
        variants={r: {"kind": "recm", "rule": r} for r in rules},
    )
    p = Params.model_validate(raw)
    df = make_data(p)
    x, y = arrays(df, 0.0, "train")
    xs = np.concatenate([np.roll(x, k, -1) for k in range(32)])
    ys = np.concatenate([np.roll(y, k, -1) for k in range(32)])
    theta = {}
    for r in rules:
        steps = 300 if r in ("two_ema", "single_ema") else 20
        q = p.model_copy(update={"train": p.train.model_copy(update={"steps": steps})})
        row, _, _ = train_one(xs, ys, *arrays(df, 0.0, "test"), q, q.variants[r], seed=0, device=torch.device("cpu"))
        theta[r] = row["max_final_theta"]
        assert 0.0 <= theta[r] <= 1.0
    # s ≡ 0 gives the closed form θ_T = (1 − α)^(T − 1) (the first step has no B average yet)
    assert theta["two_ema"] < 1.5 * 0.98**299, theta
    assert theta["single_ema"] > 5 * theta["two_ema"] and theta["single_ema"] > 0.01, theta


def test_strict_variant_never_relaxes():
    from pipelines.recm.data import arrays, make_data
    from pipelines.recm.train import train_one

    p = params(model={"channels": 2, "hidden": 1})
    df = make_data(p)
    row, _, state = train_one(
        *arrays(df, 0.5, "train"), *arrays(df, 0.5, "test"), p, p.variants["strict"], seed=0, device=torch.device("cpu")
    )
    assert row["max_final_theta"] == 0.0 and row["equiv_error"] < 1e-10
    assert all(float(v.abs().max()) == 0.0 for k, v in state.items() if k.endswith(".U"))


def test_train_variant_table_and_the_derived_metrics():
    """train_variant's long table (metrics per ε, the strict net's layer gaps, histories) and the
    declarations on it: per-seed paired ratios / gains, the point-valued excess over min(CR, RPP) + std."""
    from pipelines.core.spec import SeedValues, compute_derived
    from pipelines.recm.data import make_data
    from pipelines.recm.evaluate import data_gaps, fits_table, histories_table, layer_gaps_table
    from pipelines.recm.spec import SPEC
    from pipelines.recm.train import train_variant

    raw = copy.deepcopy(RAW)
    raw.update(
        seeds=[0, 1],
        data={"eps": [0.0, 0.2], "n_train": 128, "n_test": 32},
        model={"channels": 2, "hidden": 1},
        train={"steps": 6, "log_every": 2, "equiv_test_inputs": 4},
        variants={v: {"kind": v} for v in ("recm", "strict", "cr", "rpp")},
    )
    p = Params.model_validate(raw)
    df = make_data(p)
    gaps = data_gaps(df, p)
    tables = {}
    for v in p.variants:
        tables[v], states = train_variant(df, gaps, p, v)
        assert set(states) == {"eps0", "eps0p2"} and set(states["eps0"]) == {"seed0", "seed1"}
    values = SeedValues(tables)
    assert set(values.per_seed("strict", "layer_gap_l1.eps0p2")) == {0, 1}
    assert len(layer_gaps_table(values, p)) == 2 * 2 * 2
    assert "theta_l0.eps0" not in values.histories()["strict"] and "theta_l0.eps0" in values.histories()["recm"]
    assert set(histories_table(values, p)["recm"]["eps0p2"]) == {"0", "1"}
    assert set(fits_table(values, p)["recm"]["eps"]) == {0.0, 0.2}
    point, per_seed = compute_derived(SPEC, p, values, list(p.variants), {"gaps": gaps})
    te = {v: values.per_seed(v, "test_mse.eps0") for v in ("recm", "cr")}
    assert per_seed["ratio.test_mse.eps0.recm_over_cr"] == {s: te["recm"][s] / te["cr"][s] for s in (0, 1)}
    g = per_seed["relative_gain.test_mse.eps0p2.recm_vs_strict"]
    assert per_seed["relative_gain.test_mse.recm_vs_strict.min_eps_ge0p2"] == g
    assert set(per_seed["spearman.max_final_theta_vs_symmetry_gap"]) == {0, 1}
    m = np.array(list(values.per_seed("recm", "test_mse.eps0p2").values()))
    best = min(
        (np.array(list(values.per_seed(b, "test_mse.eps0p2").values())) for b in ("cr", "rpp")), key=lambda a: a.mean()
    )
    ref = (m.mean() - best.mean() - np.sqrt((m.std() ** 2 + best.std() ** 2) / 2)) / best.mean()
    assert point["excess.test_mse.recm_over_best_of_cr_rpp_plus_std.max_eps_ge0p2"] == pytest.approx(ref)
    assert point["symmetry_gap_linear.eps0"] == float(gaps["symmetry_gap_linear"].iloc[0])


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "key,bad,where",
    [
        ("recm", {"alpha": 0.0}, r"recm\.recm\.alpha"),
        ("model", {"kernel": 4}, r"recm\.model\.kernel"),
        ("data", {"eps": [0.0, 3.0]}, r"recm\.data\.eps"),
        ("train", {"stepz": 3}, r"recm\.train\.stepz"),
    ],
)
def test_bad_parameter_names_the_key(key, bad, where):
    raw = copy.deepcopy(RAW)
    raw.setdefault(key, {}).update(bad)
    with pytest.raises(ParameterError, match=where):
        validate(Params, raw, "recm")


def test_bad_variant_names_the_key():
    raw = copy.deepcopy(RAW)
    raw["variants"]["fixed"] = {"kind": "fixed"}  # no theta
    with pytest.raises(ParameterError, match=r"recm\.variants\.fixed"):
        validate(Params, raw, "recm")
    raw["variants"] = {"bad": {"kind": "recm", "rule": "magic"}}
    with pytest.raises(ParameterError, match=r"recm\.variants\.bad\.rule"):
        validate(Params, raw, "recm")


def test_unstable_simulation_is_rejected_naming_the_key():
    from pipelines.recm.data import make_data

    with pytest.raises(ValueError, match=r"recm\.data\.substeps"):
        make_data(params(data={"substeps": 1}))


def test_bad_user_table_names_dataset_and_column(tmp_path):
    from pipelines.recm.data import make_data

    good = pd.DataFrame(
        {
            "eps": [0.0, 0.0],
            "split": ["train", "test"],
            "u_prev": [[0.0] * 4] * 2,
            "u_now": [[1.0] * 4] * 2,
            "u_next": [[2.0] * 4] * 2,
        }
    )
    path = tmp_path / "d.parquet"
    good.to_parquet(path)
    assert len(make_data(params(data={"L": 4, "eps": [0.0], "path": str(path)}))) == 2
    for bad, col in (
        (good.drop(columns="u_now"), "u_now"),
        (good.assign(split=["train", "val"]), "split"),
        (good.assign(u_next=[[2.0] * 3] * 2), "u_next"),
        (good.assign(eps=[0.1, 0.1]), "eps"),
    ):
        bad.to_parquet(path)
        with pytest.raises(InputDataError, match=rf"recm\.user_data.*'{col}'"):
            make_data(params(data={"L": 4, "eps": [0.0], "path": str(path)}))
