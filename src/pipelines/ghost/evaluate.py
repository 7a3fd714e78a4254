"""The shared evaluate work of `ghost`: the leave-one-channel-out oracle on layer 0, the decode benchmark
(dense vs hard-truncated models, interleaved in ONE node so that load hits every model alike), the derived
metrics the card's claims read (per seed, paired, where they are per-seed; spec.py declares them), and the
plots (perplexity vs pruning ratio, kept-channel maps, score histograms)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import generate, interleaved_timing, node_setup, ratio_ci
from pipelines.ghost import model as M
from pipelines.ghost.params import Params


def rho_key(rho: float) -> str:
    return f"rho{int(round(rho * 100)):03d}"


# ------------------------------------------------------------------------------------------- oracle
def loo_oracle(corpus: dict[str, torch.Tensor], model_blob: dict, p: Params) -> dict:
    """ΔNLL (nats/token) of removing each state channel (g, n) of layer 0 alone from the dense model, on the
    first ``eval.loo_seqs`` validation sequences: the oracle the scores' rank correlation is measured on."""
    device = node_setup(p, p.seeds[0])
    if p.eval.loo_seqs == 0:
        return {"delta_nll": torch.zeros(0)}
    model = M.load_model(model_blob).to(device)
    ids = corpus["val"][: p.eval.loo_seqs]
    base = M.mean_nll(model, ids, p.eval.eval_batch)
    layer = model.layers[0]
    G, N = layer.g, layer.n
    out = torch.zeros(G, N, dtype=torch.float64)
    for g in range(G):
        for n in range(N):
            keep = torch.ones(G, N, dtype=torch.bool)
            keep[g, n] = False
            layer.state_mask.copy_(M.group_mask_to_heads(layer, keep.to(device)))
            out[g, n] = M.mean_nll(model, ids, p.eval.eval_batch) - base
    return {"delta_nll": out, "base_nll": torch.tensor(base)}


# ------------------------------------------------------------------------------------------- decode timing
def decode_timing(corpus: dict[str, torch.Tensor], model_blob: dict, ghost_scores: dict, p: Params) -> dict:
    """Recurrent greedy decode of the dense model and of GHOST's hard-truncated models (seed 0's masks at
    each ``eval.decode_rhos``), timed side by side in interleaved rounds (median of per-round ratios with an
    order-statistic interval). Also checks that truncation equals masking (max |Δ logit| on test data)."""
    device = node_setup(p, p.seeds[0])
    dense = M.load_model(model_blob).to(device)
    e = p.eval
    seed0 = ghost_scores[str(p.seeds[0])]
    models = {"dense": dense}
    max_diff = 0.0
    probe = corpus["test"][:4, :64].to(device)
    for rho in e.decode_rhos:
        if f"{rho:g}" not in seed0:
            raise ValueError(
                f"eval.decode_rhos: {rho} was not pruned by train.ghost on seed {p.seeds[0]} (it ran {sorted(seed0)})"
            )
        keeps = [k.to(device) for k in seed0[f"{rho:g}"]["keep"]]
        masked = M.load_model(model_blob).to(device)
        M.set_masks(masked, keeps)
        small = M.truncate(dense, keeps)
        with torch.no_grad():
            max_diff = max(max_diff, float((small(probe) - masked(probe)).abs().max()))
        models[rho_key(rho)] = small
    prompt = corpus["test"][: e.decode_batch, :1].to(device)

    def decoder(m):
        return lambda: generate(m, prompt, e.decode_tokens, temperature=0)

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    times = interleaved_timing(
        {k: decoder(m) for k, m in models.items()}, rounds=e.decode_rounds, warmup=1, clock="wall", sync=sync
    )
    tokens = e.decode_batch * e.decode_tokens
    out: dict = {
        "truncation_max_abs_logit_diff": max_diff,
        "tokens_per_call": tokens,
        "seconds": {k: v.tolist() for k, v in times.items()},
        "decode_tok_per_s": {k: float(tokens / np.median(v)) for k, v in times.items()},
        "state_bytes_per_seq": {"dense": M.state_bytes_per_seq(M.current_masks(dense), dense)},
        "speedup": {},
    }
    for rho in e.decode_rhos:
        k = rho_key(rho)
        out["state_bytes_per_seq"][k] = M.state_bytes_per_seq(list(seed0[f"{rho:g}"]["keep"]), dense)
        est = ratio_ci(times["dense"], times[k])  # dense time / pruned time: > 1 is faster
        out["speedup"][k] = {"ratio": est.ratio, "ci_low": est.ci_low, "ci_high": est.ci_high, "rounds": est.rounds}
    return out


# ------------------------------------------------------------------------------------------- derived
BASELINES = ("random", "weight_magnitude", "taylor", "fisher", "activation_magnitude")
GRADIENT = ("taylor", "fisher")


def all_rhos(p: Params) -> list[float]:
    return sorted(set(p.prune.rhos) | set(p.prune.extra_rhos))


def _best(values, candidates, metric: str) -> str | None:
    """The candidate with the lowest mean of ``metric`` (None: none produced it)."""
    have = [v for v in candidates if v in values.variants and values.has(v, metric)]
    return min(have, key=lambda v: values.mean(v, metric)) if have else None


def margins(values, p: Params) -> dict:
    """Per seed, paired: ``margin.<k>.ghost_minus_half_<base>`` = ghost − ½·base, and
    ``margin.<k>.ghost_minus_1p2_best_gradient`` = ghost − 1.2·(the better of Taylor and Fisher, by its
    mean), for every pruning ratio's ``delta_ppl``."""
    from pipelines.core.api import paired

    out: dict = {}
    for rho in all_rhos(p):
        k = f"delta_ppl_{rho_key(rho)}"
        if not values.has("ghost", k):
            continue
        g = values.per_seed("ghost", k)
        for base in BASELINES:
            if base in values.variants and values.has(base, k):
                b = values.per_seed(base, k)
                out[f"margin.{k}.ghost_minus_half_{base}"] = {s: g[s] - 0.5 * b[s] for s in paired(g, b)}
        best = _best(values, GRADIENT, k)
        if best is not None:
            b = values.per_seed(best, k)
            out[f"margin.{k}.ghost_minus_1p2_best_gradient"] = {s: g[s] - 1.2 * b[s] for s in paired(g, b)}
    return out


def margin_names(p: Params, planned) -> list[str]:
    out = []
    for rho in all_rhos(p):
        k = f"delta_ppl_{rho_key(rho)}"
        out += [f"margin.{k}.ghost_minus_half_{b}" for b in BASELINES if b in planned]
        if set(GRADIENT) & set(planned):
            out.append(f"margin.{k}.ghost_minus_1p2_best_gradient")
    return out


def spearman_vs_loo(scores: dict, loo: dict, seed: str) -> float:
    from scipy.stats import spearmanr

    if loo["delta_nll"].numel() == 0 or seed not in scores:
        return math.nan
    first = next(iter(scores[seed].values()))["scores"][0]  # layer 0 (dense: never recalibrated)
    if float(first.abs().sum()) == 0:
        return math.nan
    return float(spearmanr(first.flatten().numpy(), loo["delta_nll"].flatten().numpy()).statistic)


def rank_correlations(values, p: Params, loo: dict, artifacts: dict) -> dict:
    """``spearman_vs_loo.<v>``: layer-0 scores of the first seed vs the leave-one-out oracle (one seed:
    the oracle is computed once)."""
    seed0 = str(p.seeds[0])
    return {f"spearman_vs_loo.{v}": spearman_vs_loo(sc, loo, seed0) for v, sc in artifacts.items() if v != "dense"}


def spearman_names(p: Params, planned) -> list[str]:
    return [f"spearman_vs_loo.{v}" for v in planned if v != "dense"] if p.eval.loo_seqs > 0 else []


def heavy_tail(values, p: Params) -> dict:
    """``heavy_tail.ghost_top_half_mass_min``: the least concentrated layer over every seed and ratio
    GHOST pruned at (a worst case over seeds: one value)."""
    tails = [x for k, d in values.metrics("ghost").items() if k.startswith("top_half_mass_min_") for x in d.values()]
    return {"heavy_tail.ghost_top_half_mass_min": min(tails) if tails else math.nan}


def calib_speedup(values, p: Params) -> dict:
    """``calib_speedup.ghost_vs_best_gradient``: per seed, the calibration time of the faster gradient
    method (by its mean) over GHOST's, at the largest main ratio."""
    from pipelines.core.api import paired

    k = f"calib_time_s_{rho_key(max(p.prune.rhos))}"
    best = _best(values, GRADIENT, k)
    if best is None or not values.has("ghost", k):
        return {}
    g, b = values.per_seed("ghost", k), values.per_seed(best, k)
    return {"calib_speedup.ghost_vs_best_gradient": {s: b[s] / g[s] if g[s] > 0 else math.nan for s in paired(g, b)}}


def calib_names(p: Params, planned) -> list[str]:
    return ["calib_speedup.ghost_vs_best_gradient"] if set(GRADIENT) & set(planned) else []


def decode_metrics(values, p: Params, timing: dict) -> dict:
    """The decode benchmark (one interleaved measurement): speed-ups with their order-statistic interval
    over rounds, tokens per second, state bytes, and the truncation check."""
    from pipelines.core.api import Estimate

    out: dict = {}
    for name, s in timing.get("speedup", {}).items():
        out[f"decode_speedup.{name}"] = Estimate(s["ratio"], s["ci_low"], s["ci_high"], n=s["rounds"])
    for name, v in timing.get("decode_tok_per_s", {}).items():
        out[f"decode_tok_per_s.{name}"] = float(v)
    for name, v in timing.get("state_bytes_per_seq", {}).items():
        out[f"state_bytes_per_seq.{name}"] = float(v)
    if "truncation_max_abs_logit_diff" in timing:
        out["truncation_max_abs_logit_diff"] = float(timing["truncation_max_abs_logit_diff"])
    return out


def decode_names(p: Params, planned) -> list[str]:
    ks = ["dense", *(rho_key(r) for r in p.eval.decode_rhos)]
    return [
        *(f"decode_speedup.{rho_key(r)}" for r in p.eval.decode_rhos),
        *(f"decode_tok_per_s.{k}" for k in ks),
        *(f"state_bytes_per_seq.{k}" for k in ks),
        "truncation_max_abs_logit_diff",
    ]


def model_metrics(values, p: Params, model_blob: dict) -> dict:
    """The one SSM LM: its validation NLL and final training loss (mean of the last 20 steps)."""
    hist = model_blob["history"].tolist()
    return {
        "dense_val_nll": float(model_blob["dense_val_nll"]),
        "train_final_loss": float(np.mean(hist[-20:])) if hist else math.nan,
    }


def dense_ppl_over_vocab(values, p: Params) -> dict:
    """``dense_ppl_over_vocab``: per seed, the dense model's test perplexity as a fraction of the uniform
    model's (vocab_size): the gate that the LM learned its corpus at any vocabulary size."""
    return {"dense_ppl_over_vocab": {s: x / p.data.vocab_size for s, x in values.per_seed("dense", "test_ppl").items()}}


def report_extra(p: Params, values, artifacts: dict, timing: dict) -> dict:
    return {"decode_timing": timing}


# ------------------------------------------------------------------------------------------- plots
def ratio_table(values, p: Params) -> pd.DataFrame:
    """One row per variant × seed × ratio (variant, seed, rho, test_ppl, delta_ppl) from the results tables."""
    rows = []
    for v in values.variants:
        ms = values.metrics(v)
        if v == "dense":
            rows += [
                {"variant": v, "seed": s, "rho": 0.0, "test_ppl": x, "delta_ppl": ms["delta_ppl"][s]}
                for s, x in ms.get("test_ppl", {}).items()
            ]
            continue
        for rho in all_rhos(p):
            k = rho_key(rho)
            rows += [
                {"variant": v, "seed": s, "rho": rho, "test_ppl": x, "delta_ppl": ms[f"delta_ppl_{k}"][s]}
                for s, x in ms.get(f"test_ppl_{k}", {}).items()
            ]
    return (
        pd.DataFrame(rows, columns=["variant", "seed", "rho", "test_ppl", "delta_ppl"])
        .sort_values(["variant", "seed", "rho"], kind="stable")
        .reset_index(drop=True)
    )


def make_plots(p: Params, values, scores: dict, model_blob: dict, loo: dict) -> dict:
    import matplotlib.pyplot as plt

    table = ratio_table(values, p)
    table["variant"] = pd.Categorical(table["variant"], categories=values.variants, ordered=True)
    table = table.sort_values(["variant", "seed", "rho"], kind="stable")
    table["variant"] = table["variant"].astype(str)
    figs = {}
    dense = table[table.variant == "dense"]
    dense_ppl = float(dense.test_ppl.mean()) if len(dense) else math.nan

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, log in zip(axes, (False, True)):
        for c, (v, d) in enumerate(table[table.variant != "dense"].groupby("variant", sort=False)):
            g = d.groupby("rho")["delta_ppl"]
            mu, sd = g.mean(), g.std(ddof=0).fillna(0)
            x = [0.0, *mu.index]
            y = [0.0, *mu.values]
            ax.errorbar(
                x,
                y,
                yerr=[0.0, *sd.values],
                marker="o",
                ms=3,
                lw=1.2,
                capsize=2,
                label=v,
                color=f"C{c % 10}",
                ls="-" if v.startswith("ghost") else "--",
            )
        ax.set(
            xlabel="pruning ratio ρ (state channels removed per group)",
            ylabel="Δ test perplexity vs dense" + (" (symlog)" if log else ""),
        )
        if log:
            ax.set_yscale("symlog", linthresh=0.01)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"Perplexity cost of state pruning (dense test ppl {dense_ppl:.2f}; mean ± std over calibration seeds)",
        fontsize=9,
    )
    fig.tight_layout()
    figs["ppl_vs_sparsity"] = fig

    seed0 = str(p.seeds[0])
    shown = [
        v
        for v in ("ghost", "taylor", "fisher", "weight_magnitude", "activation_magnitude", "random")
        if v in scores and seed0 in scores[v]
    ]
    rho = f"{sorted(p.prune.rhos)[0]:g}"
    if shown:
        fig, axes = plt.subplots(len(shown), 1, figsize=(8, 1.2 + 0.9 * len(shown)), squeeze=False)
        for ax, v in zip(axes[:, 0], shown):
            keep = scores[v][seed0][rho]["keep"]  # [L, G, N]
            ax.imshow(keep.flatten(0, 1).numpy(), aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
            L, G, N = keep.shape
            ax.set_yticks(range(L * G), [f"L{l}g{g}" for l in range(L) for g in range(G)], fontsize=6)
            ax.set_title(v, fontsize=8, loc="left")
        axes[-1, 0].set_xlabel("state channel n (black = kept)")
        fig.suptitle(f"Kept state channels per layer and group at ρ = {rho} (seed {seed0})", fontsize=9)
        fig.tight_layout()
        figs["kept_channels"] = fig

    if "ghost" in scores and seed0 in scores["ghost"]:
        sc = scores["ghost"][seed0][rho]["scores"]
        fig, axes = plt.subplots(1, sc.shape[0], figsize=(4 * sc.shape[0], 3.2), squeeze=False)
        for l, ax in enumerate(axes[0]):
            s = sc[l].flatten().double().clamp_min(1e-30).log10().numpy()
            ax.hist(s, bins=24, color="C0")
            ax.set(xlabel="log10 GHOST score", title=f"layer {l}: top-half mass {M.top_half_mass(sc[l]):.3f}")
        fig.suptitle(f"GHOST score distribution (seed {seed0}, calibration for ρ = {rho})", fontsize=9)
        fig.tight_layout()
        figs["score_histograms"] = fig

    if loo["delta_nll"].numel() and shown:
        fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3), squeeze=False)
        y = loo["delta_nll"].flatten().numpy()
        for ax, v in zip(axes[0], shown):
            x = scores[v][seed0][rho]["scores"][0].flatten().double().numpy()
            ax.scatter(x, y, s=8)
            if v != "random" and (x > 0).all():
                ax.set_xscale("log")
            ax.set(xlabel=f"{v} score (layer 0)", title=v)
        axes[0, 0].set_ylabel("leave-one-out ΔNLL (nats)")
        fig.suptitle("Scores vs the leave-one-channel-out oracle, layer 0", fontsize=9)
        fig.tight_layout()
        figs["scores_vs_loo"] = fig

    hist = model_blob["history"].numpy()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(hist, lw=0.8)
    ax.set(xlabel="step", ylabel="train NLL (nats/token)", title="SSM LM training (one model per run)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    figs["training_loss"] = fig
    return figs
