"""Evaluate stage of TESS: test MSE/MAE (RevIN scale) per variant and seed, the card's derived metrics
(gains vs the best unimodal / raw-text baselines, gate AUROC, extraction accuracy, over-attention ratio,
MSE by text level), the plots, and the report with the declared claims."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.params import parse
from pipelines.core.plots import confusion_matrix, line_plot, reliability_diagram
from pipelines.core.report import build_report, relative_gain
from pipelines.tess.lexicon import LABELS, PRIMITIVES
from pipelines.tess.train import UNIMODAL, normalise

RAW_TEXT = ("fusion_A", "xattn_A", "tfidf_ridge")


def per_seed_metrics(preds: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    a = normalise(windows)
    y = dict(zip(a.ids, a.y.numpy()))
    rows = []
    for (variant, seed), d in preds.groupby(["variant", "seed"], sort=False):
        err = np.stack(d["pred"].to_numpy()) - np.stack([y[w] for w in d["window_id"]])
        rows.append({"variant": variant, "seed": int(seed), "test_mse": float((err ** 2).mean()),
                     "test_mae": float(np.abs(err).mean())})
    return pd.DataFrame(rows)


def gain(table: pd.DataFrame, a: str, b: str, metric: str = "test_mse") -> float:
    """(b − a) / b on the seeds both variants ran with (single-seed ablations compare on that seed)."""
    pa = table[table.variant == a].set_index("seed")[metric]
    pb = table[table.variant == b].set_index("seed")[metric]
    shared = pa.index.intersection(pb.index)
    if len(shared) == 0:
        return float("nan")
    return relative_gain(float(pb.loc[shared].mean()), float(pa.loc[shared].mean()))


def best_of(table: pd.DataFrame, names) -> str:
    means = table[table.variant.isin(names)].groupby("variant")["test_mse"].mean()
    return str(means.idxmin())


def macro_accuracy(true: np.ndarray, pred: np.ndarray) -> float:
    """Balanced accuracy: mean recall over the labels present in ``true``."""
    labels = np.unique(true)
    return float(np.mean([(pred[true == lab] == lab).mean() for lab in labels]))


def auroc(score: np.ndarray, target: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(target, score)) if 0 < target.mean() < 1 else float("nan")


def evaluate(windows: pd.DataFrame, gt: pd.DataFrame, texts: pd.DataFrame, extr: pd.DataFrame,
             pred_base: pd.DataFrame, log_base: pd.DataFrame, pred_tess: pd.DataFrame, log_tess: pd.DataFrame,
             gates: pd.DataFrame, label_info: dict, raw: dict) -> tuple[dict, dict]:
    p = parse("tess", raw)
    first = p.seeds[0]
    preds = pd.concat([pred_base, pred_tess], ignore_index=True)
    table = per_seed_metrics(preds, windows)
    logs = pd.concat([log_base, log_tess], ignore_index=True)
    extra_cols = [c for c in ("attn_cue_ratio", "train_seconds", "epochs") if c in logs]
    table = table.merge(logs[["variant", "seed", *extra_cols]], on=["variant", "seed"], how="left")
    if len(gates):
        g = gates.groupby(["variant", "seed"]).apply(
            lambda d: pd.Series({"gate_auroc": auroc(d["gate"].to_numpy(), d["correct"].to_numpy()),
                                 "gate_mean": float(d["gate"].mean())}), include_groups=False).reset_index()
        table = table.merge(g, on=["variant", "seed"], how="left")

    best_uni, best_txt = best_of(table, UNIMODAL), best_of(table, RAW_TEXT)
    best_base = best_of(table, (*UNIMODAL, *RAW_TEXT))
    metrics: dict[str, float | str] = {
        "relative_gain.test_mse.tess_vs_best_unimodal": gain(table, "tess", best_uni),
        "relative_gain.test_mse.tess_vs_best_raw_text": gain(table, "tess", best_txt),
        "relative_gain.test_mse.tess_vs_best_baseline": gain(table, "tess", best_base),
        "relative_gain.test_mse.tess_vs_patchtst": gain(table, "tess", "patchtst"),
        "relative_gain.test_mse.tess_vs_tess_nogate": gain(table, "tess", "tess_nogate"),
        "relative_gain.test_mse.oracle_vs_tess": gain(table, "oracle", "tess"),
        "relative_gain.test_mse.shuffled_vs_patchtst": gain(table, "shuffled", "patchtst"),
        "relative_gain.test_mse.tess_prototype_vs_tess": gain(table, "tess_prototype", "tess"),
    }
    # rel_impr_* in percent, the card's names
    metrics["rel_impr_vs_best_unimodal"] = 100 * metrics["relative_gain.test_mse.tess_vs_best_unimodal"]
    metrics["rel_impr_vs_best_textfusion"] = 100 * metrics["relative_gain.test_mse.tess_vs_best_raw_text"]
    # over-attention: TESS's advantage over the best raw-text model at level A vs at level D (first seed)
    one = table[table.seed == first]
    best_a = best_of(one, ("fusion_A", "xattn_A"))
    best_d = best_of(one, ("fusion_D", "xattn_D"))
    metrics["gap.test_mse.tess_vs_raw_text_at_A"] = gain(one, "tess", best_a)
    metrics["gap.test_mse.tess_vs_raw_text_at_D"] = gain(one, "tess_D", best_d)
    metrics["gap_a_minus_gap_d"] = metrics["gap.test_mse.tess_vs_raw_text_at_A"] - metrics["gap.test_mse.tess_vs_raw_text_at_D"]
    # MSE by text level (first seed): TESS on A–E, the raw-text models on the levels they ran
    levels = ["A", "B", "C", "D", "E"]
    by_level = {}
    for model in ("tess", "fusion", "xattn"):
        for lv in levels:
            v = "tess" if (model == "tess" and lv == "A") else f"{model}_{lv}"
            row = one[one.variant == v]
            if len(row):
                by_level.setdefault(model, {})[lv] = float(row["test_mse"].iloc[0])
                metrics[f"mse_by_text_level.{model}.{lv}"] = float(row["test_mse"].iloc[0])
    # extraction accuracy (macro) of the lexicon backend at level A on the test windows
    test_ids = set(windows.loc[windows.split == "test", "window_id"])
    gti = gt.set_index("window_id")
    for backend_df, suffix in ((extr, ""),):
        e = backend_df[(backend_df.level == "A") & backend_df.window_id.isin(test_ids)]
        for prim in PRIMITIVES:
            ep = e[e.primitive == prim]
            metrics[f"extract_acc_{prim}{suffix}"] = macro_accuracy(gti.loc[ep.window_id, prim].to_numpy(),
                                                                    ep["label"].to_numpy())
    if len(gates):
        tg = gates[(gates.variant == "tess")]
        metrics["gate_auroc"] = auroc(tg["gate"].to_numpy(), tg["correct"].to_numpy())
        metrics["gate_mean"] = float(tg["gate"].mean())
        rnd = set(texts.loc[(texts.level == "A") & ~texts.from_truth, "window_id"])
        sub = tg[tg.window_id.isin(rnd)]
        metrics["gate_auroc_on_random_texts"] = auroc(sub["gate"].to_numpy(), sub["correct"].to_numpy())
    metrics["best_unimodal"], metrics["best_raw_text"], metrics["best_baseline"] = best_uni, best_txt, best_base

    figures = _plots(windows, preds, table, gates, gt, extr, by_level, first, p.eval.forecast_plots)
    rows = table.drop(columns=[c for c in ("epochs",) if c in table]).to_dict("records")
    rows = [{k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))} for r in rows]
    numeric = {k: v for k, v in metrics.items() if not isinstance(v, str)}
    report = build_report("tess", raw, rows, numeric, artifacts=[f"{k}.png" for k in figures],
                          extra={"best_variants": {k: v for k, v in metrics.items() if isinstance(v, str)},
                                 "labeller": label_info})
    return report, figures


def _plots(windows, preds, table, gates, gt, extr, by_level, first, n_forecasts) -> dict:
    import matplotlib.pyplot as plt

    figs = {}
    a = normalise(windows)
    test = a.idx["test"].numpy()[:n_forecasts]
    if n_forecasts:
        fig, axes = plt.subplots(len(test), 1, figsize=(8, 2.2 * len(test)), squeeze=False)
        L = a.x.shape[1]
        for ax, i in zip(axes[:, 0], test):
            wid = a.ids[i]
            ax.plot(range(L), a.x[i], color="0.5", lw=1, label="history")
            ax.plot(range(L, L + a.y.shape[1]), a.y[i], "k", lw=1.5, label="truth")
            for v, c in (("patchtst", "C0"), ("tess", "C3"), ("oracle", "C2")):
                d = preds[(preds.variant == v) & (preds.seed == first) & (preds.window_id == wid)]
                if len(d):
                    ax.plot(range(L, L + a.y.shape[1]), d["pred"].iloc[0], color=c, lw=1.2, label=v)
            ax.set_xlim(L - 48, L + a.y.shape[1])
            ax.set_title(f"window {wid}: {', '.join(gt.set_index('window_id').loc[wid, list(PRIMITIVES)])}", fontsize=8)
        axes[0, 0].legend(fontsize=7, ncol=5)
        fig.tight_layout()
        figs["forecasts"] = fig
    if by_level:
        lv = ["A", "B", "C", "D", "E"]
        series = {m: [v.get(x, np.nan) for x in lv] for m, v in by_level.items()}
        figs["mse_vs_text_level"] = line_plot(lv, series, "text level (A = narrative + distractors … E = direction only)",
                                              "test MSE (RevIN scale)", "MSE vs text compression (first seed)")
    if len(gates):
        tg = gates[(gates.variant == "tess") & (gates.seed == first)]
        figs["gate_reliability"] = reliability_diagram(tg["gate"], tg["correct"], title="TESS gate vs extraction correctness")
    test_ids = set(windows.loc[windows.split == "test", "window_id"])
    e = extr[(extr.level == "A") & extr.window_id.isin(test_ids)]
    gti = gt.set_index("window_id")
    for prim in PRIMITIVES:
        ep = e[e.primitive == prim]
        labs = LABELS[prim]
        t = gti.loc[ep.window_id, prim].map({lab: i for i, lab in enumerate(labs)}).to_numpy()
        pr = ep["label"].map({lab: i for i, lab in enumerate(labs)}).to_numpy()
        cm = np.zeros((len(labs), len(labs)))
        np.add.at(cm, (t, pr), 1)
        figs[f"confusion_{prim}"] = confusion_matrix(cm, labs, f"lexicon extractor, {prim} (test, level A)")
    return figs
