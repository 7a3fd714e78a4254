"""Train one variant on every seed and log, per step, what the paper's anatomy of a spike needs: the loss,
Σg² against Σv̂ (decoupling), η·λ_max(Ĥ) of the preconditioned Hessian, η·λ_grad (the gradient-directional
curvature uᵀHu / gᵀu of the update actually applied), η·λ_max(H) and cos(D^½g, q_max).

The MLP trains through core's loop (``core.training.fit``) with an Adam / SGD instance built here and kept,
so the per-step callback can read its second moments; the quadratic is an exact scalar recursion in log
space (``model.quad_run``), since its loss leaves float64's range."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.adamspike.model import MlpCurvature, flat_params, make_mlp, quad_run
from pipelines.adamspike.params import Params, Variant
from pipelines.core.api import node_setup, np_rng

COLUMNS = [
    "seed",
    "step",
    "log10_loss",
    "log10_loss_next",
    "eta_lambda_grad",
    "eta_lambda_max_precond",
    "eta_lambda_max_raw",
    "decoupling_ratio",
    "cos_grad_topeig",
    "log10_sum_g2",
    "log10_sum_v",
]


def _log10(x):
    with np.errstate(divide="ignore"):
        return np.log10(x)


def run_quad(p: Params, cfg: Variant, seed: int) -> pd.DataFrame:
    q = p.quad
    tr = quad_run(q.a, q.theta0, q.lr, q.steps, cfg.optimizer, cfg.beta1, cfg.beta2, cfg.eps)
    n = q.steps
    out = pd.DataFrame(
        {
            "seed": seed,
            "step": np.arange(n),
            "log10_loss": tr.log10_loss[:-1],
            "log10_loss_next": tr.log10_loss[1:],
            "eta_lambda_grad": tr.eta_lambda_grad,
            "eta_lambda_max_precond": tr.eta_lambda_precond,
            "eta_lambda_max_raw": np.full(n, q.lr * q.a),
            "decoupling_ratio": 10.0 ** np.clip(tr.log10_g2 - tr.log10_v, -300, 300),
            "cos_grad_topeig": np.ones(n),
            "log10_sum_g2": tr.log10_g2,
            "log10_sum_v": tr.log10_v,
        }
    )
    if cfg.optimizer == "gd":  # no second moment: v̂ and the decoupling ratio are undefined
        out[["decoupling_ratio", "log10_sum_v"]] = np.nan
    return out


class Tracker:
    """The per-step callback: reads the optimizer's state and probes the curvature at θ_t, the point the
    step started from (θ_t is kept from the previous call; the update actually applied is (θ_t − θ_{t+1})/η)."""

    def __init__(self, model, curvature, cfg: Variant, p: Params, seed: int, lr: float, steps: int):
        import torch

        self.model, self.curv, self.cfg, self.p, self.lr, self.steps = model, curvature, cfg, p, lr, steps
        self.opt: torch.optim.Optimizer | None = None
        self.params = list(model.parameters())
        self.prev = flat_params(model)
        rng = np_rng(seed, "probe_directions")
        self.q_pre = rng.normal(size=self.prev.size)
        self.q_raw = rng.normal(size=self.prev.size)
        self.rec = {c: np.full(steps, np.nan) for c in COLUMNS if c not in ("seed", "step")}

    def make_optimizer(self, params):
        import torch

        c = self.cfg
        if c.optimizer == "gd":
            self.opt = torch.optim.SGD(params, lr=self.lr, momentum=0.0, weight_decay=0.0, foreach=True)
        else:
            # the fused kernel: same update as the reference loop, ~2x less per-step overhead on tiny tensors
            self.opt = torch.optim.Adam(
                params, lr=self.lr, betas=(c.beta1, c.beta2), eps=c.eps, weight_decay=0.0, fused=True
            )
        return self.opt

    def __call__(self, info) -> None:
        t = info.step
        r = self.rec
        r["log10_loss"][t] = math.log10(info.loss) if info.loss > 0 else -np.inf
        # numpy views of the CPU tensors (no copies): this runs at every step of every run
        grads = [q.grad.detach().cpu().numpy().ravel() for q in self.params]
        sg2 = float(sum(gi @ gi for gi in grads))
        if self.cfg.optimizer == "gd":
            sv, bc, vs = float("nan"), 1.0, None  # no second moment: the decoupling ratio is undefined for GD
        else:
            st = [self.opt.state[q] for q in self.params]
            bc = 1.0 - self.cfg.beta2 ** float(st[0]["step"])
            vs = [s["exp_avg_sq"].detach().cpu().numpy().ravel() for s in st]
            sv = float(sum(vi.sum() for vi in vs)) / bc
        r["log10_sum_g2"][t], r["log10_sum_v"][t] = _log10(sg2), _log10(sv)
        r["decoupling_ratio"][t] = sg2 / sv if sv > 0 else (np.inf if sv == 0 else np.nan)
        if not self.cfg.track:
            return
        theta_new = flat_params(self.model)
        theta_old, self.prev = self.prev, theta_new
        g = np.concatenate(grads)
        d = np.ones_like(g) if vs is None else 1.0 / (np.sqrt(np.concatenate(vs) / bc) + self.cfg.eps)
        u = (theta_old - theta_new) / self.lr
        c = self.curv.at(theta_old)
        sd = np.sqrt(d)
        # one batched HVP per power-iteration step: [H(D½q_pre)] (+ H q_raw while its iterations last) (+ H u first)
        q_pre, q_raw = self.q_pre / np.linalg.norm(self.q_pre), self.q_raw / np.linalg.norm(self.q_raw)
        n_pre, n_raw = self.p.tracking.power_iters, self.p.tracking.raw_power_iters
        lam = lam_raw = np.nan
        for i in range(max(n_pre, n_raw)):
            cols = [sd * q_pre] + ([q_raw] if i < n_raw else []) + ([u] if i == 0 else [])
            hv = c.hvp(np.stack(cols, axis=1)) if len(cols) > 1 else c.hvp(cols[0])[:, None]
            if i == 0:
                hu = hv[:, -1]
            if i < n_pre:
                q_pre, lam = _power_step(q_pre, sd * hv[:, 0])
            if i < n_raw:
                q_raw, lam_raw = _power_step(q_raw, hv[:, 1])
        self.q_pre, self.q_raw = q_pre, q_raw
        gu = float(g @ u)
        # ΔL ≈ −η gᵀu + ½η² uᵀHu rises iff η uᵀHu/gᵀu > 2 when gᵀu > 0; gᵀu ≤ 0 rises already at first order
        r["eta_lambda_grad"][t] = self.lr * float(u @ hu) / gu if gu > 0 else np.inf
        r["eta_lambda_max_precond"][t] = self.lr * lam
        r["eta_lambda_max_raw"][t] = self.lr * lam_raw
        pg = sd * g
        npg = float(np.linalg.norm(pg))
        r["cos_grad_topeig"][t] = abs(float(pg @ self.q_pre)) / npg if npg > 0 else np.nan


def _power_step(q: np.ndarray, aq: np.ndarray) -> tuple[np.ndarray, float]:
    """One power-iteration step from the unit vector q given A q: (next iterate, Rayleigh quotient qᵀAq)."""
    lam = float(q @ aq)
    norm = float(np.linalg.norm(aq))
    return (aq / norm if norm > 0 and math.isfinite(norm) else q), lam


class _TorchCurvature:
    """The same interface as ``MlpCurvature`` by torch double-backward (any model; GPU-capable)."""

    def __init__(self, model, x, y):
        import copy

        self.model, self.x, self.y = copy.deepcopy(model), x, y

    def at(self, theta: np.ndarray):
        import torch

        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(
                torch.as_tensor(theta, dtype=self.x.dtype, device=self.x.device), self.model.parameters()
            )
        return self

    def hvp(self, v: np.ndarray) -> np.ndarray:
        from pipelines.adamspike.model import autograd_hvp

        return autograd_hvp(self.model, self.x, self.y, v)


def run_mlp(data: pd.DataFrame, p: Params, cfg: Variant, seed: int, variant: str) -> pd.DataFrame:
    import torch
    import torch.nn.functional as F

    from pipelines.core.api import fit

    device = node_setup(p, seed)
    x = torch.tensor(data["x"].to_numpy(float), dtype=torch.float64, device=device)[:, None]
    y = torch.tensor(data["y"].to_numpy(float), dtype=torch.float64, device=device)
    model = make_mlp(p.mlp.width, seed).to(device)
    curv = (
        MlpCurvature(x.cpu().numpy(), y.cpu().numpy(), p.mlp.width)
        if p.tracking.hvp == "analytic"
        else _TorchCurvature(model, x, y)
    )
    tracker = Tracker(model, curv, cfg, p, seed, p.mlp.lr, p.mlp.steps)
    # full batch, no clipping, no weight decay: the paper's plain Adam (clipping would cap the spikes)
    y_col = y[:, None]
    fit(
        model,
        None,
        lambda m, a, b: F.mse_loss(m(a), b),
        steps=p.mlp.steps,
        sample_batch=lambda step, gen: (x, y_col),
        lr=p.mlp.lr,
        weight_decay=0.0,
        optimizer=tracker.make_optimizer,
        grad_clip=None,
        seed=seed,
        desc=f"adamspike.{variant}",
        callback=tracker,
    )
    with torch.no_grad():
        final = float(((model(x).squeeze(-1) - y) ** 2).mean())
    rec = tracker.rec
    rec["log10_loss_next"][:-1] = rec["log10_loss"][1:]
    rec["log10_loss_next"][-1] = math.log10(final) if final > 0 else -np.inf
    return pd.DataFrame({"seed": seed, "step": np.arange(p.mlp.steps), **{c: rec[c] for c in COLUMNS[2:]}})


def train_variant(dataset: pd.DataFrame, p: Params, variant: str):
    """Every seed of one variant: its long results table (per-seed metrics, curves) and, for the plots and
    the spike-event table, the per-step table (columns ``COLUMNS``) as tensors."""
    from pipelines.adamspike.evaluate import results_table, steps_artifact

    cfg = p.configs[variant]
    frames = []
    for seed in p.seeds:
        node_setup(p, seed)
        frames.append(run_quad(p, cfg, seed) if cfg.model == "quad" else run_mlp(dataset, p, cfg, seed, variant))
    run = pd.concat(frames, ignore_index=True)[COLUMNS]
    return results_table(p, variant, run), steps_artifact(run)
