"""Evaluate stage of TESS: each variant's long table (test MSE/MAE on the RevIN scale, gate AUROC, per
seed), the card's derived metrics as declarations (gains vs the best unimodal / raw-text baselines per
seed, paired; gate AUROC, extraction accuracy, over-attention ratio, MSE by text level; the seen- vs
unseen-paraphrase comparison), the report's extra fields and the figures (``evaluate.plots``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import (
    Fn,
    Gain,
    Results,
    bar_plot,
    confusion_matrix,
    line_plot,
    relative_gain,
    reliability_diagram,
)
from pipelines.tess.lexicon import LABELS, PRIMITIVES
from pipelines.tess.params import Params
from pipelines.tess.train import RAW_TEXT, SEEN, UNIMODAL, backend_variants, has_seen_condition, normalise

LEVELS = ["A", "B", "C", "D", "E"]


def per_seed_metrics(preds: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Test MSE / MAE per (variant, seed) on the test windows (PatchTST's table also holds train / val rows)."""
    a = normalise(windows)
    y = dict(zip(a.ids, a.y.numpy()))
    test_ids = set(a.ids[a.idx["test"].numpy()])
    preds = preds[preds["window_id"].isin(test_ids)]
    rows = []
    for (variant, seed), d in preds.groupby(["variant", "seed"], sort=False):
        err = np.stack(d["pred"].to_numpy()) - np.stack([y[w] for w in d["window_id"]])
        rows.append(
            {
                "variant": variant,
                "seed": int(seed),
                "test_mse": float((err**2).mean()),
                "test_mae": float(np.abs(err).mean()),
            }
        )
    return pd.DataFrame(rows, columns=["variant", "seed", "test_mse", "test_mae"])


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
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "variant": d["variant"].to_numpy(),
                    "seed": d["seed"].to_numpy(),
                    "window_id": d["window_id"].to_numpy(),
                    "primitive": prim,
                    "gate": g[:, k],
                    "correct": c[:, k],
                }
            )
            for k, prim in enumerate(PRIMITIVES)
        ],
        ignore_index=True,
    )


def extraction_accuracy(
    extr: pd.DataFrame,
    gt: pd.DataFrame,
    texts: pd.DataFrame,
    test_ids: set,
    rendering: str = "open",
    unseen_only: bool = False,
) -> dict[str, float]:
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


def results_table(
    windows: pd.DataFrame, variant: str, preds: pd.DataFrame, logs: pd.DataFrame, texts: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The long table of one variant node: per (variant, seed) of its rows (``<variant>`` and
    ``<variant>_seen``), test MSE / MAE, fit time and the cross-attention ratio from its fit log, the learned
    gate's AUROC and mean; for ``tess`` also the gate's AUROC on the randomly rendered texts."""
    table = per_seed_metrics(preds, windows)
    extra_cols = [c for c in ("attn_cue_ratio", "train_seconds") if c in logs]
    if extra_cols and len(table):
        table = table.merge(logs[["variant", "seed", *extra_cols]], on=["variant", "seed"], how="left")
    gates = gate_table(preds)
    if len(gates):
        g = (
            gates.groupby(["variant", "seed"])
            .apply(
                lambda d: pd.Series(
                    {
                        "gate_auroc": auroc(d["gate"].to_numpy(), d["correct"].to_numpy()),
                        "gate_mean": float(d["gate"].mean()),
                    }
                ),
                include_groups=False,
            )
            .reset_index()
        )
        if variant == "tess" and texts is not None:
            rnd = set(texts.loc[(texts.level == "A") & ~texts.from_truth.astype(bool), "window_id"])
            sub = gates[(gates.variant == "tess") & gates.window_id.isin(rnd)]
            g["gate_auroc_on_random_texts"] = [
                auroc(d["gate"].to_numpy(), d["correct"].to_numpy()) if v == "tess" else float("nan")
                for v, s in zip(g["variant"], g["seed"])
                for d in [sub[sub.seed == s]]
            ]
        table = table.merge(g, on=["variant", "seed"], how="left")
    parts = []
    for v in dict.fromkeys(table["variant"]):
        res = Results(v)
        for r in table[table.variant == v].to_dict("records"):
            res.add(
                r["seed"],
                **{
                    k: x
                    for k, x in r.items()
                    if k not in ("variant", "seed") and not (isinstance(x, float) and np.isnan(x))
                },
            )
        parts.append(res.table())
    return pd.concat(parts, ignore_index=True) if parts else Results(variant).table()


def prediction_tensors(preds: pd.DataFrame, variant: str) -> dict:
    """``{"seed<s>": {"window_id", "pred", ("gate", "correct")}}`` of the variant's own rows (not its seen
    condition): what the ridge baselines (PatchTST's) and the plots read."""
    import torch

    out = {}
    if not len(preds):
        return out
    for seed, d in preds[preds.variant == variant].groupby("seed", sort=False):
        t = {
            "window_id": torch.tensor(d["window_id"].to_numpy().astype("int64")),
            "pred": torch.from_numpy(np.stack(d["pred"].to_numpy())),
        }
        if "gate" in d and d["gate"].map(lambda g: isinstance(g, np.ndarray | list)).all():
            t["gate"] = torch.from_numpy(np.stack(d["gate"].to_numpy()))
            t["correct"] = torch.from_numpy(np.stack(d["correct"].to_numpy()))
        out[f"seed{int(seed)}"] = t
    return out


# ------------------------------------------------------------------------------------ derived metrics
def _rel(method: str, baseline: str, **kw) -> Gain:
    return Gain("test_mse", method, baseline, lower_is_better=True, relative=True, **kw)


BEST = {"unimodal": UNIMODAL, "raw_text": RAW_TEXT, "baseline": (*UNIMODAL, *RAW_TEXT)}
SEEN_GAINS = {
    f"relative_gain.test_mse.tess_vs_{b}.seen_paraphrases": ("tess" + SEEN, b + SEEN)
    for b in ("tfidf_ridge", "minilm_ridge")
}


def _best(label: str) -> Gain:
    return Gain("test_mse", "tess", best_of=BEST[label], label=label, lower_is_better=True, relative=True)


def seen_gains(values, p: Params) -> dict:
    """The closed-vocabulary condition: TESS vs each ridge baseline on the seen-only test rendering, per
    seed (NaN when the run has no seen rendering, e.g. user data)."""
    out = {}
    for name, (m, b) in SEEN_GAINS.items():
        ok = values.has(m, "test_mse") and values.has(b, "test_mse")
        out[name] = _rel(m, b, name=name).compute(values, p, values.variants, {})[name] if ok else float("nan")
    return out


def unseen_costs(values, p: Params) -> dict:
    """What unseen paraphrases cost each text-reading variant: its relative MSE increase over its seen
    condition, per seed."""
    out = {}
    for v in values.variants:
        if v.endswith(SEEN) and values.has(v, "test_mse") and values.has(v[: -len(SEEN)], "test_mse"):
            o = v[: -len(SEEN)]
            g = _rel(o, v, name="g").compute(values, p, values.variants, {})["g"]
            out[f"unseen_paraphrase_cost.test_mse.{o}"] = {s: -x for s, x in g.items()}
    return out


def _cost_names(p: Params, planned) -> list[str]:
    return [f"unseen_paraphrase_cost.test_mse.{v}" for v in planned if has_seen_condition(v, p)]


def rel_impr(values, p: Params) -> dict:
    """The card's percentages: 100 × the relative gains over the best unimodal / raw-text baseline."""
    out = {}
    for name, label in (("rel_impr_vs_best_unimodal", "unimodal"), ("rel_impr_vs_best_textfusion", "raw_text")):
        g = next(iter(_best(label).compute(values, p, values.variants, {}).values()), {})
        out[name] = {s: 100 * x for s, x in g.items()}
    return out


def _first_seed_mse(values, v: str, seed: int) -> float | None:
    return values.per_seed(v, "test_mse").get(seed) if values.has(v, "test_mse") else None


def _first_seed_gain(values, method: str, candidates, seed: int) -> float:
    """Relative gain of ``method`` over the best of ``candidates`` on the first seed (NaN if missing)."""
    m = _first_seed_mse(values, method, seed)
    cands = {c: x for c in candidates if (x := _first_seed_mse(values, c, seed)) is not None}
    if m is None or not cands:
        return float("nan")
    return relative_gain(method=m, baseline=min(cands.values()), lower_is_better=True)


def text_levels(values, p: Params) -> dict:
    """Over-attention: TESS's advantage over the best raw-text neural model at level A vs at level D, and MSE
    by text level (first seed: the level-D runs are single-seed)."""
    first = p.seeds[0]
    out = {
        "gap.test_mse.tess_vs_raw_text_at_A": _first_seed_gain(values, "tess", ("fusion_A", "xattn_A"), first),
        "gap.test_mse.tess_vs_raw_text_at_D": _first_seed_gain(values, "tess_D", ("fusion_D", "xattn_D"), first),
    }
    out["gap_a_minus_gap_d"] = out["gap.test_mse.tess_vs_raw_text_at_A"] - out["gap.test_mse.tess_vs_raw_text_at_D"]
    for model in ("tess", "fusion", "xattn"):
        for lv in LEVELS:
            v = "tess" if (model == "tess" and lv == "A") else f"{model}_{lv}"
            x = _first_seed_mse(values, v, first)
            if x is not None:
                out[f"mse_by_text_level.{model}.{lv}"] = x
    return out


def _text_level_names(p: Params, planned) -> list[str]:
    lv = [f"mse_by_text_level.{m}.{lv}" for m in ("tess", "fusion", "xattn") for lv in LEVELS]
    return ["gap.test_mse.tess_vs_raw_text_at_A", "gap.test_mse.tess_vs_raw_text_at_D", "gap_a_minus_gap_d", *lv]


def gate_metrics(values, p: Params) -> dict:
    """TESS's gate: AUROC against extraction correctness (all texts; the randomly rendered ones) and its
    mean, per seed."""
    out = {}
    for k in ("gate_auroc", "gate_mean", "gate_auroc_on_random_texts"):
        out[k] = values.per_seed("tess", k) if values.has("tess", k) else float("nan")
    return out


EXTRACTIONS = {f"extractions_{b}": f"extractions_{b}" for b in ("minilm_head", "lexicon", "prototype", "llm")}


def extraction_metrics(values, p: Params, windows, gt, texts, label_info, **extractions) -> dict:
    """Extraction accuracy (macro, level A, test windows) of every backend that ran, in both vocabulary
    conditions; the measured unseen-paraphrase share; the window lengths used."""
    out = {}
    test_ids = set(windows.loc[windows.split == "test", "window_id"])
    main = p.extractor.backend
    for key, extr in extractions.items():
        if extr is None or len(extr) == 0:  # a backend that did not run (llm off)
            continue
        backend = key[len("extractions_") :]
        for cond, kw in (
            ("", {}),
            (".seen_paraphrases", {"rendering": "seen"}),
            (".unseen_slots", {"unseen_only": True}),
        ):
            acc = extraction_accuracy(extr, gt, texts, test_ids, **kw)
            for prim, v in acc.items():
                out[f"extract_acc.{backend}.{prim}{cond}"] = v
                if backend == main and cond == "":
                    out[f"extract_acc_{prim}"] = v  # the card's names, main backend
            out[f"extract_acc.{backend}.mean{cond}"] = float(np.mean(list(acc.values())))
            if backend == main and cond == "":
                out["extract_acc_mean"] = out[f"extract_acc.{backend}.mean"]
    unseen_cols = [f"unseen_{prim}" for prim in PRIMITIVES if f"unseen_{prim}" in texts]
    if unseen_cols:
        ta = texts[(texts.level == "A") & texts.window_id.isin(test_ids)]
        out["unseen_paraphrase_share_measured"] = float(ta[unseen_cols].astype(float).to_numpy().mean())
    out["history_used"], out["horizon_used"] = int(label_info["history_used"]), int(label_info["horizon_used"])
    return out


def _extraction_names(p: Params, planned) -> list[str]:
    return [
        "extract_acc_mean",
        *(f"extract_acc_{prim}" for prim in PRIMITIVES),
        "history_used",
        "horizon_used",
        "unseen_paraphrase_share_measured",
    ]


def derived(p: Params) -> list:
    """The card's derived metrics: relative MSE gains per seed, paired (single-seed ablations compare on the
    first seed), and what needs more than a pair of variants."""
    out = [_best(label) for label in BEST]
    out += [
        _rel("tess", "patchtst"),
        _rel("tess", "tess_nogate"),
        _rel("oracle", "tess"),
        _rel("shuffled", "patchtst"),
        _rel("patchtst", "naive"),
    ]
    out += [
        _rel("tess", b, name=f"relative_gain.test_mse.tess_vs_{b}.unseen_paraphrases")
        for b in ("tfidf_ridge", "minilm_ridge")
    ]
    out += [_rel(v, "tess") for v in backend_variants(p) if v != "tess"]
    out += [
        Fn(seen_gains, list(SEEN_GAINS), needs_=["tess"]),
        Fn(unseen_costs, _cost_names),
        Fn(rel_impr, ["rel_impr_vs_best_unimodal", "rel_impr_vs_best_textfusion"], needs_=["tess"]),
        Fn(text_levels, _text_level_names),
        Fn(gate_metrics, ["gate_auroc", "gate_mean", "gate_auroc_on_random_texts"], needs_=["tess"]),
        Fn(extraction_metrics, _extraction_names, inputs=["windows", "gt", "texts", "label_info", *EXTRACTIONS]),
    ]
    return out


def report_extra(p: Params, values, artifacts: dict, label_info: dict) -> dict:
    best = {}
    for key, names in (
        ("best_unimodal", UNIMODAL),
        ("best_raw_text", RAW_TEXT),
        ("best_baseline", (*UNIMODAL, *RAW_TEXT)),
    ):
        cands = [v for v in names if values.has(v, "test_mse")]
        if cands:
            best[key] = min(cands, key=lambda v: values.mean(v, "test_mse"))
    L, H = int(label_info["history_used"]), int(label_info["horizon_used"])
    return {
        "best_variants": best,
        "history_used": L,
        "horizon_used": H,
        "data_source": p.data.source,
        "labeller": label_info,
    }


# --------------------------------------------------------------------------------------------- plots
def make_plots(p: Params, values, artifacts: dict, windows: pd.DataFrame, gt: pd.DataFrame, **extractions) -> dict:
    """Forecasts, MSE by text level, the two vocabulary conditions, the gate's reliability diagram and the
    main extractor's confusion matrices (test windows, level A)."""
    import matplotlib.pyplot as plt

    first = p.seeds[0]
    variants = set(values.variants)
    figs = {}
    a = normalise(windows)
    if p.eval.forecast_plots:
        test = a.idx["test"].numpy()[: p.eval.forecast_plots]
        fig, axes = plt.subplots(len(test), 1, figsize=(8, 2.2 * len(test)), squeeze=False)
        L, H = a.x.shape[1], a.y.shape[1]
        gti = gt.set_index("window_id")
        for ax, i in zip(axes[:, 0], test):
            wid = a.ids[i]
            ax.plot(range(L), a.x[i], color="0.5", lw=1, label="history")
            ax.plot(range(L, L + H), a.y[i], "k", lw=1.5, label="truth")
            for v, c in (("patchtst", "C0"), ("tess", "C3"), ("oracle", "C2")):
                t = (artifacts.get(v) or {}).get(f"seed{first}")
                if t is not None:
                    hit = (t["window_id"] == int(wid)).nonzero()
                    if len(hit):
                        ax.plot(range(L, L + H), t["pred"][int(hit[0, 0])], color=c, lw=1.2, label=v)
            ax.set_xlim(max(0, L - 48), L + H)
            ax.set_title(f"window {wid}: {', '.join(gti.loc[wid, list(PRIMITIVES)])}", fontsize=8)
        axes[0, 0].legend(fontsize=7, ncol=5)
        fig.tight_layout()
        figs["forecasts"] = fig
    if variants & {"tess", "tess_D", "fusion_A", "xattn_A"}:
        m = text_levels(values, p)
        series = {
            model: [m.get(f"mse_by_text_level.{model}.{lv}", np.nan) for lv in LEVELS]
            for model in ("tess", "fusion", "xattn")
        }
        figs["mse_vs_text_level"] = line_plot(
            LEVELS,
            series,
            "text level (A = narrative + distractors … E = direction only)",
            "test MSE (RevIN scale)",
            "MSE vs text compression (first seed)",
        )
    names = [v[: -len(SEEN)] for v in values.variants if v.endswith(SEEN) and values.has(v, "test_mse")]
    if names:
        labels, vals = [], []
        for v in names:
            labels += [f"{v} (seen)", f"{v} (unseen share {p.data.unseen_paraphrase_share:g})"]
            vals += [values.mean(v + SEEN, "test_mse"), values.mean(v, "test_mse")]
        figs["paraphrase_conditions"] = bar_plot(
            labels,
            vals,
            ylabel="test MSE (RevIN scale)",
            title="Seen-only vs unseen test paraphrases (same fitted models)",
        )
    t = (artifacts.get("tess") or {}).get(f"seed{first}")
    if t is not None and "gate" in t:
        g, c = t["gate"].numpy(), t["correct"].numpy()
        figs["gate_reliability"] = reliability_diagram(
            pd.Series(np.concatenate([g[:, k] for k in range(g.shape[1])])),
            pd.Series(np.concatenate([c[:, k] for k in range(c.shape[1])])),
            title="TESS gate vs extraction correctness",
        )
    extr = extractions.get(f"extractions_{p.extractor.backend}")
    if extr is not None and len(extr):
        test_ids = set(windows.loc[windows.split == "test", "window_id"])
        e = extr[(extr.level == "A") & extr.window_id.isin(test_ids)]
        if "rendering" in e:
            e = e[e.rendering == "open"]
        gti = gt.set_index("window_id")
        for prim in PRIMITIVES:
            ep = e[e.primitive == prim]
            labs = LABELS[prim]
            tr = gti.loc[ep.window_id, prim].map({lab: i for i, lab in enumerate(labs)}).to_numpy()
            pr = ep["label"].map({lab: i for i, lab in enumerate(labs)}).to_numpy()
            cm = np.zeros((len(labs), len(labs)))
            np.add.at(cm, (tr, pr), 1)
            figs[f"confusion_{prim}"] = confusion_matrix(
                cm, labs, f"{p.extractor.backend} extractor, {prim} (test, level A)"
            )
    return figs
