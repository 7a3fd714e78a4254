"""The anatomy of a spike, computed from one run's per-step table: spike events (the card's definition),
the five stages as per-step labels, alarm rules (sustained for k steps) and their precision / recall / lead
against the detected spikes, and the step-sign test of the λ_grad·η > 2 predictor."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

STAGES = {1: "S1 stable", 2: "S2 decoupling", 3: "S3 latent instability", 4: "S4 spike", 5: "S5 recovery"}
RULES = ("lambda_grad", "lambda_precond", "lambda_raw", "loss_up")


def precond_threshold(beta1: float) -> float:
    """η·λ_max(Ĥ) at the adaptive edge of stability: 2 for β₁ = 0, (2 + 2β₁)/(1 − β₁) with momentum
    (38 for β₁ = 0.9). GD is the β₁ = 0 case (D = I)."""
    return (2.0 + 2.0 * beta1) / (1.0 - beta1)


@dataclass
class Event:
    detect: int  # first step with loss > factor × min(previous `window` losses)
    onset: int  # the argmin of the loss over the window before detection: the rise starts here
    peak: int  # the largest loss before the event ends
    end: int  # last step of the recovery (loss back within `factor` of its onset level), inclusive
    rise_decades: float


def _prev_min(log_loss: np.ndarray, window: int) -> np.ndarray:
    """min of log_loss[t-window:t] (inf at t = 0)."""
    s = pd.Series(log_loss)
    return s.shift(1).rolling(window, min_periods=1).min().fillna(np.inf).to_numpy()


def detect_spikes(
    log_loss: np.ndarray,
    factor: float,
    window: int,
    merge: int,
    ratio: np.ndarray | None = None,
    decoupled_ratio: float | None = None,
) -> list[Event]:
    """Spikes: loss_t > factor × min(loss over the previous `window` steps, counting only steps after the
    previous event's recovery). A detection within `merge` steps of an event's first detection, or before
    that event has recovered, belongs to it.

    Per event: the onset is the loss minimum in the window before the detection (after the previous
    event); the peak is the running maximum from the detection until the loss has fallen `factor` below it
    or back to the detection level (`factor` × the onset loss);
    the recovery ends at the first step after the peak where the loss is back within `factor` of its onset
    level or, given the decoupling ratio Σg²/Σv̂, where it is back below `decoupled_ratio` (v has absorbed
    the burst of g² and decouples again), whichever comes first."""
    log_loss = np.asarray(log_loss, float)
    n = len(log_loss)
    lf = math.log10(factor)
    hit = np.flatnonzero(log_loss > _prev_min(log_loss, window) + lf)
    events: list[Event] = []
    for d in hit:
        d = int(d)
        if events and (d <= events[-1].end or d - events[-1].detect <= merge):
            continue
        # the reference minimum must come after the previous event: its pre-spike low is not a new baseline
        lo = max(0, d - window, events[-1].end + 1 if events else 0)
        if d <= lo or log_loss[d] <= log_loss[lo:d].min() + lf:
            continue
        onset = lo + int(np.argmin(log_loss[lo:d]))
        peak, t = d, d
        while t < n and log_loss[t] >= log_loss[peak] - lf and log_loss[t] > log_loss[onset] + lf:
            if log_loss[t] > log_loss[peak]:
                peak = t
            t += 1
        back = np.flatnonzero(log_loss[peak + 1 :] <= log_loss[onset] + lf)
        end = peak + 1 + int(back[0]) if back.size else n - 1
        if ratio is not None and decoupled_ratio is not None:
            again = np.flatnonzero(np.nan_to_num(ratio[peak + 1 : end + 1], nan=np.inf) < decoupled_ratio)
            if again.size:
                end = peak + int(again[0])
        events.append(Event(d, onset, peak, end, float(log_loss[peak] - log_loss[onset])))
    return events


def stage_labels(run: pd.DataFrame, events: list[Event], thr_precond: float, decoupled_ratio: float) -> np.ndarray:
    """Per-step stage 1..5. Inside an event (detected with no merging, so that every spike is labelled):
    S4 from the onset to the peak, S5 from the peak to the end of the recovery. Elsewhere: S3 when η·λ_max(Ĥ) is above its threshold (tracked runs), S2 when Σg²/Σv̂ is below
    `decoupled_ratio` (v no longer follows g²), else S1."""
    n = len(run)
    lam = run["eta_lambda_max_precond"].to_numpy(float)
    r = run["decoupling_ratio"].to_numpy(float)
    lab = np.where(r < decoupled_ratio, 2, 1)
    lab = np.where(np.nan_to_num(lam, nan=-np.inf) > thr_precond, 3, lab)
    for e in events:
        lab[e.onset : e.peak + 1] = 4
        lab[e.peak + 1 : min(e.end + 1, n)] = 5
    return lab


def rule_conditions(run: pd.DataFrame, thr_precond: float) -> dict[str, np.ndarray]:
    """The per-step condition of each alarm rule, known at step t (before θ_{t+1}'s loss is seen)."""
    ll = run["log10_loss"].to_numpy(float)
    up = np.zeros(len(ll), bool)
    up[1:] = ll[1:] > ll[:-1]
    with np.errstate(invalid="ignore"):
        return {
            "lambda_grad": run["eta_lambda_grad"].to_numpy(float) > 2.0,
            "lambda_precond": run["eta_lambda_max_precond"].to_numpy(float) > thr_precond,
            "lambda_raw": run["eta_lambda_max_raw"].to_numpy(float) > 2.0,
            "loss_up": up,
        }


def alarms(cond: np.ndarray, k: int) -> np.ndarray:
    """Steps where a run of consecutive true conditions reaches length k (one alarm per run)."""
    cond = np.asarray(cond, bool)
    if len(cond) < k:
        return np.array([], int)
    # step t alarms iff cond[t-k+1..t] all hold and cond[t-k] does not (or t = k-1)
    full = np.convolve(cond.astype(int), np.ones(k, int), mode="valid") == k  # window ending at t = i + k - 1
    prev_ok = np.r_[True, ~cond[: len(cond) - k]]
    return np.flatnonzero(full & prev_ok) + k - 1


def score_alarms(alarm_steps: np.ndarray, spike_steps: list[int], horizon: int) -> dict[str, float]:
    """Precision: alarms followed by a spike detection within `horizon` steps (0 when there is no alarm).
    Recall: spikes with an alarm in the `horizon` steps before them. Lead: detection − latest such alarm."""
    a = np.asarray(alarm_steps, int)
    s = np.asarray(spike_steps, int)
    tp = sum(bool(np.any((s >= t) & (s <= t + horizon))) for t in a)
    leads = []
    for d in s:
        before = a[(a <= d) & (a >= d - horizon)]
        if before.size:
            leads.append(int(d - before.max()))
    return {
        "precision": tp / len(a) if len(a) else 0.0,
        "recall": len(leads) / len(s) if len(s) else float("nan"),
        "median_lead": float(np.median(leads)) if leads else float("nan"),
        "n_alarms": float(len(a)),
        "leads": leads,
    }


def step_sign_accuracy(run: pd.DataFrame) -> float:
    """How often 'η·λ_grad > 2' gives the sign of the step's loss change L(θ_{t+1}) − L(θ_t)."""
    lam = run["eta_lambda_grad"].to_numpy(float)
    ok = ~np.isnan(lam)
    rise = (run["log10_loss_next"].to_numpy(float) > run["log10_loss"].to_numpy(float))[ok]
    return float(np.mean(rise == (lam[ok] > 2.0))) if ok.any() else float("nan")


def eos_median(run: pd.DataFrame, thr_precond: float) -> float:
    """Median η·λ_max(Ĥ) over the steps after it first reaches its threshold (the edge-of-stability regime);
    NaN if it never does."""
    lam = run["eta_lambda_max_precond"].to_numpy(float)
    hit = np.flatnonzero(lam >= thr_precond)
    return float(np.median(lam[hit[0] :])) if hit.size else float("nan")


def thin_steps(n: int, events: list[Event], budget: int) -> np.ndarray:
    """≤ budget step indices for an MLflow curve: an even grid plus the spikes' onsets, peaks and
    neighbourhoods, so thinning never hides a spike."""
    if n <= budget:
        return np.arange(n)
    keep: set[int] = set()
    for e in events:
        around = {e.onset, e.detect, e.peak, min(e.end, n - 1), *range(max(0, e.peak - 3), min(n, e.peak + 4))}
        if len(keep | around) > budget // 2:
            break
        keep |= around
    grid = np.linspace(0, n - 1, budget - len(keep)).round().astype(int)
    return np.array(sorted(keep | set(grid.tolist())))[:budget]
