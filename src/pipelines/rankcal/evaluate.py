"""Calibration metrics of every label-ranking model (all notions of the hierarchy, debiased, with
bootstrap CIs), the disagreement between sub-ranking and top-k orderings of the models, the RLHF
correlation, reliability diagrams and the report. The evaluate nodes gather the variants' outputs:
``**predictions`` are the ``train.<model>`` tables by model, ``**reward_models`` the ``train.rm_<name>``
frames."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pandas as pd

from pipelines.core.report import build_report
from pipelines.rankcal import calibration as C
from pipelines.rankcal import ranking as R
from pipelines.rankcal.data import unpack
from pipelines.rankcal.params import Params

# the six "popular" models ranked against each other (not the TS copy or the uniform anchor)
RANKED_MODELS = ("pl_lin", "ib_pl", "ib_mallows", "rpc_bt", "rankings_as_classes", "neural_pl")
NON_METRIC = ("variant", "seed", "dataset", "model")


def test_rankings(datasets: pd.DataFrame) -> dict[str, dict[str, tuple[np.ndarray, int]]]:
    """``{dataset: {seed: (test permutation indices, m)}}`` from the data table."""
    out: dict = {}
    for (name, seed), d in datasets[datasets.split == "test"].groupby(["dataset", "seed"], sort=False):
        _, o, m = unpack(d)
        out.setdefault(str(name), {})[str(seed)] = (R.perm_index(o), m)
    return out


def by_dataset(predictions: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """``{dataset: {seed: {model: entry}}}`` from the variants' ``{dataset: {seed: entry}}``, models in
    the order of ``models.variants``."""
    out: dict = {}
    for model, tables in predictions.items():
        for ds, seeds in tables.items():
            for seed, entry in seeds.items():
                out.setdefault(ds, {}).setdefault(seed, {})[model] = entry
    return out


def calibration_table(datasets: pd.DataFrame, p: Params, **predictions: dict) -> tuple[pd.DataFrame, dict]:
    """One row per dataset × model × seed with every ECE (plain and ``_db``), ``max_ece_db`` and the
    proper scores; bootstrap 95% CIs for the plot seed."""
    e = p.ece
    truth = test_rankings(datasets)
    rows, cis = [], {}
    for ds, seeds in by_dataset(predictions).items():
        for seed, models in seeds.items():
            y, m = truth[ds][seed]
            n_boot = e.n_bootstrap if int(seed) == p.plot_seed else 0
            for model, entry in models.items():
                Q = entry["Q"].double().numpy()
                # one stream per (seed, dataset, model) for the redraws and the bootstrap
                rng = np.random.default_rng([int(seed), zlib.crc32(f"{ds}.{model}".encode())])
                ece, ci = C.calibration_metrics(Q, y, m, n_bins=e.n_bins, n_debias=e.n_debias, n_bootstrap=n_boot,
                                                full_cw_max_m=e.full_cw_max_m, rng=rng)
                db = [v for k, v in ece.items() if k.endswith("_db")]
                row = {"variant": f"{ds}.{model}", "dataset": ds, "model": model, "seed": int(seed), **ece,
                       "max_ece_db": max(db), **C.proper_scores(Q, y, m), "n_test": len(y)}
                if "temperature" in entry:
                    row["temperature"] = float(entry["temperature"])
                if "theta_mean" in entry:
                    row["theta_mean"] = float(entry["theta_mean"])
                rows.append(row)
                if ci:
                    cis[f"{ds}.{model}"] = {k: [lo, hi] for k, (lo, hi) in ci.items()}
    return pd.DataFrame(rows), {"seed": p.plot_seed, "level": 0.95, "n_bootstrap": e.n_bootstrap, "ci": cis}


def rank_disagreement(metrics: pd.DataFrame, dataset: str) -> float:
    """Kendall τ between the models' orderings by seed-mean ece_pair_db and by ece_top1_conf_db."""
    from scipy.stats import kendalltau

    d = metrics[(metrics.dataset == dataset) & metrics.model.isin(RANKED_MODELS)]
    if d.empty:
        return math.nan
    mean = d.groupby("model")[["ece_pair_db", "ece_top1_conf_db"]].mean()
    if len(mean) < 3:
        return math.nan
    return float(kendalltau(mean["ece_pair_db"], mean["ece_top1_conf_db"]).statistic)


def gather_reward_models(reward_models: dict[str, pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in reward_models.values() if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["variant", "seed", "ts"])


def rlhf_summary(rlhf: pd.DataFrame) -> dict[str, float]:
    """Spearman(accuracy, −ece_pair_db) over all raw reward models (pooled and per seed), and what
    temperature scaling does to the median ece_pair_db and to accuracy."""
    from scipy.stats import spearmanr

    if rlhf.empty:
        return {}
    raw = rlhf[~rlhf.ts].sort_values(["seed", "rm"])
    ts = rlhf[rlhf.ts].sort_values(["seed", "rm"])
    out = {"rlhf.spearman_acc_neg_ece_pair_db": float(spearmanr(raw.pair_accuracy, -raw.ece_pair_db).statistic),
           "rlhf.n_reward_models": float(len(raw))}
    for s, d in raw.groupby("seed"):
        out[f"rlhf.spearman_acc_neg_ece_pair_db.seed{s}"] = float(spearmanr(d.pair_accuracy, -d.ece_pair_db).statistic)
    med_raw, med_ts = float(raw.ece_pair_db.median()), float(ts.ece_pair_db.median())
    change = (med_ts - med_raw) / med_raw if med_raw else math.nan
    out.update({"rlhf.median_ece_pair_db.raw": med_raw, "rlhf.median_ece_pair_db.ts": med_ts,
                "rlhf.ts_rel_change_median_ece_pair_db": change,
                "rlhf.ts_abs_rel_change_median_ece_pair_db": abs(change),
                "rlhf.ts_max_abs_accuracy_change": float(np.abs(raw.pair_accuracy.to_numpy()
                                                                - ts.pair_accuracy.to_numpy()).max()),
                "rlhf.oracle_accuracy": float(raw.oracle_accuracy.mean()),
                "rlhf.best_accuracy": float(raw.pair_accuracy.max())})
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
    fig.suptitle(f"{title} (n_test = {len(y)}, m = {m}): reliability diagrams, equal-mass bins; "
                 "pairwise pooled over pairs, top-1 and full by top-label confidence", fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.13, top=0.85, wspace=0.22)
    return fig


def demo_figure(demo: pd.DataFrame):
    import matplotlib.pyplot as plt

    d = demo[demo.seed == demo.seed.min()].set_index("variant")
    qs = {v: d.loc[v, [f"q_{i}" for i in range(6)]].to_numpy(float) for v in d.index}
    P = qs["demo.truth"]
    _, plut = R.pair_lut(3)
    rows = (plut == 0).astype(float)
    top = np.stack([(R.perms(3)[:, 0] == j).astype(float) for j in range(3)])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (name, A, labels) in zip(axes, (("pairwise marginals P(i≻j)", rows, ["a≻b", "a≻c", "b≻c"]),
                                            ("top-1 marginals P(i first)", top, ["a", "b", "c"]))):
        for k, (v, q) in enumerate(qs.items()):
            ax.bar(np.arange(3) + 0.27 * (k - 1), A @ q, width=0.27, label=v.split(".")[1])
        ax.set_xticks(range(3), labels)
        ax.set_title(name, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle("Q_sub matches P pairwise but not top-1; Q_top the reverse "
                 f"(ece_pair_db: sub {d.loc['demo.q_sub', 'ece_pair_db']:.3f}, top {d.loc['demo.q_top', 'ece_pair_db']:.3f}; "
                 f"ece_top1_cw_db: sub {d.loc['demo.q_sub', 'ece_top1_cw_db']:.3f}, top {d.loc['demo.q_top', 'ece_top1_cw_db']:.3f})",
                 fontsize=8)
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


def make_plots(datasets: pd.DataFrame, demo: pd.DataFrame, p: Params, **outputs) -> dict:
    """Reliability diagrams per dataset (plot seed), the hierarchy demo and the RLHF scatter.
    ``outputs``: the models' tables by model and the reward models' frames as ``rm_<name>``."""
    reward_models = {k: v for k, v in outputs.items() if k.startswith("rm_")}
    predictions = {k: v for k, v in outputs.items() if not k.startswith("rm_")}
    truth = test_rankings(datasets)
    figures = {}
    for ds, seeds in by_dataset(predictions).items():
        seed = str(p.plot_seed) if str(p.plot_seed) in seeds else next(iter(seeds))
        y, m = truth[ds][seed]
        tables = {model: e["Q"].double().numpy() for model, e in seeds[seed].items()}
        figures[f"reliability_{ds}"] = reliability_figure(ds, tables, y, m, p.ece.n_bins)
    figures["hierarchy_demo"] = demo_figure(demo)
    rlhf = gather_reward_models(reward_models)
    if not rlhf.empty:
        figures["rlhf_accuracy_vs_ece"] = rlhf_figure(rlhf)
    return figures


def report(metrics: pd.DataFrame, bootstrap: dict, demo: pd.DataFrame, plots: dict, p: Params,
           **reward_models: pd.DataFrame) -> dict:
    rows = []
    for frame in (metrics, demo):
        for rec in frame.to_dict("records"):
            rows.append({k: v for k, v in rec.items() if k in ("variant", "seed")
                         or (k not in NON_METRIC and isinstance(v, int | float) and not math.isnan(v))})
    derived: dict[str, float] = {}
    dis = {ds: rank_disagreement(metrics, ds) for ds in p.rank_disagreement_datasets}
    for ds, v in dis.items():
        derived[f"rank_disagreement.{ds}"] = v
    finite = [v for v in dis.values() if not math.isnan(v)]
    derived["rank_disagreement.min"] = min(finite) if finite else math.nan
    derived.update(rlhf_summary(gather_reward_models(reward_models)))
    return build_report("rankcal", p, rows, derived, artifacts=[f"{k}.png" for k in plots],
                        extra={"bootstrap_ci": bootstrap})
