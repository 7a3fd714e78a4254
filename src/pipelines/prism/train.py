"""Train one variant (the method or a baseline) over the seeds and the ε grid (and, for the variants that
declare gauges, the gauge stress test at the main ε), with core's training loop and Poisson sampling."""

import math
import time

import numpy as np
import torch

from pipelines.core.api import fit, node_setup
from pipelines.prism.model import LAYERS, AdaptedMLP, DPStep, tangent_dim
from pipelines.prism.params import Params, VariantCfg


def gauge_matrix(name: str, r: int, gen: torch.Generator, dtype=torch.float64) -> torch.Tensor | None:
    if name == "s1":
        return None
    if name in ("s0.1", "s10"):
        return float(name[1:]) * torch.eye(r, dtype=dtype)
    q1 = torch.linalg.qr(torch.randn(r, r, generator=gen, dtype=dtype))[0]
    q2 = torch.linalg.qr(torch.randn(r, r, generator=gen, dtype=dtype))[0]
    return q1 @ torch.diag(torch.logspace(-1, 1, r, dtype=dtype)) @ q2.T  # condition number 100


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return 100.0 * float((model(x).argmax(1) == y).double().mean())


def run_one(
    task: dict,
    p: Params,
    cfg: VariantCfg,
    seed: int,
    epsilon: float | None,
    sigma: float,
    steps: int,
    q: float,
    gauge: str = "s1",
    name: str = "prism",
    init: str = "standard",
) -> dict:
    dtype = torch.float64 if p.dtype == "float64" else torch.float32
    x, y = task["x_train"].to(dtype), task["y_train"]
    xt, yt = task["x_test"].to(dtype), task["y_test"]
    n = len(y)
    init_gen = torch.Generator().manual_seed(10_000 + seed)
    init = "balanced" if cfg.mechanism == "prism" else init  # PRISM needs Z0 on the rank-r manifold
    G = gauge_matrix(gauge, p.lora.rank, torch.Generator().manual_seed(20_000 + seed))
    model = AdaptedMLP(
        task["base"],
        "dense" if cfg.mechanism == "dense" else "lora",
        p.lora.rank,
        init,
        p.lora.init_scale,
        G,
        init_gen,
        dtype,
        freeze_B=cfg.mechanism == "ffa",
    )
    noise_gen = torch.Generator().manual_seed(30_000 + seed)
    holder = {}

    if cfg.mechanism == "nonprivate":
        optimizer = "adam"
    else:

        def optimizer(params):
            holder["opt"] = DPStep(
                model,
                cfg.mechanism,
                cfg.optimizer,
                cfg.lr,
                sigma,
                p.privacy.clip,
                p.privacy.batch_size,
                noise_gen,
                p.adaptive.beta1,
                p.adaptive.beta2,
                p.adaptive.floor,
            )
            return holder["opt"]

    def sample_batch(step: int, gen: torch.Generator):
        idx = (torch.rand(n, generator=gen) < q).nonzero().squeeze(1)  # Poisson sampling, rate q
        if len(idx) == 0:  # P = (1−q)^N ≈ e^{−b}: never at b = 256; keeps the loss defined
            idx = torch.randint(n, (1,), generator=gen)
        return x[idx], y[idx]

    losses = []
    t0 = time.perf_counter()
    res = fit(
        model,
        None,
        lambda mdl, a, b: torch.nn.functional.cross_entropy(mdl(a), b),
        steps=steps,
        sample_batch=sample_batch,
        optimizer=optimizer,
        lr=cfg.lr,
        weight_decay=0.0,
        grad_clip=None,
        seed=seed,
        desc=name,
        callback=lambda s: losses.append(s.loss),
    )
    wall = time.perf_counter() - t0
    acc = accuracy(model, xt, yt)
    if not math.isfinite(acc) or not all(torch.isfinite(q_).all() for q_ in model.parameters()):
        raise FloatingPointError(f"node 'prism.train.{name}': non-finite weights (seed {seed}, eps {epsilon})")
    out = {
        "test_acc": acc,
        "train_loss": float(np.mean(losses[-50:])),
        "step_time_s": wall / max(res.steps_run, 1),
        "loss_history": losses[::10],
    }
    opt = holder.get("opt")
    if opt is not None:
        out["clip_fraction"] = float(np.mean(opt.log["clip_fraction"]))
        out["noise_z_fro_measured"] = float(math.sqrt(np.mean(opt.log["noise_sq"])))
        out["noise_norms"] = [float(math.sqrt(v)) for v in opt.log["noise_sq"][::5]]
        if opt.log["noise_factor_sq"]:
            out["noise_factor_fro"] = float(math.sqrt(np.mean(opt.log["noise_factor_sq"])))
        if opt.log["noise_sq_closed"]:
            out["noise_z_fro_closed_form"] = float(math.sqrt(np.mean(opt.log["noise_sq_closed"])))
            out["sigma_min_S"] = float(np.min(opt.log["sigma_min_S"]))
            out["sigma_min_S_history"] = opt.log["sigma_min_S"][::10]
    return out


def train_variant(task: dict, noise: dict, p: Params, variant: str):
    """Every (seed, ε) run of one variant, plus its gauge runs at the main ε: the long results table and
    the raw runs (JSON-able; the plots read the per-step noise norms from them)."""
    from pipelines.prism.privacy import epsilon_spent

    cfg = p.methods[variant]
    steps, q = noise["steps"], noise["sample_rate"]
    runs = []
    for seed in p.seeds:
        node_setup(p, int(seed))
        grid = cfg.epsilons or [None]
        for eps in grid:
            sigma = noise["sigma"][str(eps)] if eps is not None else 0.0
            r = run_one(task, p, cfg, int(seed), eps, sigma, steps, q, "s1", variant)
            r.update(
                seed=int(seed),
                epsilon=eps,
                gauge="s1",
                sigma=sigma,
                epsilon_spent=epsilon_spent(sigma, noise["delta"], q, steps) if eps is not None else None,
            )
            runs.append(r)
        gauges = cfg.gauges if p.gauge_seeds is None or seed in p.gauge_seeds else []
        for g in gauges:  # the main run is the s1 gauge when it used the same init
            same_init = cfg.mechanism == "prism" or p.lora.gauge_init == "standard"
            if g == "s1" and same_init and p.privacy.main_epsilon in grid:
                continue
            eps = p.privacy.main_epsilon
            sigma = noise["sigma"][str(eps)]
            r = run_one(task, p, cfg, int(seed), eps, sigma, steps, q, g, variant, p.lora.gauge_init)
            r.update(seed=int(seed), epsilon=eps, gauge=g, sigma=sigma)
            runs.append(r)
    raw = {
        "variant": variant,
        "mechanism": cfg.mechanism,
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "runs": runs,
        "dims": {l: tangent_dim(*task["base"][f"W{l}"].shape, p.lora.rank) for l in LAYERS},
    }
    return results_table(p, variant, runs), raw


def _eps_key(e) -> str:
    return f"{float(e):g}"


def results_table(p: Params, variant: str, runs: list[dict]):
    """The long table of one variant: per seed, accuracy at each ε (gauge s1), the main run's diagnostics,
    the gauge stress test's accuracies and spread, and the main run's loss / σ_min(S) curves (every 10 steps)."""
    from pipelines.core.api import Results

    res = Results(variant)
    main = p.privacy.main_epsilon
    for seed in sorted({r["seed"] for r in runs}):
        mine = [r for r in runs if r["seed"] == seed]
        res.add(
            seed,
            **{
                f"test_acc_eps{_eps_key(r['epsilon'])}": r["test_acc"]
                for r in mine
                if r["gauge"] == "s1" and r["epsilon"] is not None
            },
        )
        main_run = next((r for r in mine if r["gauge"] == "s1" and r["epsilon"] in (None, main)), mine[0])
        res.add(seed, test_acc=main_run["test_acc"])
        res.add(
            seed,
            **{
                k: main_run.get(k)
                for k in (
                    "train_loss",
                    "step_time_s",
                    "clip_fraction",
                    "noise_z_fro_measured",
                    "noise_factor_fro",
                    "noise_z_fro_closed_form",
                    "sigma_min_S",
                    "sigma",
                    "epsilon_spent",
                )
            },
        )
        if main_run.get("noise_z_fro_closed_form") is not None:
            res.add(seed, noise_z_ratio=main_run["noise_z_fro_measured"] / main_run["noise_z_fro_closed_form"])
        gauges = {r["gauge"]: r["test_acc"] for r in mine if r["epsilon"] == main}
        if len(gauges) > 1:
            res.add(seed, **{f"test_acc_gauge_{g}": a for g, a in gauges.items()})
            res.add(
                seed,
                **{
                    f"noise_z_fro_gauge_{r['gauge']}": r["noise_z_fro_measured"]
                    for r in mine
                    if r["epsilon"] == main and "noise_z_fro_measured" in r
                },
            )
            res.add(seed, gauge_spread_acc=max(gauges.values()) - min(gauges.values()))
        for key, hist in (("train_loss", "loss_history"), ("sigma_min_S", "sigma_min_S_history")):
            if main_run.get(hist):
                res.history(seed, key, main_run[hist], steps=range(0, 10 * len(main_run[hist]), 10))
    return res.table()
