"""Training stage of `featjnd`: the backbone CNN on the image set (one shared fit, `train.backbone`), then one
FeatJND estimator per split point, each a variant node `train.estimator_<split>` (card, Mechanism: relaxed
chance-constrained loss with dual ascent on μ, then the global scale s calibrated on val so that the val
flip rate is ρ). Both fits run through core's training loop."""

from __future__ import annotations

import math

import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import StepInfo, fit, node_setup
from pipelines.featjnd.model import JNDEstimator, SmallCNN, calibrate_scale, flip_rate, freeze, jnd_loss, sample_noise
from pipelines.featjnd.params import Params, split_of

SPLIT_SEED_OFFSET = {"s1": 1000, "s2": 2000}  # the estimator of each split gets its own stream


def build_backbone(data: dict[str, torch.Tensor], widths: list[int]) -> SmallCNN:
    n_classes = int(max(int(data["y_train"].max()), int(data["y_test"].max())) + 1)
    return SmallCNN(in_ch=data["x_train"].shape[1], widths=tuple(widths), n_classes=n_classes)


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, batch: int = 512) -> torch.Tensor:
    return torch.cat([model(x[i : i + batch]) for i in range(0, x.shape[0], batch)])


@torch.no_grad()
def encode(model: SmallCNN, x: torch.Tensor, split: str, batch: int = 512) -> torch.Tensor:
    return torch.cat([model.encode(x[i : i + batch], split) for i in range(0, x.shape[0], batch)])


def train_backbone(images: dict, p: Params) -> dict[str, dict[str, torch.Tensor]]:
    """Node (shared fit): the small CNN per seed (Adam, fixed epochs; it overfits the train set, as in the
    card). Every estimator variant reads it frozen."""
    out = {}
    for seed in p.seeds:
        device = node_setup(p, seed)
        data = images[f"seed{seed}"]
        model = build_backbone(data, p.backbone.widths).to(device)
        x, y = data["x_train"].to(device), data["y_train"].to(device)
        # weight_decay=0 and no clipping: plain Adam, as the card trains it
        fit(
            model,
            [x, y],
            lambda m, xb, yb: F.cross_entropy(m(xb), yb),
            epochs=p.backbone.epochs,
            lr=p.backbone.lr,
            weight_decay=0.0,
            batch_size=p.backbone.batch_size,
            seed=seed,
            desc=f"featjnd backbone seed {seed}",
            grad_clip=None,
        )
        out[f"seed{seed}"] = {k: v.cpu() for k, v in model.state_dict().items()}
    return out


def load_backbone(data: dict, state: dict, widths: list[int], device: torch.device) -> SmallCNN:
    model = build_backbone(data, widths)
    model.load_state_dict(state)
    return freeze(model.to(device))


def train_estimator(images: dict, backbones: dict, p: Params, variant: str) -> dict[str, dict]:
    """Node `train.estimator_<split>`: the FeatJND estimator at the variant's split point for every seed:
    state, channel std, scale s, val flip rate, history (epoch, train loss, mean flip rate, μ)."""
    split = split_of(variant)
    e = p.estimator
    out = {}
    for seed in p.seeds:
        stream = seed + SPLIT_SEED_OFFSET[split]
        device = node_setup(p)
        data = images[f"seed{seed}"]
        model = load_backbone(data, backbones[f"seed{seed}"], p.backbone.widths, device)
        f_train = encode(model, data["x_train"].to(device), split)
        # per-channel train std: J is reported in these normalised units, comparable across splits
        std = f_train.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)[0]
        fn_train = f_train / std
        clean_train = torch.cat([model.head(f_train[i : i + 512], split) for i in range(0, len(f_train), 512)])

        def head(t: torch.Tensor) -> torch.Tensor:
            return model.head(t, split)

        node_setup(p, stream)  # seeded after the backbone's throw-away init: the estimator's init is the stream's
        gen = torch.Generator().manual_seed(stream)
        noise_gen = torch.Generator(device=device).manual_seed(stream)
        est = JNDEstimator(fn_train.shape[1], e.hidden, e.j_max).to(device)
        dual = {"log_mu": math.log(e.mu_init)}
        log: list[tuple[float, float]] = []

        def loss_fn(m: JNDEstimator, fn: torch.Tensor, clean: torch.Tensor):
            loss, flip = jnd_loss(
                m.raw(fn),
                fn,
                std,
                clean,
                head,
                e.k_samples,
                e.tau,
                e.lambda_m,
                math.exp(dual["log_mu"]),
                e.noise_dist,
                e.magnitude_metric,
                noise_gen,
            )
            return loss, {"flip": flip}

        def dual_ascent(info: StepInfo) -> None:
            # after each primal step, dual ascent on the mini-batch flip rate: μ grows while flips exceed ρ
            flip = info.extras["flip"]
            dual["log_mu"] = min(max(dual["log_mu"] + e.eta * (flip - e.rho) / e.rho, -20.0), 20.0)
            log.append((flip, math.exp(dual["log_mu"])))

        res = fit(
            est,
            [fn_train, clean_train],
            loss_fn,
            epochs=e.epochs,
            lr=e.lr,
            weight_decay=0.0,
            batch_size=e.batch_size,
            seed=int(torch.randint(0, 2**31 - 1, (1,), generator=gen)),
            desc=f"featjnd {variant} seed {seed}",
            callback=dual_ascent,
            grad_clip=1.0,
        )
        steps = math.ceil(len(fn_train) / e.batch_size)
        history = torch.tensor(
            [
                [
                    h["epoch"],
                    h["train_loss"],
                    sum(fl for fl, _ in log[i * steps : (i + 1) * steps]) / steps,
                    log[min((i + 1) * steps, len(log)) - 1][1],
                ]
                for i, h in enumerate(res.history)
            ],
            dtype=torch.float32,
        )

        # calibration on val: one global s so that the val flip rate is ρ (train flips understate it)
        f_val = encode(model, data["x_val"].to(device), split)
        fn_val = f_val / std
        with torch.no_grad():
            j_val = est.raw(fn_val)
        draws = [sample_noise(tuple(fn_val.shape), e.noise_dist, noise_gen, device) for _ in range(e.calib_draws)]
        s = calibrate_scale(j_val, fn_val, std, head, e.rho, e.calib_steps, draws)
        est.scale.fill_(s)
        flip_val = flip_rate(s * j_val, fn_val, std, head, draws)
        out[f"seed{seed}"] = {
            "state": {k: v.cpu() for k, v in est.state_dict().items()},
            "std": std.cpu(),
            "scale": float(s),
            "flip_rate_val": float(flip_val),
            "train_flip_rate_last_epoch": float(history[-1, 2]),
            "history": history,
        }
    return out


def train_variant(images: dict, backbones: dict, p: Params, variant: str):
    """Node `train.estimator_<split>`: the estimator at the variant's split point (every seed), then E1–E3
    with its fit-free controls (evaluate.evaluate_variant: they share the estimator's noise draws). Returns
    the long table, one row variant per map / allocation with split-prefixed metrics
    (``featjnd``: ``s1_acc_snr0``, ...), and the artifacts: the estimators (state, scale, training history)
    and the saved maps."""
    from pipelines.core.api import Results
    from pipelines.featjnd.evaluate import evaluate_variant

    estimators = train_estimator(images, backbones, p, variant)
    long, maps = evaluate_variant(images, backbones, estimators, p, variant)
    res = {v: Results(v) for v in dict.fromkeys(long["variant"])}
    for (v, seed), d in long.groupby(["variant", "seed"], sort=False):
        res[v].add(int(seed), **{f"{s}_{m}": x for s, m, x in zip(d["split"], d["metric"], d["value"])})
    return pd.concat([r.table() for r in res.values()], ignore_index=True), {"estimators": estimators, "maps": maps}
