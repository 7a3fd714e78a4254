"""One `train.<variant>` node per relaxation method: the accuracy of the relaxation vs softness, the four
toy problems (median regression, top-3 feature selection, threshold filtering, interval rule) and the
"learn to sort digits" case study, all with that method (``hard`` = the hard primitives, zero or
subgradients). Output: the variant's long table (core.spec.Results)."""

import numpy as np
import torch

from pipelines.core.api import fit, node_setup
from pipelines.softtorch import softops as so
from pipelines.softtorch.params import Params

W_STAR = (1.0, -2.0, 0.5)
TOPK_TRUE = {1, 3, 7}


class _Vec(torch.nn.Module):
    def __init__(self, init):
        super().__init__()
        self.w = torch.nn.Parameter(torch.as_tensor(init, dtype=torch.float64).clone())


def _optimise(init, loss, p: Params, name: str):
    """Adam with a cosine schedule via core's loop on a free parameter vector; ``+ 0·w`` keeps a
    hard (gradient-free) loss differentiable so that the hard baseline runs the same loop."""
    m = _Vec(init)
    fit(
        m,
        None,
        lambda mod: loss(mod.w) + 0.0 * mod.w.sum(),
        steps=p.toys.steps,
        sample_batch=lambda i, g: [],
        optimizer="adam",
        lr=p.toys.lr,
        weight_decay=0.0,
        grad_clip=None,
        scheduler=lambda opt, total: torch.optim.lr_scheduler.CosineAnnealingLR(opt, total),
        progress=False,
        desc=name,
    )
    return m.w.detach()


def toys(p: Params, variant: str, seed: int) -> dict:
    mode, method = p.mode(variant), p.method(variant)
    ss, es = p.toys.sort_softness, p.toys.softness
    out = {}
    # median regression: 20 points, w* = (1, −2, 0.5), one outlier of 1e6
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.normal(size=(20, 3)))
    y = x @ torch.tensor(W_STAR, dtype=torch.float64)
    y[0] += 1e6
    w = _optimise(
        np.zeros(3),
        lambda w: so.median(so.abs(x @ w - y, ss, mode), -1, ss, mode, method, ot_iters=p.ot_iters),
        p,
        f"softtorch.{variant}.median",
    )
    err = float((w - torch.tensor(W_STAR, dtype=torch.float64)).abs().max())
    out["toy_median"], out["toy_median_err"] = float(err < 1e-2), err
    # top-3 feature selection: 10 features, 3 informative; scores start at 0
    xk = torch.as_tensor(rng.normal(size=(50, 10)))
    yk = xk[:, sorted(TOPK_TRUE)].sum(1)
    th = _optimise(
        np.zeros(10),
        lambda t: ((xk @ so.topk_mask(t, 3, ss, mode, method, ot_iters=p.ot_iters) - yk) ** 2).mean(),
        p,
        f"softtorch.{variant}.topk",
    )
    out["toy_topk"] = float(set(torch.topk(th, 3).indices.tolist()) == TOPK_TRUE)
    # threshold filtering: keep values above t so that their sum hits a target (solution t ∈ (0.5, 0.8))
    v = torch.linspace(0.025, 0.975, 20, dtype=torch.float64)
    target = float(v[v > 0.65].sum())
    t0 = 0.3 + (0.0 if seed == 0 else float(np.random.default_rng(100 + seed).uniform(-0.05, 0.05)))
    t = _optimise(
        [t0], lambda t: ((v * so.greater(v, t[0], es, mode)).sum() - target) ** 2, p, f"softtorch.{variant}.threshold"
    )
    out["toy_threshold"], out["toy_threshold_t"] = float(0.5 < float(t[0]) < 0.8), float(t[0])
    # interval rule on 16 2-D points, function-level straight-through (hard value, soft gradient)
    r = np.random.default_rng(2026)
    pts = torch.as_tensor(r.uniform(size=(16, 2)))
    lab = ((pts[:, 0] > 0.3) & (pts[:, 0] < 0.6)).to(torch.float64)
    rule = so.st(
        lambda lo, hi, mode: so.logical_and(so.greater(pts[:, 0], lo, es, mode), so.less(pts[:, 0], hi, es, mode))
    )
    d0 = 0.0 if seed == 0 else float(np.random.default_rng(200 + seed).uniform(-0.02, 0.02))
    b = _optimise(
        [0.45 + d0, 0.5 + d0],
        lambda b: ((rule(b[0], b[1], mode=mode) - lab) ** 2).mean(),
        p,
        f"softtorch.{variant}.rule",
    )
    acc = float(
        ((so.greater(pts[:, 0], b[0], mode="hard") * so.less(pts[:, 0], b[1], mode="hard")) == lab).double().mean()
    )
    out["toy_rule"], out["toy_rule_acc"] = float(acc == 1.0), acc
    out["toy_solved_frac"] = float(np.mean([out[k] for k in ("toy_median", "toy_topk", "toy_threshold", "toy_rule")]))
    # the three tasks where the hard primitives have zero gradient (median regression has subgradients)
    out["toy_zero_grad_tasks_solved_frac"] = float(np.mean([out[k] for k in ("toy_topk", "toy_threshold", "toy_rule")]))
    return out


def accuracy(p: Params, variant: str, seed: int) -> dict:
    """approx_err = mean|soft sort − hard sort| on squashed standard-normal inputs (so the scale is
    (0, 1) for every method), Spearman(soft rank, hard rank) and the share of non-zero gradient
    entries of ⟨w, sort(x)⟩, at each softness."""
    if variant == "hard":
        return {}
    mode, method = p.mode(variant), p.method(variant)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p.accuracy.n_inputs, p.accuracy.n, generator=g, dtype=torch.float64)
    q = torch.sigmoid((x - x.mean(-1, keepdim=True)) / x.std(-1, unbiased=False, keepdim=True))
    w = torch.randn(p.accuracy.n, generator=g, dtype=torch.float64)
    hard, hrank = torch.sort(q, -1).values, so.rank(q, mode="hard")
    out, errs = {}, []
    for s in p.accuracy.softness:
        qq = q.clone().requires_grad_(True)
        soft = so.sort(qq, softness=s, mode=mode, method=method, standardize=False, ot_iters=p.ot_iters)
        (soft * w).sum().backward()
        err = float((soft.detach() - hard).abs().mean())
        r = so.rank(q, softness=s, mode=mode, method=method, standardize=False, ot_iters=p.ot_iters)
        rc, hc = r - r.mean(-1, keepdim=True), hrank - hrank.mean(-1, keepdim=True)
        # Pearson of soft ranks with hard ranks (= Spearman when the soft ranks are ordered like the input)
        sp = float(((rc * hc).sum(-1) / (rc.norm(dim=-1) * hc.norm(dim=-1)).clamp_min(1e-30)).mean())
        out[f"approx_err.s{s:g}"], out[f"rank_spearman.s{s:g}"] = err, sp
        out[f"grad_nonzero_frac.s{s:g}"] = float((qq.grad.abs() > 1e-12).double().mean())
        errs.append(err)
    out["approx_err_monotone"] = float(all(a >= b - 1e-12 for a, b in zip(errs, errs[1:])) and errs[-1] < errs[0])
    return out


class Scorer(torch.nn.Module):
    """CNN scorer of one h×2w two-digit image (8×16 by default): conv16 → pool → conv32 → pool → FC 64 → 1."""

    def __init__(self, h: int = 8, w2: int = 16):
        super().__init__()
        self.h, self.w2 = h, w2
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32 * (h // 4) * (w2 // 4), 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 1),
        )

    def forward(self, x):  # (B, n, h, 2w) → (B, n)
        b, n = x.shape[:2]
        return self.net(x.reshape(b * n, 1, self.h, self.w2)).reshape(b, n)


def sort_digits(data: dict, p: Params, variant: str, seed: int) -> tuple[dict, list]:
    mode, method, s = p.mode(variant), p.method(variant), p.digits.softness
    model = Scorer(*data["x_train"].shape[2:])
    ytr = data["y_train"]
    true_perm = torch.nn.functional.one_hot(torch.argsort(ytr, -1), ytr.shape[-1]).float()
    true_rank = so.rank(ytr.double(), mode="hard").float()

    def loss(m, xb, pb, rb):
        scores = m(xb)
        if method == "fast_soft_sort":
            return ((so.rank(scores, softness=s, mode=mode, method=method, standardize=False) - rb) ** 2).mean()
        ph = so.argsort(scores, softness=s, mode=mode, method=method, standardize=False, ot_iters=p.digits.ot_iters)
        return -(pb * torch.log(ph.clamp_min(1e-9))).sum(-1).mean()

    hist = []
    res = fit(
        model,
        [data["x_train"], true_perm, true_rank],
        loss,
        epochs=p.digits.epochs,
        batch_size=p.digits.batch_size,
        optimizer="adam",
        lr=p.digits.lr,
        weight_decay=0.0,
        grad_clip=None,
        seed=seed,
        progress=False,
        desc=f"softtorch.{variant}.digits",
        callback=lambda info: hist.append(float(info.loss)),
    )
    del res
    with torch.no_grad():
        sc = model(data["x_test"])
    pred = torch.argsort(torch.argsort(sc, -1), -1)
    true = torch.argsort(torch.argsort(data["y_test"], -1), -1)
    n = pred.shape[-1]
    d2 = ((pred - true).double() ** 2).sum(-1)
    return {
        "sort_exact_match": float((pred == true).all(-1).double().mean()),
        "sort_elementwise_acc": float((pred == true).double().mean()),
        "sort_spearman": float((1 - 6 * d2 / (n * (n * n - 1))).mean()),
    }, hist


def train_variant(digits: dict, p: Params, variant: str):
    """The variant's long table: per seed, the accuracy table, the toys and (on the digit seeds) the
    sorter's test metrics, with its training loss as the history ``sort_loss``."""
    from pipelines.core.api import Results

    res = Results(variant)
    for seed in p.seeds:
        node_setup(p, seed)
        metrics = {**accuracy(p, variant, seed), **toys(p, variant, seed)}
        if variant != "hard" and p.digits.enabled and str(seed) in digits:
            node_setup(p, seed)
            dm, hist = sort_digits(digits[str(seed)], p, variant, seed)
            metrics.update(dm)
            res.history(seed, "sort_loss", hist)
        res.add(seed, **metrics)
    return res.table()
