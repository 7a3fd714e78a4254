"""The data-level and per-layer symmetry gaps, the variants table (one column per metric and ε), the
claims' derived metrics, the metric histories (per-layer θ_ℓ(t), the RECM statistic s_ℓ(t), the training
loss) and the figures: θ trajectories, test MSE vs ε, final θ vs the measured gaps, equivariance error."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.api import relative_gain
from pipelines.recm.data import arrays, eps_tag, symmetry_gap_linear
from pipelines.recm.params import Params


# --------------------------------------------------------------------------- symmetry gaps
def data_gaps(dataset: pd.DataFrame, p: Params) -> pd.DataFrame:
    """The node ``data.symmetry_gap``: per ε, the best circulant vs best dense linear predictor."""
    from pipelines.core.api import node_setup

    node_setup(p)
    rows = []
    for eps in p.data.eps:
        rows.append(
            {"eps": float(eps), **symmetry_gap_linear(*arrays(dataset, eps, "train"), *arrays(dataset, eps, "test"))}
        )
    return pd.DataFrame(rows)


def layer_gap(model, x: np.ndarray, y: np.ndarray, batch_size: int) -> list[float]:
    """The measured symmetry gap of every layer of a (strictly equivariant) net on a training set:
    how much of the training signal on the layer's dense map points out of the equivariant subspace,
    debiased like the RECM statistic but with full-data averages instead of EMAs:
        gap_ℓ = √max(0, ⟨P⊥Ḡ^A_ℓ, P⊥Ḡ^B_ℓ⟩) / mean_b ‖G_ℓ,b‖,
    Ḡ^A, Ḡ^B the mean minibatch dense-map gradients over two disjoint halves of the data (so sampling
    noise cancels in expectation) and G_ℓ,b the gradient of minibatch b. It is what a RECM layer's s
    would settle to if the net sat at this equivariant solution; 0 on a symmetric distribution."""
    import torch

    from pipelines.recm.model import perp_inner
    from pipelines.recm.train import mse

    scale = float(y.std()) or 1.0
    xt = torch.as_tensor(x / scale, dtype=torch.float32)
    yt = torch.as_tensor(y / scale, dtype=torch.float32)
    n_layers = len(model.layers)
    sums = [[None, None] for _ in range(n_layers)]
    norms = [0.0] * n_layers
    counts = [0, 0]
    model.set_track(True)
    half = len(xt) // 2
    for start in range(0, 2 * half - batch_size + 1, batch_size):
        if start < half < start + batch_size:
            continue  # keep the halves disjoint
        side = 0 if start < half else 1
        model.zero_grad(set_to_none=True)
        mse(model, xt[start : start + batch_size], yt[start : start + batch_size]).backward()
        for i, layer in enumerate(model.layers):
            G = layer.dense_grad()
            sums[i][side] = G if sums[i][side] is None else sums[i][side] + G
            norms[i] += float(G.norm())
        counts[side] += 1
    model.set_track(False)
    model.zero_grad(set_to_none=True)
    out = []
    for i, layer in enumerate(model.layers):
        a, b = sums[i]
        if a is None or b is None:
            out.append(math.nan)
            continue
        inner = float(perp_inner(a, b, layer.c_out, layer.c_in, layer.L)) / (counts[0] * counts[1])
        out.append(math.sqrt(max(0.0, inner)) / (norms[i] / sum(counts)))
    return out


# --------------------------------------------------------------------------- the long tables, read back
def _eps_list(p: Params) -> list[float]:
    return [float(e) for e in p.data.eps]


def fits_table(values, p: Params) -> dict[str, pd.DataFrame]:
    """``{variant: one row per (ε, seed)}`` with the metrics' plain names (the figures' input)."""
    out = {}
    for v in values.variants:
        ms = values.metrics(v)
        rows = []
        for e in _eps_list(p):
            suffix = "." + eps_tag(e)
            mine = {k[: -len(suffix)]: d for k, d in ms.items() if k.endswith(suffix)}
            for seed in sorted({s for d in mine.values() for s in d}):
                rows.append(
                    {"variant": v, "eps": e, "seed": seed, **{k: d[seed] for k, d in mine.items() if seed in d}}
                )
        out[v] = pd.DataFrame(rows)
    return out


def layer_gaps_table(values, p: Params) -> pd.DataFrame:
    """The strict nets' per-layer measured gaps (train.strict), one row per (ε, seed, layer)."""
    rows = []
    ms = values.metrics("strict") if "strict" in values.variants else {}
    for e in _eps_list(p):
        tag = eps_tag(e)
        for seed in p.seeds:
            i = 0
            while seed in ms.get(f"layer_gap_l{i}.{tag}", {}):
                rows.append({"eps": e, "seed": int(seed), "layer": i, "layer_gap": ms[f"layer_gap_l{i}.{tag}"][seed]})
                i += 1
    return pd.DataFrame(rows, columns=["eps", "seed", "layer", "layer_gap"])


def histories_table(values, p: Params) -> dict[str, dict]:
    """``{variant: {eps_tag: {seed: {name: series}}}}``: every seed's curves (the figures' input)."""
    t = values.table[values.table["step"].notna()]
    out: dict[str, dict] = {}
    for v in values.variants:
        for metric in dict.fromkeys(t.loc[t["variant"] == v, "metric"]):
            name, tag = metric.rsplit(".", 1)
            for seed in sorted(set(t.loc[(t["variant"] == v) & (t["metric"] == metric), "seed"])):
                out.setdefault(v, {}).setdefault(tag, {}).setdefault(str(seed), {})[name] = values.history(
                    v, metric, int(seed)
                )
    return out


# --------------------------------------------------------------------------- derived metrics
def _big(p: Params) -> list[float]:
    return [e for e in _eps_list(p) if e >= 0.2 - 1e-12]


def gap_points(values, p: Params, gaps: pd.DataFrame) -> dict[str, float]:
    """The data-level symmetry gap per ε (one value: it is a property of the data, not of a seed)."""
    return {f"symmetry_gap_linear.{eps_tag(r.eps)}": float(r.symmetry_gap_linear) for r in gaps.itertuples()}


def gap_names(p: Params, planned) -> list[str]:
    return [f"symmetry_gap_linear.{eps_tag(e)}" for e in _eps_list(p)]


def theta_tracks_gap(values, p: Params, gaps: pd.DataFrame) -> dict[str, dict[int, float]]:
    """(2) per seed: Spearman of RECM's max_ℓ final θ_ℓ against ε and against the data gap over the ε grid,
    and θ / gap per ε (a diagnostic)."""
    from scipy.stats import spearmanr

    eps_list = _eps_list(p)
    gap = gap_points(values, p, gaps)
    g = [gap.get(f"symmetry_gap_linear.{eps_tag(e)}", math.nan) for e in eps_list]
    th = {e: values.per_seed("recm", f"max_final_theta.{eps_tag(e)}") for e in eps_list}
    seeds = sorted(set.intersection(*(set(d) for d in th.values())))
    out: dict[str, dict[int, float]] = {
        "spearman.max_final_theta_vs_eps": {},
        "spearman.max_final_theta_vs_symmetry_gap": {},
    }
    for s in seeds:
        ts = [th[e][s] for e in eps_list]
        out["spearman.max_final_theta_vs_eps"][s] = float(spearmanr(eps_list, ts).statistic)
        out["spearman.max_final_theta_vs_symmetry_gap"][s] = float(spearmanr(g, ts).statistic)
        for e, t_, g_ in zip(eps_list, ts, g):
            if g_ > 0:
                out.setdefault(f"theta_over_gap.{eps_tag(e)}", {})[s] = t_ / g_  # a diagnostic, not a claim
    return out


def theta_names(p: Params, planned) -> list[str]:
    if len(p.data.eps) < 2:
        return []
    return [
        "spearman.max_final_theta_vs_eps",
        "spearman.max_final_theta_vs_symmetry_gap",
        *[f"theta_over_gap.{eps_tag(e)}" for e in _eps_list(p) if e > 0],
    ]


def theta_vs_layer_gap(values, p: Params) -> dict[str, dict[int, float]]:
    """Diagnostics per seed, over the layers × ε of that seed: Spearman of RECM's final θ_ℓ against the strict
    net's measured layer gap, and how often θ_ℓ ends at or under it."""
    from scipy.stats import spearmanr

    lg = layer_gaps_table(values, p)
    rec = values.metrics("recm")
    out: dict[str, dict[int, float]] = {}
    for seed, d in lg.groupby("seed"):
        pairs = []
        for r in d.itertuples():
            th = rec.get(f"final_theta_l{r.layer}.{eps_tag(r.eps)}", {})
            if int(seed) in th and not math.isnan(r.layer_gap):
                pairs.append((th[int(seed)], float(r.layer_gap)))
        if len(pairs) >= 3:
            a = np.array(pairs)
            out.setdefault("spearman.final_theta_vs_layer_gap", {})[int(seed)] = float(
                spearmanr(a[:, 0], a[:, 1]).statistic
            )
            out.setdefault("fraction.final_theta_le_layer_gap", {})[int(seed)] = float(np.mean(a[:, 0] <= a[:, 1]))
    return out


def min_gain_vs_strict(values, p: Params) -> dict[str, dict[int, float]]:
    """(3) per seed: the smallest relative gain over strict among the ε ≥ 0.2."""
    per = [values.per_seed("recm", f"test_mse.{eps_tag(e)}") for e in _big(p)]
    base = [values.per_seed("strict", f"test_mse.{eps_tag(e)}") for e in _big(p)]
    seeds = sorted(set.intersection(*(set(d) for d in per + base)))
    return {
        "relative_gain.test_mse.recm_vs_strict.min_eps_ge0p2": {
            s: min(relative_gain(method=m[s], baseline=b[s]) for m, b in zip(per, base)) for s in seeds
        }
    }


def _mean_std(values, variant: str, metric: str) -> tuple[float, float]:
    v = np.array(list(values.per_seed(variant, metric).values()), float)
    return (float(v.mean()), float(v.std())) if len(v) else (math.nan, math.nan)


def excess_over_best(values, p: Params) -> dict[str, float]:
    """(3) for ε ≥ 0.2: RECM's mean test MSE over min(CR, RPP) + 1 std (the pooled population std of the two
    over seeds), as a relative excess (≤ 0: within one std). One value per ε, not per seed: the claim's
    tolerance is the seed spread itself."""
    out: dict[str, float] = {}
    excess = []
    for e in _big(p):
        m, s = _mean_std(values, "recm", f"test_mse.{eps_tag(e)}")
        best = min((_mean_std(values, b, f"test_mse.{eps_tag(e)}") for b in ("cr", "rpp")), key=lambda t: t[0])
        pooled = math.sqrt((s**2 + best[1] ** 2) / 2)
        # m <= best + std  <=>  (m - best - std) / best <= 0 (finite with a single seed too)
        excess.append((m - best[0] - pooled) / best[0])
        out[f"excess.test_mse.{eps_tag(e)}.recm_over_best_of_cr_rpp_plus_std"] = excess[-1]
    out["excess.test_mse.recm_over_best_of_cr_rpp_plus_std.max_eps_ge0p2"] = max(excess)
    return out


def excess_names(p: Params, planned) -> list[str]:
    big = _big(p)
    if not big:
        return []
    return [
        *[f"excess.test_mse.{eps_tag(e)}.recm_over_best_of_cr_rpp_plus_std" for e in big],
        "excess.test_mse.recm_over_best_of_cr_rpp_plus_std.max_eps_ge0p2",
    ]


def report_extra(p: Params, values, artifacts: dict, gaps: pd.DataFrame) -> dict:
    return {"layer_gaps": layer_gaps_table(values, p).to_dict("records"), "data_gaps": gaps.to_dict("records")}


# --------------------------------------------------------------------------- figures
def theta_figure(hists: dict, p: Params):
    """θ_ℓ(t) of RECM per ε (seed mean, band = seed range), the statistic s_ℓ(t) dotted, CR's schedule."""
    import matplotlib.pyplot as plt

    eps_list = [float(e) for e in p.data.eps]
    fig, axes = plt.subplots(1, len(eps_list), figsize=(4.2 * len(eps_list), 3.6), sharey=True, squeeze=False)
    rec = hists.get("recm", {})
    for ax, e in zip(axes[0], eps_list):
        by_seed = rec.get(eps_tag(e), {})
        if by_seed:
            seeds = list(by_seed.values())
            names = sorted(k for k in seeds[0] if k.startswith("theta_l"))
            for i, name in enumerate(names):
                steps = np.array(seeds[0][name]["step"])
                v = np.array([s[name]["value"] for s in seeds], float)
                ax.plot(steps, v.mean(0), color=f"C{i}", lw=1.6, label=f"θ_l{i}")
                ax.fill_between(steps, v.min(0), v.max(0), color=f"C{i}", alpha=0.15, lw=0)
                sname = name.replace("theta", "s")
                if sname in seeds[0]:
                    sv = np.array([s[sname]["value"] for s in seeds], float)
                    ax.plot(seeds[0][sname]["step"], sv.mean(0), color=f"C{i}", lw=0.7, ls=":", alpha=0.8)
        cr = hists.get("cr", {}).get(eps_tag(e), {})
        if cr:
            first = next(iter(cr.values()))
            ax.plot(first["theta_l0"]["step"], first["theta_l0"]["value"], "k--", lw=0.8, label="CR schedule")
        ax.axhline(p.recm.tau, color="gray", lw=0.6, ls="-.", label=f"τ = {p.recm.tau:g}")
        ax.set(title=f"ε = {e:g}", xlabel="step", yscale="log", ylim=(1e-3, 1.2))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("relaxation θ_ℓ (solid), statistic s_ℓ (dotted)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("RECM: per-layer relaxation trajectories (mean over seeds, band = seed range)", fontsize=10)
    fig.tight_layout()
    return fig


def mse_vs_eps_figure(fits: dict[str, pd.DataFrame], gaps: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for i, (v, df) in enumerate(fits.items()):
        g = df.groupby("eps")["test_mse"].agg(["mean", "std"]).reset_index()
        ax.errorbar(
            g["eps"],
            g["mean"],
            yerr=g["std"],
            marker="o",
            capsize=3,
            label=v,
            lw=2.2 if v == "recm" else 1.0,
            color="k" if v == "recm" else f"C{i}",
        )
    ax.plot(
        gaps["eps"], gaps["linear_circulant_rel_mse"].clip(lower=1e-6), "k:", lw=1, label="best circulant linear map"
    )
    ax.set(
        xlabel="symmetry-breaking ε",
        ylabel="test MSE (relative to var y)",
        yscale="log",
        title="Test MSE vs symmetry gap (mean ± std over seeds)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def theta_vs_gap_figure(fits: dict[str, pd.DataFrame], gaps: pd.DataFrame, lgaps: pd.DataFrame, p: Params):
    """Left: every RECM layer's final θ_ℓ against that layer's measured gap (strict net, per seed).
    Right: max_ℓ θ_ℓ against the data-level symmetry_gap_linear, per ε."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    f = fits.get("recm")
    eps_list = [float(e) for e in p.data.eps]
    if f is not None and not lgaps.empty:
        markers = "osD^v<>p*h"
        for r in lgaps.itertuples():
            d = f[np.isclose(f["eps"], r.eps) & (f["seed"] == r.seed)]
            if len(d):
                a1.scatter(
                    r.layer_gap,
                    d[f"final_theta_l{r.layer}"].iloc[0],
                    color=f"C{eps_list.index(r.eps)}",
                    marker=markers[r.layer % len(markers)],
                    s=30,
                )
        for i, e in enumerate(eps_list):
            a1.scatter([], [], color=f"C{i}", label=f"ε = {e:g}")
        for layer in sorted(lgaps["layer"].unique()):
            a1.scatter([], [], color="gray", marker=markers[layer % len(markers)], label=f"layer {layer}")
        lim = max(1e-3, float(np.nanmax(lgaps["layer_gap"])) * 1.1)
        a1.plot([0, lim], [0, lim], "k:", lw=0.8, label="θ = gap")
    a1.axhline(p.recm.tau, color="gray", lw=0.6, ls="-.")
    a1.set(
        xlabel="layer's measured symmetry gap (strict net)",
        ylabel="final θ_ℓ (RECM)",
        title="final relaxation vs the layer's gap",
    )
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7)
    if f is not None:
        g = f.groupby("eps")["max_final_theta"].agg(["mean", "std"]).reset_index()
        gap = gaps.set_index("eps")["symmetry_gap_linear"]
        xs = [float(gap.loc[e]) if e in gap.index else math.nan for e in g["eps"]]
        a2.errorbar(xs, g["mean"], yerr=g["std"], marker="o", capsize=3, color="k")
        for x, y, e in zip(xs, g["mean"], g["eps"]):
            a2.annotate(f"ε={e:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    a2.set(xlabel="symmetry_gap_linear (data)", ylabel="max_ℓ final θ_ℓ", title="max relaxation vs data gap")
    a2.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _fits_mean(fits: dict[str, pd.DataFrame], variant: str, metric: str, eps: float) -> float:
    df = fits.get(variant)
    if df is None or metric not in df:
        return math.nan
    v = df.loc[np.isclose(df["eps"], eps), metric].to_numpy(float)
    return float(v.mean()) if len(v) else math.nan


def equiv_figure(fits: dict[str, pd.DataFrame], p: Params):
    import matplotlib.pyplot as plt

    eps_list = [float(e) for e in p.data.eps]
    names = list(fits)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4))
    w = 0.8 / len(eps_list)
    for j, e in enumerate(eps_list):
        vals = [max(_fits_mean(fits, v, "equiv_error", e), 1e-16) for v in names]
        ax.bar(np.arange(len(names)) + (j - (len(eps_list) - 1) / 2) * w, vals, width=w, label=f"ε = {e:g}")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set(
        yscale="log",
        ylabel="equiv_error (deployed net)",
        title="Equivariance error after training (RECM: layers under τ projected; CR: branch dropped)",
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def loss_figure(hists: dict, p: Params):
    import matplotlib.pyplot as plt

    eps_list = [float(e) for e in p.data.eps]
    fig, axes = plt.subplots(1, len(eps_list), figsize=(4.2 * len(eps_list), 3.5), sharey=True, squeeze=False)
    for ax, e in zip(axes[0], eps_list):
        for i, (v, by_eps) in enumerate(hists.items()):
            by_seed = by_eps.get(eps_tag(e), {})
            if not by_seed:
                continue
            seeds = list(by_seed.values())
            steps = np.array(seeds[0]["train_mse"]["step"])
            vals = np.array([s["train_mse"]["value"] for s in seeds], float).mean(0)
            k = max(1, len(vals) // 50)  # a running mean for readability
            sm = np.convolve(vals, np.ones(k) / k, mode="valid")
            ax.plot(steps[k - 1 :], sm, color="k" if v == "recm" else f"C{i}", lw=1.8 if v == "recm" else 0.9, label=v)
        ax.set(title=f"ε = {e:g}", xlabel="step", yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training minibatch MSE (mean over seeds)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def make_plots(p: Params, values, artifacts: dict, gaps: pd.DataFrame) -> dict:
    """The node ``evaluate.plots``."""
    fits, hists, lgaps = fits_table(values, p), histories_table(values, p), layer_gaps_table(values, p)
    figs = {
        "theta_trajectories": theta_figure(hists, p),
        "test_mse_vs_eps": mse_vs_eps_figure(fits, gaps),
        "theta_vs_symmetry_gap": theta_vs_gap_figure(fits, gaps, lgaps, p),
        "equivariance_error": equiv_figure(fits, p),
        "training_loss": loss_figure(hists, p),
    }
    return figs
