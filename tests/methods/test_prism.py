"""Tests of `prism`: PRISM's mechanism against independent references (brute-force tangent projector,
dense SVD, per-example autograd, opacus' accountant), gauge invariance, and bad input (the end-to-end
--env=test run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipelines.core.params import ParameterError, validate
from pipelines.prism import model as M
from pipelines.prism.params import Params

RAW = yaml.safe_load(open("conf/base/parameters_prism.yml"))["prism"]


@pytest.fixture(autouse=True)
def _float64():
    """These references compare in float64; restore the default so other test modules are unaffected."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _factors(m=5, n=4, r=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, r, generator=g), torch.randn(n, r, generator=g)


def _brute_projector(A, B):
    """Orthogonal projector (mn × mn) onto T = {X Bᵀ + A Yᵀ}: the column space of the map's Jacobian."""
    m, r = A.shape
    n = B.shape[0]
    cols = []
    for i in range(m * r):
        X = torch.zeros(m * r)
        X[i] = 1
        cols.append((X.view(m, r) @ B.T).reshape(-1))
    for j in range(n * r):
        Y = torch.zeros(n * r)
        Y[j] = 1
        cols.append((A @ Y.view(n, r).T).reshape(-1))
    J = torch.stack(cols, 1)
    u, s, _ = torch.linalg.svd(J, full_matrices=False)
    Q = u[:, s > 1e-9 * s[0]]
    return Q @ Q.T, Q.shape[1]


def test_tangent_projection_and_lift_match_brute_force():
    A, B = _factors()
    P, dim = _brute_projector(A, B)
    assert dim == M.tangent_dim(5, 4, 2) == 2 * (5 + 4 - 2)
    G = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    U, s, V = M.usv(A, B)
    torch.testing.assert_close(U @ torch.diag(s) @ V.T, A @ B.T)
    xi = M.tangent_project(U, V, G)
    torch.testing.assert_close(xi.reshape(-1), P @ G.reshape(-1))
    dA, dB = M.lift(A, B, G)  # the factor-coordinate lift realises the same projection
    torch.testing.assert_close(dA @ B.T + A @ dB.T, xi)


def test_intrinsic_norm_matches_dense_per_example_projection():
    A, B = _factors(7, 6, 3)
    U, _, V = M.usv(A, B)
    g = torch.Generator().manual_seed(2)
    delta, a = torch.randn(9, 7, generator=g), torch.randn(9, 6, generator=g)
    dense = torch.stack([M.tangent_project(U, V, torch.outer(d, x)).pow(2).sum() for d, x in zip(delta, a)])
    torch.testing.assert_close(M.intrinsic_sq_norms(U, V, delta, a), dense)


@pytest.mark.parametrize("sampler", ["tangent", "factor"])
def test_noise_covariance_matches_closed_form(sampler):
    """Empirical covariance of vec(ν) = std² P_T (isotropic on T_Z, zero off it); E‖ν‖² = std² r(m+n−r)."""
    A, B = _factors()
    A = A @ torch.tensor([[3.0, 1.0], [0.0, 0.2]])  # an unbalanced gauge must not matter
    P, dim = _brute_projector(A, B)
    U, _, V = M.usv(A, B)
    g, std, n = torch.Generator().manual_seed(3), 0.7, 40000
    if sampler == "tangent":
        nu = M.tangent_noise(U, V, std, g, samples=n).reshape(n, -1)
    else:
        na, nb = M.factor_noise(A, B, std, g, samples=n)
        nu = (na @ B.T + A @ nb.mT).reshape(n, -1)
    cov = nu.T @ nu / n
    assert float((cov - std**2 * P).abs().max()) < 0.03
    assert abs(float(nu.pow(2).sum(1).mean()) / (std**2 * dim) - 1) < 0.02


def test_retraction_is_the_truncated_svd():
    A, B = _factors(8, 6, 2, seed=4)
    dA, dB = _factors(8, 6, 2, seed=5)
    A2, B2 = M.retract(A, B, dA, dB, -0.3)
    Y = (A @ B.T - 0.3 * (dA @ B.T + A @ dB.T)).numpy()
    u, s, vt = np.linalg.svd(Y)
    np.testing.assert_allclose((A2 @ B2.T).numpy(), (u[:, :2] * s[:2]) @ vt[:2], atol=1e-10)
    torch.testing.assert_close(A2.T @ A2, B2.T @ B2)  # balanced


def _batch(n=32, seed=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 32, generator=g), torch.randint(10, (n,), generator=g)


def _base(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "W1": torch.randn(64, 32, generator=g) / 32**0.5,
        "b1": torch.zeros(64),
        "W2": torch.randn(64, 64, generator=g) / 8,
        "b2": torch.zeros(64),
        "W3": 8 * torch.randn(10, 64, generator=g) / 8,
        "b3": torch.zeros(10),
    }


def _prism_steps(gauge, optimizer, steps=3):
    x, y = _batch()
    mdl = M.AdaptedMLP(_base(), "lora", 4, "balanced", 1e-2, gauge, torch.Generator().manual_seed(7))
    opt = M.DPStep(
        mdl,
        "prism",
        optimizer,
        0.5 if optimizer == "sgd" else 0.05,
        sigma=1.0,
        clip=0.5,
        batch=32,
        gen=torch.Generator().manual_seed(8),
    )
    for _ in range(steps):
        mdl.train()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(mdl(x), y).backward()
        opt.step()
    return [mdl.delta_w(l).detach() for l in M.LAYERS], opt


@pytest.mark.parametrize("optimizer", ["sgd", "adaptive"])
def test_prism_update_is_gauge_invariant(optimizer):
    """(A, B) → (AG, BG⁻ᵀ): same Z after several noisy steps (shared data and tangent-noise streams)."""
    ref, _ = _prism_steps(None, optimizer)
    g = torch.Generator().manual_seed(9)
    q1, q2 = torch.linalg.qr(torch.randn(4, 4, generator=g))[0], torch.linalg.qr(torch.randn(4, 4, generator=g))[0]
    for G in (0.1 * torch.eye(4), 10 * torch.eye(4), q1 @ torch.diag(torch.logspace(-1, 1, 4)) @ q2.T):
        out, _ = _prism_steps(G, optimizer)
        for z0, z1 in zip(ref, out):
            torch.testing.assert_close(z1, z0, rtol=1e-7, atol=1e-9)


def test_naive_dp_lora_is_not_gauge_invariant():
    """The contrast: DP-SGD on the factors moves Z differently under a gauge change."""
    x, y = _batch()
    zs = []
    for G in (None, 0.1 * torch.eye(4)):
        mdl = M.AdaptedMLP(_base(), "lora", 4, "balanced", 1e-2, G, torch.Generator().manual_seed(7))
        opt = M.DPStep(mdl, "naive", "sgd", 0.5, 1.0, 0.5, 32, torch.Generator().manual_seed(8))
        mdl.train()
        torch.nn.functional.cross_entropy(mdl(x), y).backward()
        opt.step()
        zs.append(mdl.delta_w("1").detach())
    assert float((zs[0] - zs[1]).norm()) > 1e-3 * float(zs[0].norm())


@pytest.mark.parametrize("mechanism", ["naive", "ffa", "dense", "prism"])
def test_per_example_clipping_bounds(mechanism):
    """The per-example norms the step clips equal per-example autograd gradients (naive / ffa / dense) or
    their tangent projections (prism), jointly over both layers; each clipped contribution is ≤ C, so adding
    or removing one example moves the clipped sum by at most C."""
    x, y = _batch(8)
    kind = "dense" if mechanism == "dense" else "lora"
    mdl = M.AdaptedMLP(
        _base(), kind, 4, "balanced", 1e-1, None, torch.Generator().manual_seed(7), freeze_B=mechanism == "ffa"
    )
    if kind == "dense":
        with torch.no_grad():
            for l in M.LAYERS:
                getattr(mdl, f"D{l}").normal_(0, 0.05)
    clip = 0.05
    lr = 0.0 if mechanism == "prism" else 1.0
    opt = M.DPStep(mdl, mechanism, "sgd", lr, 0.0, clip, 8, torch.Generator().manual_seed(8))
    params = [q for q in mdl.parameters() if q.requires_grad]
    ref, per_grads = [], []
    for i in range(8):  # per-example autograd reference
        mdl.zero_grad()
        torch.nn.functional.cross_entropy(mdl(x[i : i + 1]), y[i : i + 1]).backward()
        if mechanism == "prism":
            sq = 0.0
            for l in M.LAYERS:
                A, B = getattr(mdl, f"A{l}").detach(), getattr(mdl, f"B{l}").detach()
                U, _, V = M.usv(A, B)
                GA = getattr(mdl, f"A{l}").grad  # = G_i B; recover G_i = δ aᵀ from the layer
                W = mdl.W1 if l == "1" else mdl.W2
                Gi = torch.autograd.functional.jacobian(
                    lambda D: torch.nn.functional.cross_entropy(_forward_with(mdl, l, D, x[i : i + 1]), y[i : i + 1]),
                    torch.zeros_like(W),
                )
                torch.testing.assert_close(Gi @ B, GA)
                sq += float(M.tangent_project(U, V, Gi).pow(2).sum())
            ref.append(sq)
        else:
            ref.append(sum(float(q.grad.pow(2).sum()) for q in params))
            per_grads.append([q.grad.clone() for q in params])
    ref = torch.tensor(ref)
    mdl.train()
    mdl.zero_grad()
    torch.nn.functional.cross_entropy(mdl(x), y).backward()
    snapshot = [q.detach().clone() for q in params]
    opt.step()  # σ 0: SGD on Σ c_i g_i / b (prism: lr 0)
    c = torch.clamp(clip / ref.sqrt(), max=1.0)
    assert opt.log["clip_fraction"][-1] == pytest.approx(float((ref.sqrt() > clip).double().mean()))
    assert float((c * ref.sqrt()).max()) <= clip * (1 + 1e-9)
    assert (ref.sqrt() > clip).any()
    if mechanism != "prism":
        for k, (q, s) in enumerate(zip(params, snapshot)):
            clipped_sum = sum(ci * g[k] for ci, g in zip(c, per_grads))
            torch.testing.assert_close(s - q.detach(), clipped_sum / 8)
    # the step's own per-example norms, from its factored formulas
    ex = opt._per_example()
    if mechanism == "prism":
        mine = sum(
            M.intrinsic_sq_norms(
                *(lambda U, s, V: (U, V))(*M.usv(getattr(mdl, f"A{l}").detach(), getattr(mdl, f"B{l}").detach())), d, a
            )
            for l, (a, d) in zip(M.LAYERS, ex)
        )
        torch.testing.assert_close(mine, ref)


def _forward_with(mdl, layer, D, x):
    """The model's forward with an extra dense perturbation D on one layer (for ∂ℓ/∂W by autograd)."""
    z1 = x @ (mdl.W1 + mdl.delta_w("1") + (D if layer == "1" else 0)).T + mdl.b1
    h1 = torch.tanh(z1)
    z2 = h1 @ (mdl.W2 + mdl.delta_w("2") + (D if layer == "2" else 0)).T + mdl.b2
    return torch.tanh(z2) @ mdl.W3.T + mdl.b3


def test_sigma_matches_opacus():
    """The independent integer-order RDP computation agrees with opacus: RDP values at integer orders and
    the calibrated noise multiplier σ (card: ≈ 2.21 / 1.05 / 0.70 for ε = 1 / 3 / 8)."""
    from opacus.accountants.analysis.rdp import compute_rdp

    from pipelines.prism.privacy import noise_multiplier, rdp_sampled_gaussian, sigma_reference

    q, steps, delta = 256 / 20000, 1562, 1e-5
    orders = np.arange(2, 40)
    np.testing.assert_allclose(
        rdp_sampled_gaussian(q, 1.05, orders),
        compute_rdp(q=q, noise_multiplier=1.05, steps=1, orders=list(orders.astype(float))),
        rtol=1e-6,
    )
    for eps, card in ((1.0, 2.21), (3.0, 1.05), (8.0, 0.70)):
        mine, theirs = sigma_reference(eps, delta, q, steps), noise_multiplier(eps, delta, q, steps)
        assert mine == pytest.approx(theirs, rel=0.02)
        assert theirs == pytest.approx(card, rel=0.02)


def test_task_flips_the_declared_fraction():
    from pipelines.prism.data import make_task

    raw = copy.deepcopy(RAW)
    raw["data"].update(n_train=600, n_test=200)
    t = make_task(Params.model_validate(raw))
    assert float(t["flip_frac"]) == pytest.approx(0.35, abs=0.01)
    assert t["x_train"].shape == (600, 32) and t["y_test"].shape == (200,)


def test_bad_parameter_names_the_key():
    raw = copy.deepcopy(RAW)
    raw["methods"]["prism_sgd"]["lr"] = -1
    with pytest.raises(ParameterError, match=r"prism\.methods\.prism_sgd\.lr"):
        validate(Params, raw, "prism")
    raw = copy.deepcopy(RAW)
    raw["privacy"]["clip"] = 0
    with pytest.raises(ParameterError, match=r"prism\.privacy\.clip"):
        validate(Params, raw, "prism")
    raw = copy.deepcopy(RAW)
    raw["variants"] = raw["variants"] + ["prism_spectral"]
    with pytest.raises(ParameterError, match=r"prism_spectral"):
        validate(Params, raw, "prism")


def test_bad_user_file_names_dataset_and_column(tmp_path):
    from pipelines.core.schemas import InputDataError
    from pipelines.prism.data import make_task

    df = pd.DataFrame({f"x{i}": np.zeros(20) for i in range(32)})
    df["y"] = 0
    df["split"] = ["public"] * 10 + ["train"] * 5 + ["test"] * 5
    raw = copy.deepcopy(RAW)
    raw["data"]["path"] = str(tmp_path / "t.parquet")
    df.drop(columns="x7").to_parquet(raw["data"]["path"])
    with pytest.raises(InputDataError, match=r"prism\.user_table.*x7"):
        make_task(Params.model_validate(raw))
    df.assign(split=["public"] * 10 + ["val"] * 10).to_parquet(raw["data"]["path"])
    with pytest.raises(InputDataError, match=r"prism\.user_table.*split"):
        make_task(Params.model_validate(raw))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_factor_update_matches_torch_optimizer(optimizer):
    """With σ = 0 and a huge C the naive step is plain SGD / Adam on the batch-summed gradient / b:
    compare against torch.optim on the same gradients."""
    x, y = _batch(16)
    models = [
        M.AdaptedMLP(_base(), "lora", 4, "balanced", 1e-1, None, torch.Generator().manual_seed(7)) for _ in range(2)
    ]
    mine = M.DPStep(models[0], "naive", optimizer, 1e-2, 0.0, 1e6, 16, torch.Generator().manual_seed(8))
    params = [q for q in models[1].parameters() if q.requires_grad]
    ref = torch.optim.Adam(params, lr=1e-2) if optimizer == "adam" else torch.optim.SGD(params, lr=1e-2)
    for _ in range(3):
        for mdl, opt in zip(models, (mine, ref)):
            mdl.train()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(mdl(x), y).backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("env", ["test", "full"])
def test_env_parameters_validate(env):
    from pipelines.core.registry import method_config

    p = validate(Params, method_config("prism", env=env), "prism")
    assert set(p.variants) <= set(p.methods)


def test_user_table_fits_a_base_model_on_the_public_split(tmp_path):
    from pipelines.prism.data import make_task, teacher_logits

    g = np.random.default_rng(0)
    x = g.normal(size=(600, 32))
    df = pd.DataFrame(x, columns=[f"x{i}" for i in range(32)])
    df["y"] = (x[:, 0] > 0).astype(int) + 2 * (x[:, 1] > 0).astype(int)
    df["split"] = ["public"] * 400 + ["train"] * 100 + ["test"] * 100
    raw = copy.deepcopy(RAW)
    raw["data"]["path"] = str(tmp_path / "t.parquet")
    df.to_parquet(raw["data"]["path"])
    t = make_task(Params.model_validate(raw))
    assert t["x_train"].shape == (100, 32) and t["y_test"].shape == (100,)
    acc = float((teacher_logits(t["x_test"], t["base"]).argmax(1) == t["y_test"]).double().mean())
    assert acc > 0.6  # chance is 0.25
