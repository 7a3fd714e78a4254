"""Tests of `mts`: the GSNR estimator on gradients of known mean and variance, the meta-gradient through
the virtual step against finite differences in φ (exact unroll and the official finite-difference
Hessian-vector product), the weight normalisation, the data generator, and bad input (the end-to-end
--env=test run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipelines.core.params import ParameterError, validate
from pipelines.mts.params import Params
from tests.conftest import ROOT


def _raw(**over) -> dict:
    base = yaml.safe_load((ROOT / "conf/base/parameters_mts.yml").read_text())["mts"]
    test = yaml.safe_load((ROOT / "conf/test/parameters_mts.yml").read_text())["mts"]

    def merge(a, b):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return merge(merge(base, test), over)


# ------------------------------------------------------------------ GSNR estimator


def test_gsnr_matches_known_mean_and_variance():
    from pipelines.mts.model import gsnr

    gen = torch.Generator().manual_seed(0)
    mu = torch.tensor([0.5, -1.0, 2.0, 0.1, 0.0, 3.0], dtype=torch.float64)
    sd = torch.tensor([1.0, 0.5, 2.0, 0.1, 1.0, 1.0], dtype=torch.float64)
    g = mu + sd * torch.randn(40_000, 6, generator=gen, dtype=torch.float64)
    g = torch.cat(
        [
            g,
            torch.full((40_000, 1), 7.0, dtype=torch.float64),  # constant non-zero: infinite SNR
            torch.zeros(40_000, 1, dtype=torch.float64),
        ],
        1,
    )  # identically zero: no gradient
    r = gsnr(g)
    true = (mu / sd) ** 2  # 0.25, 4, 1, 1, 0, 9 (and inf)
    assert r["n_coords"] == 7  # only the all-zero coordinate is left out
    assert r["median"] == pytest.approx(float(np.median(np.append(true.numpy(), np.inf))), abs=0.05)
    per = g[:, :6].mean(0) ** 2 / g[:, :6].var(0)
    np.testing.assert_allclose(per.numpy(), true.numpy(), atol=0.02, rtol=0.02)
    # aggregate with the dead coordinate: its mean counts in ‖E g‖² but adds no variance
    assert r["aggregate"] == pytest.approx(float(((mu**2).sum() + 49.0) / (sd**2).sum()), rel=0.03)


def _numpy_gsnr_median(g: np.ndarray) -> float:
    """Independent reference: numpy's median (the mean of the two middle values when their count is even)
    of (mean_k)² / var_k (ddof = 1) over the coordinates that are not identically zero; a constant
    non-zero coordinate has infinite SNR."""
    g = g[:, np.abs(g).max(0) > 0]
    with np.errstate(divide="ignore"):
        return float(np.median(g.mean(0) ** 2 / g.var(0, ddof=1)))


def test_gsnr_median_is_the_usual_median_and_degenerate_cases_are_defined():
    """Review finding: torch's median is the lower one (this gave 1.0, not 2.5), off by 3% typically and
    up to 87% on random inputs; a constant non-zero coordinate was counted as carrying no gradient and an
    all-constant input gave 3e300 instead of inf."""
    from pipelines.mts.model import gsnr

    assert gsnr(torch.tensor([[1.0, 0.0], [3.0, 2.0], [2.0, 1.0]]))["median"] == pytest.approx(2.5)
    rng = np.random.default_rng(0)
    for k in (2, 7, 8, 31, 64):  # odd and even counts of coordinates
        for _ in range(20):
            g = rng.normal(rng.normal(size=k), rng.uniform(0.1, 2.0, size=k), size=(int(rng.integers(3, 40)), k))
            assert gsnr(torch.from_numpy(g))["median"] == pytest.approx(_numpy_gsnr_median(g), rel=1e-12)
    # a constant non-zero coordinate carries signal (SNR inf); an identically zero one carries none
    g = np.array([[1.0, 0.0, 5.0, 0.0], [3.0, 2.0, 5.0, 0.0], [2.0, 1.0, 5.0, 0.0]])  # SNR 4, 1, inf, —
    r = gsnr(torch.from_numpy(g))
    assert r["n_coords"] == 3 and r["median"] == 4.0 == _numpy_gsnr_median(g)
    # all-constant input: infinite median and aggregate; all-zero input: no coordinate, both undefined
    r = gsnr(torch.tensor([[1.0, -2.0], [1.0, -2.0], [1.0, -2.0]]))
    assert r["median"] == np.inf and r["aggregate"] == np.inf and r["n_coords"] == 2
    r = gsnr(torch.zeros(4, 3))
    assert np.isnan(r["median"]) and np.isnan(r["aggregate"]) and r["n_coords"] == 0


def test_gsnr_of_a_batch_mean_grows_linearly_with_the_batch():
    """Closed form: the mean of B iid per-sample gradients has GSNR B·μ²/σ²."""
    from pipelines.mts.model import gsnr

    gen = torch.Generator().manual_seed(1)
    mu, sd = torch.tensor([0.2, -0.1, 0.3]), torch.tensor([1.0, 1.0, 2.0])
    vals = {}
    for b in (4, 32):
        per_sample = mu + sd * torch.randn(4000, b, 3, generator=gen)
        vals[b] = gsnr(per_sample.mean(1))["median"]
        assert vals[b] == pytest.approx(b * float(((mu / sd) ** 2).median()), rel=0.15)
    assert vals[32] / vals[4] == pytest.approx(8.0, rel=0.2)


# ------------------------------------------------------------------ meta-gradient


def _tiny(seed=0):
    from pipelines.mts.model import MLP, MetaNet

    torch.manual_seed(seed)
    clf = MLP(3, 5, 3).double()
    net = MetaNet(4, 6, floor=1e-3).double()
    torch.nn.init.normal_(net.body[2].weight, std=0.5)  # leave the uniform start: a generic φ
    torch.nn.init.normal_(net.body[2].bias, std=0.5)
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 3, (8,))
    f = torch.randn(8, 4, dtype=torch.float64)
    xm, ym = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 3, (6,))
    theta = {k: v.detach() for k, v in clf.named_parameters()}
    buffers = {k: 0.1 * torch.randn_like(v) for k, v in theta.items()}
    return clf, net, x, y, f, xm, ym, theta, buffers


def _meta_loss_of_phi(clf, net, x, y, f, xm, ym, theta, buffers, lr, mom, wd):
    """Reference: L_meta(θ − η(μ·buf + ∇_θ L_w(θ, φ) + λθ)), written out without the module's helpers."""
    import torch.nn.functional as F
    from torch.func import functional_call

    th = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
    w = net(f)
    wn = w / w.mean()
    lw = (wn * F.cross_entropy(functional_call(clf, th, (x,)), y, reduction="none")).mean()
    g = torch.autograd.grad(lw, list(th.values()))
    new = {k: th[k] - lr * (mom * buffers[k] + gk + wd * th[k]) for k, gk in zip(th, g)}
    return F.cross_entropy(functional_call(clf, new, (xm,)), ym).item()


@pytest.mark.parametrize("method,rtol", [("exact", 1e-5), ("finite_difference", 2e-3)])
def test_meta_gradient_matches_finite_differences_in_phi(method, rtol):
    from pipelines.mts.model import meta_gradient

    clf, net, x, y, f, xm, ym, theta, buffers = _tiny()
    kw = dict(lr=0.5, momentum=0.9, weight_decay=1e-2, buffers=buffers)
    grads = meta_gradient(clf, theta, net, lambda th: f, x, y, xm, ym, method=method, fd_eps=1e-4, **kw)
    h = 1e-6
    for q, gq in zip(net.parameters(), grads):
        ref = torch.zeros_like(q)
        for i in range(q.numel()):
            orig = q.data.view(-1)[i].item()
            q.data.view(-1)[i] = orig + h
            lp = _meta_loss_of_phi(clf, net, x, y, f, xm, ym, theta, buffers, 0.5, 0.9, 1e-2)
            q.data.view(-1)[i] = orig - h
            lm = _meta_loss_of_phi(clf, net, x, y, f, xm, ym, theta, buffers, 0.5, 0.9, 1e-2)
            q.data.view(-1)[i] = orig
            ref.view(-1)[i] = (lp - lm) / (2 * h)
        np.testing.assert_allclose(gq.detach().numpy(), ref.numpy(), rtol=rtol, atol=1e-8)


def test_normalised_uniform_weights_give_the_plain_loss_and_zero_bias_gradient():
    """Limit case: the zero-initialised meta-net weights every sample equally, so the weighted loss is
    the plain mean; and a bias shift rescales all weights, which the normalisation cancels."""
    import torch.nn.functional as F

    from pipelines.mts.model import MetaNet, meta_gradient, normalise, weighted_loss

    clf, _, x, y, f, xm, ym, theta, _ = _tiny()
    net = MetaNet(4, 6).double()
    w = net(f)
    assert torch.allclose(normalise(w), torch.ones(8, dtype=torch.float64))
    plain = F.cross_entropy(clf(x), y)
    assert weighted_loss(clf, theta, x, y, w).item() == pytest.approx(float(plain), rel=1e-7)
    g = meta_gradient(clf, theta, net, lambda th: f, x, y, xm, ym, lr=0.5)
    assert abs(float(g[-1])) < 1e-9 * float(g[-2].abs().sum())  # output bias: cancelled
    assert float(g[-2].abs().sum()) > 1e-6  # output weights do move


def test_cls_features_match_brute_force():
    from pipelines.mts.model import MLP, cls_features

    torch.manual_seed(0)
    clf = MLP(4, 6, 3)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    xm, ym = torch.randn(12, 4), torch.tensor([0, 1, 2] * 4)
    out = cls_features(clf, x, y, xm, ym, k=3)
    with torch.no_grad():
        e, em = clf.embed(x).numpy(), clf.embed(xm).numpy()
    for i in range(5):
        same = em[ym.numpy() == y[i].item()]
        cos = same @ e[i] / (np.linalg.norm(same, axis=1) * np.linalg.norm(e[i]) + 1e-12)
        assert out[i, 0] == pytest.approx(np.sort(cos)[-3:].mean(), abs=1e-5)
        un = same / (np.linalg.norm(same, axis=1, keepdims=True) + 1e-12)
        c = un.sum(0)
        assert out[i, 1] == pytest.approx(c @ e[i] / (np.linalg.norm(c) * np.linalg.norm(e[i])), abs=1e-5)


def test_weight_auc_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    from pipelines.mts.train import _auc

    rng = np.random.default_rng(0)
    q = np.array(["real"] * 5 + list(rng.choice(["good", "off_manifold", "mixup"], 200)))
    w = np.round(rng.random(205), 1)  # ties
    syn = q != "real"
    assert _auc(w, q) == pytest.approx(roc_auc_score(q[syn] == "good", w[syn]))


# ------------------------------------------------------------------ data


def test_pool_has_the_declared_mix_and_pixel_range():
    from pipelines.mts.data import make_pool

    p = Params.model_validate(_raw())
    df = make_pool(p)
    d = df[df.seed == 0]
    assert (d.split == "train").sum() == p.data.n_real_train + p.data.n_syn
    assert (d.split == "meta").sum() == p.data.n_meta and (d.split == "test").sum() == p.data.n_test
    counts = d[d.is_syn].quality.value_counts()
    assert counts["good"] == 120 and counts["off_manifold"] == 90 and counts["label_noise"] == 60
    assert counts["mixup"] == 30
    x = d[[f"x{i}" for i in range(64)]].to_numpy()
    assert x.min() >= 0 and x.max() <= 1
    assert set(d[~d.is_syn].quality) == {"real"}
    # seeded: the same table twice
    pd.testing.assert_frame_equal(df, make_pool(p))


def test_shift_moves_by_one_pixel():
    from pipelines.mts.data import _shift

    img = np.zeros((50, 64))
    img[:, 3 * 8 + 4] = 1.0  # one lit pixel at (3, 4)
    out = _shift(img, np.random.default_rng(0)).reshape(50, 8, 8)
    r, c = np.nonzero(out)[1:]
    assert len(r) == 50 and (np.abs(r - 3) <= 1).all() and (np.abs(c - 4) <= 1).all()


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "over,key",
    [
        ({"meta": {"lr": -1.0}}, r"mts\.meta\.lr"),
        ({"classifier": {"momentum": 1.5}}, r"mts\.classifier\.momentum"),
        ({"variants": ["uniform", "l2rw"]}, r"variants"),
        ({"selectors": {"mts": {"features": "clip", "batch_size": 64}}}, r"mts\.selectors\.mts\.features"),
        ({"gsnr": {"ratio_pair": [64, 4096]}}, r"ratio_pair"),
    ],
)
def test_bad_parameter_names_the_key(over, key):
    with pytest.raises(ParameterError, match=key):
        validate(Params, _raw(**over), "mts")


def test_bad_user_table_names_dataset_and_column(tmp_path):
    from pipelines.core.schemas import InputDataError
    from pipelines.mts.data import make_pool

    f = tmp_path / "pool.csv"
    pd.DataFrame({"x0": [0.1] * 20, "y": [1] * 20, "is_syn": [False] * 20}).to_csv(f, index=False)
    p = Params.model_validate(_raw(data={"source": "table", "path": str(f)}))
    with pytest.raises(InputDataError, match=r"mts\.pool.*'split'"):
        make_pool(p)


def test_sd_features_match_a_brute_force_loop():
    """The SD_* features, recomputed sample by sample with plain loops on the same PCA embedding."""
    from sklearn.decomposition import PCA

    from pipelines.mts.train import Split, sd_features

    rng = np.random.default_rng(0)
    n, d = 40, 6
    x = rng.random((n, d)).astype(np.float32)
    y = np.tile(np.arange(3), 14)[:n]
    syn = np.arange(n) >= 15
    s = Split(
        torch.tensor(x), torch.tensor(y), torch.tensor(syn), np.where(syn, "good", "real"), None, None, None, None, 3
    )
    p = Params.model_validate(_raw(features={"embed_dim": 4, "knn": 5, "top_k": 3, "pre_epochs": 1}))
    got = sd_features(s, p, seed=0)
    z = PCA(n_components=4, random_state=0).fit(x[~syn].astype(np.float64)).transform(x.astype(np.float64))
    cos = lambda a, b: a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    for i in range(n):
        others = [j for j in range(n) if j != i]
        for col, group in ((0, ~syn), (1, syn)):
            cent = z[group & (y == y[i])].mean(0)
            assert got[i, col] == pytest.approx(cos(z[i], cent), abs=1e-6)
            sims = sorted((cos(z[i], z[j]) for j in others if group[j] and y[j] == y[i]), reverse=True)[:3]
            assert got[i, 2 + col] == pytest.approx(np.mean(sims), abs=1e-6)
        dist = {j: np.linalg.norm(z[i] - z[j]) for j in others}
        nn = sorted(others, key=dist.get)[:5]
        wk = np.array([1 / (dist[j] + 1e-6) for j in nn])
        assert got[i, 4] == pytest.approx((wk * (y[nn] == y[i])).sum() / wk.sum(), abs=1e-6)
        assert got[i, 5] == pytest.approx(np.median([dist[j] for j in others if not syn[j] and y[j] == y[i]]), abs=1e-6)
