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
from pipelines.ntk_feynman import dntk, mc, theory
from pipelines.ntk_feynman.params import DNTK_TENSORS, TENSORS, Params

RAW = {
    "seeds": [0],
    "data": {"n0": 6, "sq_norm": 1.0},
    "net": {"depth": 3, "lambda_b": 1.0, "lambda_w": 1.0},
    "activations": {"relu": {"c_w": 2.0, "c_b": 0.0}, "tanh": {"c_w": 1.0, "c_b": 0.0}},
    "quadrature": {"nodes_per_half": 48, "half_width_sd": 12.0},
    "mc": {
        "widths": [4, 8],
        "nets_per_seed": [60, 60],
        "blocks_per_seed": 3,
        "chunk_elems": 100_000,
        "claim_widths": [8],
        "narrow_width": 4,
        "slope_min_width": 4,
    },
    "variants": ["recursion", "no_interlayer", "infinite_width", "mc_relu", "mc_tanh"],
}


DNTK2_RAW = {"widths": [4, 8], "nets_per_seed": [30, 30], "blocks_per_seed": 3, "chunk_elems": 100_000}
DNTK_RAW = {
    "widths": [4, 8],
    "nets_per_seed": [30, 30],
    "blocks_per_seed": 3,
    "chunk_elems": 100_000,
    "narrow_width": 4,
    "slope_min_width": 4,
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
    assert {k: round(last[k], 9) for k in ("K", "Theta", *TENSORS)} == {
        "K": 2,
        "Theta": 8,
        "V": 60,
        "A": 166,
        "B": 112,
        "D": 84,
        "F": 48,
    }


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
    X[2] = -0.9 * X[1] + 0.1 * X[2]  # a strongly anti-correlated pair
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
    if K12 * K12 >= K11 * K22 * (1 - 1e-12):  # one input with itself: a 1-D integral
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
        ss = np.array(
            [[_hermite_expect2(np.tanh, np.tanh, K[a, a], K[a, b], K[b, b]) for b in range(3)] for a in range(3)]
        )
        dd = np.array(
            [
                [
                    _hermite_expect2(
                        lambda z: 1 - np.tanh(z) ** 2, lambda z: 1 - np.tanh(z) ** 2, K[a, a], K[a, b], K[b, b]
                    )
                    for b in range(3)
                ]
                for a in range(3)
            ]
        )
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
        Ws = [torch.randn(n, n0, dtype=torch.float64)] + [
            torch.randn(n, n, dtype=torch.float64) for _ in range(depth - 1)
        ]
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
            fan_in = n0 if k == "W0" else n
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
        ref = [
            np.mean(zz**2),
            np.mean(np.diag(t)),
            np.mean([zz[i] ** 2 * zz[k] ** 2 for i, k in pairs]),
            np.mean([t[i, i] * t[k, k] for i, k in pairs]),
            np.mean([t[i, i] * zz[k] ** 2 for i, k in pairs]),
            np.mean([t[i, k] ** 2 for i, k in pairs]),
            np.mean([t[i, k] * zz[i] * zz[k] for i, k in pairs]),
            np.mean(zz),
        ]
        np.testing.assert_allclose(got[b], ref, rtol=1e-12)


@pytest.mark.parametrize("kind,c_w,c_b", [("relu", 2.0, 0.0), ("tanh", 1.0, 0.3)])
def test_mc_estimators_unbiased_at_layer_two(kind, c_w, c_b):
    """At layer 2 the first-order formulas are exact at any width (layer 1 is i.i.d. Gaussian with a
    deterministic NTK), so at width 3, where 1/n^2 terms would be large, the pooled estimators must hit them."""
    x = np.array([1.2, -0.4, 0.9, 0.3])
    stats = mc.sample_nets(
        kind, x, width=3, depth=2, n_nets=60_000, c_w=c_w, c_b=c_b, lambda_b=0.8, lambda_w=1.4, seed=11
    )
    blocks = mc.block_table(stats, 30, input=0, seed=0, width=3)
    est = mc.pooled_blocks(blocks[blocks.layer == 2], n_prev=3)
    exact = theory.first_order(kind, c_w, c_b, 0.8, 1.4, float(x @ x) / 4, 2)[-1]
    for t, q in {**{t: t for t in TENSORS}, "mean_ntk": "Theta", "mean_z2": "K"}.items():
        assert abs(est[t] - exact[q]) <= 4 * est[f"{t}_se"], (t, est[t], exact[q], est[f"{t}_se"])


def test_two_input_estimators_unbiased_at_layer_two():
    """Two inputs through the same nets: at layer 2 the vertex V_(ab)(cd) = C_W^2 Cov(s_a s_b, s_c s_d) is
    exact at any width."""
    X = np.array([[1.0, -0.5, 0.8], [0.3, 0.9, -1.1]])
    stats = mc.sample_nets(
        "relu", X[0], width=3, depth=2, n_nets=60_000, c_w=2.0, c_b=0.1, lambda_b=1.0, lambda_w=1.0, seed=21, x2=X[1]
    )
    blocks = mc.block_table(stats, 30, input=0, seed=0, width=3)
    est = mc.pooled_blocks(blocks[blocks.layer == 2], n_prev=3)
    exact = theory.two_input_vertex("relu", 2.0, 0.1, X, 2)[-1]
    for k in theory.VERTEX_KEYS:
        assert abs(est[k] - exact[k]) <= 4 * est[f"{k}_se"], (k, est[k], exact[k])
    assert est["V_11_11"] == pytest.approx(est["V"], rel=1e-12)  # the pair's first input is input 0


def test_mean_corrections_match_sampled_nets():
    """K1 and Theta1 (E z^2 = K + K1/n, E Th_ii = Theta + Theta1/n) against n x (MC mean - infinite width)
    for a strongly nonlinear tanh (C_W = 2), where both are clearly nonzero."""
    n = 8
    stats = mc.sample_nets(
        "tanh", np.ones(5), width=n, depth=4, n_nets=60_000, c_w=2.0, c_b=0.0, lambda_b=1.0, lambda_w=1.0, seed=7
    )
    blocks = mc.block_table(stats, 20, input=0, seed=0, width=n)
    r = theory.first_order("tanh", 2.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]
    est = mc.pooled_blocks(blocks[blocks.layer == 4], n_prev=n)
    assert r["K1"] < -0.1 and r["Theta1"] > 0.5
    assert abs(n * (est["mean_z2"] - r["K"]) - r["K1"]) <= 4 * n * est["mean_z2_se"] + 0.1 * abs(r["K1"])
    assert abs(n * (est["mean_ntk"] - r["Theta"]) - r["Theta1"]) <= 4 * n * est["mean_ntk_se"] + 0.1 * r["Theta1"]


def test_relu_mean_diagonal_ntk_is_exact_at_small_width():
    """The ReLU theorem: E[Theta_ii] follows the infinite-width recursion at every width and layer."""
    x = np.ones(5)
    stats = mc.sample_nets(
        "relu", x, width=4, depth=4, n_nets=20_000, c_w=2.0, c_b=0.0, lambda_b=1.0, lambda_w=1.0, seed=5
    )
    blocks = mc.block_table(stats, 20, input=0, seed=0, width=4)
    rows = theory.first_order("relu", 2.0, 0.0, 1.0, 1.0, 1.0, 4)
    for ell in (2, 3, 4):
        est = mc.pooled_blocks(blocks[blocks.layer == ell], n_prev=4)
        assert abs(est["mean_ntk"] - rows[ell - 1]["Theta"]) <= 4 * est["mean_ntk_se"]
    # the same check catches a real O(1/n) shift: tanh (C_W = 2, strongly nonlinear) at width 4
    st = mc.sample_nets(
        "tanh", x, width=4, depth=4, n_nets=20_000, c_w=2.0, c_b=0.0, lambda_b=1.0, lambda_w=1.0, seed=5
    )
    bt = mc.block_table(st, 20, input=0, seed=0, width=4)
    est = mc.pooled_blocks(bt[bt.layer == 4], n_prev=4)
    th = theory.first_order("tanh", 2.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]["Theta"]
    assert abs(est["mean_ntk"] - th) > 4 * est["mean_ntk_se"]


def test_block_means_pool_like_per_net_rows():
    stats = mc.sample_nets(
        "gelu", np.ones(3), width=6, depth=3, n_nets=300, c_w=1.98, c_b=0.17, lambda_b=1.0, lambda_w=1.0, seed=2
    )
    per_net = pd.DataFrame(stats[:, 2], columns=list(mc.NET_COLUMNS))
    blocks = mc.block_table(stats, 10, input=0, seed=0, width=6)
    a = mc.pooled_blocks(blocks[blocks.layer == 3], 6)
    b = mc.pooled(per_net, 6, 10)
    for k in ("V", "A", "B", "D", "F", "mean_ntk", "V_se", "A_se"):
        assert a[k] == pytest.approx(b[k], rel=1e-10), k


# ------------------------------------------------------------------------ pipeline shape and bad input
def test_theory_variants_differ_only_where_they_should():
    from pipelines.ntk_feynman.data import make_inputs
    from pipelines.ntk_feynman.train import variant_stats

    p = Params.model_validate(RAW)
    inputs = make_inputs(p)
    assert inputs["sq_norm"] == [pytest.approx(1.0)]
    xa, xb = np.asarray(inputs["pair"])
    assert np.allclose(xa, inputs["x"][0]) and xb @ xb == pytest.approx(xa @ xa)
    assert xa @ xb / (xa @ xa) == pytest.approx(0.5)  # data.pair_cosine default
    rec, abl, inf = (variant_stats(inputs, p, variant=v) for v in ("recursion", "no_interlayer", "infinite_width"))
    np.testing.assert_allclose(rec[["K", "Theta", "K_12"]].fillna(0), inf[["K", "Theta", "K_12"]].fillna(0))
    assert (inf[list(TENSORS)] == 0).all().all() and (inf[["K1", "Theta1"]] == 0).all().all()
    l2 = rec.layer == 2  # inter-layer terms start at layer 3
    np.testing.assert_allclose(rec.loc[l2, list(TENSORS)], abl.loc[l2, list(TENSORS)])
    assert (rec.loc[rec.layer == 3, "V"].to_numpy() > abl.loc[abl.layer == 3, "V"].to_numpy()).all()
    assert (inf[list(DNTK_TENSORS)] == 0).all().all()
    np.testing.assert_allclose(rec.loc[l2, list(DNTK_TENSORS)], abl.loc[l2, list(DNTK_TENSORS)])
    relu3 = (rec.layer == 3) & (rec.activation == "relu")
    assert (rec.loc[relu3, "P"].to_numpy() > abl.loc[relu3, "P"].to_numpy()).all()
    dd = ["R", "S", "T", "U"]  # the ddNTK recursion, layer 2 exact in both
    assert (inf[dd] == 0).all().all()
    np.testing.assert_allclose(rec.loc[l2, dd], abl.loc[l2, dd])
    assert (rec.loc[relu3, dd].to_numpy() > abl.loc[relu3, dd].to_numpy()).all()


@pytest.mark.parametrize(
    "patch,key",
    [
        ({"variants": ["recursion", "mc_swish"]}, "ntk_feynman.variants"),
        ({"activations": {"relu": {"c_w": -2.0, "c_b": 0.0}}}, "ntk_feynman.activations.relu.c_w"),
        ({"mc": {**RAW["mc"], "nets_per_seed": [60]}}, "ntk_feynman.mc"),
        ({"mc": {**RAW["mc"], "widths": [8, 4]}}, "ntk_feynman.mc.widths"),
        ({"net": {**RAW["net"], "depth": True}}, "ntk_feynman.net.depth"),
        ({"net": {**RAW["net"], "dept": 3}}, "ntk_feynman.net.dept"),
        ({"variants": ["recursion", "mc_dntk_relu"]}, "ntk_feynman.variants"),  # no dntk block
        ({"dntk": {**DNTK_RAW, "probes": 0}}, "ntk_feynman.dntk.probes"),
        ({"dntk": {**DNTK_RAW, "narrow_width": 5}}, "ntk_feynman.dntk"),
        ({"variants": ["recursion", "mc_dntk2_relu"]}, "ntk_feynman.variants"),  # no dntk2 block
        ({"dntk2": {**DNTK2_RAW, "widths": [8, 4]}}, "ntk_feynman.dntk2.widths"),
        ({"dntk2": {**DNTK2_RAW, "nets_per_seed": [30]}}, "ntk_feynman.dntk2"),
        ({"dntk2": {**DNTK2_RAW, "chunk": 10}}, "ntk_feynman.dntk2.chunk"),
        ({"variants": ["recursion", "mc_ddntk2_relu"]}, "ntk_feynman.variants"),  # no ddntk2 block
        ({"ddntk2": {**DNTK2_RAW, "widths": [8, 4]}}, "ntk_feynman.ddntk2.widths"),
        ({"ddntk2": {**DNTK2_RAW, "widths": [4, 256]}}, "ntk_feynman.ddntk2.widths"),  # MAX_WIDTH 128
        ({"ddntk2": {**DNTK2_RAW, "nets_per_seed": [30]}}, "ntk_feynman.ddntk2"),
        ({"ddntk2": {**DNTK2_RAW, "probes": 2}}, "ntk_feynman.ddntk2.probes"),
    ],
)
def test_bad_parameter_names_the_key(patch, key):
    with pytest.raises(ParameterError, match=key.replace(".", r"\.")):
        validate(Params, {**RAW, **patch}, "ntk_feynman")


def check(raw: dict):
    """The params validated, then the core's check that every claim and gate names a metric this run produces."""
    from pipelines.ntk_feynman.spec import SPEC

    p = validate(Params, raw, "ntk_feynman")
    SPEC.check(p)
    return p


def test_claims_must_name_planned_variants():
    claim = {"id": "c", "text": "t", "metric": "dntk_agreement_excess.relu", "op": "<=", "threshold": 0.1}
    with pytest.raises(
        ParameterError, match=r"claim 'c': metric 'dntk_agreement_excess.relu' is produced by no variant"
    ):
        check({**RAW, "dntk": DNTK_RAW, "claims": [claim]})
    ok = check({**RAW, "dntk": DNTK_RAW, "claims": [claim], "variants": [*RAW["variants"], "mc_dntk_relu"]})
    assert ok.block_activations("dntk") == ["relu"] and "relu" in ok.mc_activations()
    abl = {**claim, "metric": "dntk_interlayer_error_ratio.relu"}
    with pytest.raises(ParameterError, match="is produced by no variant or derived-metric declaration"):
        check({**RAW, "dntk": DNTK_RAW, "claims": [abl], "variants": ["recursion", "mc_relu", "mc_dntk_relu"]})


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


# ------------------------------------------------------------------------ the dNTK (P, Q)
def relu_dntk_reference(c_w, c_b, lam_b, lam_w, sq, depth):
    """The ReLU dNTK recursions by hand: sigma'' = 0 almost everywhere, St[s s'] = <s'^2> = 1/2,
    <s^2 s'^2> = K/2; so P' = 2 lW CW (Th K/2 + F/4) + CW^2 P/4 and Q' = lW CW (Th K/2 + F/4) + CW^2 Q/4."""
    K, Th, F, P, Q = c_b + c_w * sq, lam_b + lam_w * sq, 0.0, 0.0, 0.0
    for _ in range(depth - 1):
        lin = lam_w * c_w * (Th * K / 2 + F / 4)
        P, Q = 2 * lin + c_w**2 * P / 4, lin + c_w**2 * Q / 4
        F = c_w**2 * (K / 2) * Th + (c_w / 2) ** 2 * F
        K, Th = c_b + c_w * K / 2, lam_b + lam_w * K / 2 + c_w * Th / 2
    return P, Q


@pytest.mark.parametrize("c_w,c_b,lam_b,lam_w,sq,depth", [(2.0, 0.0, 1.0, 1.0, 1.0, 4), (1.7, 0.3, 0.5, 2.0, 2.3, 5)])
def test_relu_dntk_recursion_matches_hand_closed_form(c_w, c_b, lam_b, lam_w, sq, depth):
    got = dntk.dntk_first_order("relu", c_w, c_b, lam_b, lam_w, sq, depth)[-1]
    P, Q = relu_dntk_reference(c_w, c_b, lam_b, lam_w, sq, depth)
    assert got["P"] == pytest.approx(P, rel=1e-11) and got["Q"] == pytest.approx(Q, rel=1e-11)
    if (c_w, depth) == (2.0, 4):
        assert (round(got["P"], 9), round(got["Q"], 9)) == (80, 40)  # critical ReLU, depth 4 (default run)


def _brute_dntk(kind, Ws, bs, x, lam_b, lam_w):
    """The full dNTK tensor dTh_{i0 i1 i2} = sum_mu lambda_mu dz_i0/dtheta_mu dTh_i1i2/dtheta_mu of one net by
    nested torch.func Jacobians (independent of the sampler's NTK recursion and of its contractions)."""
    from torch.func import jacrev

    n0, depth, n = x.shape[0], len(Ws), Ws[-1].shape[0]
    pr = {f"W{i}": W for i, W in enumerate(Ws)} | {f"b{i}": b for i, b in enumerate(bs)}
    lam = {k: lam_b if k[0] == "b" else lam_w / (n0 if k == "W0" else n) for k in pr}

    def f(q):
        z = q["W0"] @ x + q["b0"]
        for i in range(1, depth):
            z = q[f"W{i}"] @ mc.act(kind, z)[0] + q[f"b{i}"]
        return z

    def ntk(q):
        J = jacrev(f)(q)
        return sum(lam[k] * J[k].reshape(n, -1) @ J[k].reshape(n, -1).T for k in q)

    J, dT = jacrev(f)(pr), jacrev(ntk)(pr)
    d = sum(lam[k] * torch.einsum("am,bcm->abc", J[k].reshape(n, -1), dT[k].reshape(n, n, -1)) for k in pr)
    return f(pr), d


@pytest.mark.parametrize("kind", ["tanh", "gelu", "relu"])
def test_dntk_contractions_match_the_full_tensor(kind):
    """The sampler's S1 (exact) and S2 (one Rademacher probe u) equal the contractions of the full dNTK tensor
    from nested autodiff: S1 = sum_ik z_i dTh_ikk, S2_u = sum u_i0 u_i1 z_i2 dTh_i0i1i2 (whose mean over u is
    sum_ik dTh_iik z_k). The nets are re-drawn from the sampler's generator in its order."""
    import math

    n0, n, depth, c_w, c_b, lam_b, lam_w, seed = 4, 3, 3, 1.5, 0.2, 0.7, 1.3, 5
    x = np.array([0.9, -1.1, 0.4, 0.7])
    got = dntk.sample_dntk(kind, x, n, depth, 1, c_w, c_b, lam_b, lam_w, seed)
    gen = torch.Generator().manual_seed(seed)
    Ws, bs = [], []
    for ell in range(depth):
        fan = n0 if ell == 0 else n
        Ws.append(torch.randn(1, n, fan, generator=gen, dtype=torch.float64)[0] * math.sqrt(c_w / fan))
        bs.append(torch.randn(1, n, generator=gen, dtype=torch.float64)[0] * math.sqrt(c_b))
    us = torch.randint(0, 2, (1, depth, 1, n), generator=gen).to(torch.float64) * 2 - 1
    xt = torch.as_tensor(x)
    for ell in (1, 2):
        z, d = _brute_dntk(kind, Ws[: ell + 1], bs[: ell + 1], xt, lam_b, lam_w)
        u = us[0, ell, 0]
        s1 = float(torch.einsum("i,ikk->", z, d))
        s2 = float(torch.einsum("a,b,c,abc->", u, u, z, d))
        assert got[0, ell, 0] * n * n == pytest.approx(s1, rel=1e-9, abs=1e-12)
        assert got[0, ell, 1] * n * n == pytest.approx(s2, rel=1e-9, abs=1e-12)
    assert (got[:, 0] == 0).all()  # layer 1: z is linear in the parameters


def test_dntk_vanishes_when_only_biases_learn_in_a_linear_net():
    """A deep linear net's NTK does not depend on its biases, so with lambda_W = 0 the dNTK is identically 0;
    the recursion agrees (a deep linear net with lambda_W > 0 has a nonzero dNTK, P = 2Q)."""
    stats = dntk.sample_dntk("linear", np.ones(5), 6, 4, 50, 1.0, 0.3, 1.0, 0.0, seed=3)
    assert np.abs(stats).max() < 1e-12
    for r in dntk.dntk_first_order("linear", 1.0, 0.3, 1.0, 0.0, 1.0, 4):
        assert r["P"] == 0 and r["Q"] == 0
    lin = dntk.dntk_first_order("linear", 1.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]
    assert lin["P"] > 0 and lin["P"] == pytest.approx(2 * lin["Q"])


@pytest.mark.parametrize("kind,c_w,c_b", [("tanh", 1.3, 0.2), ("relu", 2.0, 0.1)])
def test_dntk_at_layer_two_by_brute_force_pair_averages(kind, c_w, c_b):
    """One hidden layer (layer 2): the first-order P, Q are exact at any width. Brute force at width 3 from the
    full dNTK tensor of each net: P/n = mean_{i != k} dTh_ikk z_i and Q/n = mean_{i != k} dTh_iik z_k, over
    sampled nets (no S1/S2 contraction, no probe), against the recursion (sigma'' terms included for tanh)."""
    from torch.func import vmap

    n0, n, N, lam_b, lam_w = 3, 3, 4000, 0.8, 1.2
    x = torch.tensor([1.0, -0.6, 0.8], dtype=torch.float64)
    g = torch.Generator().manual_seed(17)
    W0 = torch.randn(N, n, n0, generator=g, dtype=torch.float64) * (c_w / n0) ** 0.5
    W1 = torch.randn(N, n, n, generator=g, dtype=torch.float64) * (c_w / n) ** 0.5
    b0 = torch.randn(N, n, generator=g, dtype=torch.float64) * c_b**0.5
    b1 = torch.randn(N, n, generator=g, dtype=torch.float64) * c_b**0.5
    z, d = vmap(lambda a, b, c, e: _brute_dntk(kind, [a, b], [c, e], x, lam_b, lam_w))(W0, W1, b0, b1)
    off = ~torch.eye(n, dtype=torch.bool)
    p_pairs = torch.einsum("si,sikk->sik", z, d)[:, off].mean(-1) * n  # i != k
    q_pairs = torch.einsum("siik,sk->sik", d, z)[:, off].mean(-1) * n
    ref = dntk.dntk_first_order(kind, c_w, c_b, lam_b, lam_w, float(x @ x) / n0, 2)[-1]
    for est, t in ((p_pairs, "P"), (q_pairs, "Q")):
        blocks = est.reshape(20, -1).mean(1)
        se = float(blocks.std() / 20**0.5)
        assert abs(float(est.mean()) - ref[t]) <= 4 * se, (t, float(est.mean()), ref[t], se)


def test_dntk_estimator_unbiased_at_layer_two_and_converges_deeper():
    """The pooled S1/S2 estimator hits the exact layer-2 values at width 3, and at layer 4 (tanh) its error
    shrinks from width 4 to width 16, where it is within 10 % (1/n behaviour)."""
    x = np.ones(6)
    ref = dntk.dntk_first_order("tanh", 1.0, 0.0, 1.0, 1.0, 1.0, 4)
    stats = dntk.sample_dntk("tanh", x, 3, 4, 20_000, 1.0, 0.0, 1.0, 1.0, seed=2)
    blk = pd.DataFrame({"s1": stats[:, 1, 0], "s2": stats[:, 1, 1]}).groupby(np.arange(20_000) // 1000).mean()
    est = dntk.pooled_dntk(blk.assign(n_nets=1000), 3, 3)
    for t in DNTK_TENSORS:
        assert abs(est[t] - ref[1][t]) <= 4 * est[f"{t}_se"], (t, est[t], ref[1][t])
    errs = {}
    for w, N in ((4, 6000), (16, 3000)):
        st = dntk.sample_dntk("tanh", x, w, 4, N, 1.0, 0.0, 1.0, 1.0, seed=4)
        m = st[:, 3].mean(0)
        P, Q = dntk.pq_from_sums(m[0], m[1], w, w)
        errs[w] = max(abs(P / ref[3]["P"] - 1), abs(Q / ref[3]["Q"] - 1))
    assert errs[16] < 0.10 and errs[16] < errs[4]


def test_report_of_the_test_env_run(test_env_run):
    report = test_env_run("ntk_feynman").report
    assert report["variants"]["recursion"]["relu.V"] == pytest.approx(60.0)  # depth 4, critical ReLU
    assert set(report["histories"]) >= {"recursion", "mc_relu"}
    assert report["histories"]["mc_relu"]["V_L4_vs_width"]["step"] == [4, 8, 16]
    assert len(report["claims"]) == report["claims_declared"] >= 17
    assert report["variants"]["recursion"]["relu.P"] == pytest.approx(80.0)  # dNTK, depth 4
    assert report["histories"]["mc_dntk_relu"]["P_L4_vs_width"]["step"] == [4, 8]
    assert "dntk_vs_width.png" in report["artifacts"]
    assert [report["variants"]["recursion"][f"relu.{t}"] for t in "RSTU"] == pytest.approx([160, 40, 80, 80])
    assert {"ddntk_vs_width.png", "ddntk_layer_profiles.png"} <= set(report["artifacts"])
    assert report["histories"]["mc_ddntk_relu"]["S_L4_rel_err_vs_width"]["step"] == [4, 8]
    # the M-input dNTK / ddNTK variants (conf/test only, ReLU): the shared metrics and their plots
    for k in (
        "multi_dntk_extrap_excess.relu",
        "multi_dntk_layer2_max_abs_z.relu",
        "multi_ddntk_extrap_max_abs_z.relu",
        "multi_ddntk_interlayer_error_ratio.relu",
        "multi_dntk_extrap_excess.P.L4.relu",
    ):
        assert k in report["metrics"], k
    assert {"multi_input_dntk.png", "multi_input_ddntk.png"} <= set(report["artifacts"])
    # the core spec: the gates, the comparisons that join a variant's row, and every derived metric declared
    assert [g["id"] for g in report["gates"]] == [
        "mc_resolves_relu_tensors",
        "mc_resolves_relu_dntk",
        "mc_resolves_relu_ddntk",
    ]
    assert {"relu.mean_abs_rel_err", "relu.mean_abs_rel_err_n16"} <= set(report["variants"]["infinite_width"])
    assert report["variants"]["infinite_width"]["relu.mean_abs_rel_err"] == pytest.approx(1.0)
    assert {"mean_ntk_shift_n4", "mean_ntk_shift_n16", "V_n16"} <= set(report["variants"]["mc_relu"])
    assert set(report["variants"]["mc_ntk2_relu"]) == {"runtime_s"}
    from pipelines.core.registry import method_config
    from pipelines.ntk_feynman.spec import metric_names

    p = validate(Params, method_config("ntk_feynman", env="test"), "ntk_feynman")
    assert set(report["metrics"]) <= set(metric_names(p, p.variants))


# ------------------------------------------------------------------------ ddNTK (R, S, T, U)
from pipelines.ntk_feynman import ddntk  # noqa: E402
from pipelines.ntk_feynman.params import DDNTK_TENSORS  # noqa: E402


def _brute_ddntk(kind, Ws, bs, x, lam_b, lam_w):
    """(z, ddI, ddII) of one net from nested torch.func derivatives of z(theta) on a flat parameter vector:
    ddI_abcd = H[Th_ab](l z_c, l z_d), ddII_abcd = H[z_c](l Th_ab, l z_d) with Th = J diag(lambda) J^T."""
    from torch.func import jacfwd, jacrev

    n0, depth, n = x.shape[0], len(Ws), Ws[-1].shape[0]
    shapes = [W.shape for W in Ws] + [b.shape for b in bs]
    sizes = [math.prod(s) for s in shapes]
    theta = torch.cat([t.reshape(-1) for t in (*Ws, *bs)])
    lam = torch.cat(
        [
            torch.full((sz,), lam_w / (n0 if i == 0 else n) if i < depth else lam_b, dtype=torch.float64)
            for i, sz in enumerate(sizes)
        ]
    )

    def f(t):
        parts = list(torch.split(t, sizes))
        W = [p.reshape(s) for p, s in zip(parts[:depth], shapes[:depth])]
        z = W[0] @ x + parts[depth]
        for i in range(1, depth):
            z = W[i] @ mc.act(kind, z)[0] + parts[depth + i]
        return z

    def ntk(t):
        J = jacrev(f)(t)
        return (J * lam) @ J.T

    lJ = jacrev(f)(theta) * lam
    hT, gT, hz = jacfwd(jacrev(ntk))(theta), jacrev(ntk)(theta) * lam, jacfwd(jacrev(f))(theta)
    ddI = torch.einsum("abmv,cm,dv->abcd", hT, lJ, lJ)
    ddII = torch.einsum("abm,cmv,dv->abcd", gT, hz, lJ)
    return f(theta), ddI, ddII


@pytest.mark.parametrize("kind", ["tanh", "gelu", "relu"])
def test_ddntk_probe_contractions_match_nested_torch_func(kind):
    """The sampler's four Hessian forms (double backward through the forward NTK recursion) equal the probe
    contractions of the full ddI / ddII tensors from nested torch.func derivatives of z(theta), at layers 2 and 3:
    C1 = sum u_c u_d ddI_aacd, C2 = sum u_a u'_b u_c u'_d ddI_abcd, C3, C4 the same for ddII."""
    n0, n, depth, c_w, c_b, lam_b, lam_w, seed = 4, 3, 3, 1.5, 0.2, 0.7, 1.3, 9
    x = np.array([0.9, -1.1, 0.4, 0.7])
    got = ddntk.sample_ddntk(kind, x, n, depth, 1, c_w, c_b, lam_b, lam_w, seed)
    gen = torch.Generator().manual_seed(seed)
    Ws, bs = [], []
    for ell in range(depth):
        fan = n0 if ell == 0 else n
        Ws.append(torch.randn(1, n, fan, generator=gen, dtype=torch.float64)[0] * math.sqrt(c_w / fan))
        bs.append(torch.randn(1, n, generator=gen, dtype=torch.float64)[0] * math.sqrt(c_b))
    us = torch.randint(0, 2, (2, depth, 1, n), generator=gen).to(torch.float64) * 2 - 1
    for ell in (1, 2):
        _, dI, dII = _brute_ddntk(kind, Ws[: ell + 1], bs[: ell + 1], torch.as_tensor(x), lam_b, lam_w)
        u, v = us[0, ell, 0], us[1, ell, 0]
        ref = [
            torch.einsum("aacd,c,d->", dI, u, u),
            torch.einsum("abcd,a,b,c,d->", dI, u, v, u, v),
            torch.einsum("aacd,c,d->", dII, u, u),
            torch.einsum("abcd,a,b,c,d->", dII, u, v, u, v),
        ]
        for j in range(4):
            assert got[0, ell, j] * n * n == pytest.approx(float(ref[j]), rel=1e-8, abs=1e-10), (ell, j)
    assert (got[:, 0] == 0).all()


@pytest.mark.parametrize("kind,c_w,c_b", [("tanh", 1.3, 0.2), ("relu", 2.0, 0.1)])
def test_ddntk_at_layer_two_by_brute_force_full_tensor(kind, c_w, c_b):
    """Layer 2: the first-order R, S, T, U are exact at any width. Brute force at width 3 from the full ddI, ddII
    tensors of each sampled net (no probes, no contraction): R/n = mean_{i != k} ddI_iikk, S/n = mean ddI_ikik,
    T/n = mean ddII_iikk, U/n = mean ddII_ikik, against ddntk.layer2_values (sigma'', sigma''' terms for tanh)."""
    from torch.func import vmap

    n0, n, N, lam_b, lam_w = 3, 3, 1000, 0.8, 1.2
    x = torch.tensor([1.0, -0.6, 0.8], dtype=torch.float64)
    g = torch.Generator().manual_seed(23)
    W0 = torch.randn(N, n, n0, generator=g, dtype=torch.float64) * (c_w / n0) ** 0.5
    W1 = torch.randn(N, n, n, generator=g, dtype=torch.float64) * (c_w / n) ** 0.5
    b0 = torch.randn(N, n, generator=g, dtype=torch.float64) * c_b**0.5
    b1 = torch.randn(N, n, generator=g, dtype=torch.float64) * c_b**0.5
    _, dI, dII = vmap(lambda a, b, c, e: _brute_ddntk(kind, [a, b], [c, e], x, lam_b, lam_w))(W0, W1, b0, b1)
    off = ~torch.eye(n, dtype=torch.bool)
    est = {
        "R": torch.einsum("siikk->sik", dI),
        "S": torch.einsum("sikik->sik", dI),
        "T": torch.einsum("siikk->sik", dII),
        "U": torch.einsum("sikik->sik", dII),
    }
    sq = float(x @ x) / n0
    ref = ddntk.layer2_values(kind, c_w, lam_w, c_b + c_w * sq, lam_b + lam_w * sq, theory.Quad())
    for t in DDNTK_TENSORS:
        per = est[t][:, off].mean(-1) * n
        blocks = per.reshape(20, -1).mean(1)
        se = float(blocks.std() / 20**0.5)
        assert abs(float(per.mean()) - ref[t]) <= 4 * se, (t, float(per.mean()), ref[t], se)


def test_ddntk_probe_estimator_unbiased_at_layer_two():
    """The pooled C1..C4 estimator (Rademacher probes) hits the exact layer-2 values at width 8 (GELU, with
    sigma'' and sigma''' terms), and a linear net whose biases alone learn has a ddNTK of exactly 0."""
    x = np.array([1.0, -0.6, 0.8, 0.3])
    c_w, c_b, lam_b, lam_w = 1.98305826, 0.17292239, 0.8, 1.2
    stats = ddntk.sample_ddntk("gelu", x, 8, 2, 4000, c_w, c_b, lam_b, lam_w, seed=4)
    blk = pd.DataFrame(stats[:, 1], columns=list(ddntk.DDNTK_COLUMNS)).groupby(np.arange(4000) // 200).mean()
    est = ddntk.pooled_ddntk(blk.assign(n_nets=200), 8, 8)
    sq = float(x @ x) / 4
    ref = ddntk.layer2_values("gelu", c_w, lam_w, c_b + c_w * sq, lam_b + lam_w * sq, theory.Quad())
    for t in DDNTK_TENSORS:
        assert abs(est[t] - ref[t]) <= 4 * est[f"{t}_se"], (t, est[t], ref[t])
    lin = ddntk.sample_ddntk("linear", np.ones(5), 6, 4, 20, 1.0, 0.3, 1.0, 0.0, seed=3)
    assert np.abs(lin).max() < 1e-12
    assert all(v == 0 for v in ddntk.layer2_values("linear", 1.0, 0.0, 1.3, 1.0, theory.Quad()).values())


def test_ddntk_relu_layer2_closed_form():
    """ReLU (sigma'' = 0 a.e.): R = 2 lW CW Th^2 <s'^4> = lW CW Th^2, S = lW^2 Th <s^2 s'^2> = lW^2 Th K / 2,
    T = 2 S, U = R / 2, by the half-Gaussian moments."""
    K, Th, c_w, lw = 1.7, 2.3, 2.0, 0.9
    v = ddntk.layer2_values("relu", c_w, lw, K, Th, theory.Quad())
    assert v["R"] == pytest.approx(lw * c_w * Th**2, rel=1e-10)
    assert v["S"] == pytest.approx(lw**2 * Th * K / 2, rel=1e-10)
    assert v["T"] == pytest.approx(lw**2 * Th * K, rel=1e-10)
    assert v["U"] == pytest.approx(lw * c_w * Th**2 / 2, rel=1e-10)


def test_ddntk_variant_needs_its_block_and_claims_name_it():
    with pytest.raises(ParameterError, match=r"ntk_feynman\.variants"):
        validate(Params, {**RAW, "variants": ["recursion", "mc_ddntk_relu"]}, "ntk_feynman")
    dd = {
        "widths": [4, 8],
        "nets_per_seed": [30, 30],
        "blocks_per_seed": 3,
        "chunk_elems": 100_000,
        "slope_min_width": 4,
    }
    with pytest.raises(ParameterError, match=r"ntk_feynman\.ddntk\.widths"):
        validate(Params, {**RAW, "ddntk": {**dd, "widths": [8, 4]}}, "ntk_feynman")
    claim = {"id": "c", "text": "t", "metric": "ddntk_layer2_max_abs_z.relu", "op": "<=", "threshold": 3.5}
    with pytest.raises(ParameterError, match="is produced by no variant or derived-metric declaration"):
        check({**RAW, "ddntk": dd, "claims": [claim]})
    ok = check({**RAW, "ddntk": dd, "claims": [claim], "variants": [*RAW["variants"], "mc_ddntk_relu"]})
    assert ok.block_activations("ddntk") == ["relu"] and "ddntk_relu" not in ok.mc_activations()


# ------------------------------------------------------------------------ ddNTK recursion (every layer)
def relu_ddntk_reference(c_w, c_b, lam_b, lam_w, sq, depth):
    """The ddNTK recursion written out for ReLU with the half-Gaussian moments (<s'^2> = <s'^4> = 1/2,
    <s^2 s'^2> = K/2, St[s s'] = 1/2, sigma'' = sigma''' = 0 a.e.): chi_perp = CW/2, chi_Th = lW/2, next to the
    hand-written B, F, P, Q recursions that feed it. Per layer 2..depth: R, S, T, U."""
    K, Th = c_b + c_w * sq, lam_b + lam_w * sq
    B = F = P = Q = R = S = T = U = 0.0
    out = []
    for _ in range(depth - 1):
        cp, ct = c_w / 2, lam_w / 2
        R, S, T, U = (
            lam_w * c_w * Th**2 + 2 * cp * (lam_w / 2) * B + 2 * cp * ct * (Q - P / 2) + cp**2 * R,
            lam_w**2 * Th * K / 2 + ct**2 * F + 2 * cp * ct * Q + cp**2 * S,
            lam_w**2 * Th * K + 2 * ct**2 * F + 2 * cp * ct * P + cp**2 * T,
            lam_w * c_w * Th**2 / 2 + cp * (lam_w / 2) * B + cp**2 * U,
        )
        P, Q = (
            2 * lam_w * c_w * (Th * K / 2 + F / 4) + c_w**2 * P / 4,
            lam_w * c_w * (Th * K / 2 + F / 4) + c_w**2 * Q / 4,
        )
        B, F = c_w**2 * Th**2 / 2 + cp**2 * B, c_w**2 * K * Th / 2 + cp**2 * F
        K, Th = c_b + c_w * K / 2, lam_b + lam_w * K / 2 + c_w * Th / 2
        out.append({"R": R, "S": S, "T": T, "U": U})
    return out


@pytest.mark.parametrize("c_w,c_b,lam_b,lam_w,sq,depth", [(2.0, 0.0, 1.0, 1.0, 1.0, 6), (1.7, 0.3, 0.5, 2.0, 2.3, 5)])
def test_relu_ddntk_recursion_matches_hand_closed_form(c_w, c_b, lam_b, lam_w, sq, depth):
    got = ddntk.ddntk_first_order("relu", c_w, c_b, lam_b, lam_w, sq, depth)
    assert got[0] == {"layer": 1, "R": 0.0, "S": 0.0, "T": 0.0, "U": 0.0}
    for g, ref in zip(got[1:], relu_ddntk_reference(c_w, c_b, lam_b, lam_w, sq, depth)):
        for t in DDNTK_TENSORS:
            assert g[t] == pytest.approx(ref[t], rel=1e-10), (g["layer"], t)
        # ReLU keeps the layer-2 identities T = 2 S and U = R / 2 at every layer (P = 2 Q)
        assert g["T"] == pytest.approx(2 * g["S"], rel=1e-10) and g["U"] == pytest.approx(g["R"] / 2, rel=1e-10)
    last = ddntk.ddntk_first_order("relu", 2.0, 0.0, 1.0, 1.0, 1.0, 4)[-1]
    assert [round(last[t], 9) for t in DDNTK_TENSORS] == [160, 40, 80, 80]  # the default run's layer 4


@pytest.mark.parametrize("kind,c_w,c_b", [("relu", 1.8, 0.2), ("tanh", 1.3, 0.2), ("gelu", 1.98305826, 0.17292239)])
def test_ddntk_recursion_starts_from_the_exact_layer2_values(kind, c_w, c_b):
    """At layer 2 the recursion is layer2_values at layer 1's K, Theta (exact at any width); without inter-layer
    terms every layer is layer2_values at the previous layer's K, Theta; infinite_width carries zeros."""
    lam_b, lam_w, sq, quad = 0.7, 1.3, 1.4, theory.Quad()
    rec = ddntk.ddntk_first_order(kind, c_w, c_b, lam_b, lam_w, sq, 4, quad=quad)
    abl = ddntk.ddntk_first_order(kind, c_w, c_b, lam_b, lam_w, sq, 4, interlayer=False, quad=quad)
    base = theory.first_order(kind, c_w, c_b, lam_b, lam_w, sq, 4, quad=quad)
    for ell in (2, 3, 4):
        ref = ddntk.layer2_values(kind, c_w, lam_w, base[ell - 2]["K"], base[ell - 2]["Theta"], quad)
        for t in DDNTK_TENSORS:
            assert abl[ell - 1][t] == pytest.approx(ref[t], rel=1e-12)
            if ell == 2:
                assert rec[1][t] == pytest.approx(ref[t], rel=1e-12)
    assert any(abs(rec[3][t] - abl[3][t]) > 0.1 * abs(rec[3][t]) for t in DDNTK_TENSORS)


def test_ddntk_recursion_limit_cases():
    """A linear net whose biases alone learn has no ddNTK at any layer (the NTK does not depend on the
    parameters); with lambda_W > 0 a linear net obeys the ReLU-like identities T = 2 S, U = R / 2 and the
    closed form R' = 2 lW CW Th^2 + 2 lW CW B + CW^2 R, S' = lW^2 (Th K + F) + lW CW P + CW^2 S."""
    for row in ddntk.ddntk_first_order("linear", 1.1, 0.3, 1.0, 0.0, 1.2, 5):
        assert all(row[t] == 0.0 for t in DDNTK_TENSORS)
    c_w, c_b, lam_b, lam_w, sq = 0.9, 0.2, 0.6, 1.4, 1.3
    got = ddntk.ddntk_first_order("linear", c_w, c_b, lam_b, lam_w, sq, 5)
    K, Th, B, F, P, R, S = c_b + c_w * sq, lam_b + lam_w * sq, 0.0, 0.0, 0.0, 0.0, 0.0
    for g in got[1:]:
        R, S, P, B, F, K, Th = (
            2 * lam_w * c_w * Th**2 + 2 * lam_w * c_w * B + c_w**2 * R,
            lam_w**2 * (Th * K + F) + lam_w * c_w * P + c_w**2 * S,
            2 * lam_w * c_w * (Th * K + F) + c_w**2 * P,
            c_w**2 * Th**2 + c_w**2 * B,
            c_w**2 * K * Th + c_w**2 * F,
            c_b + c_w * K,
            lam_b + lam_w * K + c_w * Th,
        )
        assert (g["R"], g["S"], g["T"], g["U"]) == pytest.approx((R, S, 2 * S, R / 2), rel=1e-10)


def test_ddntk_recursion_matches_sampled_nets_at_layer_three():
    """The mechanism test: at layer 3 (the first with inter-layer terms) the 1/n (Richardson) extrapolation
    (16 T_16 - 8 T_8) / 8 of sampled tanh nets (with sigma'' and sigma''' terms and every inter-layer term,
    Q - P/2 included) equals the recursion within 3.5 s.e. for R, S, T, U, while the ablation without
    inter-layer terms is rejected; the raw n = 16 error is below the n = 8 error. (ReLU's extrapolation needs
    n >= 16, too slow here; the default run checks ReLU and tanh at layers 3 and 4.)"""
    kind, c_w, c_b, seed = "tanh", 1.0, 0.0, 21
    x, lam_b, lam_w = np.ones(5), 1.0, 1.0
    rec = ddntk.ddntk_first_order(kind, c_w, c_b, lam_b, lam_w, 1.0, 3)[2]
    abl = ddntk.ddntk_first_order(kind, c_w, c_b, lam_b, lam_w, 1.0, 3, interlayer=False)[2]
    est = {}
    for n, nets in ((8, 12000), (16, 6000)):
        stats = ddntk.sample_ddntk(kind, x, n, 3, nets, c_w, c_b, lam_b, lam_w, seed=seed + n, layers=[3])
        blk = pd.DataFrame(stats[:, 2], columns=list(ddntk.DDNTK_COLUMNS)).groupby(np.arange(nets) // (nets // 30))
        est[n] = ddntk.pooled_ddntk(blk.mean().assign(n_nets=nets // 30), n, n)
    z_abl = []
    for t in DDNTK_TENSORS:
        ex = 2 * est[16][t] - est[8][t]
        se = math.hypot(2 * est[16][f"{t}_se"], est[8][f"{t}_se"])
        assert abs(ex - rec[t]) <= 3.5 * se, (t, ex, se, rec[t])
        assert abs(est[16][t] - rec[t]) < abs(est[8][t] - rec[t]), t
        z_abl.append(abs(ex - abl[t]) / se)
    assert max(z_abl) > 5


def test_dntk_recursion_with_unequal_widths_matches_sampled_nets():
    """Unequal widths n = (a, 4a, 2a, 2a): each previous-layer tensor enters layer l + 1 times r = n_l / n_{l-1}
    (4 into layer 3, 1/2 into layer 4, also through the kernel side's F and B). The 1/n extrapolation over
    a = 8, 16 of sampled tanh nets matches the dNTK recursion with these r within 3.5 s.e. at layers 3 and 4,
    and rejects the equal-width recursion at layer 3; layer 2 (exact at any widths) matches the raw MC."""
    kind, c_w, c_b, x = "tanh", 1.0, 0.0, np.ones(5)
    est = {}
    for a, nets in ((8, 4000), (16, 2000)):
        ws = [a, 4 * a, 2 * a, 2 * a]
        stats = dntk.sample_dntk(kind, x, ws, 4, nets, c_w, c_b, 1.0, 1.0, seed=40 + a)
        for ell in (2, 3, 4):
            blk = pd.DataFrame(stats[:, ell - 1], columns=list(dntk.DNTK_COLUMNS))
            blk = blk.groupby(np.arange(nets) // (nets // 20))
            est[a, ell] = dntk.pooled_dntk(blk.mean().assign(n_nets=nets // 20), ws[ell - 1], ws[ell - 2])
    rec = dntk.dntk_first_order(kind, c_w, c_b, 1.0, 1.0, 1.0, 4, widths=[16, 64, 32, 32])
    equal = dntk.dntk_first_order(kind, c_w, c_b, 1.0, 1.0, 1.0, 4)
    for t in DNTK_TENSORS:
        assert abs(est[16, 2][t] - rec[1][t]) <= 3.5 * est[16, 2][f"{t}_se"], t
        for ell in (3, 4):
            ex = 2 * est[16, ell][t] - est[8, ell][t]
            se = math.hypot(2 * est[16, ell][f"{t}_se"], est[8, ell][f"{t}_se"])
            assert abs(ex - rec[ell - 1][t]) <= 3.5 * se, (ell, t, ex, se, rec[ell - 1][t])
            if ell == 3:
                assert abs(ex - equal[2][t]) > 6 * se, (t, ex, equal[2][t])


# ------------------------------------------------------------------------ two-input NTK tensors (ntk2.py)
def _pair_inputs(seed=1, n0=6):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((2, n0))
    X[1] = 0.5 * X[0] + X[1]  # correlated, unequal norms
    return X


@pytest.mark.parametrize("kind, c_w, c_b", [("relu", 2.0, 0.0), ("tanh", 1.0, 0.0), ("gelu", 1.98305826, 0.17292239)])
def test_two_input_ntk_tensors_contain_the_single_input_ones(kind, c_w, c_b):
    """The components whose input indices are all 1 (all 2) are the single-input V, D, A, B, F of x_1 (x_2),
    for any partner input; the kernel, NTK Gram and V equal infinite_width_gram and two_input_vertex."""
    from pipelines.ntk_feynman import ntk2

    X = _pair_inputs()
    rows = ntk2.two_input_ntk_tensors(kind, c_w, c_b, 1.0, 0.7, X, 4)
    grams = theory.infinite_width_gram(kind, c_w, c_b, 1.0, 0.7, X, 4)
    vert = theory.two_input_vertex(kind, c_w, c_b, X, 4)
    for a, (u, o) in enumerate(((0, 0), (2, 3))):
        single = theory.first_order(kind, c_w, c_b, 1.0, 0.7, float(X[a] @ X[a]) / X.shape[1], 4)
        for r, s in zip(rows, single):
            got = {"V": r["V"][u, u], "D": r["D"][u, u], "A": r["A"][u, u], "B": r["B"][o, o], "F": r["F"][o, o]}
            for t in TENSORS:
                # rel 1e-7: the two-input susceptibilities are central differences, the single-input ones
                # Hermite-weighted integrals
                assert got[t] == pytest.approx(s[t], rel=1e-7, abs=1e-12), (a, r["layer"], t)
    for r, (K, Th), v in zip(rows, grams, vert):
        np.testing.assert_allclose(r["K"], K, rtol=1e-12)
        np.testing.assert_allclose(r["Theta"], Th, rtol=1e-12)
        for i in range(3):
            for j in range(i, 3):
                assert r["V"][i, j] == pytest.approx(
                    v[f"V_{theory.PAIR_NAMES[i]}_{theory.PAIR_NAMES[j]}"], rel=1e-10, abs=1e-14
                )


def test_two_input_ntk_tensors_linear_closed_form():
    """A linear net (any C_W, C_b, lambda's): every average is a Wick product of K, the susceptibilities are
    constants and the Stein links are C_W delta, so the recursions are written out by hand."""
    from pipelines.ntk_feynman import ntk2

    X = np.random.default_rng(3).standard_normal((2, 5))
    cw, cb, lb, lw = 1.3, 0.2, 0.7, 1.1
    rows = ntk2.two_input_ntk_tensors("linear", cw, cb, lb, lw, X, 4)
    U, O = ntk2.UPAIRS, ntk2.OPAIRS
    G = X @ X.T / 5
    K, Th = cb + cw * G, lb + lw * G
    V, D, A, B, F = np.zeros((3, 3)), np.zeros((3, 3)), np.zeros((3, 3)), np.zeros((4, 4)), np.zeros((4, 4))
    for r in rows[1:]:
        wick = np.array([[K[a, c] * K[b, d] + K[a, d] * K[b, c] for c, d in U] for a, b in U])
        V, D, A, B, F = (
            cw**2 * (wick + V),
            lw * cw * (wick + V) + cw**2 * D,
            lw**2 * (wick + V) + lw * cw * (D + D.T) + cw**2 * A,
            np.array([[cw**2 * Th[a, b] * Th[c, d] for c, d in O] for a, b in O]) + cw**2 * B,
            np.array([[cw**2 * Th[a, b] * K[c, d] for c, d in O] for a, b in O]) + cw**2 * F,
        )
        K, Th = cb + cw * K, lb + lw * K + cw * Th
        for t, M in zip("VDABF", (V, D, A, B, F)):
            np.testing.assert_allclose(r[t], M, rtol=1e-9, atol=1e-9 * np.abs(M).max(), err_msg=f"{t} L{r['layer']}")


def test_two_input_ntk_tensors_relu_layer2_arc_cosine():
    """ReLU at layer 2: B and F of the cross pairs are arc-cosine kernels,
    B[(12),(12)] = B[(12),(21)] = C_W^2 Theta_12^2 k0, F[(12),(12)] = F[(12),(21)] = C_W^2 Theta_12 k1,
    F[(11),(22)] = C_W^2 Theta_11 <s'_1 s_2^2> = C_W^2 Theta_11 K_22 (pi - th + sin th cos th) / (2 pi), and
    B[(11),(22)] = C_W^2 Theta_11 Theta_22 k0 (th the angle of K)."""
    from pipelines.ntk_feynman import ntk2

    X = _pair_inputs(2)
    cw, cb, lb, lw = 1.7, 0.3, 0.5, 1.2
    r = ntk2.two_input_ntk_tensors("relu", cw, cb, lb, lw, X, 2)[1]
    G = X @ X.T / X.shape[1]
    K, Th = cb + cw * G, lb + lw * G
    k1, k0 = theory.relu_arccos(K[0, 0], K[0, 1], K[1, 1])
    O = ntk2.OPAIRS
    i12, i21, i11, i22 = O.index((0, 1)), O.index((1, 0)), O.index((0, 0)), O.index((1, 1))
    for j in (i12, i21):
        assert r["B"][i12, j] == pytest.approx(cw**2 * Th[0, 1] ** 2 * k0, rel=1e-10)
        assert r["F"][i12, j] == pytest.approx(cw**2 * Th[0, 1] * k1, rel=1e-10)
    assert r["B"][i11, i22] == pytest.approx(cw**2 * Th[0, 0] * Th[1, 1] * k0, rel=1e-10)
    th = math.acos(K[0, 1] / math.sqrt(K[0, 0] * K[1, 1]))
    assert r["F"][i11, i22] == pytest.approx(
        cw**2 * Th[0, 0] * K[1, 1] * (math.pi - th + math.sin(th) * math.cos(th)) / (2 * math.pi), rel=1e-10
    )


@pytest.mark.parametrize("kind, c_w", [("tanh", 1.0), ("relu", 2.0)])
def test_two_input_ntk_estimators_unbiased_at_layer_two(kind, c_w):
    """Layer 1 is Gaussian with a deterministic NTK, so at layer 2 the first-order tensors are exact at any
    width: 12 000 width-3 nets match all 50 components (the sampler's NTK of both inputs is checked by this)."""
    from pipelines.ntk_feynman import ntk2

    X = _pair_inputs()
    rec = ntk2.two_input_ntk_tensors(kind, c_w, 0.0, 1.0, 1.0, X, 2)[1]
    m = ntk2.pooled_two_input(ntk2.sample_two_input(kind, X, 3, 2, 12_000, c_w, 0.0, 1.0, 1.0, seed=11), 3)[1]
    z = np.concatenate([((m[t] - rec[t]) / m[f"{t}_se"]).ravel() for t in "VDABF"])
    z = z[np.isfinite(z)]
    assert np.abs(z).max() < 4.0
    assert np.mean(z**2) < 2.0
    np.testing.assert_allclose(m["Theta"], [rec["Theta"][a, b] for a, b in ntk2.UPAIRS], rtol=0.02)


@pytest.mark.parametrize("kind, c_w", [("tanh", 1.0), ("relu", 2.0)])
def test_two_input_ntk_recursion_matches_sampled_nets_at_layer_three(kind, c_w):
    """Mechanism: at layer 3 the 1/n extrapolation of sampled nets at n = 8 and 16 (16 000 / 8 000 nets) matches
    the recursion within 3.5 s.e. in every component, and rejects the ablation without inter-layer terms."""
    from pipelines.ntk_feynman import ntk2

    X = _pair_inputs()
    rec = ntk2.two_input_ntk_tensors(kind, c_w, 0.0, 1.0, 1.0, X, 3)[2]
    abl = ntk2.two_input_ntk_tensors(kind, c_w, 0.0, 1.0, 1.0, X, 3, interlayer=False)[2]
    m = [
        ntk2.pooled_two_input(ntk2.sample_two_input(kind, X, w, 3, n, c_w, 0.0, 1.0, 1.0, seed=5), w)[2]
        for w, n in ((8, 16_000), (16, 8_000))
    ]
    z_rec, z_abl = [], []
    for t in "VDABF":
        ext = 2 * m[1][t] - m[0][t]
        se = np.hypot(2 * m[1][f"{t}_se"], m[0][f"{t}_se"])
        z_rec.append(np.abs((ext - rec[t]) / se).max())
        z_abl.append(np.abs((ext - abl[t]) / se).max())
    assert max(z_rec) < 3.5, z_rec
    assert min(z_abl) > 4.0, z_abl


def test_ntk2_variant_needs_its_block_and_claims_name_it():
    with pytest.raises(Exception, match="ntk2"):
        Params.model_validate({**RAW, "variants": [*RAW["variants"], "mc_ntk2_relu"]})
    ok = {**RAW, "ntk2": {"widths": [4, 8], "nets_per_seed": [20, 20], "blocks_per_seed": 2, "chunk_elems": 100_000}}
    Params.model_validate({**ok, "variants": [*RAW["variants"], "mc_ntk2_relu"]})
    claim = {"id": "c", "text": "t", "metric": "ntk2_extrap_excess.relu", "op": "<=", "threshold": 0.1}
    with pytest.raises(
        ParameterError, match="ntk2_extrap_excess.relu' is produced by no variant or derived-metric declaration"
    ):
        check({**ok, "claims": [claim]})
    check({**ok, "claims": [claim], "variants": [*RAW["variants"], "mc_ntk2_relu"]})


@pytest.mark.parametrize("kind,c_w,c_b", [("tanh", 1.3, 0.2), ("relu", 2.0, 0.1)])
def test_two_input_dntk_at_layer_two_by_brute_force(kind, c_w, c_b):
    """The two-input dNTK at layer 2 (exact at any width): the full tensor over (neuron, input) from nested
    autodiff of width-3 nets that see both inputs; n mean_{i != k} dTh_{i k k; a0 a1 a2} z_{i; a3} -> P and
    n mean_{i != k} dTh_{i i k; a0 a1 a2} z_{k; a3} -> Q for all 16 input-index tuples; the all-equal ones are
    the single-input dntk values."""
    from torch.func import jacrev, vmap

    from pipelines.ntk_feynman import ntk2

    n0, n, N, lam_b, lam_w = 3, 3, 2000, 0.8, 1.2
    X = torch.tensor([[1.0, -0.6, 0.8], [0.3, 0.9, 1.1]], dtype=torch.float64)
    g = torch.Generator().manual_seed(23)
    W0 = torch.randn(N, n, n0, generator=g, dtype=torch.float64) * (c_w / n0) ** 0.5
    W1 = torch.randn(N, n, n, generator=g, dtype=torch.float64) * (c_w / n) ** 0.5
    b0 = torch.randn(N, n, generator=g, dtype=torch.float64) * c_b**0.5
    b1 = torch.randn(N, n, generator=g, dtype=torch.float64) * c_b**0.5
    lam = {"W0": lam_w / n0, "b0": lam_b, "W1": lam_w / n, "b1": lam_b}

    def one(a, b, c, e):
        pr = {"W0": a, "b0": c, "W1": b, "b1": e}

        def f(q):  # (n, 2): neuron x input
            z = X @ q["W0"].T + q["b0"]
            return (mc.act(kind, z)[0] @ q["W1"].T + q["b1"]).T

        def ntk(q):
            J = jacrev(f)(q)
            return sum(
                lam[k] * torch.einsum("iam,kbm->iakb", J[k].reshape(n, 2, -1), J[k].reshape(n, 2, -1)) for k in q
            )

        J, dT = jacrev(f)(pr), jacrev(ntk)(pr)
        d = sum(
            lam[k] * torch.einsum("iam,jbkcm->iajbkc", J[k].reshape(n, 2, -1), dT[k].reshape(n, 2, n, 2, -1))
            for k in pr
        )
        return f(pr), d

    z, d = vmap(one)(W0, W1, b0, b1)  # z (N, n, 2); d (N, i0, a0, i1, a1, i2, a2)
    off = ~torch.eye(n, dtype=torch.bool)
    p_est = torch.einsum("siakbkc,sie->sikabce", d, z)[:, off].mean(1) * n  # (N, a0, a1, a2, a3)
    q_est = torch.einsum("siaibkc,ske->sikabce", d, z)[:, off].mean(1) * n
    P, Q = ntk2.two_input_dntk_layer2(kind, c_w, c_b, lam_b, lam_w, X.numpy())
    single = dntk.dntk_first_order(kind, c_w, c_b, lam_b, lam_w, float(X[0] @ X[0]) / n0, 2)[-1]
    assert P[0, 0, 0, 0] == pytest.approx(single["P"], rel=1e-10)
    assert Q[0, 0, 0, 0] == pytest.approx(single["Q"], rel=1e-10)
    zs = []
    for est, ref in ((p_est, P), (q_est, Q)):
        blocks = est.reshape(20, -1, 2, 2, 2, 2).mean(1)
        se = blocks.std(0).numpy() / 20**0.5
        zs.append((est.mean(0).numpy() - ref) / se)
    zs = np.concatenate([z.ravel() for z in zs])
    assert np.abs(zs).max() < 4.0, np.abs(zs).max()
    assert np.mean(zs**2) < 2.0


# ------------------------------------------------------------------------ two-input dNTK at every layer
@pytest.mark.parametrize("kind, c_w, c_b", [("relu", 2.0, 0.0), ("tanh", 1.3, 0.2), ("gelu", 1.98305826, 0.17292239)])
def test_two_input_dntk_recursion_contains_single_input_and_layer2(kind, c_w, c_b):
    """The two-input P, Q recursion: at layer 2 it is two_input_dntk_layer2; its all-1 (all-2) components are
    dntk.dntk_first_order at x_1 (x_2) at every layer; P is symmetric in (a1, a2); the ablation keeps the
    layer-2 formula at each layer's K, Theta."""
    from pipelines.ntk_feynman import ntk2

    X = _pair_inputs()
    rows = ntk2.two_input_dntk(kind, c_w, c_b, 0.8, 1.2, X, 4)
    P2, Q2 = ntk2.two_input_dntk_layer2(kind, c_w, c_b, 0.8, 1.2, X)
    np.testing.assert_allclose(rows[1]["P"], P2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rows[1]["Q"], Q2, rtol=1e-12, atol=1e-14)
    assert np.all(rows[0]["P"] == 0) and np.all(rows[0]["Q"] == 0)
    for a in range(2):
        single = dntk.dntk_first_order(kind, c_w, c_b, 0.8, 1.2, float(X[a] @ X[a]) / X.shape[1], 4)
        for r, s in zip(rows, single):
            for t in DNTK_TENSORS:
                assert r[t][a, a, a, a] == pytest.approx(s[t], rel=1e-10, abs=1e-13), (a, r["layer"], t)
    for r in rows:
        np.testing.assert_allclose(r["P"], r["P"].transpose(0, 2, 1, 3), rtol=1e-12, atol=1e-13)
    abl = ntk2.two_input_dntk(kind, c_w, c_b, 0.8, 1.2, X, 4, interlayer=False)
    assert not np.allclose(abl[3]["P"], rows[3]["P"])


def test_two_input_dntk_recursion_linear_closed_form():
    """A linear net: the Stein vectors are unit vectors and sigma'' = 0, so with the hand-written two-input F
    (F' = C_W^2 Theta_ab K_cd + C_W^2 F) the recursion reads
    P' = lW CW (Th_01 K_23 + Th_02 K_13 + F[(01),(32)] + F[(02),(31)]) + CW^2 P and
    Q' = lW CW (Th_12 K_03 + F[(12),(03)]) + CW^2 Q (indices a0..a3 written 0..3)."""
    from pipelines.ntk_feynman import ntk2

    X = np.random.default_rng(3).standard_normal((2, 5))
    cw, cb, lb, lw = 1.3, 0.2, 0.7, 1.1
    rows = ntk2.two_input_dntk("linear", cw, cb, lb, lw, X, 5)
    G = X @ X.T / 5
    K, Th = cb + cw * G, lb + lw * G
    F = np.zeros((2, 2, 2, 2))  # F[a, b, c, d] = F[(ab),(cd)]
    P, Q = np.zeros((2, 2, 2, 2)), np.zeros((2, 2, 2, 2))
    for r in rows[1:]:
        Pn, Qn = np.empty_like(P), np.empty_like(Q)
        for a0, a1, a2, a3 in np.ndindex(2, 2, 2, 2):
            Pn[a0, a1, a2, a3] = (
                lw * cw * (Th[a0, a1] * K[a2, a3] + Th[a0, a2] * K[a1, a3] + F[a0, a1, a3, a2] + F[a0, a2, a3, a1])
                + cw**2 * P[a0, a1, a2, a3]
            )
            Qn[a0, a1, a2, a3] = lw * cw * (Th[a1, a2] * K[a0, a3] + F[a1, a2, a0, a3]) + cw**2 * Q[a0, a1, a2, a3]
        P, Q = Pn, Qn
        F = cw**2 * np.einsum("ab,cd->abcd", Th, K) + cw**2 * F
        K, Th = cb + cw * K, lb + lw * K + cw * Th
        for t, M in (("P", P), ("Q", Q)):
            np.testing.assert_allclose(r[t], M, rtol=1e-9, atol=1e-9 * np.abs(M).max(), err_msg=f"{t} L{r['layer']}")


def _brute_dntk2(kind, Ws, bs, X, lam_b, lam_w):
    """The full two-input dNTK tensor d[i0, a0, i1, a1, i2, a2] of one net by nested torch.func Jacobians, and
    z[i, a] (as in test_two_input_dntk_at_layer_two_by_brute_force, any depth)."""
    from torch.func import jacrev

    n0, depth, n = X.shape[1], len(Ws), Ws[-1].shape[0]
    pr = {f"W{i}": W for i, W in enumerate(Ws)} | {f"b{i}": b for i, b in enumerate(bs)}
    lam = {k: lam_b if k[0] == "b" else lam_w / (n0 if k == "W0" else n) for k in pr}

    def f(q):
        z = X @ q["W0"].T + q["b0"]
        for i in range(1, depth):
            z = mc.act(kind, z)[0] @ q[f"W{i}"].T + q[f"b{i}"]
        return z.T

    def ntk(q):
        J = jacrev(f)(q)
        return sum(lam[k] * torch.einsum("iam,kbm->iakb", J[k].reshape(n, 2, -1), J[k].reshape(n, 2, -1)) for k in q)

    J, dT = jacrev(f)(pr), jacrev(ntk)(pr)
    d = sum(
        lam[k] * torch.einsum("iam,jbkcm->iajbkc", J[k].reshape(n, 2, -1), dT[k].reshape(n, 2, n, 2, -1)) for k in pr
    )
    return f(pr), d


@pytest.mark.parametrize("kind", ["tanh", "relu"])
def test_two_input_dntk_contractions_match_the_full_tensor(kind):
    """sample_two_input_dntk's three contractions per input tuple equal those of the full nested-autodiff
    two-input dNTK tensor at layers 2 and 3 (nets re-drawn from the sampler's generator in its order)."""
    from pipelines.ntk_feynman import ntk2

    n0, n, depth, c_w, c_b, lam_b, lam_w, seed = 3, 3, 3, 1.5, 0.2, 0.7, 1.3, 5
    X = np.array([[0.9, -1.1, 0.4], [0.3, 0.8, 1.2]])
    got = ntk2.sample_two_input_dntk(kind, X, n, depth, 1, c_w, c_b, lam_b, lam_w, seed)
    gen = torch.Generator().manual_seed(seed)
    Ws, bs = [], []
    for ell in range(depth):
        fan = n0 if ell == 0 else n
        Ws.append(torch.randn(1, n, fan, generator=gen, dtype=torch.float64)[0] * math.sqrt(c_w / fan))
        bs.append(torch.randn(1, n, generator=gen, dtype=torch.float64)[0] * math.sqrt(c_b))
    us = torch.randint(0, 2, (depth, 1, n), generator=gen).to(torch.float64) * 2 - 1
    for ell in (1, 2):
        z, d = _brute_dntk2(kind, Ws[: ell + 1], bs[: ell + 1], torch.as_tensor(X), lam_b, lam_w)
        u = us[ell, 0]
        s1 = torch.einsum("iakbkc,ie->abce", d, z)
        s2 = torch.einsum("i,k,iakblc,le->abce", u, u, d, z)  # sum u_i0 u_i1 z_i2;a3 dTh_..;a0a1a2
        s3 = torch.einsum("i,k,iakclb,le->abce", u, u, d, z)  # the same with (a1, a2) swapped
        np.testing.assert_allclose(got[0, ell, 0] * n * n, s1.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got[0, ell, 1] * n * n, s2.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got[0, ell, 2] * n * n, s3.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind, c_w, c_b", [("tanh", 1.3, 0.2), ("relu", 2.0, 0.1)])
def test_two_input_dntk_recursion_matches_sampled_nets_at_layer_three(kind, c_w, c_b):
    """Sampled nets (the contraction sampler, checked against the full tensor above) at n = 8 and 16
    (12 000 / 6 000 nets): layer 2 matches the exact P, Q raw at both widths; at layer 3 the 1/n extrapolation
    2 T(16) - T(8) matches the recursion in all 32 components, and rejects the ablation without inter-layer
    terms (the F, B, P, Q links)."""
    from pipelines.ntk_feynman import ntk2

    X = np.array([[1.0, -0.6, 0.8], [0.3, 0.9, 1.1]])
    rec = ntk2.two_input_dntk(kind, c_w, c_b, 0.8, 1.2, X, 3)
    abl = ntk2.two_input_dntk(kind, c_w, c_b, 0.8, 1.2, X, 3, interlayer=False)[2]
    m = {
        w: ntk2.pooled_two_input_dntk(ntk2.sample_two_input_dntk(kind, X, w, 3, N, c_w, c_b, 0.8, 1.2, seed=7 + w), w)
        for w, N in ((8, 12_000), (16, 6_000))
    }
    z2 = np.concatenate([((m[w][1][t] - rec[1][t]) / m[w][1][f"{t}_se"]).ravel() for w in m for t in "PQ"])
    assert np.abs(z2).max() < 4.0, np.abs(z2).max()
    for t in "PQ":
        ext = 2 * m[16][2][t] - m[8][2][t]
        se = np.hypot(2 * m[16][2][f"{t}_se"], m[8][2][f"{t}_se"])
        z_rec, z_abl = (ext - rec[2][t]) / se, (ext - abl[t]) / se
        # max |z| only: the 32 components come from the same nets and move together (no chi^2 test)
        assert np.abs(z_rec).max() < 3.5, (t, np.abs(z_rec).max())
        assert np.abs(z_abl).max() > 5.0, (t, np.abs(z_abl).max())


def test_dntk2_variant_needs_its_block_and_claims_name_it():
    with pytest.raises(Exception, match="dntk2"):
        Params.model_validate({**RAW, "variants": [*RAW["variants"], "mc_dntk2_relu"]})
    ok = validate(Params, {**RAW, "dntk2": DNTK2_RAW, "variants": [*RAW["variants"], "mc_dntk2_relu"]}, "ntk_feynman")
    assert ok.block_activations("dntk2") == ["relu"] and ok.mc_activations() == ["relu", "tanh"]
    assert ok.block_activations("dntk") == [] and ok.block_activations("ntk2") == []
    claim = {"id": "c", "text": "t", "metric": "dntk2_extrap_excess.relu", "op": "<=", "threshold": 0.1}
    with pytest.raises(ParameterError, match="is produced by no variant or derived-metric declaration"):
        check({**RAW, "dntk2": DNTK2_RAW, "claims": [claim]})


def test_dntk2_pooled_blocks_match_direct_pooling():
    """The pipeline's block table (ntk2.DNTK2_COLUMNS) pools to the same P, Q as pooled_two_input_dntk."""
    from pipelines.ntk_feynman import ntk2

    X = np.random.default_rng(3).normal(size=(2, 5))
    stats = ntk2.sample_two_input_dntk("tanh", X, 4, 3, 40, 1.0, 0.0, 1.0, 1.0, seed=2)
    edges = np.linspace(0, 40, 5).round().astype(int)
    blocks = pd.DataFrame(
        [
            {"n_nets": int(b - a), **dict(zip(ntk2.DNTK2_COLUMNS, ntk2.dntk2_block_row(stats[a:b])[2]))}
            for a, b in zip(edges[:-1], edges[1:])
        ]
    )
    got = ntk2.dntk2_pooled_blocks(blocks, 4)
    ref = ntk2.pooled_two_input_dntk(stats, 4, n_blocks=4)[2]
    names = ntk2.dntk2_quantity_names()
    np.testing.assert_allclose([got[k] for k in names], [*ref["P"].ravel(), *ref["Q"].ravel()], rtol=1e-10)
    np.testing.assert_allclose([got[f"{k}_se"] for k in names], [*ref["P_se"].ravel(), *ref["Q_se"].ravel()], rtol=1e-8)


# ------------------------------------------------------------------------ two-input ddNTK wiring (mc_ddntk2_*)
def test_ddntk2_variant_needs_its_block_and_claims_name_it():
    with pytest.raises(Exception, match="ddntk2"):
        Params.model_validate({**RAW, "variants": [*RAW["variants"], "mc_ddntk2_relu"]})
    ok = validate(Params, {**RAW, "ddntk2": DNTK2_RAW, "variants": [*RAW["variants"], "mc_ddntk2_relu"]}, "ntk_feynman")
    assert ok.block_activations("ddntk2") == ["relu"] and ok.mc_activations() == ["relu", "tanh"]
    assert ok.block_activations("ddntk") == [] and ok.block_activations("dntk2") == []
    claim = {"id": "c", "text": "t", "metric": "ddntk2_extrap_excess.relu", "op": "<=", "threshold": 0.1}
    with pytest.raises(ParameterError, match="is produced by no variant or derived-metric declaration"):
        check({**RAW, "ddntk2": DNTK2_RAW, "claims": [claim]})
    abl = {**claim, "metric": "ddntk2_interlayer_error_ratio.relu"}
    with pytest.raises(ParameterError, match="is produced by no variant or derived-metric declaration"):
        check({**RAW, "ddntk2": DNTK2_RAW, "claims": [abl], "variants": ["recursion", "mc_relu", "mc_ddntk2_relu"]})


def test_ddntk2_pooled_blocks_match_direct_pooling():
    """The pipeline's block table (train.DDNTK2_COLUMNS) pools to the same R, S, T, U as
    ddntk2.pooled_two_input_ddntk, and the theory variants carry the recursion as "dd2.*" columns."""
    from pipelines.ntk_feynman import ddntk2
    from pipelines.ntk_feynman.data import make_inputs
    from pipelines.ntk_feynman.train import (
        DDNTK2_COLUMNS,
        ddntk2_block_row,
        ddntk2_pooled_blocks,
        ddntk2_quantity_names,
        variant_stats,
    )

    X = np.random.default_rng(3).normal(size=(2, 5))
    stats = ddntk2.sample_two_input_ddntk("tanh", X, 4, 3, 40, 1.0, 0.0, 1.0, 1.0, seed=2)
    edges = np.linspace(0, 40, 5).round().astype(int)
    blocks = pd.DataFrame(
        [
            {"n_nets": int(b - a), **dict(zip(DDNTK2_COLUMNS, ddntk2_block_row(stats[a:b])[2]))}
            for a, b in zip(edges[:-1], edges[1:])
        ]
    )
    got = ddntk2_pooled_blocks(blocks, 4)
    ref = ddntk2.pooled_two_input_ddntk(stats, 4, n_blocks=4)[2]
    names = ddntk2_quantity_names()
    assert len(names) == 64 and names[0] == "dd2.R_1111" and names[-1] == "dd2.U_2222"
    np.testing.assert_allclose([got[k] for k in names], np.concatenate([ref[t].ravel() for t in "RSTU"]), rtol=1e-10)
    np.testing.assert_allclose(
        [got[f"{k}_se"] for k in names], np.concatenate([ref[f"{t}_se"].ravel() for t in "RSTU"]), rtol=1e-8
    )
    p = Params.model_validate({**RAW, "ddntk2": DNTK2_RAW})
    inputs = make_inputs(p)
    rec, abl, inf = (variant_stats(inputs, p, variant=v) for v in ("recursion", "no_interlayer", "infinite_width"))
    spec = p.activations["relu"]
    want = ddntk2.two_input_ddntk(
        "relu",
        spec.c_w,
        spec.c_b,
        p.net.lambda_b,
        p.net.lambda_w,
        np.asarray(inputs["pair"]),
        p.net.depth,
        quad=theory.Quad(p.quadrature.nodes_per_half, p.quadrature.half_width_sd),
    )
    row = rec[(rec.input == 0) & (rec.activation == "relu") & (rec.layer == 3)].iloc[0]
    np.testing.assert_allclose(
        row[names].to_numpy(float), np.concatenate([want[2][t].ravel() for t in "RSTU"]), rtol=1e-12
    )
    l2 = (rec.input == 0) & (rec.layer == 2)
    np.testing.assert_allclose(rec.loc[l2, names].to_numpy(float), abl.loc[l2, names].to_numpy(float))
    assert (inf.loc[inf.input == 0, names] == 0).all().all()
