"""Metrics, the side-by-side timing benchmark, plots and the report of `medtpe` (the paper's evaluation:
token length, prefill latency, AUROC and format compliance vs the original tokeniser and token dropping)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.core.api import interleaved_timing, ratio_ci
from pipelines.medtpe.params import Params


# ------------------------------------------------------------------------------------------------ metrics
def _auc(y: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    from sklearn.metrics import average_precision_score, roc_auc_score

    if len(np.unique(y)) < 2:
        return float("nan"), float("nan")
    return float(roc_auc_score(y, s)), float(average_precision_score(y, s))


def _risk(d: pd.DataFrame) -> np.ndarray:
    """P(yes | answer is yes or no): the answer distribution restricted to the two answers."""
    return (d["p_yes"] / (d["p_yes"] + d["p_no"]).clip(lower=1e-30)).to_numpy()


def _rows(predictions: dict[str, pd.DataFrame]) -> list[dict]:
    rows = []
    for variant, preds in predictions.items():
        for seed, d in preds.groupby("seed"):
            r = {"variant": variant, "seed": int(seed)}
            aucs = []
            for task, dt in d.groupby("task"):
                auc, ap = _auc(dt["label"].to_numpy(), _risk(dt))
                r[f"auroc_{task}"], r[f"auprc_{task}"] = auc, ap
                r[f"accuracy_{task}"] = float(((dt["p_yes"] > dt["p_no"]).astype(int) == dt["label"]).mean())
                aucs.append(auc)
            r["auroc_mean"] = float(np.mean(aucs))
            r["format_compliance"] = 100.0 * float(d["compliant"].mean())
            r["mean_input_tokens"] = float(d["n_tokens"].mean())
            r["compression_ratio"] = 100.0 * (1 - d["n_tokens"].sum() / d["n_tokens_orig"].sum())
            r["roundtrip_lossless_rate"] = 100.0 * float(d["roundtrip_ok"].mean())
            r["vocab_size"] = float(d["vocab_size"].iloc[0])
            r["trainable_param_pct"] = 100.0 * float(d["trainable_params"].iloc[0] / d["total_params"].iloc[0])
            r["n_new_tokens"] = float(d["n_new_tokens"].iloc[0])
            rows.append(r)
    return rows


# ------------------------------------------------------------------------------------------------ timing
def timing(ehr: pd.DataFrame, bpe_base: dict, tpes: dict, base_state: dict, p: Params) -> dict:
    """data.timing — one node because its measurements must interleave: prefill CPU time (batch 1
    and batch 64), tokenisation time and tokenise + prefill, original vs MedTPE, rounds alternating
    between the two in a rotated order; ratios are medians of per-round ratios with an order-statistic
    interval. Also a prefill-time-vs-length curve of the base model."""
    import torch

    from pipelines.core.api import node_setup
    from pipelines.medtpe.model import adapt_model, make_model
    from pipelines.medtpe.tpe import BPE, SPECIALS, TPE
    from pipelines.medtpe.train import pad, prompts

    node_setup(p, p.seeds[0])
    bpe = BPE.from_dict(bpe_base)
    tok = TPE.from_dict(bpe, tpes[str(p.seeds[0])]["replace"])
    base = make_model(len(bpe.vocab), p.model)
    base.load_state_dict(base_state)
    base.eval()
    tpe_model = adapt_model(base, bpe.vocab, tok, set(SPECIALS)).eval()
    te = prompts(ehr[ehr.split == "test"], p.tasks[:1])
    texts = te["text"].tolist()[: p.timing.n_records]
    few = texts[: min(8, len(texts))]
    seqs = {"original": [bpe.encode(t) for t in texts], "medtpe": [tok.encode(t) for t in texts]}
    models = {"original": base, "medtpe": tpe_model}
    toks = {"original": bpe, "medtpe": tok}
    batch = {k: pad(v, bpe.pad_id) for k, v in seqs.items()}
    singles = {k: [pad([s], bpe.pad_id) for s in v[: len(few)]] for k, v in seqs.items()}

    def prefill_b1(k):
        def run():
            with torch.no_grad():
                for ids, ln in singles[k]:
                    models[k].last_logits(ids, ln)

        return run

    def prefill_b64(k):
        def run():
            with torch.no_grad():
                models[k].last_logits(*batch[k])

        return run

    def tokenize(k):
        def run():
            for t in few:
                toks[k].encode(t)

        return run

    def e2e(k):
        def run():
            with torch.no_grad():
                for t in few:
                    s = toks[k].encode(t)
                    models[k].last_logits(*pad([s], bpe.pad_id))

        return run

    fns = {}
    for k in ("original", "medtpe"):
        fns.update(
            {
                f"prefill_b1.{k}": prefill_b1(k),
                f"prefill_b64.{k}": prefill_b64(k),
                f"tokenize.{k}": tokenize(k),
                f"e2e_b1.{k}": e2e(k),
            }
        )
    t = interleaved_timing(fns, rounds=p.timing.rounds, warmup=1, clock="cpu")
    n_few = len(few)
    tok_ratio = float(np.mean([len(s) for s in seqs["medtpe"]]) / np.mean([len(s) for s in seqs["original"]]))
    tok_ratio_few = float(
        np.mean([len(s) for s in seqs["medtpe"][:n_few]]) / np.mean([len(s) for s in seqs["original"][:n_few]])
    )
    metrics: dict[str, float] = {"token_ratio.medtpe_vs_original": tok_ratio}
    for what, tr in (
        ("prefill_b1", tok_ratio_few),
        ("prefill_b64", tok_ratio),
        ("e2e_b1", tok_ratio_few),
        ("tokenize", tok_ratio_few),
    ):
        est = ratio_ci(t[f"{what}.medtpe"], t[f"{what}.original"])
        metrics.update(est.as_metrics(f"time_ratio.{what}.medtpe_vs_original"))
        if what.startswith("prefill"):
            # time reduction per unit of token reduction; the interval maps the ratio's interval
            red = 1 - tr
            metrics.update(
                {
                    f"prefill_reduction_per_token_reduction.{what[8:]}": (1 - est.ratio) / red,
                    f"prefill_reduction_per_token_reduction.{what[8:]}.ci_low": (1 - est.ci_high) / red,
                    f"prefill_reduction_per_token_reduction.{what[8:]}.ci_high": (1 - est.ci_low) / red,
                }
            )
    per_record = {"prefill_b1": n_few, "prefill_b64": 1, "tokenize": n_few, "e2e_b1": n_few}
    for name, v in t.items():
        what, k = name.split(".")
        metrics[f"{what}_ms.{k}"] = 1e3 * float(np.median(v)) / per_record[what]

    # prefill time vs length (batch 1, random token ids), interleaved over lengths
    g = torch.Generator().manual_seed(0)
    lens = [L for L in p.timing.lengths if L <= p.model.max_len]
    inputs = {L: (torch.randint(len(SPECIALS), len(bpe.vocab), (1, L), generator=g), torch.tensor([L])) for L in lens}

    def at(L):
        def run():
            with torch.no_grad():
                base.last_logits(*inputs[L])

        return run

    curve = interleaved_timing({str(L): at(L) for L in lens}, rounds=max(3, p.timing.rounds // 3), clock="cpu")
    return {
        "metrics": metrics,
        "rounds": p.timing.rounds,
        "records": len(texts),
        "records_b1": n_few,
        "curve": {"length": lens, "prefill_ms": [1e3 * float(np.median(curve[str(L)])) for L in lens]},
        "raw_seconds": {k: v.tolist() for k, v in t.items()},
    }


# ------------------------------------------------------------------------------------------------ report
def results_table(variant: str, preds: pd.DataFrame):
    """The variant's Results (core.spec) from its per-record predictions, one row of metrics per seed."""
    from pipelines.core.api import Results

    return Results(variant).add_rows(_rows({variant: preds}))


def derived(p: Params) -> list:
    """AUROC deltas vs the original tokeniser and vs init-only, per task and their mean, per seed (paired);
    the timing ratios of data.timing."""
    from pipelines.core.api import Diff, Fn

    out = []
    for task in [*p.tasks, "mean"]:
        col = f"auroc_{task}"
        out += [
            Diff(col, "original", v, name=f"delta.{col}.original_minus_{v}")
            for v in ("token_drop", "truncation", "medtpe_init", "medtpe", "medtpe_hard", "extend", "full_ft")
        ]
        out += [
            Diff(col, v, "medtpe_init", name=f"delta.{col}.{v}_minus_medtpe_init")
            for v in ("medtpe", "medtpe_hard", "extend", "full_ft")
        ]
    out.append(Fn(timing_metrics, timing_names, inputs=["timing"]))
    out.append(Fn(resolution_metrics, resolution_names, inputs=["original"]))
    return out


def hanley_mcneil_se(auc: float, n_pos: int, n_neg: int) -> float:
    """Standard error of an AUROC from its value and the class counts (Hanley & McNeil 1982)."""
    if not (n_pos and n_neg) or math.isnan(auc):
        return float("nan")
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def resolution_names(p: Params, planned) -> list[str]:
    return [f"{k}.{t}.original" for t in p.tasks for k in ("auroc_halfwidth", "test_cases", "test_positives")]


def resolution_metrics(values, p: Params, original: pd.DataFrame) -> dict[str, float]:
    """How finely the test set resolves an AUROC (gate `auroc_resolves_deltas`): the base model's AUROC on
    every test stay (all seeds' shards pooled, each stay once), 1.96 x its Hanley-McNeil standard error
    (the 95% test-sampling half-width), and the number of test stays and positives."""
    d = original.drop_duplicates(["task", "record_id"])
    out = {}
    for task in p.tasks:
        dt = d[d.task == task]
        y = dt["label"].to_numpy()
        n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
        auc = _auc(y, _risk(dt))[0]
        out[f"auroc_halfwidth.{task}.original"] = 1.96 * hanley_mcneil_se(auc, n_pos, n_neg)
        out[f"test_cases.{task}.original"] = float(len(y))
        out[f"test_positives.{task}.original"] = float(n_pos)
    return out


def timing_names(p: Params, planned) -> list[str]:
    names = ["token_ratio.medtpe_vs_original"]
    for what in ("prefill_b1", "prefill_b64", "e2e_b1", "tokenize"):
        names += [f"time_ratio.{what}.medtpe_vs_original{x}" for x in ("", ".ci_low", ".ci_high")]
        names += [f"{what}_ms.{k}" for k in ("original", "medtpe")]
    names += [
        f"prefill_reduction_per_token_reduction.{b}{x}" for b in ("b1", "b64") for x in ("", ".ci_low", ".ci_high")
    ]
    return names


def timing_metrics(values, p: Params, timing: dict) -> dict[str, float]:
    """The interleaved timing node's ratios (medians of per-round ratios with their order-statistic
    interval, computed in data.timing) as point metrics."""
    return {k: float(v) for k, v in timing["metrics"].items()}


def top_composites(tpes: dict, seed: int, k: int = 30) -> list[dict]:
    from pipelines.medtpe.tpe import unmap_safe

    spec = tpes[str(seed)]["replace"]
    stoi = {s: i for i, s in enumerate(spec["vocab"])}
    out = []
    for rank, g in enumerate(spec["merges"][:k]):
        out.append(
            {
                "rank": rank + 1,
                "composite": unmap_safe("".join(g)),
                "parts": [unmap_safe(t) for t in g],
                "id": stoi["".join(g)],
                "replaced": unmap_safe(spec["removed"][rank]) if spec["removed"] else None,
            }
        )
    return out


def make_plots(p: Params, results, artifacts: dict, timing: dict, tpes: dict, original: pd.DataFrame) -> dict:
    import matplotlib.pyplot as plt

    from pipelines.core.api import bar_plot, line_plot

    predictions = {"original": original, **{v: pd.DataFrame(a["predictions"]) for v, a in artifacts.items()}}

    figs = {}
    rows = pd.DataFrame(_rows(predictions))
    agg = rows.groupby("variant")[f"auroc_{p.tasks[0]}"].agg(["mean", "std"]).fillna(0.0)
    figs["auroc_by_variant"] = bar_plot(
        list(agg.index),
        list(agg["mean"]),
        list(agg["std"]),
        ylabel=f"AUROC ({p.tasks[0]})",
        title="AUROC by variant (mean ± std over seeds)",
    )
    ref = predictions["original"]
    ref = ref[ref.seed == p.seeds[0]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(ref["n_tokens_orig"], bins=30, alpha=0.6, label="original BPE")
    for v in ("medtpe", "medtpe_init"):
        if v in predictions:
            d = predictions[v]
            ax.hist(d[d.seed == p.seeds[0]]["n_tokens"], bins=30, alpha=0.6, label="MedTPE")
            break
    ax.set(xlabel="input tokens per prompt", ylabel="prompts", title="Input length before / after MedTPE")
    ax.legend()
    fig.tight_layout()
    figs["length_histogram"] = fig
    figs["latency_vs_length"] = line_plot(
        timing["curve"]["length"],
        {"base model, batch 1": timing["curve"]["prefill_ms"]},
        xlabel="input tokens",
        ylabel="prefill CPU ms (median)",
        title="Prefill latency vs input length",
    )
    # AUROC by input-length bucket (tertiles of the original length), first task
    edges = np.quantile(ref["n_tokens_orig"], [0, 1 / 3, 2 / 3, 1])
    series = {}
    for v, d in predictions.items():
        d = d[d.task == p.tasks[0]]
        vals = []
        for lo, hi in zip(edges[:-1], edges[1:]):
            b = d[(d.n_tokens_orig >= lo) & (d.n_tokens_orig <= hi)]
            vals.append(float(np.nanmean([_auc(bs["label"].to_numpy(), _risk(bs))[0] for _, bs in b.groupby("seed")])))
        series[v] = vals
    figs["auroc_by_length_bucket"] = line_plot(
        [f"{int(a)}-{int(b)}" for a, b in zip(edges[:-1], edges[1:])],
        series,
        xlabel="original input tokens (tertile)",
        ylabel=f"AUROC ({p.tasks[0]})",
        title="AUROC by input-length bucket",
    )
    top = top_composites(tpes, p.seeds[0])
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(top) + 1))
    ax.axis("off")
    cells = [
        [r["rank"], repr(r["composite"]), " + ".join(repr(x) for x in r["parts"]), repr(r["replaced"])] for r in top
    ]
    if cells:
        tb = ax.table(cellText=cells, colLabels=["#", "composite", "parts", "ID taken from"], loc="center")
        tb.auto_set_font_size(False)
        tb.set_fontsize(7)
    ax.set_title(f"Top {len(top)} composite tokens (seed {p.seeds[0]})")
    fig.tight_layout()
    figs["top_composites"] = fig
    return figs


def report_extra(p: Params, results, artifacts: dict, timing: dict, tpes: dict) -> dict:
    return {
        "top_composites": top_composites(tpes, p.seeds[0]),
        "timing_note": f"CPU time (process_time), {timing['rounds']} interleaved rounds; "
        f"batch 1 over {timing['records_b1']} records, batch {timing['records']}",
    }
