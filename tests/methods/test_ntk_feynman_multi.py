"""Tests of `ntk_feynman`'s M-input statistics (`multi.py`) and the k-D Gaussian rule `theory.Quad.gridk`: the rule
against closed forms (orthant probabilities, Isserlis), scipy and seeded Monte Carlo; the expectation engine;
the M-input NTK tensors and dNTK against the two-input and single-input recursions, permutations, repeated
inputs; the M-input samplers against the two-input ones and against the recursion (layer 2 exact, layer 3 by
the 1/n extrapolation)."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import multivariate_normal

from pipelines.ntk_feynman import dntk, multi, ntk2, theory
from pipelines.ntk_feynman.theory import Quad

C3 = np.array([[1.0, 0.5, 0.2], [0.5, 1.3, -0.3], [0.2, -0.3, 0.8]])
C4 = np.array([[1.0, 0.5, 0.2, 0.1], [0.5, 1.3, -0.3, 0.4], [0.2, -0.3, 0.8, 0.3], [0.1, 0.4, 0.3, 1.1]])
X2 = np.array([[1.0, -0.6, 0.8], [0.3, 0.9, 1.1]])
X3 = np.array([[1.0, -0.6, 0.8], [0.3, 0.9, 1.1], [-0.5, 0.4, 1.0]])
ACTS = [("tanh", 1.3, 0.2), ("relu", 2.0, 0.1), ("gelu", 1.9, 0.15)]


def _three_inputs():
    """Three inputs in R^6 at pairwise cosines 0.5, 0.2, -0.3 (not all equal) and norm ratios 1 : 1.3 : 0.8."""
    x1 = np.random.default_rng(1).standard_normal(6)
    x1 *= math.sqrt(6) / np.linalg.norm(x1)
    return multi.inputs_with_cosines(x1, [[1, 0.5, 0.2], [0.5, 1, -0.3], [0.2, -0.3, 1]], [1.0, 1.3, 0.8], seed=2)


def _isserlis(C, a, b, c, d):
    return C[a, b] * C[c, d] + C[a, c] * C[b, d] + C[a, d] * C[b, c]


# ------------------------------------------------------------------------ the k-D rule
def test_gridk_is_nodes_and_grid2_for_one_and_two_variables():
    q = Quad()
    Z, w = q.gridk(np.array([[1.7]]))
    u, wu = q.nodes()
    np.testing.assert_array_equal(w, wu)
    np.testing.assert_array_equal(Z[0], math.sqrt(1.7) * u)
    Z, w = q.gridk(C3[:2, :2])
    z1, z2, w2 = q.grid2(C3[0, 0], C3[0, 1], C3[1, 1])
    np.testing.assert_array_equal(Z, np.stack([z1, z2]))
    np.testing.assert_array_equal(w, w2)


@pytest.mark.parametrize(
    "C, tol",
    [
        (C3, 1e-12),
        (np.array([[1.0, -0.7, 0.4], [-0.7, 2.0, -0.5], [0.4, -0.5, 0.6]]), 1e-12),
        (np.array([[1.0, 0.95, 0.9], [0.95, 1.0, 0.93], [0.9, 0.93, 1.0]]), 2e-7),
    ],
)
def test_gridk_trivariate_orthant_probability_closed_form(C, tol):
    """P(z > 0) = 1/8 + sum_{i<j} asin(rho_ij) / (4 pi): the kinks sit on the splits, so the indicator is exact
    up to the Gauss-Legendre error of the Gaussian density (20 nodes per piece; strongly correlated variables,
    rho ~ 0.95, make the inner averages steep in the outer variables and converge more slowly: 1e-6, 7e-8,
    1e-9, 2e-13 at 16, 20, 24, 32 nodes)."""
    Z, w = Quad().gridk(C)
    s = np.sqrt(np.diag(C))
    rho = C / np.outer(s, s)
    exact = 0.125 + (math.asin(rho[0, 1]) + math.asin(rho[0, 2]) + math.asin(rho[1, 2])) / (4 * math.pi)
    assert np.sum(w * np.all(Z > 0, axis=0)) == pytest.approx(exact, abs=tol)
    assert np.sum(w) == pytest.approx(1.0, abs=1e-12)


def test_gridk_four_variate_orthant_probability_against_scipy():
    Z, w = Quad().gridk(C4)
    ref = multivariate_normal.cdf(
        np.zeros(4), mean=np.zeros(4), cov=C4, abseps=1e-10, releps=1e-10, rng=np.random.default_rng(0)
    )
    assert np.sum(w * np.all(Z > 0, axis=0)) == pytest.approx(ref, abs=1e-6)
    # and the 16 sign orthants sum to the total weight, within 1e-6 of one (12 nodes per piece)
    tot = sum(
        np.sum(w * np.all((Z > 0) == np.array(sg)[:, None], axis=0))
        for sg in itertools.product([False, True], repeat=4)
    )
    assert tot == pytest.approx(np.sum(w), rel=1e-13)
    assert np.sum(w) == pytest.approx(1.0, abs=1e-6)


def test_gridk_isserlis_moments():
    """All fourth and second moments (4-D: 12 nodes per piece, whose outer variable limits <z^4> to ~1e-5)."""
    for C, tol in ((C3, 1e-10), (C4, 1e-4)):
        Z, w = Quad().gridk(C)
        k = len(C)
        for idx in itertools.combinations_with_replacement(range(k), 4):
            assert np.sum(w * np.prod(Z[list(idx)], axis=0)) == pytest.approx(_isserlis(C, *idx), abs=tol), idx
        for a, b in itertools.product(range(k), repeat=2):
            assert np.sum(w * Z[a] * Z[b]) == pytest.approx(C[a, b], abs=tol)


def test_gridk_activation_products_against_monte_carlo():
    """tanh and ReLU products of 3 and 4 variables against 400 000 seeded samples (|z| < 4), and the ReLU
    product of 3 and 4 variables against their node refinements (convergence in the node count)."""
    rng = np.random.default_rng(7)
    for C in (C3, C4):
        Z, w = Quad().gridk(C)
        S = rng.multivariate_normal(np.zeros(len(C)), C, size=400_000).T
        for f in (lambda z: np.maximum(z, 0.0), np.tanh, lambda z: (z > 0) * 1.0):
            g_mc = np.prod(f(S), axis=0)
            val = np.sum(w * np.prod(f(Z), axis=0))
            assert abs(val - g_mc.mean()) < 4 * g_mc.std() / math.sqrt(S.shape[1])
    relu3 = [
        np.sum(w * np.prod(np.maximum(Z, 0.0), axis=0))
        for Z, w in (Quad(nodes_per_half_3d=n).gridk(C3) for n in (6, 10, 20, 28))
    ]
    errs = np.abs(np.array(relu3[:-1]) - relu3[-1])
    assert errs[0] > errs[1] > 1e-10 > errs[2]
    relu4 = [
        np.sum(w * np.prod(np.maximum(Z, 0.0), axis=0))
        for Z, w in (Quad(nodes_per_half_4d=n).gridk(C4) for n in (8, 12, 16))
    ]
    assert abs(relu4[1] - relu4[2]) < 1e-4 * abs(relu4[2]) and abs(relu4[1] - relu4[2]) < abs(relu4[0] - relu4[2])


def test_gridk_degenerate_kernels_give_the_lower_dimensional_averages():
    """Repeated and collinear variables: a dimension with ~0 conditional variance is dropped, no NaN, and the
    averages equal those of the distinct variables (here the kinks of the dropped ones coincide with, or lie
    on, the kept ones' splits)."""
    q = Quad()
    relu = lambda z: np.maximum(z, 0.0)  # noqa: E731
    # z3 = z1 (repeated): <relu(z1) relu(z2) relu(z3)> = <relu(z1)^2 relu(z2)>
    C = C3.copy()
    C[2, :], C[:, 2] = C[0, :], C[:, 0]
    Z, w = q.gridk(C)
    z1, z2, w2 = q.grid2(C[0, 0], C[0, 1], C[1, 1])
    assert np.isfinite(Z).all() and np.isfinite(w).all()
    assert np.sum(w * relu(Z[0]) * relu(Z[1]) * relu(Z[2])) == pytest.approx(
        np.sum(w2 * relu(z1) ** 2 * relu(z2)), rel=1e-10
    )
    # z3 = -2 z1 (collinear): relu(z1) relu(z3) = 0
    C = np.array([[1.0, 0.5, -2.0], [0.5, 1.3, -1.0], [-2.0, -1.0, 4.0]])
    Z, w = q.gridk(C)
    assert np.isfinite(Z).all() and abs(np.sum(w * relu(Z[0]) * relu(Z[2]))) < 1e-14
    assert np.sum(w * Z[2] ** 2) == pytest.approx(4.0, rel=1e-10)
    # 4-D with two repeated pairs
    C = np.array([[1.0, 0.3, 1.0, 0.3], [0.3, 2.0, 0.3, 2.0], [1.0, 0.3, 1.0, 0.3], [0.3, 2.0, 0.3, 2.0]])
    Z, w = q.gridk(C)
    assert np.isfinite(Z).all()
    assert np.sum(w * np.prod(Z, axis=0)) == pytest.approx(_isserlis(C, 0, 1, 2, 3), rel=1e-4)


# ------------------------------------------------------------------------ the expectation engine
def test_expect_engine_uses_the_rule_of_the_distinct_inputs_it_touches():
    K = np.array(
        [
            [1.0, 0.5, 0.2, 0.1, 1.0],
            [0.5, 1.3, -0.3, 0.4, 0.5],
            [0.2, -0.3, 0.8, 0.3, 0.2],
            [0.1, 0.4, 0.3, 1.1, 0.1],
            [1.0, 0.5, 0.2, 0.1, 1.0],
        ]
    )  # input 4 repeats input 0
    ex = multi.Expect("tanh", K)
    assert ex.rep == [0, 1, 2, 3, 0]
    q = Quad()
    Z, w = q.gridk(K[np.ix_((1, 2, 3), (1, 2, 3))])
    ref = np.sum(w * np.tanh(Z[0]) * (1 - np.tanh(Z[1]) ** 2) * Z[2])
    assert ex.E(("s", 1), ("d", 2), ("z", 3)) == pytest.approx(ref, rel=1e-14)
    # the repeated input shares input 0's variable: a 4-input product of (0, 1, 2, 4) is a 3-D average
    Z, w = q.gridk(K[:3, :3])
    ref = np.sum(w * np.tanh(Z[0]) ** 2 * np.tanh(Z[1]) * np.tanh(Z[2]))
    assert ex.E(("s", 0), ("s", 1), ("s", 2), ("s", 4)) == pytest.approx(ref, rel=1e-14)
    assert set(ex._grids) == {(1, 2, 3), (0, 1, 2)}
    # Stein: <d g / dz_e> = sum_f (K^-1)_ef <g z_f> on the touched inputs; for g = z_1^2 z_2 it is (2 K_12, K_11)
    S = ex.stein(("z", 1), ("z", 1), ("z", 2))
    np.testing.assert_allclose(S, [0.0, 2 * K[1, 2], K[1, 1], 0.0, 0.0], atol=1e-12)


# ------------------------------------------------------------------------ M-input recursions
@pytest.mark.parametrize("kind,c_w,c_b", ACTS)
def test_two_inputs_equal_ntk2(kind, c_w, c_b):
    a = ntk2.two_input_ntk_tensors(kind, c_w, c_b, 0.8, 1.2, X2, 4)
    b = multi.multi_input_ntk_tensors(kind, c_w, c_b, 0.8, 1.2, X2, 4)
    for ra, rb in zip(a, b):
        for t in ("K", "Theta", "V", "D", "A", "B", "F"):
            np.testing.assert_allclose(rb[t], ra[t], rtol=0, atol=1e-10 * max(1.0, np.abs(ra[t]).max()))
    pa = ntk2.two_input_dntk(kind, c_w, c_b, 0.8, 1.2, X2, 4)
    pb = multi.multi_input_dntk(kind, c_w, c_b, 0.8, 1.2, X2, 4)
    for ra, rb in zip(pa, pb):
        for t in "PQ":
            np.testing.assert_allclose(rb[t], ra[t], rtol=0, atol=1e-10 * max(1.0, np.abs(ra[t]).max()))


def _pair_index(idx, M):
    pos = multi._upos(M)
    return (
        [pos[(idx[a], idx[b])] for a, b in multi.upairs(len(idx))],
        [idx[a] * M + idx[b] for a, b in multi.opairs(len(idx))],
    )


@pytest.mark.parametrize("kind,c_w,c_b", ACTS[:2])
def test_repeated_input_reproduces_the_two_input_components(kind, c_w, c_b):
    Xr = np.array([X2[0], X2[1], X2[0]])
    a = ntk2.two_input_ntk_tensors(kind, c_w, c_b, 0.8, 1.2, X2, 4)
    b = multi.multi_input_ntk_tensors(kind, c_w, c_b, 0.8, 1.2, Xr, 4)
    idx = [0, 1, 0]
    iu, io = _pair_index(idx, 2)
    for ra, rb in zip(a, b):
        np.testing.assert_allclose(rb["K"], ra["K"][np.ix_(idx, idx)], rtol=1e-12)
        for t in "VDA":
            np.testing.assert_allclose(rb[t], ra[t][np.ix_(iu, iu)], rtol=0, atol=1e-10 * max(1, np.abs(ra[t]).max()))
        for t in "BF":
            np.testing.assert_allclose(rb[t], ra[t][np.ix_(io, io)], rtol=0, atol=1e-10 * max(1, np.abs(ra[t]).max()))
    pa = ntk2.two_input_dntk(kind, c_w, c_b, 0.8, 1.2, X2, 4)
    pb = multi.multi_input_dntk(kind, c_w, c_b, 0.8, 1.2, Xr, 4)
    for ra, rb in zip(pa, pb):
        for t in "PQ":
            np.testing.assert_allclose(
                rb[t], ra[t][np.ix_(idx, idx, idx, idx)], rtol=0, atol=1e-10 * max(1, np.abs(ra[t]).max())
            )


@pytest.mark.parametrize("kind,c_w,c_b", ACTS[:2])
def test_permuting_the_inputs_permutes_the_tensors(kind, c_w, c_b):
    """To the 3-D rule's accuracy (the Cholesky order of the nested variables follows the input order)."""
    perm = [2, 0, 1]
    a = multi.multi_input_ntk_tensors(kind, c_w, c_b, 0.8, 1.2, X3, 4)
    b = multi.multi_input_ntk_tensors(kind, c_w, c_b, 0.8, 1.2, X3[perm], 4)
    iu, io = _pair_index(perm, 3)
    for ra, rb in zip(a, b):
        for t in "VDA":
            np.testing.assert_allclose(rb[t], ra[t][np.ix_(iu, iu)], rtol=0, atol=1e-6 * np.abs(ra[t]).max() + 1e-300)
        for t in "BF":
            np.testing.assert_allclose(rb[t], ra[t][np.ix_(io, io)], rtol=0, atol=1e-6 * np.abs(ra[t]).max() + 1e-300)
    pa = multi.multi_input_dntk(kind, c_w, c_b, 0.8, 1.2, X3, 4)
    pb = multi.multi_input_dntk(kind, c_w, c_b, 0.8, 1.2, X3[perm], 4)
    for ra, rb in zip(pa, pb):
        for t in "PQ":
            np.testing.assert_allclose(
                rb[t], ra[t][np.ix_(perm, perm, perm, perm)], rtol=0, atol=1e-6 * np.abs(ra[t]).max() + 1e-300
            )


@pytest.mark.parametrize("kind,c_w,c_b", ACTS)
def test_all_equal_indices_are_the_single_input_recursions(kind, c_w, c_b):
    rows = multi.multi_input_ntk_tensors(kind, c_w, c_b, 0.8, 1.2, X3, 4)
    prs = multi.multi_input_dntk(kind, c_w, c_b, 0.8, 1.2, X3, 4)
    pos = multi._upos(3)
    for j in range(3):
        sq = float(X3[j] @ X3[j] / 3)
        single = theory.first_order(kind, c_w, c_b, 0.8, 1.2, sq, 4)
        sd = dntk.dntk_first_order(kind, c_w, c_b, 0.8, 1.2, sq, 4)
        for ell in range(4):
            assert rows[ell]["K"][j, j] == pytest.approx(single[ell]["K"], rel=1e-12)
            assert rows[ell]["Theta"][j, j] == pytest.approx(single[ell]["Theta"], rel=1e-12)
            for t in "VDA":
                assert rows[ell][t][pos[(j, j)], pos[(j, j)]] == pytest.approx(single[ell][t], rel=1e-7, abs=1e-12)
            for t in "BF":
                assert rows[ell][t][4 * j, 4 * j] == pytest.approx(single[ell][t], rel=1e-7, abs=1e-12)
            for t in "PQ":
                assert prs[ell][t][j, j, j, j] == pytest.approx(sd[ell][t], rel=1e-7, abs=1e-12)


def test_four_inputs_use_the_4d_rule_and_contain_the_three_input_block():
    """M = 4 (B's intra-layer <s'_a s'_b s'_c s'_d> of four distinct inputs on the 4-D rule): the block of the
    first three inputs equals the M = 3 result (the central-difference step differs, hence 1e-6)."""
    X4 = np.vstack([X3, [0.2, 0.2, -1.0]])
    a = multi.multi_input_ntk_tensors("tanh", 1.3, 0.2, 0.8, 1.2, X3, 3)
    b = multi.multi_input_ntk_tensors("tanh", 1.3, 0.2, 0.8, 1.2, X4, 3)
    iu, io = _pair_index([0, 1, 2], 4)
    for ra, rb in zip(a, b):
        for t in "VDA":
            np.testing.assert_allclose(rb[t][np.ix_(iu, iu)], ra[t], rtol=0, atol=1e-6 * np.abs(ra[t]).max() + 1e-300)
        for t in "BF":
            np.testing.assert_allclose(rb[t][np.ix_(io, io)], ra[t], rtol=0, atol=1e-6 * np.abs(ra[t]).max() + 1e-300)
    # a four-distinct-input component exists and is finite
    assert np.isfinite(b[2]["B"]).all() and abs(b[2]["B"][1, 11]) > 0


@pytest.mark.parametrize("kind", ["relu", "tanh"])
def test_collinear_and_nearly_repeated_inputs_give_no_nan(kind):
    for third in (2 * X3[0], -X3[0], X3[0] + 1e-9, X3[0] + X3[1]):
        Xd = np.array([X3[0], X3[1], third])
        r = multi.multi_input_ntk_tensors(kind, 1.5, 0.0, 1.0, 1.0, Xd, 4)
        p = multi.multi_input_dntk(kind, 1.5, 0.0, 1.0, 1.0, Xd, 4)
        assert all(np.isfinite(x[t]).all() for x in r for t in "VDABF")
        assert all(np.isfinite(x[t]).all() for x in p for t in "PQ")


# ------------------------------------------------------------------------ M-input samplers
def test_a_third_input_leaves_the_pair_s_statistics_unchanged():
    """The nets do not depend on the inputs they see (same seed, same draws), so with a third input the
    samplers' statistics of the first two equal those of the pair alone (the two-input samplers in ntk2 are
    these samplers at M = 2)."""
    X3p = np.array([X2[0], X2[1], X3[2]])
    two = multi.pooled_multi(ntk2.sample_two_input("tanh", X2, 5, 3, 40, 1.3, 0.2, 0.8, 1.2, seed=4), 5, 2, n_blocks=4)
    three = multi.pooled_multi(multi.sample_multi("tanh", X3p, 5, 3, 40, 1.3, 0.2, 0.8, 1.2, seed=4), 5, 3, n_blocks=4)
    u3, o3 = multi.upairs(3), multi.opairs(3)
    iu = [u3.index(p) for p in multi.upairs(2)]
    io = [o3.index(p) for p in multi.opairs(2)]
    for ell in range(3):
        for t, idx in (("K", iu), ("Theta", iu)):
            np.testing.assert_allclose(three[ell][t][idx], two[ell][t], rtol=1e-12, atol=1e-14)
        for t, idx in (("V", iu), ("D", iu), ("A", iu), ("B", io), ("F", io)):
            np.testing.assert_allclose(three[ell][t][np.ix_(idx, idx)], two[ell][t], rtol=1e-10, atol=1e-12)
    a = ntk2.sample_two_input_dntk("relu", X2, 4, 3, 30, 2.0, 0.1, 0.8, 1.2, seed=4)
    b = multi.sample_multi_dntk("relu", X3p, 4, 3, 30, 2.0, 0.1, 0.8, 1.2, seed=4)
    np.testing.assert_allclose(b[..., :2, :2, :2, :2], a, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="shape \\(2, n0\\)"):
        ntk2.sample_two_input("tanh", X3p, 5, 3, 4, 1.3, 0.2, 0.8, 1.2, seed=4)


@pytest.mark.parametrize("kind, c_w", [("tanh", 1.0), ("relu", 2.0)])
def test_three_input_estimators_unbiased_at_layer_two(kind, c_w):
    """Layer 2 is exact at any width: 12 000 width-3 nets seeing three inputs match all 270 components (40 batch
    means: with 20, the s.e. estimate's 19 degrees of freedom give the max over 270 |z| heavy tails)."""
    X = _three_inputs()
    rec = multi.multi_input_ntk_tensors(kind, c_w, 0.0, 1.0, 1.0, X, 2)[1]
    m = multi.pooled_multi(multi.sample_multi(kind, X, 3, 2, 12_000, c_w, 0.0, 1.0, 1.0, seed=11), 3, 3, n_blocks=40)[1]
    z = np.concatenate([((m[t] - rec[t]) / m[f"{t}_se"]).ravel() for t in "VDABF"])
    assert z.size == 270 and np.isfinite(z).all()
    assert np.abs(z).max() < 4.5
    assert np.mean(z**2) < 2.0
    np.testing.assert_allclose(m["Theta"], [rec["Theta"][a, b] for a, b in multi.upairs(3)], rtol=0.02)


@pytest.mark.parametrize("kind, c_w", [("tanh", 1.0), ("relu", 2.0)])
def test_three_input_recursion_matches_sampled_nets_at_layer_three(kind, c_w):
    """At layer 3 the 1/n extrapolation of n = 8 and 16 (16 000 / 8 000 nets, three inputs at cosines 0.5, 0.2,
    -0.3) matches the recursion within 3.5 s.e. in every component and rejects the ablation in every tensor."""
    X = _three_inputs()
    rec = multi.multi_input_ntk_tensors(kind, c_w, 0.0, 1.0, 1.0, X, 3)[2]
    abl = multi.multi_input_ntk_tensors(kind, c_w, 0.0, 1.0, 1.0, X, 3, interlayer=False)[2]
    m = [
        multi.pooled_multi(multi.sample_multi(kind, X, w, 3, n, c_w, 0.0, 1.0, 1.0, seed=5 + w), w, 3)[2]
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


def test_three_input_dntk_exact_at_layer_two():
    """The M-input dNTK sampler (S1, S2, S2' for 81 index tuples) matches the exact layer-2 P, Q (tanh with its
    sigma'' terms), 2 000 width-8 nets."""
    X = _three_inputs()
    rec = multi.multi_input_dntk("tanh", 1.3, 0.2, 0.8, 1.2, X, 2)[1]
    m = multi.pooled_multi_dntk(multi.sample_multi_dntk("tanh", X, 8, 2, 2_000, 1.3, 0.2, 0.8, 1.2, seed=9), 8)[1]
    z = np.concatenate([((m[t] - rec[t]) / m[f"{t}_se"]).ravel() for t in "PQ"])
    assert np.isfinite(z).all() and np.abs(z).max() < 4.5 and np.mean(z**2) < 2.0


# ------------------------------------------------------------------------ pipeline wiring
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
MULTI_RAW = {"widths": [4, 8], "nets_per_seed": [40, 30], "blocks_per_seed": 3, "chunk_elems": 100_000}


@pytest.mark.parametrize(
    "patch,key",
    [
        ({"variants": [*RAW["variants"], "mc_multi_relu"]}, "ntk_feynman.variants"),  # no multi block
        ({"multi": {**MULTI_RAW, "cosines": [0.5, 0.2]}}, "ntk_feynman.multi"),
        ({"multi": {**MULTI_RAW, "cosines": [0.9, 0.9, -0.9]}}, "ntk_feynman.multi"),  # not positive definite
        ({"multi": {**MULTI_RAW, "norm_ratios": [1.2, 1.0, 1.0]}}, "ntk_feynman.multi"),
        ({"multi": {**MULTI_RAW, "widths": [8, 4]}}, "ntk_feynman.multi.widths"),
        ({"multi": {**MULTI_RAW, "n_input": 3}}, "ntk_feynman.multi.n_input"),
        (
            {
                "multi": {**MULTI_RAW, "n_inputs": 4, "cosines": [0.1] * 6, "norm_ratios": [1.0] * 4},
                "data": {"n0": 3, "sq_norm": 1.0},
            },
            "multi.n_inputs",
        ),
    ],
)
def test_bad_multi_parameter_names_the_key(patch, key):
    from pipelines.core.params import ParameterError, validate
    from pipelines.ntk_feynman.params import Params

    with pytest.raises(ParameterError, match=key.replace(".", r"\.")):
        validate(Params, {**RAW, **patch}, "ntk_feynman")


def test_multi_claims_need_their_variant():
    from pipelines.core.params import ParameterError, validate
    from pipelines.ntk_feynman.params import Params

    claim = {"id": "c", "text": "t", "metric": "multi_extrap_excess.relu", "op": "<=", "threshold": 0.1}
    from pipelines.ntk_feynman.spec import SPEC

    with pytest.raises(ParameterError, match="is produced by no variant or derived-metric declaration"):
        SPEC.check(validate(Params, {**RAW, "multi": MULTI_RAW, "claims": [claim]}, "ntk_feynman"))
    ok = validate(
        Params,
        {**RAW, "multi": MULTI_RAW, "claims": [claim], "variants": [*RAW["variants"], "mc_multi_relu"]},
        "ntk_feynman",
    )
    assert ok.block_activations("multi") == ["relu"] and ok.mc_activations() == ["relu", "tanh"]


def test_multi_inputs_tables_and_pooling():
    """data.inputs builds the three inputs (first = data's x, the block's cosines and norm ratios); the theory
    variants carry the 'mi.*' columns on input 0; the block table pools to pooled_multi's estimates."""
    from pipelines.ntk_feynman import train
    from pipelines.ntk_feynman.data import make_inputs
    from pipelines.ntk_feynman.params import Params

    p = Params.model_validate({**RAW, "multi": MULTI_RAW, "variants": [*RAW["variants"], "mc_multi_relu"]})
    inputs = make_inputs(p)
    Xm = np.asarray(inputs["multi"])
    np.testing.assert_allclose(Xm[0], inputs["x"][0])
    nrm = np.linalg.norm(Xm, axis=1)
    np.testing.assert_allclose(nrm / nrm[0], [1.0, 1.3, 0.8])
    np.testing.assert_allclose((Xm @ Xm.T / np.outer(nrm, nrm))[np.triu_indices(3, 1)], [0.5, 0.2, -0.3], atol=1e-12)
    rec = train.variant_stats(inputs, p, variant="recursion")
    ref = multi.multi_input_ntk_tensors("tanh", 1.0, 0.0, 1.0, 1.0, Xm, 3, quad=Quad(48, 12.0))[2]
    row = rec[(rec.activation == "tanh") & (rec.layer == 3) & (rec.input == 0)].iloc[0]
    assert row["mi.B_12_31"] == pytest.approx(ref["B"][1, 6], rel=1e-12)
    assert row["mi.V_13_23"] == pytest.approx(ref["V"][2, 4], rel=1e-12)
    stats = multi.sample_multi("relu", Xm, 5, 3, 60, 2.0, 0.0, 1.0, 1.0, seed=3)
    blocks = pd.DataFrame(train._block_rows(stats, 6, multi.columns(3), 0, 5, 3))
    a = multi.pooled_blocks(blocks[blocks.layer == 3], 5, 3)
    b = multi.pooled_multi(stats, 5, 3, n_blocks=6)[2]
    assert a["mi.F_12_23"] == pytest.approx(b["F"][1, 5], rel=1e-10)
    assert a["mi.A_11_33_se"] == pytest.approx(b["A_se"][0, 5], rel=1e-8)


# ------------------------------------------------------------------------ dNTK / ddNTK of M inputs as pipeline variants
MD_RAW = {"widths": [3, 4], "nets_per_seed": [6, 6], "blocks_per_seed": 3, "chunk_elems": 100_000}
MD_VARIANTS = ["mc_multi_dntk_relu", "mc_multi_ddntk_tanh"]


def _md_params(**patch):
    from pipelines.ntk_feynman.params import Params

    return Params.model_validate(
        {
            **RAW,
            "multi": MULTI_RAW,
            "multi_dntk": MD_RAW,
            "multi_ddntk": MD_RAW,
            "variants": [*RAW["variants"], *MD_VARIANTS],
            **patch,
        }
    )


@pytest.mark.parametrize(
    "patch,key,msg",
    [
        (
            {"variants": [*RAW["variants"], "mc_multi_dntk_relu"], "multi_dntk": None},
            "ntk_feynman.variants",
            "'multi_dntk' and 'multi' blocks",
        ),  # no multi_dntk block
        (
            {"variants": [*RAW["variants"], "mc_multi_ddntk_relu"], "multi": None},
            "ntk_feynman.variants",
            "'multi_ddntk' and 'multi' blocks",
        ),  # no multi block (inputs)
        (
            {"variants": [*RAW["variants"], "mc_multi_dntk_gelu"]},
            "ntk_feynman.variants",
            "after 'mc_multi_dntk_'",
        ),  # activation not declared
        ({"multi_dntk": {**MD_RAW, "widths": [4, 3]}}, "ntk_feynman.multi_dntk.widths", "strictly increasing"),
        ({"multi_ddntk": {**MD_RAW, "widths": [4, 256]}}, "ntk_feynman.multi_ddntk.widths", "128"),
        ({"multi_ddntk": {**MD_RAW, "nets_per_seed": [6, 6, 6]}}, "ntk_feynman.multi_ddntk", "one entry per width"),
        ({"multi_dntk": {**MD_RAW, "probes": 2}}, "ntk_feynman.multi_dntk.probes", ""),
        ({"multi": {**MULTI_RAW, "n_inputs": 5}}, "ntk_feynman.multi", "no default for n_inputs = 5"),
    ],
)
def test_bad_multi_d_block_names_the_key(patch, key, msg):
    from pipelines.core.params import ParameterError, validate
    from pipelines.ntk_feynman.params import Params

    raw = {**RAW, "multi": MULTI_RAW, "multi_dntk": MD_RAW, "multi_ddntk": MD_RAW, **patch}
    with pytest.raises(ParameterError, match=key.replace(".", r"\.")) as e:
        validate(Params, raw, "ntk_feynman")
    assert msg in str(e.value)


def test_multi_d_prefixes_do_not_clash_and_claims_need_their_variant():
    from pipelines.core.params import ParameterError, validate
    from pipelines.ntk_feynman import train
    from pipelines.ntk_feynman.params import Params, variant_prefix
    from pipelines.ntk_feynman.spec import SPEC

    p = _md_params()
    assert p.block_activations("multi") == [] and p.mc_activations() == ["relu", "tanh"]
    assert p.block_activations("multi_dntk") == ["relu"] and p.block_activations("multi_ddntk") == ["tanh"]
    assert [
        variant_prefix(v)
        for v in ("mc_multi_relu", "mc_multi_dntk_relu", "mc_multi_ddntk_relu", "mc_ddntk_relu", "mc_relu")
    ] == ["mc_multi_", "mc_multi_dntk_", "mc_multi_ddntk_", "mc_ddntk_", None]
    assert {"multi_dntk", "multi_ddntk"} <= set(train._SAMPLERS)
    for metric, need in (
        ("multi_dntk_extrap_excess.relu", "mc_multi_dntk_relu"),
        ("multi_ddntk_interlayer_error_ratio.tanh", "mc_multi_ddntk_tanh"),
    ):
        claim = {"id": "c", "text": "t", "metric": metric, "op": "<=", "threshold": 0.1}
        raw = {
            **RAW,
            "multi": MULTI_RAW,
            "multi_dntk": MD_RAW,
            "multi_ddntk": MD_RAW,
            "claims": [claim],
            "variants": [*RAW["variants"], "mc_multi_relu", "mc_multi_tanh"],
        }
        with pytest.raises(ParameterError, match=f"'{metric}' is produced by no variant or derived-metric declaration"):
            SPEC.check(validate(Params, raw, "ntk_feynman"))
        SPEC.check(validate(Params, {**raw, "variants": [*raw["variants"], need]}, "ntk_feynman"))


def test_full_env_four_inputs_new_variants_and_base_claims(monkeypatch):
    """--env=full: the multi block has M = 4 (six cosines) and builds those inputs, plans the four new variants
    (one train node each), and appends its own claims to base's (extra_claims)."""
    from pipelines.core.registry import method_config
    from pipelines.ntk_feynman.data import make_inputs
    from pipelines.ntk_feynman.params import Params

    base, full = method_config("ntk_feynman", env="base"), method_config("ntk_feynman", env="full")
    p = Params.model_validate(full)
    assert p.multi.n_inputs == 4 and len(p.multi.cosines) == 6 and p.net.depth == 10
    new = {"mc_multi_dntk_relu", "mc_multi_dntk_tanh", "mc_multi_ddntk_relu", "mc_multi_ddntk_tanh"}
    assert set(p.variants) == set(base["variants"]) | new
    assert full["claims"] == base["claims"]
    assert [c.model_dump(mode="json") for c in p.claims[: len(base["claims"])]] == [
        Params.model_validate(base).claims[i].model_dump(mode="json") for i in range(len(base["claims"]))
    ]
    assert len(p.claims) == len(base["claims"]) + len(full["extra_claims"])
    assert {c.metric.split(".")[0] for c in p.claims[len(base["claims"]) :]} >= {
        "multi_dntk_extrap_excess",
        "multi_dntk_extrap_max_abs_z",
        "multi_dntk_interlayer_error_ratio",
        "multi_dntk_layer2_max_abs_z",
        "multi_ddntk_extrap_excess",
        "multi_ddntk_extrap_max_abs_z",
        "multi_ddntk_interlayer_error_ratio",
        "multi_ddntk_layer2_max_abs_z",
    }
    Xm = np.asarray(make_inputs(p)["multi"])
    nrm = np.linalg.norm(Xm, axis=1)
    np.testing.assert_allclose(nrm / nrm[0], p.multi.norm_ratios)
    np.testing.assert_allclose((Xm @ Xm.T / np.outer(nrm, nrm))[np.triu_indices(4, 1)], p.multi.cosines, atol=1e-12)
    from pipelines.ntk_feynman.spec import SPEC

    names = {n.name for n in SPEC.pipeline(p).only_nodes_with_tags("train").nodes}
    assert {f"ntk_feynman.train.{v}" for v in new} <= names
    assert not any(v.startswith("mc_multi_d") for v in base["variants"])  # not in the base default run
    test = method_config("ntk_feynman", env="test")["variants"]  # repeats base's list (replaces)
    assert set(test) == set(base["variants"]) | {"mc_multi_dntk_relu", "mc_multi_ddntk_relu"}


def test_multi_d_variants_tables_pool_to_the_library_estimates():
    """One tiny train_variant per new kind: finite block tables that pool (multi_d_pooled_blocks) to the library's
    pooled estimates of the same nets (multi.pooled_multi_dntk, ddntk2.pooled_two_input_ddntk); the theory
    variants carry the library's M-input P, Q / R, S, T, U only for the planned kinds and activations; compare,
    the shared metrics function and the plots take them."""
    from pipelines.ntk_feynman import ddntk2, evaluate, multi_ddntk, train
    from pipelines.ntk_feynman.data import make_inputs

    p = _md_params()
    inputs = make_inputs(p)
    Xm = np.asarray(inputs["multi"])
    out = {v: train.variant_stats(inputs, p, variant=v) for v in p.variants}
    quad = Quad(48, 12.0)
    rec = out["recursion"]
    row = rec[(rec.activation == "relu") & (rec.layer == 3) & (rec.input == 0)].iloc[0]
    ref = multi.multi_input_dntk("relu", 2.0, 0.0, 1.0, 1.0, Xm, 3, quad=quad)[2]
    assert row["md.P_1223"] == pytest.approx(ref["P"][0, 1, 1, 2], rel=1e-12)
    assert row["md.Q_3121"] == pytest.approx(ref["Q"][2, 0, 1, 0], rel=1e-12)
    row = rec[(rec.activation == "tanh") & (rec.layer == 3) & (rec.input == 0)].iloc[0]
    ref = multi_ddntk.multi_input_ddntk("tanh", 1.0, 0.0, 1.0, 1.0, Xm, 3, quad=quad)[2]
    assert row["mdd.S_1233"] == pytest.approx(ref["S"][0, 1, 2, 2], rel=1e-12)
    assert np.isnan(rec[rec.activation == "tanh"]["md.P_1111"]).all()  # only planned activations
    assert not any(
        c.startswith("md") for c in train.variant_stats(inputs, _without_md(p), variant="infinite_width").columns
    )
    for kind, v, fn, pooled in (
        ("multi_dntk", "mc_multi_dntk_relu", multi.sample_multi_dntk, multi.pooled_multi_dntk),
        ("multi_ddntk", "mc_multi_ddntk_tanh", ddntk2.sample_ddntk_probes, ddntk2.pooled_two_input_ddntk),
    ):
        blocks = out[v]
        assert np.isfinite(blocks[list(train.multi_d_columns(kind, 3))].to_numpy()).all()
        act = v.split("_")[-1]
        spec, w = p.activations[act], 4
        stream = int(np.random.SeedSequence([0, w, 0, train._SAMPLERS[kind]["tag"]]).generate_state(1)[0])
        stats = fn(act, Xm, w, 3, 6, spec.c_w, spec.c_b, 1.0, 1.0, stream, chunk=100_000 // 16)
        a = train.multi_d_pooled_blocks(kind, blocks[(blocks.width == w) & (blocks.layer == 3)], w, 3)
        b = pooled(stats, w, n_blocks=3)[2]
        tag, t = ("md", "Q") if kind == "multi_dntk" else ("mdd", "U")
        assert a[f"{tag}.{t}_1232"] == pytest.approx(b[t][0, 1, 2, 1], rel=1e-10)
        assert a[f"{tag}.{t}_2131_se"] == pytest.approx(b[f"{t}_se"][1, 0, 2, 0], rel=1e-8)
    cmp = evaluate.compare(inputs, p, **out)
    m = evaluate.derived_metrics(cmp, p)
    for k in (
        "multi_dntk_extrap_excess.relu",
        "multi_dntk_extrap_excess.Q.L3.relu",
        "multi_dntk_layer2_max_abs_z.relu",
        "multi_dntk_interlayer_error_ratio.relu",
        "multi_ddntk_extrap_max_abs_z.L3.tanh",
        "multi_ddntk_extrap_excess.U.L3.tanh",
        "multi_ddntk_interlayer_error_ratio.tanh",
    ):
        assert math.isfinite(m[k]), k
    assert not any(k.startswith("multi_extrap") for k in m)  # mc_multi_ is not planned
    figs = evaluate.make_plots(cmp, p)
    assert {"multi_input_dntk", "multi_input_ddntk"} <= set(figs) and "multi_input_ntk" not in figs


def _without_md(p):
    """``p`` without the new variants (their theory columns are then not computed)."""
    return p.model_copy(update={"variants": [v for v in p.variants if not v.startswith("mc_multi_d")]})
