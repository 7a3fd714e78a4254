"""The figures of `adamspike` (MLflow artifacts): the quadratic's spike, each headline run's stacked time
series shaded by stage (whole run and zoomed on one spike with the five stages labelled on the loss curve),
spike counts over the β₂ / ε ablations, loss curves, the alarm rules compared, and the step-sign test."""

from __future__ import annotations

import numpy as np

from pipelines.adamspike.anatomy import RULES, STAGES
from pipelines.adamspike.params import Params

STAGE_COLORS = {1: "#9ecae1", 2: "#a1d99b", 3: "#fdd0a2", 4: "#fc9272", 5: "#bcbddc"}
RULE_LABELS = {
    "lambda_grad": "η·λ_grad > 2 (paper)",
    "lambda_precond": "η·λ_max(Ĥ) > thr",
    "lambda_raw": "η·λ_max(H) > 2",
    "loss_up": "loss went up",
}


def _shade(ax, steps, lab):
    for s, c in STAGE_COLORS.items():
        m = lab == s
        if m.any():
            ax.fill_between(
                steps, 0, 1, where=m, step="mid", color=c, alpha=0.45, lw=0, transform=ax.get_xaxis_transform()
            )


def _stage_legend(fig):
    import matplotlib.patches as mpatches

    handles = [mpatches.Patch(color=STAGE_COLORS[s], alpha=0.6, label=STAGES[s]) for s in STAGES]
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=7, frameon=False)


def _first(analysed_v):
    seed = min(analysed_v)
    return seed, analysed_v[seed]


def _stack(p: Params, v: str, a: dict, seed: int, lo: int = 0, hi: int | None = None, annotate: bool = False):
    import matplotlib.pyplot as plt

    run = a["run"]
    hi = len(run) if hi is None else hi
    sl = slice(lo, hi)
    st = run["step"].to_numpy()[sl]
    lab = a["stages"][sl]
    fig, axes = plt.subplots(5, 1, figsize=(10, 11), sharex=True)
    ll = run["log10_loss"].to_numpy()[sl]
    axes[0].plot(st, ll, lw=0.8, color="k")
    for e in a["events"]:
        if lo <= e.detect < hi:
            axes[0].axvline(e.detect, color="r", lw=0.6, ls=":")
    axes[0].set_ylabel("log10 loss")
    if annotate:
        seen = set()
        for s in (1, 2, 3, 4, 5):
            idx = np.flatnonzero(lab == s)
            if idx.size == 0 or s in seen:
                continue
            # label the longest stretch of this stage in the window
            splits = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
            seg = max(splits, key=len)
            mid = seg[len(seg) // 2]
            axes[0].annotate(
                f"S{s}",
                (st[mid], ll[mid]),
                xytext=(0, 14),
                textcoords="offset points",
                ha="center",
                fontsize=10,
                fontweight="bold",
                arrowprops={"arrowstyle": "-", "lw": 0.6},
            )
            seen.add(s)
    lam = run["eta_lambda_max_precond"].to_numpy()[sl]
    axes[1].plot(st, lam, lw=0.7, label="η·λ_max(Ĥ)")
    axes[1].plot(st, run["eta_lambda_max_raw"].to_numpy()[sl], lw=0.7, label="η·λ_max(H) (raw)")
    axes[1].axhline(a["threshold"], color="r", ls="--", lw=0.8, label=f"threshold {a['threshold']:.3g}")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("η·λ")
    axes[1].legend(fontsize=7, loc="upper left")
    lg = np.minimum(run["eta_lambda_grad"].to_numpy()[sl], 1e3)
    axes[2].plot(st, np.clip(lg, 1e-2, None), lw=0.6, color="C2", label="η·λ_grad (∞ shown at 1e3)")
    axes[2].axhline(2.0, color="r", ls="--", lw=0.8, label="2")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("η·uᵀHu / gᵀu")
    axes[2].legend(fontsize=7, loc="upper left")
    axes[3].plot(st, run["log10_sum_v"].to_numpy()[sl], lw=0.8, label="log10 Σ v̂")
    axes[3].plot(st, run["log10_sum_g2"].to_numpy()[sl], lw=0.8, label="log10 Σ g²")
    axes[3].set_ylabel("second moment")
    axes[3].legend(fontsize=7, loc="upper left")
    axes[4].plot(st, run["cos_grad_topeig"].to_numpy()[sl], lw=0.6, color="C4")
    axes[4].set_ylabel("|cos(D½g, q_max)|")
    axes[4].set_ylim(0, 1.05)
    axes[4].set_xlabel("step")
    for ax in axes:
        _shade(ax, st, lab)
        ax.grid(alpha=0.2)
    cfg = p.configs[v]
    fig.suptitle(
        f"{v} (β₁={cfg.beta1}, β₂={cfg.beta2}, ε={cfg.eps:g}), seed {seed}"
        + (f", steps {lo}–{hi}" if annotate else ""),
        y=0.985,
        fontsize=10,
    )
    _stage_legend(fig)
    fig.tight_layout(rect=(0, 0, 1, 0.965))
    return fig


def _zoom_score(lab: np.ndarray, e) -> tuple:
    """Which spike to zoom on: one whose run-up shows decoupling (S2) and latent instability (S3) before
    it, then the largest rise; the whole-run figure shows every spike."""
    before = set(lab[max(0, e.onset - 250) : e.onset].tolist())
    return (2 in before, 3 in before, e.rise_decades)


def _quad_figure(p: Params, analysed):
    import matplotlib.pyplot as plt

    quads = [v for v in analysed if p.configs[v].model == "quad"]
    adam = [v for v in quads if p.configs[v].optimizer == "adam"]
    main = "quad_adam" if "quad_adam" in adam else (adam[0] if adam else quads[0])
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for v in quads:
        _, a = _first(analysed[v])
        c = p.configs[v]
        name = f"{v} (GD)" if c.optimizer == "gd" else f"{v} (β₁={c.beta1}, β₂={c.beta2})"
        axes[0].plot(a["run"]["step"], a["run"]["log10_loss"], lw=1.0, label=name)
        if c.optimizer == "adam":
            axes[1].plot(a["run"]["step"], a["run"]["eta_lambda_max_precond"], lw=1.0, label=name)
    _, a = _first(analysed[main])
    run = a["run"]
    axes[1].axhline(2.0, color="r", ls="--", lw=0.8, label="2 (stability threshold)")
    axes[1].axhline(p.quad.lr * p.quad.a, color="k", ls=":", lw=0.8, label=f"η·a = {p.quad.lr * p.quad.a:g} (GD)")
    axes[1].set_yscale("log")
    axes[2].plot(run["step"], run["log10_sum_v"], label="log10 v̂")
    axes[2].plot(run["step"], run["log10_sum_g2"], label="log10 g²")
    axes[0].set_ylabel("log10 loss")
    axes[1].set_ylabel("η·a / (√v̂ + ε)")
    axes[2].set_ylabel(f"{main}: v̂ vs g²")
    axes[2].set_xlabel("step")
    for ax in axes:
        _shade(ax, run["step"].to_numpy(), a["stages"])
        ax.grid(alpha=0.2)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(
        f"½aθ² with a={p.quad.a:g}, η={p.quad.lr:g}: GD converges, Adam spikes (shading: {main})", y=0.985, fontsize=10
    )
    _stage_legend(fig)
    fig.tight_layout(rect=(0, 0, 1, 0.965))
    return fig


def _counts(p: Params, analysed):
    import matplotlib.pyplot as plt

    names = list(analysed)
    mean = [np.mean([a["row"]["n_spikes"] for a in analysed[v].values()]) for v in names]
    std = [np.std([a["row"]["n_spikes"] for a in analysed[v].values()]) for v in names]
    strict = [np.mean([a["row"]["n_spikes_100x"] for a in analysed[v].values()]) for v in names]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.42 * len(names)))
    y = np.arange(len(names))[::-1]
    ax.barh(y + 0.2, mean, 0.4, xerr=std, capsize=3, label=f"> {p.spikes.factor:g}× (mean ± std over seeds)")
    ax.barh(y - 0.2, strict, 0.4, label=f"> {p.spikes.factor_strict:g}×")
    labels = []
    for v in names:
        c = p.configs[v]
        labels.append(f"{v}: " + ("GD" if c.optimizer == "gd" else f"β₁={c.beta1} β₂={c.beta2} ε={c.eps:g}"))
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("spikes per run")
    ax.set_title("Spike counts over the β₂ and ε ablations and GD", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _beta2_heatmap(p: Params, analysed):
    from pipelines.core.api import heatmap

    cells = {}
    for v, by in analysed.items():
        c = p.configs[v]
        if c.model == "mlp" and c.optimizer == "adam" and c.eps == 1e-8:
            cells[(c.beta1, c.beta2)] = np.mean([a["row"]["n_spikes"] for a in by.values()])
    b1 = sorted({k[0] for k in cells})
    b2 = sorted({k[1] for k in cells})
    if len(b1) * len(b2) < 2:
        return None
    vals = np.array([[cells.get((i, j), np.nan) for j in b2] for i in b1])
    return heatmap(
        vals, b2, b1, title="MLP spikes per run (mean over seeds), ε = 1e-8", fmt="{:.1f}", xlabel="β₂", ylabel="β₁"
    )


def _loss_curves(p: Params, analysed):
    import matplotlib.pyplot as plt

    mlps = [v for v in analysed if p.configs[v].model == "mlp"]
    if not mlps:
        return None
    cols = 3
    rows = int(np.ceil(len(mlps) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows), sharex=True, squeeze=False)
    for ax, v in zip(axes.ravel(), mlps):
        for seed, a in sorted(analysed[v].items()):
            ax.plot(a["run"]["step"], a["run"]["log10_loss"], lw=0.5, label=f"seed {seed}")
        c = p.configs[v]
        ax.set_title(f"{v}: " + ("GD" if c.optimizer == "gd" else f"β₁={c.beta1} β₂={c.beta2} ε={c.eps:g}"), fontsize=8)
        ax.grid(alpha=0.2)
    for ax in axes.ravel()[len(mlps) :]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6)
    for ax in axes[:, 0]:
        ax.set_ylabel("log10 loss")
    fig.tight_layout()
    return fig


def _predictors(p: Params, analysed):
    import matplotlib.pyplot as plt

    heads = [v for v in p.headline_variants if v in analysed]
    if not heads:
        return None
    fig, axes = plt.subplots(1, len(heads) + 1, figsize=(5 * (len(heads) + 1), 4.2))
    x = np.arange(len(RULES))
    all_leads = {r: [] for r in RULES}
    for ax, v in zip(axes, heads):
        by = analysed[v].values()
        prec = [np.mean([a["scores"][r]["precision"] for a in by]) for r in RULES]
        rec = [np.nanmean([a["scores"][r]["recall"] for a in by]) for r in RULES]
        for r in RULES:
            for a in by:
                all_leads[r] += a["scores"][r]["leads"]
        ax.bar(x - 0.2, prec, 0.4, label="precision")
        ax.bar(x + 0.2, rec, 0.4, label="recall")
        ax.set_xticks(x, [RULE_LABELS[r] for r in RULES], rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(
            f"{v}: alarms after k={p.predictor.k} consecutive steps,\nwindow {p.predictor.horizon}", fontsize=8
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    bins = np.arange(0, p.predictor.horizon + 2, 2)
    for r in RULES:
        if all_leads[r]:
            ax.hist(all_leads[r], bins=bins, histtype="step", lw=1.2, label=f"{RULE_LABELS[r]} (n={len(all_leads[r])})")
    ax.set_xlabel("lead: detection step − alarm step")
    ax.set_ylabel("spikes")
    ax.set_title("lead time of the caught spikes (all headline runs)", fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def _step_sign(p: Params, analysed):
    import matplotlib.pyplot as plt

    heads = [v for v in p.headline_variants if v in analysed]
    quads = [v for v in analysed if p.configs[v].model == "quad" and p.configs[v].optimizer == "adam"][:1]
    shown = quads + heads
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown), 4), squeeze=False)
    for ax, v in zip(axes[0], shown):
        _, a = _first(analysed[v])
        run = a["run"]
        lam = np.minimum(run["eta_lambda_grad"].to_numpy(float), 1e3)
        dl = (run["log10_loss_next"] - run["log10_loss"]).to_numpy(float)
        rise = dl > 0
        ax.scatter(np.clip(lam[rise], 1e-2, None), dl[rise], s=2, color="C3", label="loss rose")
        ax.scatter(np.clip(lam[~rise], 1e-2, None), dl[~rise], s=2, color="C0", label="loss fell")
        ax.axvline(2.0, color="k", ls="--", lw=0.8)
        ax.axhline(0.0, color="k", lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.set_xlabel("η·λ_grad at step t (∞ at 1e3)")
        ax.set_ylabel("Δ log10 loss over the step")
        ax.set_title(f"{v}: sign accuracy {a['row']['step_sign_accuracy']:.3f}", fontsize=9)
        ax.legend(fontsize=7, markerscale=4)
        ax.grid(alpha=0.2)
    fig.tight_layout()
    return fig


def make_figures(p: Params, analysed) -> dict:
    figs = {}
    if any(p.configs[v].model == "quad" for v in analysed):
        figs["quadratic_anatomy"] = _quad_figure(p, analysed)
    for v in p.headline_variants:
        if v not in analysed:
            continue
        seed, a = _first(analysed[v])
        figs[f"anatomy_{v}"] = _stack(p, v, a, seed)
        if a["every"]:
            e = max(a["every"], key=lambda ev: _zoom_score(a["stages"], ev))
            lo, hi = max(0, e.onset - 250), min(len(a["run"]), e.end + 120)
            figs[f"spike_zoom_{v}"] = _stack(p, v, a, seed, lo, hi, annotate=True)
    figs["spike_counts"] = _counts(p, analysed)
    for name, make in (
        ("beta2_ablation", _beta2_heatmap),
        ("loss_curves_mlp", _loss_curves),
        ("predictor_comparison", _predictors),
        ("step_sign", _step_sign),
    ):
        f = make(p, analysed)
        if f is not None:
            figs[name] = f
    return figs
