"""What the report and plots derive from the train nodes' tables: the disagreement between sub-ranking and
top-k orderings of the models and the RLHF correlation (both declared as ``Fn`` in spec.py), the reliability
diagrams, the hierarchy-demo and RLHF figures, and the report's bootstrap CIs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.rankcal import calibration as C
from pipelines.rankcal import ranking as R
from pipelines.rankcal.params import DEMO_VARIANTS, Params, node_variant

# the six "popular" models ranked against each other (not the TS copy or the uniform anchor)
RANKED_MODELS = ("pl_lin", "ib_pl", "ib_mallows", "rpc_bt", "rankings_as_classes", "neural_pl")


def rank_disagreement(values, ds: str) -> float:
    """Kendall τ between the models' orderings by seed-mean ece_pair_db and by ece_top1_conf_db."""
    from scipy.stats import kendalltau

    models = [m for m in RANKED_MODELS if values.has(f"{ds}.{m}", "ece_pair_db")]
    if len(models) < 3:
        return math.nan
    mean = {
        k: [float(np.mean(list(values.per_seed(f"{ds}.{m}", k).values()))) for m in models]
        for k in ("ece_pair_db", "ece_top1_conf_db")
    }
    return float(kendalltau(mean["ece_pair_db"], mean["ece_top1_conf_db"]).statistic)


def rank_disagreement_metrics(values, p: Params) -> dict[str, float]:
    """``rank_disagreement.<ds>`` of each listed dataset and their minimum (point values: one ordering of
    the models' seed means)."""
    dis = {ds: rank_disagreement(values, ds) for ds in p.rank_disagreement_datasets}
    out = {f"rank_disagreement.{ds}": v for ds, v in dis.items()}
    finite = [v for v in dis.values() if not math.isnan(v)]
    out["rank_disagreement.min"] = min(finite) if finite else math.nan
    return out


def rank_disagreement_names(p: Params, planned) -> list[str]:
    return [*(f"rank_disagreement.{ds}" for ds in p.rank_disagreement_datasets), "rank_disagreement.min"]


def gather_reward_models(values) -> pd.DataFrame:
    """One row per reward model × size × seed × {raw, temperature-scaled} (rm, seed, ts, n_pairs and its
    metrics), from the ``train.rm_<name>`` tables' ``n<size>[_ts].<metric>`` entries."""
    rows: dict[tuple, dict] = {}
    for v in values.variants:
        if not v.startswith("rm_"):
            continue
        for key, by_seed in values.metrics(v).items():
            tag, metric = key.split(".", 1)
            ts = tag.endswith("_ts")
            n = int(tag.removesuffix("_ts")[1:])
            for seed, x in by_seed.items():
                r = rows.setdefault(
                    (v, n, ts, seed), {"rm": f"{v.removeprefix('rm_')}_n{n}", "seed": seed, "ts": ts, "n_pairs": n}
                )
                r[metric] = x
    return pd.DataFrame(list(rows.values())) if rows else pd.DataFrame(columns=["rm", "seed", "ts"])


def rlhf_metrics(values, p: Params) -> dict[str, float]:
    return rlhf_summary(gather_reward_models(values))


def rlhf_names(p: Params, planned) -> list[str]:
    if not p.rlhf.enabled:
        return []
    return [
        "rlhf.spearman_acc_neg_ece_pair_db",
        "rlhf.n_reward_models",
        *(f"rlhf.spearman_acc_neg_ece_pair_db.seed{s}" for s in p.seeds),
        "rlhf.median_ece_pair_db.raw",
        "rlhf.median_ece_pair_db.ts",
        "rlhf.ts_rel_change_median_ece_pair_db",
        "rlhf.ts_abs_rel_change_median_ece_pair_db",
        "rlhf.ts_max_abs_accuracy_change",
        "rlhf.oracle_accuracy",
        "rlhf.best_accuracy",
    ]


def rlhf_summary(rlhf: pd.DataFrame) -> dict[str, float]:
    """Spearman(accuracy, −ece_pair_db) over all raw reward models (pooled and per seed), and what
    temperature scaling does to the median ece_pair_db and to accuracy."""
    from scipy.stats import spearmanr

    if rlhf.empty:
        return {}
    raw = rlhf[~rlhf.ts].sort_values(["seed", "rm"])
    ts = rlhf[rlhf.ts].sort_values(["seed", "rm"])
    out = {
        "rlhf.spearman_acc_neg_ece_pair_db": float(spearmanr(raw.pair_accuracy, -raw.ece_pair_db).statistic),
        "rlhf.n_reward_models": float(len(raw)),
    }
    for s, d in raw.groupby("seed"):
        out[f"rlhf.spearman_acc_neg_ece_pair_db.seed{s}"] = float(spearmanr(d.pair_accuracy, -d.ece_pair_db).statistic)
    med_raw, med_ts = float(raw.ece_pair_db.median()), float(ts.ece_pair_db.median())
    change = (med_ts - med_raw) / med_raw if med_raw else math.nan
    out.update(
        {
            "rlhf.median_ece_pair_db.raw": med_raw,
            "rlhf.median_ece_pair_db.ts": med_ts,
            "rlhf.ts_rel_change_median_ece_pair_db": change,
            "rlhf.ts_abs_rel_change_median_ece_pair_db": abs(change),
            "rlhf.ts_max_abs_accuracy_change": float(
                np.abs(raw.pair_accuracy.to_numpy() - ts.pair_accuracy.to_numpy()).max()
            ),
            "rlhf.oracle_accuracy": float(raw.oracle_accuracy.mean()),
            "rlhf.best_accuracy": float(raw.pair_accuracy.max()),
        }
    )
    return out


# --------------------------------------------------------------------------- plots
def _reliability_inputs(Q: np.ndarray, y: np.ndarray, m: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    notion = {"pairwise": "pair", "top-1": "top1_conf", "full": "full_conf"}[kind]
    g = C.notion_groups(Q, m, notion)
    ind = np.stack([lut[y] == tgt for lut, tgt in zip(g.lut, g.target)])
    return g.scores.ravel(), ind.ravel()  # pairwise: pooled over the pairs


def reliability_figure(title: str, tables: dict[str, np.ndarray], y: np.ndarray, m: int, n_bins: int):
    """One figure per dataset: pairwise (pooled over pairs), top-1 and full-ranking confidence
    reliability curves, every model overlaid (equal-mass bins, as in the estimators)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    for ax, kind in zip(axes, ("pairwise", "top-1", "full")):
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        for c, (model, Q) in enumerate(tables.items()):
            s, ind = _reliability_inputs(Q, y, m, kind)
            conf, acc, cnt = C.reliability_points(s, ind, n_bins)
            ece = float(np.sum(cnt * np.abs(acc - conf)) / cnt.sum())
            ax.plot(conf, acc, "o-", ms=3, lw=1, color=f"C{c}", label=f"{model} ({ece:.3f})")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted probability", title=f"{kind} calibration")
        ax.legend(fontsize=6, loc="upper left", title="model (plain ECE)", title_fontsize=6)
    axes[0].set_ylabel("observed frequency")
    fig.suptitle(
        f"{title} (n_test = {len(y)}, m = {m}): reliability diagrams, equal-mass bins; "
        "pairwise pooled over pairs, top-1 and full by top-label confidence",
        fontsize=9,
    )
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.13, top=0.85, wspace=0.22)
    return fig


def demo_figure(values):
    import matplotlib.pyplot as plt

    seed = min(values.per_seed("demo.truth", "q_0"))
    d = {v: {k: x[seed] for k, x in values.metrics(f"demo.{v}").items()} for v in DEMO_VARIANTS}
    qs = {v: np.array([d[v][f"q_{i}"] for i in range(6)]) for v in DEMO_VARIANTS}
    _, plut = R.pair_lut(3)
    rows = (plut == 0).astype(float)
    top = np.stack([(R.perms(3)[:, 0] == j).astype(float) for j in range(3)])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (name, A, labels) in zip(
        axes,
        (
            ("pairwise marginals P(i≻j)", rows, ["a≻b", "a≻c", "b≻c"]),
            ("top-1 marginals P(i first)", top, ["a", "b", "c"]),
        ),
    ):
        for k, (v, q) in enumerate(qs.items()):
            ax.bar(np.arange(3) + 0.27 * (k - 1), A @ q, width=0.27, label=v)
        ax.set_xticks(range(3), labels)
        ax.set_title(name, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "Q_sub matches P pairwise but not top-1; Q_top the reverse "
        f"(ece_pair_db: sub {d['q_sub']['ece_pair_db']:.3f}, top {d['q_top']['ece_pair_db']:.3f}; "
        f"ece_top1_cw_db: sub {d['q_sub']['ece_top1_cw_db']:.3f}, top {d['q_top']['ece_top1_cw_db']:.3f})",
        fontsize=8,
    )
    fig.tight_layout()
    return fig


def rlhf_figure(rlhf: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for ts, d in rlhf.groupby("ts"):
        ax.scatter(d.pair_accuracy, d.ece_pair_db, s=14, label="temperature-scaled" if ts else "raw (T = 1)")
    ax.set(xlabel="test pairwise accuracy", ylabel="ece_pair_db", title="Reward models: accuracy vs calibration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def make_plots(p: Params, values, artifacts: dict[str, dict]) -> dict:
    """Reliability diagrams per dataset (plot seed), the hierarchy demo and the RLHF scatter."""
    figures = {}
    for ds in p.data.datasets:
        a = artifacts.get(node_variant(ds)) or {}
        if a.get("Q"):
            tables = {model: Q.double().numpy() for model, Q in a["Q"].items()}
            figures[f"reliability_{ds}"] = reliability_figure(ds, tables, a["y"].numpy(), int(a["m"]), p.ece.n_bins)
    if "demo" in values.variants:
        figures["hierarchy_demo"] = demo_figure(values)
    rlhf = gather_reward_models(values)
    if not rlhf.empty:
        figures["rlhf_accuracy_vs_ece"] = rlhf_figure(rlhf)
    return figures


def report_extra(p: Params, values, artifacts: dict[str, dict]) -> dict:
    """The bootstrap 95% CIs of every ``<dataset>.<model>`` (plot seed)."""
    cis = {
        k: ci
        for ds in p.data.datasets
        for k, ci in ((artifacts.get(node_variant(ds)) or {}).get("bootstrap") or {}).items()
    }
    return {"bootstrap_ci": {"seed": p.plot_seed, "level": 0.95, "n_bootstrap": p.ece.n_bootstrap, "ci": cis}}
