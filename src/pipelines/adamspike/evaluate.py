"""Metrics, spike-event table, report and plots of `adamspike`: every variant's per-step table → spike counts,
stage fractions, the edge-of-stability level of η·λ_max(Ĥ), the step-sign accuracy of λ_grad, and the
sustained alarm rules' precision / recall / lead (paper §4-5; the card's scoring)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.adamspike.anatomy import (
    RULES,
    STAGES,
    alarms,
    detect_spikes,
    eos_median,
    precond_threshold,
    rule_conditions,
    score_alarms,
    stage_labels,
    step_sign_accuracy,
    thin_steps,
)
from pipelines.adamspike.params import Params, Variant

RULE_PREFIX = {
    "lambda_grad": "predictor",
    "lambda_precond": "precond_rule",
    "lambda_raw": "raw_rule",
    "loss_up": "loss_up_rule",
}


def _threshold(cfg: Variant) -> float:
    return precond_threshold(cfg.beta1 if cfg.optimizer == "adam" else 0.0)


def _tracked(cfg: Variant) -> bool:
    return cfg.model == "quad" or cfg.track


def analyse(run: pd.DataFrame, cfg: Variant, p: Params) -> dict:
    """One (variant, seed) run → its metrics row, events, stage labels and alarm scores."""
    run = run.sort_values("step").reset_index(drop=True)
    ll = run["log10_loss"].to_numpy(float)
    sp = p.spikes
    thr = _threshold(cfg)
    ratio, dr = run["decoupling_ratio"].to_numpy(float), p.stages.decoupled_ratio
    events = detect_spikes(ll, sp.factor, sp.window, sp.merge, ratio, dr)  # the card's events (merged)
    strict = detect_spikes(ll, sp.factor_strict, sp.window, sp.merge, ratio, dr)
    every = detect_spikes(ll, sp.factor, sp.window, 0, ratio, dr)  # every spike, for the stages
    lab = stage_labels(run, every, thr, dr)
    dl = run["log10_loss_next"].to_numpy(float) - ll
    row = {
        "n_spikes": len(events),
        "n_spikes_100x": len(strict),
        "max_spike_rise_decades": max((e.rise_decades for e in events), default=0.0),
        "min_log10_loss": float(np.nanmin(np.r_[ll, run["log10_loss_next"].to_numpy(float)[-1:]])),
        "final_log10_loss": float(run["log10_loss_next"].iloc[-1]),
        "n_loss_increases": int(np.sum(dl > 0)),
        "frac_steps_decoupled": float(np.mean(run["decoupling_ratio"].to_numpy(float) < p.stages.decoupled_ratio)),
        "median_decoupling_ratio": float(np.median(run["decoupling_ratio"].to_numpy(float))),
    }
    for s in STAGES:
        row[f"frac_stage_{s}"] = float(np.mean(lab == s))
    scores = {}
    if _tracked(cfg):
        lam = run["eta_lambda_max_precond"].to_numpy(float)
        med = eos_median(run, thr)
        row.update(
            {
                "precond_threshold": thr,
                "max_eta_lambda_precond": float(np.max(lam)),
                "median_eta_lambda_precond_eos": med,
                "eos_rel_err": abs(med - thr) / thr if math.isfinite(med) else float("nan"),
                "step_sign_accuracy": step_sign_accuracy(run),
                "frac_steps_lambda_grad_above_2": float(np.mean(run["eta_lambda_grad"].to_numpy(float) > 2.0)),
                "median_cos_grad_topeig_s3": float(np.median(run["cos_grad_topeig"].to_numpy(float)[lab == 3]))
                if np.any(lab == 3)
                else float("nan"),
            }
        )
        conds = rule_conditions(run, thr)
        spikes = [e.detect for e in events]
        for rule in RULES:
            al = alarms(conds[rule], p.predictor.k)
            sc = score_alarms(al, spikes, p.predictor.horizon)
            sc["alarms"] = al
            scores[rule] = sc
            pre = RULE_PREFIX[rule]
            row[f"{pre}_precision"], row[f"{pre}_recall"] = sc["precision"], sc["recall"]
            row[f"{pre}_n_alarms"] = sc["n_alarms"]
            row["median_lead_steps" if rule == "lambda_grad" else f"{pre}_median_lead"] = sc["median_lead"]
        one = score_alarms(alarms(conds["lambda_grad"], 1), spikes, p.predictor.horizon)
        row["predictor_precision_k1"] = one["precision"]
        row["precision_gain_vs_precond_rule"] = row["predictor_precision"] - row["precond_rule_precision"]
        row["recall_gain_vs_precond_rule"] = row["predictor_recall"] - row["precond_rule_recall"]
    row["n_spikes_unmerged"] = len(every)
    return {
        "run": run,
        "row": row,
        "events": events,
        "strict": strict,
        "every": every,
        "stages": lab,
        "scores": scores,
        "threshold": thr,
    }


def analyse_all(p: Params, runs: dict[str, pd.DataFrame]) -> dict[str, dict[int, dict]]:
    return {v: {int(s): analyse(d, p.configs[v], p) for s, d in df.groupby("seed")} for v, df in runs.items()}


def steps_artifact(run: pd.DataFrame) -> dict:
    """A variant's per-step table (every seed, columns ``train.COLUMNS``) as tensors (the plots' input)."""
    import torch

    return {"steps": {c: torch.from_numpy(run[c].to_numpy().copy()) for c in run.columns}}


def runs_from_artifacts(artifacts: dict[str, dict]) -> dict[str, pd.DataFrame]:
    """``{variant: per-step table}`` back from the variants' artifacts."""
    from pipelines.adamspike.train import COLUMNS

    return {v: pd.DataFrame({c: t.numpy() for c, t in a["steps"].items()})[COLUMNS] for v, a in artifacts.items()}


def results_table(p: Params, variant: str, run: pd.DataFrame):
    """The long table of one variant: per seed its metrics row, and its per-step curves (``history_points``
    steps: an even grid plus every spike): every quantity of the first seed, the loss of the other seeds
    (``log10_loss_seed<s>``)."""
    from pipelines.core.api import Results

    res = Results(variant)
    by_seed = analyse_all(p, {variant: run})[variant]
    for k, (seed, a) in enumerate(sorted(by_seed.items())):
        res.add(seed, **a["row"])
        for name, h in _histories(p, variant, a, first=k == 0).items():
            res.history(seed, name, h["value"], h["step"])
    return res.table()


def spike_events(p: Params, analysed: dict[str, dict[int, dict]]) -> pd.DataFrame:
    """One row per detected spike: where it starts, is detected, peaks and recovers, its size, and the lead
    of each alarm rule that caught it (tracked runs)."""
    rows = []
    for v, by_seed in analysed.items():
        for seed, a in by_seed.items():
            strict = {e.detect for e in a["strict"]}
            for i, e in enumerate(a["events"]):
                r = {
                    "variant": v,
                    "seed": seed,
                    "event": i,
                    "onset_step": e.onset,
                    "detect_step": e.detect,
                    "peak_step": e.peak,
                    "recovery_end_step": e.end,
                    "rise_decades": e.rise_decades,
                    "over_100x": any(e.onset <= d <= e.end for d in strict),
                }
                for rule, sc in a["scores"].items():
                    al = sc["alarms"]
                    before = al[(al <= e.detect) & (al >= e.detect - p.predictor.horizon)]
                    r[f"lead_{rule}"] = float(e.detect - before.max()) if before.size else float("nan")
                rows.append(r)
    cols = [
        "variant",
        "seed",
        "event",
        "onset_step",
        "detect_step",
        "peak_step",
        "recovery_end_step",
        "rise_decades",
        "over_100x",
        *[f"lead_{r}" for r in RULES],
    ]
    return pd.DataFrame(rows, columns=cols)


def _histories(p: Params, v: str, a: dict, first: bool) -> dict[str, dict]:
    """One (variant, seed) run's MLflow curves: every per-step quantity for the first seed (``log10_loss``,
    ...), only the loss (``log10_loss_seed<s>``) for the others."""
    run = a["run"]
    idx = thin_steps(len(run), a["events"], p.history_points)
    steps = run["step"].to_numpy()[idx]

    def series(col, transform=lambda z: z):
        vals = transform(np.asarray(col, float)[idx])
        return {"step": steps.tolist(), "value": vals.tolist()}

    if not first:
        return {f"log10_loss_seed{int(run['seed'].iloc[0])}": series(run["log10_loss"])}
    h = {
        "log10_loss": series(run["log10_loss"]),
        "stage": series(a["stages"]),
        "log10_sum_g2": series(run["log10_sum_g2"]),
        "log10_sum_v": series(run["log10_sum_v"]),
    }
    with np.errstate(divide="ignore"):
        h["log10_decoupling_ratio"] = series(run["decoupling_ratio"], np.log10)
    if _tracked(p.configs[v]):
        h["eta_lambda_max_precond"] = series(run["eta_lambda_max_precond"])
        h["eta_lambda_max_precond_threshold"] = series(np.full(len(run), a["threshold"]))
        # +inf (gᵀu ≤ 0: the step raises the loss at first order) shown capped at 1e3
        h["eta_lambda_grad"] = series(run["eta_lambda_grad"], lambda z: np.minimum(z, 1e3))
        h["eta_lambda_max_raw"] = series(run["eta_lambda_max_raw"])
        h["cos_grad_topeig"] = series(run["cos_grad_topeig"])
    return h


def pooled_names(p: Params, planned) -> list[str]:
    if not any(v in planned for v in p.headline_variants):
        return []
    return [
        n
        for rule in RULES
        for n in (
            f"pooled.{RULE_PREFIX[rule]}_precision",
            f"pooled.{RULE_PREFIX[rule]}_recall",
            "pooled.median_lead_steps" if rule == "lambda_grad" else f"pooled.{RULE_PREFIX[rule]}_median_lead",
        )
    ]


def pooled(values, p: Params, artifacts: dict[str, dict]) -> dict[str, float]:
    """The predictor study pooled over the headline variants and seeds (a point value each: alarms, spikes
    and leads are summed over the runs, not averaged per seed)."""
    heads = {v: a for v, a in artifacts.items() if v in p.headline_variants}
    return _pooled(p, analyse_all(p, runs_from_artifacts(heads)))


def _pooled(p: Params, analysed) -> dict[str, float]:
    """The predictor study pooled over the headline variants and seeds (alarms and spikes summed)."""
    m: dict[str, float] = {}
    heads = [v for v in p.headline_variants if v in analysed]
    if not heads:
        return m
    for rule in RULES:
        tp = n_al = caught = n_sp = 0.0
        leads: list[int] = []
        for v in heads:
            for a in analysed[v].values():
                sc = a["scores"][rule]
                tp += sc["precision"] * sc["n_alarms"]
                n_al += sc["n_alarms"]
                caught += len(sc["leads"])
                n_sp += len(a["events"])
                leads += sc["leads"]
        pre = RULE_PREFIX[rule]
        m[f"pooled.{pre}_precision"] = tp / n_al if n_al else 0.0
        m[f"pooled.{pre}_recall"] = caught / n_sp if n_sp else float("nan")
        m["pooled.median_lead_steps" if rule == "lambda_grad" else f"pooled.{pre}_median_lead"] = (
            float(np.median(leads)) if leads else float("nan")
        )
    return m


def report_extra(p: Params, values, artifacts: dict[str, dict]) -> dict:
    """The spike-event table (first 500 rows) and its length, beside the contract's report fields."""
    events = spike_events(p, analyse_all(p, runs_from_artifacts(artifacts))).to_dict(orient="records")
    return {"spike_events": events[:500], "n_spike_events": len(events)}


def plots(p: Params, values, artifacts: dict[str, dict]) -> dict:
    from pipelines.adamspike.figures import make_figures

    return make_figures(p, analyse_all(p, runs_from_artifacts(artifacts)))
