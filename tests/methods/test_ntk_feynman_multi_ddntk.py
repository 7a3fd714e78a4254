"""Tests of the ddNTK of M inputs (`ntk_feynman.multi_ddntk`, one implementation of the formulas with `ddntk2`):
M = 2 against the two-input ddNTK, repeated inputs and sub-blocks against it, all-equal indices against the
single-input ddNTK, permutations, M = 4; the M-input probe sampler against the two-input one (bit for bit) and
against the recursion at M = 3 (layer 2 exact at any width; layer 3 by the 1/n extrapolation, ablation rejected)."""

import math

import numpy as np
import pytest

from pipelines.ntk_feynman import ddntk, ddntk2, multi
from pipelines.ntk_feynman import multi_ddntk as md
from pipelines.ntk_feynman.theory import Quad

X2 = np.array([[1.0, -0.6, 0.8], [0.3, 0.9, 1.1]])  # ddntk2's test pair
LAM_B, LAM_W = 0.8, 1.2
ACTS = [("relu", 2.0, 0.1), ("tanh", 1.3, 0.2), ("gelu", 1.98305826, 0.17292239)]


def _three_inputs():
    """Three inputs in R^6 at pairwise cosines 0.5, 0.2, -0.3 (not all equal), norm ratios 1 : 1.3 : 0.8."""
    x1 = np.random.default_rng(1).standard_normal(6)
    x1 *= math.sqrt(6) / np.linalg.norm(x1)
    return multi.inputs_with_cosines(x1, [[1, 0.5, 0.2], [0.5, 1, -0.3], [0.2, -0.3, 1]], [1.0, 1.3, 0.8], seed=2)


X3 = _three_inputs()


def _close(a, b, rel, what=""):
    for ra, rb in zip(a, b):
        for t in md.TENSORS:
            scale = np.abs(rb[t]).max()
            np.testing.assert_allclose(
                ra[t], rb[t], rtol=0, atol=rel * scale + 1e-300, err_msg=f"{what} {t} layer {rb['layer']}"
            )


# ------------------------------------------------------------------------ the recursion
@pytest.mark.parametrize("kind, c_w, c_b", ACTS)
def test_two_inputs_equal_the_two_input_ddntk(kind, c_w, c_b):
    """M = 2 on the M-input engine (multi.Expect rules, multi's B, F, P, Q) equals ddntk2.two_input_ddntk (2-D rule,
    ntk2's tensors) at layers 1-4, with and without the inter-layer terms; repeating x1 as a third input copies
    the components."""
    ref = ddntk2.two_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X2, 4)
    _close(md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X2, 4), ref, 1e-11, "M=2")
    abl = ddntk2.two_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X2, 4, interlayer=False)
    _close(md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X2, 4, interlayer=False), abl, 1e-11, "ablation")
    rep = md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, np.vstack([X2, X2[0]]), 4)
    ix = np.ix_(*[[0, 1, 0]] * 4)
    _close(rep, [{"layer": r["layer"], **{t: r[t][ix] for t in md.TENSORS}} for r in ref], 1e-11, "x3 = x1")


@pytest.mark.parametrize("kind, c_w, c_b", ACTS)
def test_three_inputs_against_two_input_and_single_input_ddntk(kind, c_w, c_b):
    """Three distinct inputs: every two-input sub-block (a_i in {a, b}) is two_input_ddntk of (x_a, x_b) (1e-10),
    all-equal indices are ddntk.ddntk_first_order (1e-10) at layers 1-4, layer 2 is multi_input_ddntk_layer2,
    the symmetries of the definitions hold and S, U are not symmetric under the other swap from layer 3 on."""
    rows = md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X3, 4)
    for a, b in ((0, 1), (0, 2), (1, 2)):
        ix = np.ix_(*[[a, b]] * 4)
        ref = ddntk2.two_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X3[[a, b]], 4)
        _close([{"layer": r["layer"], **{t: r[t][ix] for t in md.TENSORS}} for r in rows], ref, 1e-10, (a, b))
    for a in range(3):
        single = ddntk.ddntk_first_order(kind, c_w, c_b, LAM_B, LAM_W, float(X3[a] @ X3[a]) / 6, 4)
        for r, s in zip(rows, single):
            for t in md.TENSORS:
                assert r[t][a, a, a, a] == pytest.approx(s[t], rel=1e-10, abs=1e-12), (a, r["layer"], t)
    l2 = md.multi_input_ddntk_layer2(kind, c_w, c_b, LAM_B, LAM_W, X3)
    for t in md.TENSORS:
        assert np.all(rows[0][t] == 0)
        np.testing.assert_allclose(rows[1][t], l2[t], rtol=1e-12, atol=1e-14)
    for r in rows:
        R, S, T = r["R"], r["S"], r["T"]
        for A, perm in ((R, (0, 1, 3, 2)), (R, (1, 0, 2, 3)), (S, (1, 0, 3, 2)), (T, (1, 0, 2, 3))):
            np.testing.assert_allclose(A, A.transpose(perm), rtol=1e-9, atol=1e-10 * np.abs(A).max())
    assert not np.allclose(rows[3]["S"], rows[3]["S"].transpose(0, 1, 3, 2), rtol=1e-3)
    assert not np.allclose(rows[3]["U"], rows[3]["U"].transpose(1, 0, 2, 3), rtol=1e-3)


@pytest.mark.parametrize("kind, c_w, c_b", ACTS[1:2])
def test_permuting_the_inputs_permutes_the_tensors(kind, c_w, c_b):
    """To the 3-D rule's accuracy (its nested variables follow the input order), as multi's tensors."""
    perm = [2, 0, 1]
    a = md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X3, 4)
    b = md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X3[perm], 4)
    _close(
        [{"layer": r["layer"], **{t: r[t][np.ix_(perm, perm, perm, perm)] for t in md.TENSORS}} for r in a],
        b,
        1e-6,
        "permutation",
    )


def test_four_inputs():
    """M = 4 (4-D rules for the averages that touch four inputs): the sub-block of the first three inputs is the
    M = 3 result, and the cross components with all four inputs distinct are finite and non-zero."""
    x4 = np.array([0.4, -1.0, 0.2, 0.7, -0.3, 0.9])
    X4 = np.vstack([X3, x4])
    a = md.multi_input_ddntk("relu", 2.0, 0.1, LAM_B, LAM_W, X4, 3)
    b = md.multi_input_ddntk("relu", 2.0, 0.1, LAM_B, LAM_W, X3, 3)
    ix = np.ix_(*[range(3)] * 4)
    _close([{"layer": r["layer"], **{t: r[t][ix] for t in md.TENSORS}} for r in a], b, 1e-12, "M=4 sub-block")
    for t in md.TENSORS:
        assert np.isfinite(a[2][t]).all() and abs(a[2][t][0, 1, 2, 3]) > 1e-6 * np.abs(a[2][t]).max()


def test_engine_extends_multi_expect_with_sigma3():
    """The engine's s''' average on the 1-D rule, and its other averages are multi.Expect's."""
    K = ddntk2.gram(1.3, 0.2, LAM_B, LAM_W, X3)[0]
    ex, base = md.Expect("tanh", K, Quad()), multi.Expect("tanh", K, Quad())
    u, w = Quad().nodes()
    z = math.sqrt(K[1, 1]) * u
    ref = float(np.sum(w * ddntk.d3sigma("tanh", z) * (1 - np.tanh(z) ** 2)))
    assert ex.E(("ddd", 1), ("d", 1)) == pytest.approx(ref, rel=1e-12)
    assert ex.E(("s", 0), ("d", 1), ("dd", 2)) == base.E(("s", 0), ("d", 1), ("dd", 2))


# ------------------------------------------------------------------------ the probe sampler
def _zs(row: dict, ref: dict) -> dict:
    """Per tensor the z-scores of a pooled MC row (values ``t``, standard errors ``t_se``) against ``ref``."""
    return {t: (row[t] - ref[t]) / row[f"{t}_se"] for t in md.TENSORS}


def test_sampler_is_the_two_input_sampler_at_m2_and_shares_nets():
    """sample_multi_input_ddntk at M = 2 is sample_two_input_ddntk bit for bit; at M = 3 (same seed: same nets and
    probes) its components on the first two inputs are the M = 2 ones."""
    a = ddntk2.sample_two_input_ddntk("tanh", X3[:2], 5, 3, 12, 1.3, 0.2, LAM_B, LAM_W, seed=3)
    b = md.sample_multi_input_ddntk("tanh", X3[:2], 5, 3, 12, 1.3, 0.2, LAM_B, LAM_W, seed=3)
    c = md.sample_multi_input_ddntk("tanh", X3, 5, 3, 12, 1.3, 0.2, LAM_B, LAM_W, seed=3)
    assert np.array_equal(a, b)
    assert c.shape == (12, 3, 4, 3, 3, 3, 3)
    np.testing.assert_allclose(c[..., :2, :2, :2, :2], a, rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError):
        ddntk2.sample_two_input_ddntk("tanh", X3, 5, 3, 2, 1.3, 0.2, LAM_B, LAM_W, seed=3)


def test_probe_estimator_unbiased_at_layer_two_three_inputs():
    """Layer 2 is exact at any width: 2 000 width-6 GELU nets (s'', s''' terms) seeing three inputs at unequal
    cosines match all 324 components of R, S, T, U."""
    c_w, c_b = 1.98305826, 0.17292239
    pooled = md.pooled_multi_input_ddntk(
        md.sample_multi_input_ddntk("gelu", X3, 6, 2, 2000, c_w, c_b, LAM_B, LAM_W, seed=4), 6
    )
    z = np.concatenate(
        [v.ravel() for v in _zs(pooled[1], md.multi_input_ddntk_layer2("gelu", c_w, c_b, LAM_B, LAM_W, X3)).values()]
    )
    assert np.abs(z).max() < 4.0 and np.mean(z**2) < 2.0, (np.abs(z).max(), np.mean(z**2))


def test_recursion_matches_sampled_nets_at_layer_three_three_inputs():
    """ReLU nets at n = 8 and 16 (4 000 / 2 000 nets) seeing three inputs: at layer 3 the 1/n extrapolation
    2 T(16) - T(8) matches the recursion in all 81 components of each tensor (max |z| < 3.5) and rejects the
    ablation without inter-layer terms in every tensor (max |z| > 4); layer 2 matches raw at both widths."""
    kind, c_w, c_b = "relu", 2.0, 0.1
    rec = md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X3, 3)
    abl = md.multi_input_ddntk(kind, c_w, c_b, LAM_B, LAM_W, X3, 3, interlayer=False)
    m = {
        w: md.pooled_multi_input_ddntk(
            md.sample_multi_input_ddntk(kind, X3, w, 3, N, c_w, c_b, LAM_B, LAM_W, seed=101 + w), w
        )
        for w, N in ((8, 4000), (16, 2000))
    }

    raw = [float(np.abs(z).max()) for w in m for z in _zs(m[w][1], rec[1]).values()]
    assert max(raw) < 4.0, raw
    ext = {t: 2 * m[16][2][t] - m[8][2][t] for t in md.TENSORS}  # the 1/n extrapolation
    ext.update({f"{t}_se": np.hypot(2 * m[16][2][f"{t}_se"], m[8][2][f"{t}_se"]) for t in md.TENSORS})
    z_rec = {t: float(np.abs(z).max()) for t, z in _zs(ext, rec[2]).items()}
    z_abl = {t: float(np.abs(z).max()) for t, z in _zs(ext, abl[2]).items()}
    assert max(z_rec.values()) < 3.5, z_rec
    assert min(z_abl.values()) > 4.0, z_abl
