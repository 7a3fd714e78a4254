"""Evaluation of `featjnd` (card, Experiments): E1 matched-distortion test against Gaussian, shuffled,
inverse and saliency-inverse maps; E2 attribution (bg/fg tolerance ratio, rank agreement with
gradient×input and occlusion); E3 token-wise dynamic quantization with FeatJND / permuted / uniform /
saliency-inverse step allocations at the same noise budget, measured in the estimator variant's node
(`train.estimator_<split>` fits the estimator, then calls :func:`evaluate_variant`); the derived gaps
(declared in spec.py) and the plots read the gathered tables.

The E1/E3 controls (gauss, shuffled, shuffled_all, inverse, sal_inv, perm_step, uniform_step) have nothing to
fit: they are built from the variant's J (or the frozen head's gradient) and share its noise draw z and
dither u (common random numbers), so they are measured in the variant's node: one table row variant per map / allocation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import Estimate, node_setup, paired, t_interval
from pipelines.featjnd import ops
from pipelines.featjnd.model import SPLITS, JNDEstimator, flip_rate, sample_noise
from pipelines.featjnd.params import Params, split_of
from pipelines.featjnd.train import encode, load_backbone

E1_MAPS = ("featjnd", "gauss", "shuffled", "shuffled_all", "inverse", "sal_inv")
E3_ALLOCS = ("featjnd", "perm_step", "uniform_step", "sal_inv")
EVAL_SEED_OFFSET = {"s1": 3000, "s2": 4000}


def snr_tag(s: float) -> str:
    """10 → '10', −5 → 'm5', 2.5 → '2p5' (metric-name safe)."""
    t = f"{abs(s):g}".replace(".", "p")
    return ("m" if s < 0 else "") + t


def step_tag(d: float) -> str:
    return f"{d:g}".replace(".", "p")


def gradient_x_input(head, fn: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """|∂ logit_ŷ / ∂f ⊙ f| for the *predicted* class ŷ (no labels), in normalised units."""
    out = []
    for i in range(0, fn.shape[0], batch):
        f = fn[i : i + batch].clone().requires_grad_(True)
        logits = head(f)
        sel = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
        (g,) = torch.autograd.grad(sel, f)
        out.append((g * f).abs().detach())
    return torch.cat(out)


@torch.no_grad()
def accuracy(head, fn: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    correct = 0
    for i in range(0, fn.shape[0], batch):
        correct += int((head(fn[i : i + batch]).argmax(-1) == y[i : i + batch]).sum())
    return correct / fn.shape[0]


@torch.no_grad()
def occlusion_drop(head, fn: torch.Tensor, patch: int) -> torch.Tensor:
    """Drop of the predicted-class probability when a patch×patch block of tokens is zeroed (B×Hp×Wp)."""
    b, c, h, w = fn.shape
    probs = torch.softmax(head(fn), -1)
    pred = probs.argmax(-1, keepdim=True)
    p0 = probs.gather(1, pred).squeeze(1)
    hp, wp = math.ceil(h / patch), math.ceil(w / patch)
    drops = torch.zeros(b, hp, wp)
    for r in range(hp):
        for col in range(wp):
            occ = fn.clone()
            occ[:, :, r * patch : (r + 1) * patch, col * patch : (col + 1) * patch] = 0.0  # "off" for ReLU features
            drops[:, r, col] = (p0 - torch.softmax(head(occ), -1).gather(1, pred).squeeze(1)).cpu()
    return drops


def evaluate_variant(
    images: dict, backbones: dict, estimators: dict, p: Params, variant: str
) -> tuple[pd.DataFrame, dict]:
    """E1–E3 at the variant's split point for every seed (in `train.estimator_<split>`): long table
    (seed, split, variant, metric, value; `variant` there is the map / allocation) and the saved maps."""
    split = split_of(variant)
    ev, e = p.evaluation, p.estimator
    device = node_setup(p)
    rows: list[dict] = []
    maps: dict[str, dict] = {}
    for seed in p.seeds:
        data, st = images[f"seed{seed}"], estimators[f"seed{seed}"]
        model = load_backbone(data, backbones[f"seed{seed}"], p.backbone.widths, device)
        std = st["std"].to(device)

        def head(t: torch.Tensor) -> torch.Tensor:
            return model.head(t * std, split)

        x, y = data["x_test"].to(device), data["y_test"].to(device)
        fn = encode(model, x, split) / std
        est = JNDEstimator(fn.shape[1], e.hidden, e.j_max).to(device)
        est.load_state_dict(st["state"])
        est.eval()
        with torch.no_grad():
            j = torch.cat([est(fn[i : i + 512]) for i in range(0, len(fn), 512)])
        gen = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET[split])

        def rec(name: str, metric: str, value: float) -> None:
            rows.append({"seed": seed, "split": split, "variant": name, "metric": metric, "value": float(value)})

        acc_clean = accuracy(head, fn, y)
        for v in set(E1_MAPS) | set(E3_ALLOCS):
            rec(v, "acc_clean", acc_clean)
        rec("featjnd", "calib_scale", st["scale"])
        rec("featjnd", "flip_rate_at_J_val", st["flip_rate_val"])
        draws = [sample_noise(tuple(fn.shape), e.noise_dist, gen).to(device) for _ in range(e.calib_draws)]
        rec("featjnd", "flip_rate_at_J_test", flip_rate(j, fn, std, lambda t: model.head(t, split), draws))

        # ---- E1: matched-distortion test (same z for every map: common random numbers) ----
        gxi = gradient_x_input(head, fn)
        sal_inv = 1.0 / (gxi + ev.sal_eps * gxi.mean(dim=(1, 2, 3), keepdim=True))
        shuffled = ops.shuffle_spatial(j.cpu(), gen).to(device)
        shaped = {
            "featjnd": j,
            "gauss": torch.ones_like(j),
            "shuffled": shuffled,
            "shuffled_all": ops.shuffle_all(j.cpu(), gen).to(device),
            "inverse": 1.0 / j,
            "sal_inv": sal_inv,
        }
        z = sample_noise(tuple(fn.shape), e.noise_dist, gen).to(device)
        for name, m in shaped.items():
            accs, direction = [], m * z
            for s in ev.snr_db:
                delta = ops.match_energy(direction, fn, s)
                acc = accuracy(head, fn + delta, y)
                rec(name, f"acc_snr{snr_tag(s)}", acc)
                accs.append(acc)
            rec(name, "auc_acc_vs_snr", float(np.mean(accs)))

        # ---- E2: attribution ----
        h, w = fn.shape[2:]
        mask = ops.pooled_mask(data["mask_test"].to(device), (h, w))
        sens = (-torch.log(j)).mean(1)  # S = mean_c(−log J): high where little is tolerated
        sal_pos = gxi.mean(1)
        rec("featjnd", "spearman_jnd_saliency", ops.spearman(sens.flatten(1), sal_pos.flatten(1)).mean())
        if ev.occlusion_images > 0:
            n_occ = min(ev.occlusion_images, len(fn))
            drop = occlusion_drop(head, fn[:n_occ], ev.occlusion_patch)
            sens_p = (
                torch.nn.functional.avg_pool2d(sens[:n_occ].unsqueeze(1), ev.occlusion_patch, ceil_mode=True)
                .squeeze(1)
                .cpu()
            )
            rec("featjnd", "spearman_jnd_occlusion", ops.spearman(sens_p.flatten(1), drop.flatten(1)).mean())
        for name, m in (("featjnd", j), ("shuffled", shuffled), ("sal_inv", sal_inv)):
            ratio = ops.bg_fg_ratio(m.mean(1), mask)
            rec(name, "jnd_bgfg_ratio", torch.nanmean(ratio))
            energy = m.pow(2).sum(1)
            share = (energy * (~mask)).sum((1, 2)) / energy.sum((1, 2))
            rec(name, "bg_energy_share", share.mean())  # logged only: the background covers most positions
        rec("featjnd", "bg_position_share", (~mask).float().mean())

        # ---- E3: token-wise dynamic quantization at matched budget mean_t Δ_t² = Δ0² ----
        u = (torch.rand(fn.shape, generator=gen) - 0.5).to(device)  # one dither for every allocation
        w_jnd = ops.token_weights(j, ev.token_aggregation)
        w_sal = ops.token_weights(sal_inv, ev.token_aggregation)
        qacc: dict[tuple[str, bool], list[float]] = {}
        for d0 in ev.steps_for(split):
            steps_jnd = ops.steps_from_weights(w_jnd, d0)
            allocs = {
                "featjnd": steps_jnd,
                "perm_step": ops.permute_steps(steps_jnd.cpu(), gen).to(device),
                "uniform_step": torch.full_like(steps_jnd, d0),
                "sal_inv": ops.steps_from_weights(w_sal, d0),
            }
            for name, steps in allocs.items():
                for dith in (False, True):
                    fq, sym = ops.quantize(fn, steps, ev.q_clip, u if dith else None)
                    sfx = "_dither" if dith else ""
                    acc = accuracy(head, fq, y)
                    qacc.setdefault((name, dith), []).append(acc)
                    rec(name, f"qacc_D{step_tag(d0)}{sfx}", acc)
                    rec(name, f"qmse_D{step_tag(d0)}{sfx}", (fq - fn).pow(2).mean())
                    rec(name, f"bits_D{step_tag(d0)}{sfx}", ops.entropy_bits(sym))
        for (name, dith), accs in qacc.items():
            rec(name, "qacc_mean" + ("_dither" if dith else ""), float(np.mean(accs)))

        n = min(ev.maps_saved, len(fn))
        maps[f"seed{seed}"] = {
            "J": j[:n].half().cpu(),
            "x": data["x_test"][:n],
            "mask": data["mask_test"][:n],
            "saliency": sal_pos[:n].cpu(),
            "y": data["y_test"][:n],
        }
    return pd.DataFrame(rows), maps


# ----------------------------------------------------------------------------------------------- derived

OTHERS_E1 = ("gauss", "shuffled", "shuffled_all", "inverse", "sal_inv")
OTHERS_E3 = ("uniform_step", "perm_step", "sal_inv")


def _splits(p: Params) -> list[str]:
    return [sp for sp in SPLITS if f"estimator_{sp}" in p.variants]


def derived_names(p: Params, planned) -> list[str]:
    """Every derived metric of the planned splits (what the claims may name)."""
    out = []
    low = [s for s in p.evaluation.snr_db if s <= 0]
    for sp in _splits(p):
        out += [f"gap_pts.{sp}_auc_acc_vs_snr.featjnd_vs_gauss", f"gap_pts.{sp}_auc_acc_vs_snr.gauss_vs_inverse"]
        out += [f"gap_pts.{sp}_acc_snr{snr_tag(s)}.featjnd_vs_{o}" for s in p.evaluation.snr_db for o in OTHERS_E1]
        out.append(f"max_abs_gap_pts.{sp}_acc_snr.shuffled_all_vs_gauss")
        if low:
            out.append(f"min_gap_pts.{sp}_acc_snr_le0.featjnd_vs_shuffled")
        out.append(f"abs_dev_from_1.{sp}_jnd_bgfg_ratio.shuffled")
        out += [f"gain_pts.{sp}_qacc_mean{sfx}.featjnd_vs_{o}" for sfx in ("", "_dither") for o in OTHERS_E3]
        # headroom of the plain-rounding comparison (gates): the uniform step's accuracy at its worst
        # budget, and its loss against clean accuracy (mean over budgets)
        out += [f"min_qacc.{sp}_qacc.uniform_step", f"qloss_pts.{sp}_qacc_mean.uniform_step"]
    return out


def _abs_estimate(est: Estimate, centre: float = 0.0) -> Estimate:
    """|x − centre| of an estimate: its interval is the range of |x − centre| over x's interval."""
    value = abs(est.value - centre)
    if not est.has_interval:
        return Estimate(value, n=est.n)
    lo, hi = est.lo - centre, est.hi - centre
    return Estimate(value, 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)), est.n)


def _extreme(ests: list[Estimate], pick) -> Estimate:
    """max / min over several quantities: the value of the extreme mean, and the interval of the extreme
    bounds (holds when every quantity's interval is on the claimed side, fails when one is wholly off it)."""
    value = pick(e.value for e in ests)
    if not all(e.has_interval for e in ests):
        return Estimate(value, n=min(e.n for e in ests))
    return Estimate(value, pick(e.lo for e in ests), pick(e.hi for e in ests), min(e.n for e in ests))


def derived_metrics(values, p: Params) -> dict:
    """The gaps in accuracy points that the claims read (per split), per seed and paired: method − control
    on the same seed (common random numbers). The max / min over SNRs and |ratio − 1| keep the seed-mean
    value (their intervals follow from the per-SNR seed intervals)."""
    snrs = p.evaluation.snr_db
    out: dict = {}

    def pts(metric: str, a: str, b: str) -> dict[int, float]:
        xa, xb = values.per_seed(a, metric), values.per_seed(b, metric)
        return {s: 100.0 * (xa[s] - xb[s]) for s in paired(xa, xb)}

    def est(by_seed: dict[int, float]) -> Estimate:
        return t_interval([by_seed[s] for s in sorted(by_seed)])

    for sp in _splits(p):
        out[f"gap_pts.{sp}_auc_acc_vs_snr.featjnd_vs_gauss"] = pts(f"{sp}_auc_acc_vs_snr", "featjnd", "gauss")
        out[f"gap_pts.{sp}_auc_acc_vs_snr.gauss_vs_inverse"] = pts(f"{sp}_auc_acc_vs_snr", "gauss", "inverse")
        for s in snrs:
            t = f"acc_snr{snr_tag(s)}"
            for other in OTHERS_E1:
                out[f"gap_pts.{sp}_{t}.featjnd_vs_{other}"] = pts(f"{sp}_{t}", "featjnd", other)
        out[f"max_abs_gap_pts.{sp}_acc_snr.shuffled_all_vs_gauss"] = _extreme(
            [_abs_estimate(est(pts(f"{sp}_acc_snr{snr_tag(s)}", "shuffled_all", "gauss"))) for s in snrs], max
        )
        low = [s for s in snrs if s <= 0]
        if low:
            out[f"min_gap_pts.{sp}_acc_snr_le0.featjnd_vs_shuffled"] = _extreme(
                [est(pts(f"{sp}_acc_snr{snr_tag(s)}", "featjnd", "shuffled")) for s in low], min
            )
        out[f"abs_dev_from_1.{sp}_jnd_bgfg_ratio.shuffled"] = _abs_estimate(
            est(values.per_seed("shuffled", f"{sp}_jnd_bgfg_ratio")), 1.0
        )
        for sfx in ("", "_dither"):
            for other in OTHERS_E3:
                out[f"gain_pts.{sp}_qacc_mean{sfx}.featjnd_vs_{other}"] = pts(f"{sp}_qacc_mean{sfx}", "featjnd", other)
        # headroom gates of the plain-rounding claims: the uniform allocation's accuracy at the worst budget
        # (min over Δ0 of the per-budget seed intervals; in accuracy, not points) and its loss against the
        # clean accuracy, 100·(acc_clean − qacc_mean), per seed
        out[f"min_qacc.{sp}_qacc.uniform_step"] = _extreme(
            [est(values.per_seed("uniform_step", f"{sp}_qacc_D{step_tag(d)}")) for d in p.evaluation.steps_for(sp)], min
        )
        clean, qmean = (
            values.per_seed("uniform_step", f"{sp}_acc_clean"),
            values.per_seed("uniform_step", f"{sp}_qacc_mean"),
        )
        out[f"qloss_pts.{sp}_qacc_mean.uniform_step"] = {s: 100.0 * (clean[s] - qmean[s]) for s in paired(clean, qmean)}
    return out


def _jnd_grid(maps: dict, split: str, n: int):
    """The artifact users come for: inputs, mean_c J over the input (digit mask outlined), and the
    gradient×input saliency, for ``n`` test examples of the first seed."""
    import matplotlib.pyplot as plt
    import torch.nn.functional as F

    m = maps[sorted(maps)[0]]
    n = min(n, m["J"].shape[0])
    x = m["x"][:n, 0].float()
    size = x.shape[-2:]
    jmap = F.interpolate(m["J"][:n].float().mean(1, keepdim=True), size=size, mode="nearest")[:, 0]
    sal = F.interpolate(m["saliency"][:n].float().unsqueeze(1), size=size, mode="nearest")[:, 0]
    fig, axes = plt.subplots(3, n, figsize=(1.6 * n, 5.2), squeeze=False)
    vmax = float(jmap.max())
    for i in range(n):
        axes[0, i].imshow(x[i], cmap="gray")
        axes[0, i].contour(m["mask"][i].float(), levels=[0.5], colors="lime", linewidths=0.6)
        axes[0, i].set_title(f"y={int(m['y'][i])}", fontsize=8)
        im = axes[1, i].imshow(jmap[i], cmap="magma", vmin=0, vmax=vmax)
        axes[1, i].contour(m["mask"][i].float(), levels=[0.5], colors="cyan", linewidths=0.6)
        axes[2, i].imshow(sal[i], cmap="viridis")
        for r in range(3):
            axes[r, i].set_xticks([])
            axes[r, i].set_yticks([])
    axes[0, 0].set_ylabel("input", fontsize=8)
    axes[1, 0].set_ylabel("mean_c J", fontsize=8)
    axes[2, 0].set_ylabel("|grad×input|", fontsize=8)
    fig.colorbar(im, ax=axes[1, :].tolist(), fraction=0.02, label="J (channel-std units)")
    fig.suptitle(f"FeatJND maps at split {split.upper()} (tolerable perturbation, normalised units)")
    return fig


def _quant_plot(results: pd.DataFrame, split: str, steps: list[float]):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    d = results[results.split == split]
    for ax, sfx, title in ((axes[0], "", "plain rounding"), (axes[1], "_dither", "dithered")):
        for v in E3_ALLOCS:
            vals = [d[(d.variant == v) & (d.metric == f"qacc_D{step_tag(s)}{sfx}")]["value"] for s in steps]
            ax.errorbar(
                steps, [x.mean() for x in vals], yerr=[x.std(ddof=0) for x in vals], marker="o", capsize=3, label=v
            )
        ax.set(xlabel="Δ0 (RMS step, channel-std units)", title=f"{split.upper()}: {title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _training_plot(estimators: dict[str, dict]):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for split, ests in estimators.items():
        for key, st in sorted(ests.items()):
            h = st["history"]
            axes[0].plot(h[:, 0], h[:, 2], marker=".", label=f"{split} {key}")
            axes[1].plot(h[:, 0], h[:, 3], marker=".", label=f"{split} {key}")
    axes[0].set(xlabel="epoch", ylabel="train flip rate (mean over batches)", title="estimator flip rate")
    axes[1].set(xlabel="epoch", ylabel="μ (end of epoch)", yscale="log", title="dual variable")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _long(values) -> pd.DataFrame:
    """The gathered tables as (variant, seed, split, metric, value): metric names without their split."""
    t = values.table[values.table["step"].isna()]
    t = t[t["metric"].str.match(r"^s\d_")]
    return pd.DataFrame(
        {
            "variant": t["variant"],
            "seed": t["seed"],
            "split": t["metric"].str[:2],
            "metric": t["metric"].str[3:],
            "value": t["value"],
        }
    )


def make_plots(p: Params, values, artifacts: dict[str, dict]) -> dict:
    """Node `evaluate.plots`: per split the J-map grid, accuracy vs SNR and accuracy vs quantization budget;
    the estimators' training curves (the artifacts of `train.estimator_<split>`)."""
    from pipelines.core.api import line_plot

    ev = p.evaluation
    long = _long(values)
    arts = {split_of(v): a for v, a in artifacts.items()}
    figures = {}
    for sp in sorted(arts):
        d = long[long.split == sp]
        figures[f"jnd_maps_{sp}"] = _jnd_grid(arts[sp]["maps"], sp, ev.plot_examples)
        series, errors = {}, {}
        for v in E1_MAPS:
            vals = [d[(d.variant == v) & (d.metric == f"acc_snr{snr_tag(s)}")]["value"] for s in ev.snr_db]
            series[v], errors[v] = [x.mean() for x in vals], [x.std(ddof=0) for x in vals]
        figures[f"acc_vs_snr_{sp}"] = line_plot(
            ev.snr_db,
            series,
            "SNR (dB), energy matched per image",
            "test accuracy",
            f"{sp.upper()}: accuracy vs SNR",
            errors,
        )
        figures[f"qacc_vs_budget_{sp}"] = _quant_plot(d, sp, ev.steps_for(sp))
    figures["estimator_training"] = _training_plot({sp: arts[sp]["estimators"] for sp in sorted(arts)})
    return figures
