"""Evaluate stage of TESS: test MSE/MAE (RevIN scale) per variant and seed, the card's derived metrics
(gains vs the best unimodal / raw-text baselines, gate AUROC, extraction accuracy, over-attention ratio,
MSE by text level), the seen- vs unseen-paraphrase comparison, the report with the declared claims
(``evaluate.report``) and the figures (``evaluate.plots``)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.metrics import relative_gain
from pipelines.core.plots import bar_plot, confusion_matrix, line_plot, reliability_diagram
from pipelines.core.report import build_report
from pipelines.tess.lexicon import LABELS, PRIMITIVES
from pipelines.tess.params import Params
from pipelines.tess.train import RAW_TEXT, SEEN, UNIMODAL, backend_variants, normalise

LEVELS = ["A", "B", "C", "D", "E"]


def split_outputs(outputs: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The variant nodes' ``predictions_<v>`` and ``fit_log_<v>`` tables, each concatenated."""
    preds = [d for k, d in outputs.items() if k.startswith("predictions_") and len(d)]
    logs = [d for k, d in outputs.items() if k.startswith("fit_log_") and len(d)]
    return (pd.concat(preds, ignore_index=True) if preds else pd.DataFrame(columns=["variant", "seed", "window_id", "pred"]),
            pd.concat(logs, ignore_index=True) if logs else pd.DataFrame(columns=["variant", "seed"]))


def per_seed_metrics(preds: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Test MSE / MAE per (variant, seed) on the test windows (PatchTST's table also holds train / val rows)."""
    a = normalise(windows)
    y = dict(zip(a.ids, a.y.numpy()))
    test_ids = set(a.ids[a.idx["test"].numpy()])
    preds = preds[preds["window_id"].isin(test_ids)]
    rows = []
    for (variant, seed), d in preds.groupby(["variant", "seed"], sort=False):
        err = np.stack(d["pred"].to_numpy()) - np.stack([y[w] for w in d["window_id"]])
        rows.append({"variant": variant, "seed": int(seed), "test_mse": float((err ** 2).mean()),
                     "test_mae": float(np.abs(err).mean())})
    return pd.DataFrame(rows, columns=["variant", "seed", "test_mse", "test_mae"])


def gain(table: pd.DataFrame, method: str, baseline: str, metric: str = "test_mse") -> float:
    """core.metrics.relative_gain of ``method`` over ``baseline`` (lower is better), on the seeds both ran
    with (single-seed ablations compare on that seed); NaN when either did not run."""
    pa = table[table.variant == method].set_index("seed")[metric]
    pb = table[table.variant == baseline].set_index("seed")[metric]
    shared = pa.index.intersection(pb.index)
    if len(shared) == 0:
        return float("nan")
    return relative_gain(method=float(pa.loc[shared].mean()), baseline=float(pb.loc[shared].mean()),
                         lower_is_better=True)


def best_of(table: pd.DataFrame, names) -> str | None:
    means = table[table.variant.isin(names)].groupby("variant")["test_mse"].mean()
    return str(means.idxmin()) if len(means) else None


def macro_accuracy(true: np.ndarray, pred: np.ndarray) -> float:
    """Balanced accuracy: mean recall over the labels present in ``true``."""
    labels = np.unique(true)
    if len(labels) == 0:
        return float("nan")
    return float(np.mean([(pred[true == lab] == lab).mean() for lab in labels]))


def auroc(score: np.ndarray, target: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(target, score)) if len(target) and 0 < target.mean() < 1 else float("nan")


def gate_table(preds: pd.DataFrame) -> pd.DataFrame:
    """Long table (variant, seed, window_id, primitive, gate, correct) from the learned-gate variants' rows."""
    if "gate" not in preds:
        return pd.DataFrame(columns=["variant", "seed", "window_id", "primitive", "gate", "correct"])
    d = preds[preds["gate"].map(lambda g: isinstance(g, np.ndarray | list))]
    if len(d) == 0:
        return pd.DataFrame(columns=["variant", "seed", "window_id", "primitive", "gate", "correct"])
    g, c = np.stack(d["gate"].to_numpy()), np.stack(d["correct"].to_numpy())
    return pd.concat([pd.DataFrame({"variant": d["variant"].to_numpy(), "seed": d["seed"].to_numpy(),
                                    "window_id": d["window_id"].to_numpy(), "primitive": prim,
                                    "gate": g[:, k], "correct": c[:, k]})
                      for k, prim in enumerate(PRIMITIVES)], ignore_index=True)


def extraction_accuracy(extr: pd.DataFrame, gt: pd.DataFrame, texts: pd.DataFrame, test_ids: set,
                        rendering: str = "open", unseen_only: bool = False) -> dict[str, float]:
    """Macro accuracy per primitive at level A on the test windows (``unseen_only``: only the windows whose
    phrase for that primitive is an unseen paraphrase)."""
    if extr is None or len(extr) == 0:
        return {prim: float("nan") for prim in PRIMITIVES}
    e = extr[(extr.level == "A") & extr.window_id.isin(test_ids)]
    if "rendering" in e:
        e = e[e.rendering == rendering]
    gti = gt.set_index("window_id")
    out = {}
    for prim in PRIMITIVES:
        ep = e[e.primitive == prim]
        if unseen_only:
            col = f"unseen_{prim}"
            if col not in texts:
                out[prim] = float("nan")
                continue
            ids = set(texts.loc[(texts.level == "A") & texts[col].astype(bool), "window_id"])
            ep = ep[ep.window_id.isin(ids)]
        out[prim] = macro_accuracy(gti.loc[ep.window_id, prim].to_numpy(), ep["label"].to_numpy())
    return out


def report(p: Params, windows: pd.DataFrame, gt: pd.DataFrame, texts: pd.DataFrame, label_info: dict,
           **outputs: pd.DataFrame) -> dict:
    """The report: per-seed rows of every variant (and of the ``<variant>_seen`` closed-vocabulary rows),
    the derived metrics and the claims. ``outputs``: ``predictions_<v>``, ``fit_log_<v>`` of every variant
    node and ``extractions_<backend>`` of every backend that ran."""
    first = p.seeds[0]
    preds, logs = split_outputs(outputs)
    extractions = {k[len("extractions_"):]: d for k, d in outputs.items() if k.startswith("extractions_")}
    table = per_seed_metrics(preds, windows)
    extra_cols = [c for c in ("attn_cue_ratio", "train_seconds", "epochs") if c in logs]
    if extra_cols:
        table = table.merge(logs[["variant", "seed", *extra_cols]], on=["variant", "seed"], how="left")
    gates = gate_table(preds)
    if len(gates):
        g = gates.groupby(["variant", "seed"]).apply(
            lambda d: pd.Series({"gate_auroc": auroc(d["gate"].to_numpy(), d["correct"].to_numpy()),
                                 "gate_mean": float(d["gate"].mean())}), include_groups=False).reset_index()
        table = table.merge(g, on=["variant", "seed"], how="left")

    best_uni, best_txt = best_of(table, UNIMODAL), best_of(table, RAW_TEXT)
    best_base = best_of(table, (*UNIMODAL, *RAW_TEXT))
    metrics: dict[str, float | str | None] = {
        "relative_gain.test_mse.tess_vs_best_unimodal": gain(table, "tess", best_uni),
        "relative_gain.test_mse.tess_vs_best_raw_text": gain(table, "tess", best_txt),
        "relative_gain.test_mse.tess_vs_best_baseline": gain(table, "tess", best_base),
        "relative_gain.test_mse.tess_vs_patchtst": gain(table, "tess", "patchtst"),
        "relative_gain.test_mse.tess_vs_tess_nogate": gain(table, "tess", "tess_nogate"),
        "relative_gain.test_mse.oracle_vs_tess": gain(table, "oracle", "tess"),
        "relative_gain.test_mse.shuffled_vs_patchtst": gain(table, "shuffled", "patchtst"),
        # the two vocabulary conditions: the same fitted models on the two renderings of the test texts
        "relative_gain.test_mse.tess_vs_tfidf_ridge.seen_paraphrases": gain(table, "tess" + SEEN, "tfidf_ridge" + SEEN),
        "relative_gain.test_mse.tess_vs_tfidf_ridge.unseen_paraphrases": gain(table, "tess", "tfidf_ridge"),
        "relative_gain.test_mse.tess_vs_minilm_ridge.seen_paraphrases": gain(table, "tess" + SEEN, "minilm_ridge" + SEEN),
        "relative_gain.test_mse.tess_vs_minilm_ridge.unseen_paraphrases": gain(table, "tess", "minilm_ridge"),
    }
    for v in backend_variants(p):
        if v != "tess":
            metrics[f"relative_gain.test_mse.{v}_vs_tess"] = gain(table, v, "tess")
    # what unseen paraphrases cost each text-reading variant: relative MSE increase over its seen condition
    for v in sorted({v[:-len(SEEN)] for v in table.variant if v.endswith(SEEN)}):
        metrics[f"unseen_paraphrase_cost.test_mse.{v}"] = -gain(table, v, v + SEEN)
    metrics["rel_impr_vs_best_unimodal"] = 100 * metrics["relative_gain.test_mse.tess_vs_best_unimodal"]
    metrics["rel_impr_vs_best_textfusion"] = 100 * metrics["relative_gain.test_mse.tess_vs_best_raw_text"]
    # over-attention: TESS's advantage over the best raw-text neural model at level A vs at level D (first seed)
    one = table[table.seed == first]
    best_a, best_d = best_of(one, ("fusion_A", "xattn_A")), best_of(one, ("fusion_D", "xattn_D"))
    metrics["gap.test_mse.tess_vs_raw_text_at_A"] = gain(one, "tess", best_a) if best_a else float("nan")
    metrics["gap.test_mse.tess_vs_raw_text_at_D"] = gain(one, "tess_D", best_d) if best_d else float("nan")
    metrics["gap_a_minus_gap_d"] = metrics["gap.test_mse.tess_vs_raw_text_at_A"] - metrics["gap.test_mse.tess_vs_raw_text_at_D"]
    for model in ("tess", "fusion", "xattn"):
        for lv in LEVELS:
            v = "tess" if (model == "tess" and lv == "A") else f"{model}_{lv}"
            row = one[one.variant == v]
            if len(row):
                metrics[f"mse_by_text_level.{model}.{lv}"] = float(row["test_mse"].iloc[0])
    # extraction accuracy (macro, level A, test windows) of every backend that ran, in both conditions
    test_ids = set(windows.loc[windows.split == "test", "window_id"])
    main = p.extractor.backend
    for backend, extr in extractions.items():
        for cond, kw in (("", {}), (".seen_paraphrases", {"rendering": "seen"}), (".unseen_slots", {"unseen_only": True})):
            acc = extraction_accuracy(extr, gt, texts, test_ids, **kw)
            for prim, v in acc.items():
                metrics[f"extract_acc.{backend}.{prim}{cond}"] = v
                if backend == main and cond == "":
                    metrics[f"extract_acc_{prim}"] = v               # the card's names, main backend
            metrics[f"extract_acc.{backend}.mean{cond}"] = float(np.mean(list(acc.values())))
    if len(gates):
        tg = gates[gates.variant == "tess"]
        metrics["gate_auroc"] = auroc(tg["gate"].to_numpy(), tg["correct"].to_numpy())
        metrics["gate_mean"] = float(tg["gate"].mean()) if len(tg) else float("nan")
        rnd = set(texts.loc[(texts.level == "A") & ~texts.from_truth.astype(bool), "window_id"])
        sub = tg[tg.window_id.isin(rnd)]
        metrics["gate_auroc_on_random_texts"] = auroc(sub["gate"].to_numpy(), sub["correct"].to_numpy())
    else:
        metrics["gate_auroc"] = metrics["gate_mean"] = float("nan")
    # the open vocabulary as rendered: share of (test window, primitive) phrases at level A that are unseen
    unseen_cols = [f"unseen_{prim}" for prim in PRIMITIVES if f"unseen_{prim}" in texts]
    if unseen_cols:
        ta = texts[(texts.level == "A") & texts.window_id.isin(test_ids)]
        metrics["unseen_paraphrase_share_measured"] = float(ta[unseen_cols].astype(float).to_numpy().mean())
    L, H = int(label_info["history_used"]), int(label_info["horizon_used"])
    metrics["history_used"], metrics["horizon_used"] = L, H
    metrics["best_unimodal"], metrics["best_raw_text"], metrics["best_baseline"] = best_uni, best_txt, best_base

    rows = table.drop(columns=[c for c in ("epochs",) if c in table]).to_dict("records")
    rows = [{k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))} for r in rows]
    numeric = {k: (float("nan") if v is None else v) for k, v in metrics.items() if not isinstance(v, str)}
    artifacts = [f"{k}.png" for k in figure_names(p, table, extractions, len(gates) > 0)]
    return build_report("tess", p, rows, numeric, artifacts=artifacts,
                        extra={"best_variants": {k: v for k, v in metrics.items() if isinstance(v, str)},
                               "history_used": L, "horizon_used": H,
                               "data_source": p.data.source, "labeller": label_info})


def figure_names(p: Params, table: pd.DataFrame, extractions: dict, has_gates: bool) -> list[str]:
    names = []
    if p.eval.forecast_plots:
        names.append("forecasts")
    if any(v in set(table.variant) for v in ("tess", "tess_D", "fusion_A", "xattn_A")):
        names.append("mse_vs_text_level")
    if any(v.endswith(SEEN) for v in table.variant):
        names.append("paraphrase_conditions")
    if has_gates:
        names.append("gate_reliability")
    if p.extractor.backend in extractions and len(extractions[p.extractor.backend]):
        names += [f"confusion_{prim}" for prim in PRIMITIVES]
    return names


def plots(p: Params, windows: pd.DataFrame, gt: pd.DataFrame, report: dict, **outputs: pd.DataFrame) -> dict:
    """The figures the report lists: forecasts, MSE by text level, the two vocabulary conditions, the gate's
    reliability diagram and the main extractor's confusion matrices (test windows, level A)."""
    import matplotlib.pyplot as plt

    preds, _ = split_outputs(outputs)
    extractions = {k[len("extractions_"):]: d for k, d in outputs.items() if k.startswith("extractions_")}
    wanted = {a[:-len(".png")] for a in report["artifacts"]}
    first = p.seeds[0]
    figs = {}
    a = normalise(windows)
    if "forecasts" in wanted:
        test = a.idx["test"].numpy()[:p.eval.forecast_plots]
        fig, axes = plt.subplots(len(test), 1, figsize=(8, 2.2 * len(test)), squeeze=False)
        L, H = a.x.shape[1], a.y.shape[1]
        gti = gt.set_index("window_id")
        for ax, i in zip(axes[:, 0], test):
            wid = a.ids[i]
            ax.plot(range(L), a.x[i], color="0.5", lw=1, label="history")
            ax.plot(range(L, L + H), a.y[i], "k", lw=1.5, label="truth")
            for v, c in (("patchtst", "C0"), ("tess", "C3"), ("oracle", "C2")):
                d = preds[(preds.variant == v) & (preds.seed == first) & (preds.window_id == wid)]
                if len(d):
                    ax.plot(range(L, L + H), d["pred"].iloc[0], color=c, lw=1.2, label=v)
            ax.set_xlim(max(0, L - 48), L + H)
            ax.set_title(f"window {wid}: {', '.join(gti.loc[wid, list(PRIMITIVES)])}", fontsize=8)
        axes[0, 0].legend(fontsize=7, ncol=5)
        fig.tight_layout()
        figs["forecasts"] = fig
    m = report["metrics"]
    if "mse_vs_text_level" in wanted:
        series = {model: [m.get(f"mse_by_text_level.{model}.{lv}", np.nan) for lv in LEVELS]
                  for model in ("tess", "fusion", "xattn")}
        series = {k: [np.nan if v is None else v for v in vals] for k, vals in series.items()}
        figs["mse_vs_text_level"] = line_plot(LEVELS, series, "text level (A = narrative + distractors … E = direction only)",
                                              "test MSE (RevIN scale)", "MSE vs text compression (first seed)")
    if "paraphrase_conditions" in wanted:
        var = report["variants"]
        names = [v[:-len(SEEN)] for v in var if v.endswith(SEEN)]
        labels, values = [], []
        for v in names:
            labels += [f"{v} (seen)", f"{v} (unseen share {p.data.unseen_paraphrase_share:g})"]
            values += [var[v + SEEN]["test_mse"], var[v]["test_mse"]]
        figs["paraphrase_conditions"] = bar_plot(labels, values, ylabel="test MSE (RevIN scale)",
                                                 title="Seen-only vs unseen test paraphrases (same fitted models)")
    if "gate_reliability" in wanted:
        g = gate_table(preds)
        tg = g[(g.variant == "tess") & (g.seed == first)]
        figs["gate_reliability"] = reliability_diagram(tg["gate"], tg["correct"], title="TESS gate vs extraction correctness")
    extr = extractions.get(p.extractor.backend)
    if extr is not None and len(extr):
        test_ids = set(windows.loc[windows.split == "test", "window_id"])
        e = extr[(extr.level == "A") & extr.window_id.isin(test_ids)]
        if "rendering" in e:
            e = e[e.rendering == "open"]
        gti = gt.set_index("window_id")
        for prim in PRIMITIVES:
            if f"confusion_{prim}" not in wanted:
                continue
            ep = e[e.primitive == prim]
            labs = LABELS[prim]
            t = gti.loc[ep.window_id, prim].map({lab: i for i, lab in enumerate(labs)}).to_numpy()
            pr = ep["label"].map({lab: i for i, lab in enumerate(labs)}).to_numpy()
            cm = np.zeros((len(labs), len(labs)))
            np.add.at(cm, (t, pr), 1)
            figs[f"confusion_{prim}"] = confusion_matrix(cm, labs, f"{p.extractor.backend} extractor, {prim} "
                                                                   "(test, level A)")
    return figs
