"""Tests of `softtorch`: every soft op against an independent reference — its hard op in the limit
softness → 0, finite differences (gradcheck, float64), sorted inputs, the permutahedron projection and
isotonic regression against cvxpy, sparsemax against cvxpy — plus bad input (the end-to-end --env=test
run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import itertools

import numpy as np
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.softtorch import softops as so

SOFT_MODES = ("smooth", "c0", "c1", "c2")
P_METHODS = ("neuralsort", "softsort", "ot", "sorting_network")


def _x(n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64)


# ------------------------------------------------------------------------------ limit softness → 0
@pytest.mark.parametrize("mode", SOFT_MODES)
def test_elementwise_ops_converge_to_hard(mode):
    x = torch.tensor([-2.3, -0.7, -0.2, 0.15, 0.6, 1.4, 2.2], dtype=torch.float64)  # away from 0 and ±½
    y = torch.tensor([0.1, -0.7, 0.3, -0.5, 0.6, 2.0, 1.0], dtype=torch.float64)  # ties for eq
    y2 = y + torch.tensor([0, 0.2, 0, 0, -0.3, 0, 0], dtype=torch.float64)  # no ties for greater/less
    cases = {
        "heaviside": lambda s, m: so.heaviside(x, s, m),
        "sign": lambda s, m: so.sign(x, s, m),
        "abs": lambda s, m: so.abs(x, s, m),
        "relu": lambda s, m: so.relu(x, s, m),
        "relu_gated": lambda s, m: so.relu(x, s, m, gated=True) if m != "hard" else torch.relu(x),
        "clamp": lambda s, m: so.clamp(x, -1.0, 1.0, s, m),
        "round": lambda s, m: so.round(x, s, m),
        "greater": lambda s, m: so.greater(x, y2, s, m),
        "less": lambda s, m: so.less(x, y2, s, m),
        "eq": lambda s, m: so.eq(x, y, s, m),
    }
    for name, f in cases.items():
        hard = f(None, "hard")
        errs = [float((f(s, mode) - hard).abs().max()) for s in (1.0, 0.1, 0.01, 1e-4)]
        assert errs[-1] < 1e-6, (name, mode, errs)
        assert errs[-1] <= errs[0] + 1e-12, (name, mode, errs)


@pytest.mark.parametrize("mode", SOFT_MODES)
def test_argmax_max_converge_to_hard(mode):
    x = _x(7, 1)
    assert torch.allclose(so.argmax(x, softness=1e-4, mode=mode), so.argmax(x, mode="hard"), atol=1e-6)
    assert abs(float(so.max(x, softness=1e-4, mode=mode)) - float(x.max())) < 1e-6
    assert abs(float(so.min(x, softness=1e-4, mode=mode)) - float(x.min())) < 1e-6
    p = so.argmax(x, softness=0.5, mode=mode)
    assert abs(float(p.sum()) - 1) < 1e-9 and float(p.min()) >= 0


@pytest.mark.parametrize("method", P_METHODS + ("fast_soft_sort",))
def test_sort_rank_median_converge_to_hard(method):
    x = torch.stack([_x(9, 2), _x(9, 3)])
    mode = "c0" if method == "fast_soft_sort" else "smooth"
    s = 1e-4 if method == "ot" else 1e-3  # OT's entropic regulariser acts on squared costs
    tol = 3e-3 if method == "ot" else 1e-3  # Sinkhorn blurs near-ties (gap 4e-3 here) the longest
    err = (so.sort(x, softness=s, mode=mode, method=method, ot_iters=3000) - torch.sort(x).values).abs().max()
    err_soft = (so.sort(x, softness=100 * s, mode=mode, method=method) - torch.sort(x).values).abs().max()
    assert err < tol and err <= err_soft + 1e-9
    assert torch.allclose(
        so.rank(x, softness=s, mode=mode, method=method, ot_iters=3000), so.rank(x, mode="hard"), atol=2e-2
    )
    assert torch.allclose(
        so.median(x, softness=s, mode=mode, method=method, ot_iters=3000), torch.median(x, -1).values, atol=tol
    )
    # descending sort and top-k membership
    assert torch.allclose(
        so.sort(x, softness=s, mode=mode, method=method, descending=True, ot_iters=3000),
        torch.sort(x, descending=True).values,
        atol=tol,
    )
    assert torch.allclose(
        so.topk_mask(x, 3, softness=s, mode=mode, method=method, ot_iters=3000),
        so.topk_mask(x, 3, mode="hard"),
        atol=2e-2,
    )


@pytest.mark.parametrize("mode", ("c0", "c1", "c2"))
def test_piecewise_permutation_methods_converge(mode):
    x = _x(8, 4)
    for method in ("neuralsort", "softsort", "sorting_network"):
        assert torch.allclose(so.sort(x, softness=1e-3, mode=mode, method=method), torch.sort(x).values, atol=1e-4)


def _neuralsort_np(s: np.ndarray, tau: float, absval=np.abs) -> np.ndarray:
    """Grover et al. (2019), written independently: P̂[i, :] = softmax(((n + 1 − 2i)·s − A_s·1) / τ),
    A_s[j, k] = |s_j − s_k|, i = 1..n, row i the i-th LARGEST. ``absval`` swaps in another |·|."""
    n = s.shape[-1]
    row_sum = absval(s[..., :, None] - s[..., None, :]).sum(-1)  # (A_s·1)[j]
    coef = (n + 1 - 2 * np.arange(1, n + 1)).astype(float)
    z = (coef[:, None] * s[..., None, :] - row_sum[..., None, :]) / tau
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_neuralsort_is_the_published_operator():
    """Review finding: `neuralsort` used a soft |·| in A_s and was up to 0.37 per entry from Grover et
    al.'s operator at τ ∈ [0.05, 1]. Against the formula in numpy (float precision), descending rows as
    published and ascending (rows flipped); on raw and on squashed (0, 1) inputs, batched."""
    rng = np.random.default_rng(0)
    for n in (2, 5, 9, 16):
        for tau in (0.05, 0.1, 0.3, 1.0):
            for s in (rng.normal(size=(3, n)), rng.uniform(size=(3, n))):
                ref = _neuralsort_np(s, tau)
                t = torch.from_numpy(s)
                desc = so.argsort(t, softness=tau, method="neuralsort", standardize=False, descending=True)
                asc = so.argsort(t, softness=tau, method="neuralsort", standardize=False)
                np.testing.assert_allclose(desc.numpy(), ref, atol=1e-12, rtol=0)
                np.testing.assert_allclose(asc.numpy(), ref[..., ::-1, :], atol=1e-12, rtol=0)


def test_neuralsort_tends_to_the_hard_permutation():
    """τ → 0: P̂ → the hard permutation matrix (Grover et al., Thm. 4), monotonically here."""
    x = _x(9, 11)
    hard = so.argsort(x, mode="hard")
    errs = [
        float((so.argsort(x, softness=t, method="neuralsort", standardize=False) - hard).abs().max())
        for t in (1.0, 0.1, 0.01, 1e-3, 1e-4)
    ]
    assert errs[-1] < 1e-12 and all(b <= a for a, b in zip(errs, errs[1:])), errs
    assert torch.equal(so.argsort(x, softness=1e-4, method="neuralsort").argmax(-1), torch.argsort(x))


def test_neuralsort_smoothabs_is_the_formula_with_the_soft_abs():
    """The SoftTorch library's variant, kept as `neuralsort_smoothabs`: the same operator with
    |d| ≈ d·(2σ(d/τ) − 1), the smooth-mode soft abs at the operator's own softness."""
    s, tau = np.random.default_rng(1).normal(size=(2, 7)), 0.2
    soft_abs = lambda d: d * (2 / (1 + np.exp(-d / tau)) - 1)  # noqa: E731
    got = so.argsort(
        torch.from_numpy(s), softness=tau, method="neuralsort_smoothabs", standardize=False, descending=True
    )
    np.testing.assert_allclose(got.numpy(), _neuralsort_np(s, tau, soft_abs), atol=1e-12, rtol=0)
    assert (
        float(
            (
                got
                - so.argsort(torch.from_numpy(s), softness=tau, method="neuralsort", standardize=False, descending=True)
            )
            .abs()
            .max()
        )
        > 1e-3
    )


# ------------------------------------------------------------------------------ finite differences
@pytest.mark.parametrize("mode", SOFT_MODES)
def test_elementwise_gradcheck(mode):
    x = torch.tensor([-0.31, -0.04, 0.07, 0.22, 0.9, 1.3], dtype=torch.float64, requires_grad=True)
    for f in (
        lambda t: so.sigmoidal(t, 0.1, mode),
        lambda t: so.relu(t, 0.1, mode),
        lambda t: so.abs(t, 0.1, mode),
        lambda t: so.round(t, 0.2, mode),
        lambda t: so.clamp(t, -0.1, 0.5, 0.1, mode),
        lambda t: so.argmax(t, softness=0.3, mode=mode),
    ):
        assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("method", P_METHODS)
def test_sort_rank_gradcheck(method):
    x = _x(6, 5).requires_grad_(True)
    kw = dict(softness=0.3, mode="smooth", method=method, ot_iters=50, ot_tol=0.0)
    assert torch.autograd.gradcheck(lambda t: so.sort(t, **kw), (x,), eps=1e-6, atol=1e-5)
    assert torch.autograd.gradcheck(
        lambda t: so.rank(t, softness=0.3, method=method, ot_iters=50), (x,), eps=1e-6, atol=1e-5
    )


def test_fast_soft_sort_gradcheck():
    # the custom PAV backward (block means) against finite differences, away from block boundaries
    x = torch.tensor([0.3, -1.2, 0.25, 2.0, -0.1, 0.9], dtype=torch.float64, requires_grad=True)
    for s in (0.05, 0.5, 5.0):
        assert torch.autograd.gradcheck(
            lambda t: so.sort(t, softness=s, mode="c0", method="fast_soft_sort"), (x,), eps=1e-7, atol=1e-5
        )
        assert torch.autograd.gradcheck(
            lambda t: so.rank(t, softness=s, mode="c0", method="fast_soft_sort"), (x,), eps=1e-7, atol=1e-5
        )


# ------------------------------------------------------------------------------ sorted input
@pytest.mark.parametrize("method", P_METHODS)
def test_soft_sort_of_sorted_input_is_identity(method):
    x = torch.sort(_x(8, 6) * 3).values
    s = 1e-4 if method == "ot" else 1e-3
    p = so.argsort(x, softness=s, method=method, ot_iters=3000)
    assert torch.allclose(p, torch.eye(8, dtype=torch.float64), atol=1e-3)
    assert torch.allclose(so.sort(x, softness=s, method=method, ot_iters=3000), x, atol=1e-3)


def test_fast_soft_sort_of_sorted_input_is_identity_exactly():
    # well-separated sorted input: the permutahedron projection is inside, so the output is exact
    x = torch.linspace(-2, 2, 10, dtype=torch.float64)
    assert torch.allclose(so.sort(x, softness=0.01, mode="c0", method="fast_soft_sort"), x, atol=1e-10)
    assert torch.allclose(
        so.rank(x, softness=0.01, mode="c0", method="fast_soft_sort"),
        torch.arange(1, 11, dtype=torch.float64),
        atol=1e-10,
    )


# ------------------------------------------------------------------------------ cvxpy references
def test_permutahedron_projection_matches_cvxpy():
    import cvxpy as cp

    rng = np.random.default_rng(0)
    n = 5
    for _ in range(4):
        z, w = rng.normal(size=n) * 2, rng.normal(size=n)
        mu = cp.Variable(n)
        ws = np.sort(w)[::-1]
        cons = [cp.sum(mu) == ws.sum()]
        for k in range(1, n):
            for S in itertools.combinations(range(n), k):
                cons.append(cp.sum(mu[list(S)]) <= ws[:k].sum())
        cp.Problem(cp.Minimize(cp.sum_squares(mu - z)), cons).solve(solver="CLARABEL")
        ours = so.project_permutahedron(torch.tensor(z), torch.tensor(w)).numpy()
        np.testing.assert_allclose(ours, mu.value, atol=1e-6)


def test_isotonic_regression_matches_cvxpy():
    import cvxpy as cp

    y = np.random.default_rng(1).normal(size=12)
    v = cp.Variable(12)
    cp.Problem(cp.Minimize(cp.sum_squares(v - y)), [v[:-1] >= v[1:]]).solve(solver="CLARABEL")
    np.testing.assert_allclose(so.isotonic_decreasing(torch.tensor(y)).numpy(), v.value, atol=1e-6)


def test_sparsemax_matches_cvxpy_simplex_projection():
    import cvxpy as cp

    z = np.random.default_rng(2).normal(size=7)
    p = cp.Variable(7)
    cp.Problem(cp.Minimize(cp.sum_squares(p - z)), [p >= 0, cp.sum(p) == 1]).solve(solver="CLARABEL")
    np.testing.assert_allclose(so.sparsemax(torch.tensor(z)).numpy(), p.value, atol=1e-6)


# ------------------------------------------------------------------------------ structure
def test_ot_plan_is_doubly_stochastic():
    p = so.argsort(_x(10, 7), softness=0.05, method="ot", ot_iters=2000, ot_tol=1e-10)
    assert torch.allclose(p.sum(-1), torch.ones(10, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(p.sum(-2), torch.ones(10, dtype=torch.float64), atol=1e-6)


def test_fuzzy_logic_matches_boolean_truth_table():
    a = torch.tensor([0.0, 0.0, 1.0, 1.0])
    b = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert so.logical_and(a, b).tolist() == [0, 0, 0, 1]
    assert so.logical_or(a, b).tolist() == [0, 1, 1, 1]
    assert so.logical_xor(a, b).tolist() == [0, 1, 1, 0]
    assert so.logical_not(a).tolist() == [1, 1, 0, 0]
    assert float(so.all(b[3:])) == 1 and float(so.all(b)) == 0
    assert float(so.any(a[:2])) == 0 and float(so.any(b)) == 1
    assert so.where(a, b, 1 - b).tolist() == [1, 0, 0, 1]


def test_straight_through_value_is_hard_gradient_is_soft():
    x = _x(6, 8).requires_grad_(True)
    y = so.sort_st(x, softness=0.5, method="neuralsort")
    assert torch.equal(y.detach(), torch.sort(x.detach()).values)
    w = torch.arange(6, dtype=torch.float64)
    (g_st,) = torch.autograd.grad((y * w).sum(), x)
    (g_soft,) = torch.autograd.grad((so.sort(x, softness=0.5, method="neuralsort") * w).sum(), x)
    assert torch.allclose(g_st, g_soft)


def test_hard_threshold_has_zero_gradient_and_soft_does_not():
    v = torch.linspace(0, 1, 10, dtype=torch.float64)
    for mode, nonzero in (("hard", False), ("smooth", True)):
        t = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        out = (v * so.greater(v, t, 0.1, mode)).sum() + 0 * t
        (g,) = torch.autograd.grad(out, t)
        assert (float(g) != 0) == nonzero


def test_speed_metrics_from_interleaved_rounds(raw):
    """The speed-ups are medians of paired per-round ratios with their order-statistic interval; the
    medians per (method, n) are point values."""
    import pandas as pd

    from pipelines.softtorch.evaluate import speed_metrics
    from pipelines.softtorch.params import Params

    p = Params.model_validate({**raw, "speed": {**raw["speed"], "ratio_n_ot": 8, "ratio_n_quadratic": 8}})
    rows = [
        {"n": 8, "method": m, "round": i, "seconds": t * (i + 1)}
        for i in range(11)
        for m, t in (("ot", 1.0), ("neuralsort", 0.5), ("softsort", 0.2), ("fast_soft_sort", 0.01))
    ]
    out = speed_metrics(None, p, pd.DataFrame(rows))
    assert out["fwdbwd_ms.ot.n8"] == pytest.approx(6000.0)
    est = out["speedup.fast_soft_sort_vs_ot"]
    assert est.value == pytest.approx(100.0) and est.lo == pytest.approx(100.0) and est.n == 11
    assert out["speedup.fast_soft_sort_vs_softsort"].value == pytest.approx(20.0)


# ------------------------------------------------------------------------------ bad input
@pytest.fixture
def raw():
    import pathlib

    import yaml

    root = pathlib.Path(__file__).resolve().parents[2]
    return yaml.safe_load((root / "conf/base/parameters_softtorch.yml").read_text())["softtorch"]


def test_bad_parameters_name_the_key(raw):
    from pipelines.softtorch.params import Params

    with pytest.raises(ParameterError, match=r"softtorch\.variants"):
        validate(Params, {**raw, "variants": ["neuralsort", "quicksort"]}, "softtorch")
    with pytest.raises(ParameterError, match=r"softtorch\.modes"):
        validate(Params, {**raw, "modes": {"neuralsort": "c3"}}, "softtorch")
    with pytest.raises(ParameterError, match=r"softtorch\.toys\.softness"):
        validate(Params, {**raw, "toys": {**raw["toys"], "softness": -0.1}}, "softtorch")
    with pytest.raises(ParameterError, match=r"softtorch\.accuracy\.softness"):
        validate(Params, {**raw, "accuracy": {**raw["accuracy"], "softness": [1.0, 0.0]}}, "softtorch")
    with pytest.raises(ParameterError, match=r"claim 'hard_mode_fails_toys'.*variant 'hard'"):
        validate(Params, {**raw, "variants": ["neuralsort", "fast_soft_sort"]}, "softtorch")
    with pytest.raises(ParameterError, match=r"softtorch\.digits\.n_seeds"):
        validate(Params, {**raw, "digits": {**raw["digits"], "n_seeds": 0}}, "softtorch")


def test_bad_mode_and_softness_in_ops():
    with pytest.raises(ValueError, match="mode"):
        so.sigmoidal(_x(), 0.1, "c3")
    with pytest.raises(ValueError, match="softness"):
        so.sort(_x(), softness=0.0)
    with pytest.raises(ValueError, match="method"):
        so.sort(_x(), method="bogo")


def test_bad_user_file_names_dataset_and_column(tmp_path, raw):
    from pipelines.core.schemas import InputDataError
    from pipelines.softtorch.data import make_digit_sequences
    from pipelines.softtorch.params import Params

    rng = np.random.default_rng(0)
    import pandas as pd

    df = pd.DataFrame(rng.uniform(0, 16, size=(40, 64)), columns=[f"p{i}" for i in range(64)])
    df["label"] = np.arange(40) % 10
    bad = df.drop(columns=["p5"])
    path = tmp_path / "digits.csv"
    bad.to_csv(path, index=False)
    p = Params.model_validate({**raw, "digits": {**raw["digits"], "user_csv": str(path)}})
    with pytest.raises(InputDataError, match=r"softtorch\.digits\.user_csv.*p5"):
        make_digit_sequences(p)
    df.assign(label=df["label"] + 5).to_csv(path, index=False)
    with pytest.raises(InputDataError, match=r"'label'"):
        make_digit_sequences(p)
    # a valid user file builds sequences of two-digit images
    df.to_csv(path, index=False)
    small = Params.model_validate(
        {**raw, "digits": {**raw["digits"], "user_csv": str(path), "n_train": 12, "n_test": 10}}
    )
    out = make_digit_sequences(small)["0"]
    assert out["x_train"].shape == (12, 5, 8, 16) and out["y_test"].shape == (10, 5)
