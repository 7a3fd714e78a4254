"""Tests of `ntk_feynman`: the recursions and kernels against independent references (hand-derived ReLU
closed forms, the arc-cosine kernels, an independent Gauss-Hermite quadrature for tanh), the sampler's NTK
against autodiff, the Monte-Carlo estimators on a case with an exact finite-width answer, the ReLU theorem,
and bad input (the end-to-end --env=test run is covered by tests/methods/test_all_pipelines.py; its report
is checked here through the shared fixture)."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.ntk_feynman import mc, theory
from pipelines.ntk_feynman.params import TENSORS, Params

RAW = {
    "seeds": [0],
    "data": {"n0": 6, "sq_norm": 1.0},
    "net": {"depth": 3, "lambda_b": 1.0, "lambda_w": 1.0},
    "activations": {"relu": {"c_w": 2.0, "c_b": 0.0}, "tanh": {"c_w": 1.0, "c_b": 0.0}},
    "quadrature": {"nodes_per_half": 48, "half_width_sd": 12.0},
    "mc": {"widths": [4, 8], "nets_per_seed": [60, 60], "blocks_per_seed": 3, "chunk_elems": 100_000,
           "claim_widths": [8], "narrow_width": 4, "slope_min_width": 4},
    "variants": ["recursion", "no_interlayer", "infinite_width", "mc_relu", "mc_tanh"],
}


# ------------------------------------------------------------------------ theory vs closed forms
def relu_reference(c_w, c_b, lam_b, lam_w, sq, depth, interlayer=True):
    """The ReLU recursions written out by hand with the exact half-Gaussian moments
    <s^2> = K/2, <s^4> = 3K^2/2, <s'^2> = <s'^4> = 1/2, <s'^2 s^2> = K/2, d<s^2>/dK = 1/2, d<s'^2>/dK = 0."""
    K, Th = c_b + c_w * sq, lam_b + lam_w * sq
    V = A = B = D = F = 0.0
    for _ in range(depth - 1):
        r = 1.0 if interlayer else 0.0
        chi_par, chi_perp, chi_th = c_w / 2, c_w / 2, lam_w / 2
        Ef = lam_w * K / 2 + c_w * Th / 2
        var_f = 0.5 * (3 * lam_w**2 * K**2 + 2 * lam_w * c_w * Th * K + c_w**2 * Th**2) - Ef**2
        cov_f = c_w * 0.5 * (3 * lam_w * K**2 + c_w * Th * K) - c_w * (K / 2) * Ef
        V, B, F, D, A = (
            c_w**2 * (1.5 * K**2 - K**2 / 4) + r * chi_par**2 * V,
            c_w**2 * 0.5 * Th**2 + r * chi_perp**2 * B,
            c_w**2 * (K / 2) * Th + r * chi_par**2 * F,
            cov_f + r * (chi_par * chi_th * V + chi_par * chi_perp * D),
            var_f + r * (chi_th**2 * V + 2 * chi_perp * chi_th * D + chi_perp**2 * A),
        )
        K, Th = c_b + c_w * K / 2, lam_b + lam_w * K / 2 + c_w * Th / 2
    return {"K": K, "Theta": Th, "V": V, "A": A, "B": B, "D": D, "F": F}


def test_relu_recursion_reproduces_the_card_values():
    last = theory.first_order("relu", 2.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]
    assert {k: round(last[k], 9) for k in ("K", "Theta", *TENSORS)} == \
        {"K": 2, "Theta": 8, "V": 60, "A": 166, "B": 112, "D": 84, "F": 48}


@pytest.mark.parametrize("interlayer", [True, False])
@pytest.mark.parametrize("c_w,c_b,lam_b,lam_w,sq,depth", [(2.0, 0.0, 1.0, 1.0, 1.0, 6), (1.7, 0.3, 0.5, 2.0, 2.3, 5)])
def test_relu_recursion_matches_hand_closed_form(c_w, c_b, lam_b, lam_w, sq, depth, interlayer):
    got = theory.first_order("relu", c_w, c_b, lam_b, lam_w, sq, depth, interlayer=interlayer)[-1]
    ref = relu_reference(c_w, c_b, lam_b, lam_w, sq, depth, interlayer)
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, rel=1e-11, abs=1e-11), k


def test_infinite_width_relu_is_the_arc_cosine_kernel():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3, 7)) * np.array([[0.5], [1.0], [2.0]])
    X[2] = -0.9 * X[1] + 0.1 * X[2]                         # a strongly anti-correlated pair
    c_w, c_b, lam_b, lam_w = 2.0, 0.1, 0.7, 1.3
    got = theory.infinite_width_gram("relu", c_w, c_b, lam_b, lam_w, X, 4)
    G = X @ X.T / X.shape[1]
    K, T = c_b + c_w * G, lam_b + lam_w * G
    for ell in range(4):
        np.testing.assert_allclose(got[ell][0], K, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[ell][1], T, rtol=1e-10, atol=1e-12)
        ss, dd = np.empty_like(K), np.empty_like(K)
        for a in range(3):
            for b in range(3):
                ss[a, b], dd[a, b] = theory.relu_arccos(K[a, a], K[a, b], K[b, b])
        K, T = c_b + c_w * ss, lam_b + lam_w * ss + c_w * dd * T


def _hermite_expect2(f, g, K11, K12, K22, n=120):
    """Independent reference: tensor-product probabilists' Gauss-Hermite over a Cholesky factor."""
    u, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    if K12 * K12 >= K11 * K22 * (1 - 1e-12):               # one input with itself: a 1-D integral
        z = math.sqrt(K11) * u
        return float(np.sum(w * f(z) * g(z)))
    L = np.linalg.cholesky(np.array([[K11, K12], [K12, K22]]))
    U1, U2 = np.meshgrid(u, u, indexing="ij")
    z1 = L[0, 0] * U1
    z2 = L[1, 0] * U1 + L[1, 1] * U2
    return float(np.sum(np.outer(w, w) * f(z1) * g(z2)))


def test_infinite_width_tanh_matches_gauss_hermite():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3, 5))
    got = theory.infinite_width_gram("tanh", 1.3, 0.2, 1.0, 0.5, X, 3)
    G = X @ X.T / 5
    K, T = 0.2 + 1.3 * G, 1.0 + 0.5 * G
    for ell in range(3):
        np.testing.assert_allclose(got[ell][0], K, rtol=1e-9)
        np.testing.assert_allclose(got[ell][1], T, rtol=1e-9)
        ss = np.array([[_hermite_expect2(np.tanh, np.tanh, K[a, a], K[a, b], K[b, b]) for b in range(3)]
                       for a in range(3)])
        dd = np.array([[_hermite_expect2(lambda z: 1 - np.tanh(z) ** 2, lambda z: 1 - np.tanh(z) ** 2,
                                         K[a, a], K[a, b], K[b, b]) for b in range(3)] for a in range(3)])
        K, T = 0.2 + 1.3 * ss, 1.0 + 0.5 * ss + 1.3 * dd * T


def test_tanh_and_gelu_moments_match_gauss_hermite():
    """The split Gauss-Legendre rule against Gauss-Hermite on smooth activations, including dK."""
    u, w = np.polynomial.hermite_e.hermegauss(150)
    w = w / w.sum()
    for kind in ("tanh", "gelu"):
        g = theory.gaussian_moments(kind, 0.8, 2.5, 1.0, 1.5, theory.Quad())
        z = math.sqrt(0.8) * u
        s, d = theory.sigma(kind, z), theory.dsigma(kind, z)
        assert g["s4"] == pytest.approx(np.sum(w * s**4), rel=1e-10)
        assert g["p2s2"] == pytest.approx(np.sum(w * d**2 * s**2), rel=1e-10)
        # d<s^2>/dK by a central difference of an independent quadrature
        h = 1e-5
        e = lambda K: np.sum(w * theory.sigma(kind, math.sqrt(K) * u) ** 2)  # noqa: E731
        assert g["dK_s2"] == pytest.approx((e(0.8 + h) - e(0.8 - h)) / (2 * h), rel=1e-6)


def test_tanh_values_pinned_to_the_card():
    last = theory.first_order("tanh", 1.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]
    card = {"V": 0.050, "A": 0.987, "B": 6.107, "D": -0.203, "F": 0.259, "Theta": 3.140}
    for k, v in card.items():
        assert last[k] == pytest.approx(v, abs=1.5e-3), k


@pytest.mark.parametrize("c_w,c_b,lam_b,lam_w,sq", [(2.0, 0.0, 1.0, 1.0, 1.0), (1.3, 0.4, 0.2, 2.5, 3.0)])
def test_relu_has_no_mean_corrections_in_theory(c_w, c_b, lam_b, lam_w, sq):
    """The ReLU theorem on the theory side: K1 = Theta1 = 0 at every layer, critical or not, any lambdas."""
    for r in theory.first_order("relu", c_w, c_b, lam_b, lam_w, sq, 6):
        assert abs(r["K1"]) < 1e-10 and abs(r["Theta1"]) < 1e-10


def test_two_input_vertex_contains_the_single_input_one():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(2, 8))
    for kind, c_w, c_b in (("tanh", 1.0, 0.0), ("relu", 2.0, 0.0), ("gelu", 1.98305826, 0.17292239)):
        two = theory.two_input_vertex(kind, c_w, c_b, X, 4, quad=theory.Quad(48))[-1]
        for a, key in ((0, "V_11_11"), (1, "V_22_22")):
            one = theory.first_order(kind, c_w, c_b, 1.0, 1.0, float(X[a] @ X[a]) / 8, 4, quad=theory.Quad(48))[-1]
            assert two[key] == pytest.approx(one["V"], rel=1e-6)
            assert two[f"K_{a + 1}{a + 1}"] == pytest.approx(one["K"], rel=1e-12)


# ------------------------------------------------------------------------ the sampler
def test_forward_ntk_recursion_matches_autodiff():
    """The sampler's layer step against the NTK from torch.func Jacobians with lambda_b for biases and
    lambda_W / n_prev for weights."""
    from torch.func import functional_call, jacrev

    torch.manual_seed(0)
    n0, n, depth, lam_b, lam_w = 4, 5, 3, 0.7, 1.9
    x = torch.randn(n0, dtype=torch.float64)
    for kind in ("tanh", "gelu", "relu"):
        Ws = [torch.randn(n, n0, dtype=torch.float64)] + [torch.randn(n, n, dtype=torch.float64)
                                                         for _ in range(depth - 1)]
        bs = [torch.randn(n, dtype=torch.float64) for _ in range(depth)]
        params = {f"W{i}": W for i, W in enumerate(Ws)} | {f"b{i}": b for i, b in enumerate(bs)}

        def f(pr):
            z = pr["W0"] @ x + pr["b0"]
            for i in range(1, depth):
                z = pr[f"W{i}"] @ mc.act(kind, z)[0] + pr[f"b{i}"]
            return z

        class M(torch.nn.Module):
            def forward(self, **pr):
                return f(pr)

        J = jacrev(lambda pr: functional_call(M(), {}, (), pr))(params)
        ntk = torch.zeros(n, n, dtype=torch.float64)
        for k, j in J.items():
            fan_in = (n0 if k == "W0" else n)
            lam = lam_b if k.startswith("b") else lam_w / fan_in
            jj = j.reshape(n, -1)
            ntk += lam * jj @ jj.T
        z = (Ws[0] @ x + bs[0]).unsqueeze(0)
        th = torch.eye(n, dtype=torch.float64).unsqueeze(0) * (lam_b + lam_w * float(x @ x) / n0)
        for i in range(1, depth):
            z, th = mc.layer_step(kind, z, th, Ws[i].unsqueeze(0), bs[i].unsqueeze(0), lam_b, lam_w)
        torch.testing.assert_close(z[0], f(params), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(th[0], ntk, rtol=1e-10, atol=1e-10)


def test_pair_averages_match_brute_force():
    rng = np.random.default_rng(3)
    z = torch.as_tensor(rng.normal(size=(2, 5)))
    A = rng.normal(size=(2, 5, 5))
    th = torch.as_tensor(A + A.transpose(0, 2, 1))
    got = mc.layer_stats(z, th).numpy()
    for b in range(2):
        zz, t = z[b].numpy(), th[b].numpy()
        pairs = [(i, k) for i in range(5) for k in range(5) if i != k]
        ref = [np.mean(zz**2), np.mean(np.diag(t)),
               np.mean([zz[i] ** 2 * zz[k] ** 2 for i, k in pairs]),
               np.mean([t[i, i] * t[k, k] for i, k in pairs]),
               np.mean([t[i, i] * zz[k] ** 2 for i, k in pairs]),
               np.mean([t[i, k] ** 2 for i, k in pairs]),
               np.mean([t[i, k] * zz[i] * zz[k] for i, k in pairs]), np.mean(zz)]
        np.testing.assert_allclose(got[b], ref, rtol=1e-12)


@pytest.mark.parametrize("kind,c_w,c_b", [("relu", 2.0, 0.0), ("tanh", 1.0, 0.3)])
def test_mc_estimators_unbiased_at_layer_two(kind, c_w, c_b):
    """At layer 2 the first-order formulas are exact at any width (layer 1 is i.i.d. Gaussian with a
    deterministic NTK), so at width 3, where 1/n^2 terms would be large, the pooled estimators must hit them."""
    x = np.array([1.2, -0.4, 0.9, 0.3])
    stats = mc.sample_nets(kind, x, width=3, depth=2, n_nets=60_000, c_w=c_w, c_b=c_b, lambda_b=0.8,
                           lambda_w=1.4, seed=11)
    blocks = mc.block_table(stats, 30, input=0, seed=0, width=3)
    est = mc.pooled_blocks(blocks[blocks.layer == 2], n_prev=3)
    exact = theory.first_order(kind, c_w, c_b, 0.8, 1.4, float(x @ x) / 4, 2)[-1]
    for t, q in {**{t: t for t in TENSORS}, "mean_ntk": "Theta", "mean_z2": "K"}.items():
        assert abs(est[t] - exact[q]) <= 4 * est[f"{t}_se"], (t, est[t], exact[q], est[f"{t}_se"])


def test_two_input_estimators_unbiased_at_layer_two():
    """Two inputs through the same nets: at layer 2 the vertex V_(ab)(cd) = C_W^2 Cov(s_a s_b, s_c s_d) is
    exact at any width."""
    X = np.array([[1.0, -0.5, 0.8], [0.3, 0.9, -1.1]])
    stats = mc.sample_nets("relu", X[0], width=3, depth=2, n_nets=60_000, c_w=2.0, c_b=0.1, lambda_b=1.0,
                           lambda_w=1.0, seed=21, x2=X[1])
    blocks = mc.block_table(stats, 30, input=0, seed=0, width=3)
    est = mc.pooled_blocks(blocks[blocks.layer == 2], n_prev=3)
    exact = theory.two_input_vertex("relu", 2.0, 0.1, X, 2)[-1]
    for k in theory.VERTEX_KEYS:
        assert abs(est[k] - exact[k]) <= 4 * est[f"{k}_se"], (k, est[k], exact[k])
    assert est["V_11_11"] == pytest.approx(est["V"], rel=1e-12)   # the pair's first input is input 0


def test_mean_corrections_match_sampled_nets():
    """K1 and Theta1 (E z^2 = K + K1/n, E Th_ii = Theta + Theta1/n) against n x (MC mean - infinite width)
    for a strongly nonlinear tanh (C_W = 2), where both are clearly nonzero."""
    n = 8
    stats = mc.sample_nets("tanh", np.ones(5), width=n, depth=4, n_nets=60_000, c_w=2.0, c_b=0.0, lambda_b=1.0,
                           lambda_w=1.0, seed=7)
    blocks = mc.block_table(stats, 20, input=0, seed=0, width=n)
    r = theory.first_order("tanh", 2.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]
    est = mc.pooled_blocks(blocks[blocks.layer == 4], n_prev=n)
    assert r["K1"] < -0.1 and r["Theta1"] > 0.5
    assert abs(n * (est["mean_z2"] - r["K"]) - r["K1"]) <= 4 * n * est["mean_z2_se"] + 0.1 * abs(r["K1"])
    assert abs(n * (est["mean_ntk"] - r["Theta"]) - r["Theta1"]) <= 4 * n * est["mean_ntk_se"] + 0.1 * r["Theta1"]


def test_relu_mean_diagonal_ntk_is_exact_at_small_width():
    """The ReLU theorem: E[Theta_ii] follows the infinite-width recursion at every width and layer."""
    x = np.ones(5)
    stats = mc.sample_nets("relu", x, width=4, depth=4, n_nets=20_000, c_w=2.0, c_b=0.0, lambda_b=1.0,
                           lambda_w=1.0, seed=5)
    blocks = mc.block_table(stats, 20, input=0, seed=0, width=4)
    rows = theory.first_order("relu", 2.0, 0.0, 1.0, 1.0, 1.0, 4)
    for ell in (2, 3, 4):
        est = mc.pooled_blocks(blocks[blocks.layer == ell], n_prev=4)
        assert abs(est["mean_ntk"] - rows[ell - 1]["Theta"]) <= 4 * est["mean_ntk_se"]
    # the same check catches a real O(1/n) shift: tanh (C_W = 2, strongly nonlinear) at width 4
    st = mc.sample_nets("tanh", x, width=4, depth=4, n_nets=20_000, c_w=2.0, c_b=0.0, lambda_b=1.0,
                        lambda_w=1.0, seed=5)
    bt = mc.block_table(st, 20, input=0, seed=0, width=4)
    est = mc.pooled_blocks(bt[bt.layer == 4], n_prev=4)
    th = theory.first_order("tanh", 2.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]["Theta"]
    assert abs(est["mean_ntk"] - th) > 4 * est["mean_ntk_se"]


def test_block_means_pool_like_per_net_rows():
    stats = mc.sample_nets("gelu", np.ones(3), width=6, depth=3, n_nets=300, c_w=1.98, c_b=0.17, lambda_b=1.0,
                           lambda_w=1.0, seed=2)
    per_net = pd.DataFrame(stats[:, 2], columns=list(mc.NET_COLUMNS))
    blocks = mc.block_table(stats, 10, input=0, seed=0, width=6)
    a = mc.pooled_blocks(blocks[blocks.layer == 3], 6)
    b = mc.pooled(per_net, 6, 10)
    for k in ("V", "A", "B", "D", "F", "mean_ntk", "V_se", "A_se"):
        assert a[k] == pytest.approx(b[k], rel=1e-10), k


# ------------------------------------------------------------------------ pipeline shape and bad input
def test_one_train_node_per_variant():
    from pipelines.ntk_feynman.pipeline import create_pipeline

    names = {n.name for n in create_pipeline().only_nodes_with_tags("train").nodes}
    assert names == {f"ntk_feynman.train.{v}" for v in
                     ("recursion", "no_interlayer", "infinite_width", "mc_relu", "mc_tanh", "mc_gelu")}


def test_theory_variants_differ_only_where_they_should():
    from pipelines.ntk_feynman.data import make_inputs
    from pipelines.ntk_feynman.train import train_variant

    p = Params.model_validate(RAW)
    inputs = make_inputs(p)
    assert inputs["sq_norm"] == [pytest.approx(1.0)]
    xa, xb = np.asarray(inputs["pair"])
    assert np.allclose(xa, inputs["x"][0]) and xb @ xb == pytest.approx(xa @ xa)
    assert xa @ xb / (xa @ xa) == pytest.approx(0.5)                  # data.pair_cosine default
    rec, abl, inf = (train_variant(inputs, p, variant=v) for v in ("recursion", "no_interlayer", "infinite_width"))
    np.testing.assert_allclose(rec[["K", "Theta", "K_12"]].fillna(0), inf[["K", "Theta", "K_12"]].fillna(0))
    assert (inf[list(TENSORS)] == 0).all().all() and (inf[["K1", "Theta1"]] == 0).all().all()
    l2 = rec.layer == 2                                     # inter-layer terms start at layer 3
    np.testing.assert_allclose(rec.loc[l2, list(TENSORS)], abl.loc[l2, list(TENSORS)])
    assert (rec.loc[rec.layer == 3, "V"].to_numpy() > abl.loc[abl.layer == 3, "V"].to_numpy()).all()


@pytest.mark.parametrize("patch,key", [
    ({"variants": ["recursion", "mc_swish"]}, "ntk_feynman.variants"),
    ({"activations": {"relu": {"c_w": -2.0, "c_b": 0.0}}}, "ntk_feynman.activations.relu.c_w"),
    ({"mc": {**RAW["mc"], "nets_per_seed": [60]}}, "ntk_feynman.mc"),
    ({"mc": {**RAW["mc"], "widths": [8, 4]}}, "ntk_feynman.mc.widths"),
    ({"net": {**RAW["net"], "depth": True}}, "ntk_feynman.net.depth"),
    ({"net": {**RAW["net"], "dept": 3}}, "ntk_feynman.net.dept"),
])
def test_bad_parameter_names_the_key(patch, key):
    with pytest.raises(ParameterError, match=key.replace(".", r"\.")):
        validate(Params, {**RAW, **patch}, "ntk_feynman")


def test_bad_user_inputs_name_dataset_and_column(tmp_path):
    from pipelines.ntk_feynman.data import make_inputs

    f = tmp_path / "inputs.csv"
    pd.DataFrame({"x_0": [1.0, 2.0], "x_1": [0.5, 0.1]}).to_csv(f, index=False)
    p = Params.model_validate({**RAW, "data": {"n0": 3, "sq_norm": 1.0, "inputs_path": str(f)}})
    with pytest.raises(InputDataError, match=r"ntk_feynman\.data\.inputs_path.*column 'x_2' is missing"):
        make_inputs(p)
    pd.DataFrame({"x_0": ["a", "b"], "x_1": [0.5, 0.1], "x_2": [1.0, 1.0]}).to_csv(f, index=False)
    with pytest.raises(InputDataError, match=r"column 'x_0' should be number"):
        make_inputs(p)
    pd.DataFrame({"x_0": [0.0], "x_1": [0.0], "x_2": [0.0]}).to_csv(f, index=False)
    with pytest.raises(InputDataError, match=r"zero vector"):
        make_inputs(p)
    pd.DataFrame({"x_0": [3.0, 1.0], "x_1": [0.0, 1.0], "x_2": [0.0, 1.0]}).to_csv(f, index=False)
    assert make_inputs(p)["sq_norm"] == [pytest.approx(3.0), pytest.approx(1.0)]


def test_report_of_the_test_env_run(test_env_run):
    report = test_env_run("ntk_feynman").report
    assert report["variants"]["recursion"]["relu.V"] == pytest.approx(60.0)      # depth 4, critical ReLU
    assert set(report["histories"]) >= {"recursion", "mc_relu"}
    assert report["histories"]["mc_relu"]["V_L4_vs_width"]["step"] == [4, 8, 16]
    assert len(report["claims"]) == report["claims_declared"] >= 9
