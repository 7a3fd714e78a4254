"""The `prism_teacher` task (card, small-scale reproduction): a confident tanh-MLP teacher is the public
model; the private task perturbs its two hidden weight matrices by rank-k terms whose strength is found by
bisection so a given fraction of labels flips. Also the privacy calibration (σ per ε), computed once."""

import numpy as np
import torch

from pipelines.core.api import TableSchema, read_user_file
from pipelines.prism.params import Params


def teacher_logits(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    h1 = torch.tanh(x @ w["W1"].T + w["b1"])
    h2 = torch.tanh(h1 @ w["W2"].T + w["b2"])
    return h2 @ w["W3"].T + w["b3"]


def _rank_k(rng: np.random.Generator, m: int, n: int, k: int, like: np.ndarray) -> np.ndarray:
    u, v = rng.normal(size=(m, k)), rng.normal(size=(n, k))
    p = u @ v.T
    return p * np.linalg.norm(like) / np.linalg.norm(p)  # same Frobenius norm as the weight


def make_task(p: Params) -> dict:
    d = p.data
    if d.path:
        return load_user_task(p)
    rng = np.random.default_rng(d.seed)
    w = {
        "W1": rng.normal(size=(d.hidden, d.n_in)) / np.sqrt(d.n_in),
        "b1": np.zeros(d.hidden),
        "W2": rng.normal(size=(d.hidden, d.hidden)) / np.sqrt(d.hidden),
        "b2": np.zeros(d.hidden),
        "W3": d.out_scale * rng.normal(size=(d.n_classes, d.hidden)) / np.sqrt(d.hidden),
        "b3": np.zeros(d.n_classes),
    }
    pert = {
        "W1": _rank_k(rng, d.hidden, d.n_in, d.perturb_rank, w["W1"]),
        "W2": _rank_k(rng, d.hidden, d.hidden, d.perturb_rank, w["W2"]),
    }
    n = d.n_train + d.n_test
    x = torch.tensor(rng.normal(size=(n, d.n_in)))
    wt = {k: torch.tensor(v) for k, v in w.items()}
    base = teacher_logits(x, wt).argmax(1)

    def labels(alpha: float) -> torch.Tensor:
        wp = dict(wt, W1=wt["W1"] + alpha * torch.tensor(pert["W1"]), W2=wt["W2"] + alpha * torch.tensor(pert["W2"]))
        return teacher_logits(x, wp).argmax(1)

    lo, hi = 0.0, 0.25
    while (labels(hi) != base).double().mean() < d.flip_frac:
        hi *= 2
        if hi > 1e3:
            raise ValueError(f"prism.data.make_task: no perturbation strength flips {d.flip_frac:.0%} of labels")
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (labels(mid) != base).double().mean() < d.flip_frac else (lo, mid)
    y = labels(hi)
    return {
        "x_train": x[: d.n_train],
        "y_train": y[: d.n_train],
        "x_test": x[d.n_train :],
        "y_test": y[d.n_train :],
        "base": wt,
        "alpha": torch.tensor(hi),
        "flip_frac": (y != base).double().mean(),
    }


USER_TABLE = TableSchema(
    "prism.user_table",
    {"y": "int", "split": "str"},
    min_rows=10,
    no_missing=("y", "split"),
    allowed={"split": ("public", "train", "test")},
)  # features x0..x{n_in-1}, y < n_classes


def user_schema(n_in: int, n_classes: int) -> TableSchema:
    return USER_TABLE.refine(columns={f"x{i}": "number" for i in range(n_in)}, ranges={"y": (0, n_classes - 1)})


def load_user_task(p: Params) -> dict:
    """A user table (full env): features x0..x{d-1}, integer label y in [0, n_classes), split in
    {public, train, test}. The base MLP (same shape as the teacher) is fit without privacy on `public`;
    DP fine-tuning uses `train`; accuracy is measured on `test`."""
    from pipelines.core.api import fit

    d = p.data
    df = read_user_file(d.path, key="prism.data.path", schema=user_schema(d.n_in, d.n_classes), kind="parquet")
    cols = [f"x{i}" for i in range(d.n_in)]
    t = {s: (torch.tensor(g[cols].to_numpy(float)), torch.tensor(g["y"].to_numpy())) for s, g in df.groupby("split")}

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(d.n_in, d.hidden).double()
            self.l2 = torch.nn.Linear(d.hidden, d.hidden).double()
            self.l3 = torch.nn.Linear(d.hidden, d.n_classes).double()

        def forward(self, x):
            return self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))

    torch.manual_seed(d.seed)
    net = MLP()
    fit(
        net,
        list(t["public"]),
        lambda m, a, b: torch.nn.functional.cross_entropy(m(a), b),
        epochs=30,
        batch_size=256,
        optimizer="adam",
        lr=3e-3,
        seed=d.seed,
        desc="prism.base",
        grad_clip=1.0,
    )
    wt = {
        "W1": net.l1.weight,
        "b1": net.l1.bias,
        "W2": net.l2.weight,
        "b2": net.l2.bias,
        "W3": net.l3.weight,
        "b3": net.l3.bias,
    }
    return {
        "x_train": t["train"][0],
        "y_train": t["train"][1],
        "x_test": t["test"][0],
        "y_test": t["test"][1],
        "base": {k: v.detach().clone() for k, v in wt.items()},
        "alpha": torch.tensor(float("nan")),
        "flip_frac": torch.tensor(float("nan")),
    }


def calibrate_noise(p: Params, task: dict) -> dict:
    """σ for every ε any variant asks for, from opacus' RDP accountant (Poisson rate q = b/N, T steps);
    computed once here so the variant nodes share it."""
    from pipelines.prism.privacy import noise_multiplier, steps_and_rate

    steps, q = steps_and_rate(p, len(task["y_train"]))
    eps = sorted({e for v in p.variants for e in p.methods[v].epsilons} | {p.privacy.main_epsilon})
    return {
        "steps": steps,
        "sample_rate": q,
        "delta": p.privacy.delta,
        "sigma": {str(e): noise_multiplier(e, p.privacy.delta, q, steps) for e in eps},
    }
