"""Data stage of TESS: the `tess_synth` semi-synthetic generator (card: Small-scale reproduction), the
ground-truth primitive labeller (paper's TESS space, thresholds fit on train only) and the text ladder A–E."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from pipelines.core.params import parse
from pipelines.tess.lexicon import BANK, DEFAULT, DIRECTION, DISTRACTORS, LABELS, LAG_GROUPS, PRIMITIVES

log = logging.getLogger(__name__)
TEMPLATES = ("ramp_up", "ramp_down", "bump", "dip", "oscillation")
LEVELS = ("A", "B", "C", "D", "E")


# ----------------------------------------------------------------------------------------------- generator
def _template(name: str, tau: np.ndarray, span: int) -> np.ndarray:
    u = tau / max(span, 1)
    return {"ramp_up": u, "ramp_down": -u, "bump": np.sin(np.pi * u), "dip": -np.sin(np.pi * u),
            "oscillation": np.sin(2 * np.pi * tau / 6.0)}[name]


def generate_windows(raw: dict) -> pd.DataFrame:
    """One window per series: history x (L), future y (H), the no-event future and the event path.

    The event happens inside the forecast window, so the history cannot reveal it; the no-event
    continuation shares the noise draws, so ``event_path = y - y_no_event`` is the realised event."""
    p = parse("tess", raw)
    d = p.data
    if d.source == "files":
        return load_user_windows(d.windows_path)
    rng = np.random.default_rng(d.data_seed)
    n, L, H = d.n_windows, d.history, d.horizon
    T = L + H
    t = np.arange(T)
    level = rng.normal(0, 2, n)
    amp = rng.uniform(0.5, 1.5, n)
    phase = rng.uniform(0, 2 * np.pi, n)
    season = level[:, None] + amp[:, None] * np.sin(2 * np.pi * t[None, :] / d.period + phase[:, None])
    eps = rng.normal(0, d.ar_sigma, (n, T))
    has_event = rng.random(n) < d.p_event
    shift_mult = rng.choice([0.0, 0.5, -0.5, 1.5, -1.5], n)
    vol_mult = rng.choice([0.5, 1.0, 2.0], n)
    template = rng.choice(TEMPLATES, n)
    shape_amp = rng.uniform(0.5, 1.5, n)
    onset = rng.choice([0, H // 3, 2 * H // 3], n)
    decay = rng.choice(["fade", "persist"], n)

    ar = np.zeros((n, T))
    for i in range(1, T):
        ar[:, i] = d.ar_phi * ar[:, i - 1] + eps[:, i]
    base = season + ar
    sigma_x = base[:, :L].std(1)
    y_no = base[:, L:]
    y = y_no.copy()
    for i in np.flatnonzero(has_event):
        tau = np.arange(H) - onset[i]
        on = tau >= 0
        # volatility: innovations after onset scaled, AR state carried from the history
        scaled = eps[i, L:] * np.where(on, vol_mult[i], 1.0)
        ar_e = np.empty(H)
        prev = ar[i, L - 1]
        for k in range(H):
            prev = d.ar_phi * prev + scaled[k]
            ar_e[k] = prev
        env = np.where(decay[i] == "fade", 0.5 ** (np.clip(tau, 0, None) / (H / 6)), 1.0)
        bump = sigma_x[i] * (shift_mult[i] + shape_amp[i] * _template(template[i], np.clip(tau, 0, None), H - onset[i]))
        y[i] = season[i, L:] + ar_e + np.where(on, bump * env, 0.0)
    ids = np.arange(n)
    split = np.array(["train", "val", "test"])[np.searchsorted(np.cumsum(d.split)[:2] * n, ids, side="right")]
    return pd.DataFrame({
        "window_id": ids, "split": split,
        "x": list(base[:, :L].astype("float32")), "y": list(y.astype("float32")),
        "y_no_event": list(y_no.astype("float32")),
        "has_event": has_event, "gen_shift": np.where(has_event, shift_mult, 0.0),
        "gen_vol": np.where(has_event, vol_mult, 1.0), "gen_template": np.where(has_event, template, "none"),
        "gen_onset": np.where(has_event, onset, -1), "gen_decay": np.where(has_event, decay, "none"),
    })


def load_user_windows(path: str) -> pd.DataFrame:
    """User windows (README: 'Bring your own data'): parquet with window_id, split, x, y (lists)."""
    df = pd.read_parquet(path)
    missing = {"window_id", "split", "x", "y"} - set(df.columns)
    if missing:
        raise ValueError(f"tess windows file {path}: missing columns {sorted(missing)}")
    if "y_no_event" not in df:  # without a counterfactual the event path is the deviation from the history mean
        df["y_no_event"] = [np.full(len(y), np.mean(x), dtype="float32") for x, y in zip(df.x, df.y)]
    return df


# ----------------------------------------------------------------------------------------------- labeller
def primitive_stats(x: np.ndarray, y: np.ndarray, y_no: np.ndarray) -> dict[str, np.ndarray]:
    """Continuous statistics per window, in RevIN units (divided by std of the history)."""
    sx = x.std(1) + 1e-8
    s = (y.mean(1) - x.mean(1)) / sx
    r = np.log((np.diff(y, axis=1).std(1) + 1e-8) / (np.diff(x, axis=1).std(1) + 1e-8))
    a = np.abs(y - y_no) / sx[:, None]                     # realised event path a_t >= 0
    H = y.shape[1]
    tt = np.arange(1, H + 1)
    mass = a.sum(1)
    safe = np.where(mass > 1e-6, mass, 1.0)
    c = (a * tt).sum(1) / (H * safe)
    tail = a[:, -(H // 3):].sum(1) / safe
    q = a.max(1) / safe
    return {"s": s, "r": r, "c": c, "tail": tail, "q": q, "mass": mass,
            "z": (y - y_no) / sx[:, None]}


def _smooth(z: np.ndarray) -> np.ndarray:
    pad = np.pad(z, ((0, 0), (1, 1)), mode="edge")
    return (pad[:, :-2] + pad[:, 1:-1] + pad[:, 2:]) / 3


def shape_label(z: np.ndarray, sign_changes: int, rel_step: float, trend_share: float) -> str:
    """Rules in priority order on one (smoothed) event path: OSCILLATE, ASCEND/DESCEND, PEAK/TROUGH, else OSCILLATE."""
    dz = np.diff(z)
    big = np.abs(dz).max() if len(dz) else 0.0
    if big < 1e-9:
        return "OSCILLATE"
    sig = np.abs(dz) > rel_step * big
    signs = np.sign(dz[sig])
    if np.count_nonzero(np.diff(signs)) >= sign_changes:
        return "OSCILLATE"
    n_sig = max(int(sig.sum()), 1)
    up, down = np.sum(dz[sig] > 0) / n_sig, np.sum(dz[sig] < 0) / n_sig
    net = z[-1] - z[0]
    if up >= trend_share and net > 0 and up > down:
        return "ASCEND"
    if down >= trend_share and net < 0 and down > up:
        return "DESCEND"
    H = len(z)
    rng_ = z.max() - z.min()
    best_peak, best_trough = 0.0, 0.0
    for k in range(H // 4, 3 * H // 4 + 1):
        before, after = (z[k] - z[0]) / rng_, (z[-1] - z[k]) / rng_
        if before > 0 and after < 0:
            best_peak = max(best_peak, min(before, -after))
        if before < 0 and after > 0:
            best_trough = max(best_trough, min(-before, after))
    if max(best_peak, best_trough) >= 0.25:
        return "PEAK" if best_peak >= best_trough else "TROUGH"
    return "OSCILLATE"


def _signed_label(v: np.ndarray, cuts: tuple[float, float], names: list[str]) -> np.ndarray:
    """names = [strong-neg, mild-neg, neutral, mild-pos, strong-pos] from |v| cut points and the sign."""
    mag = np.where(np.abs(v) < cuts[0], 0, np.where(np.abs(v) < cuts[1], 1, 2))
    idx = 2 + np.sign(v).astype(int) * mag
    return np.array(names)[idx]


def fit_thresholds(stats: dict[str, np.ndarray], train: np.ndarray, lp) -> dict[str, float]:
    """Cut points from the TRAIN windows only (card: Pitfalls, future leakage)."""
    ev = train & (stats["mass"] > 1e-6)
    early_mid = ev & (stats["c"] < 2 / 3)  # fade vs persist only splits EARLY-* and MID-* labels
    return {
        "shift_lo": float(np.quantile(np.abs(stats["s"][train]), lp.shift_quantiles[0])),
        "shift_hi": float(np.quantile(np.abs(stats["s"][train]), lp.shift_quantiles[1])),
        "vol_lo": float(np.quantile(np.abs(stats["r"][train]), lp.vol_quantiles[0])),
        "vol_hi": float(np.quantile(np.abs(stats["r"][train]), lp.vol_quantiles[1])),
        "q_diffuse": float(np.quantile(stats["q"][ev], lp.diffuse_quantile)) if ev.any() else 0.0,
        "tail_median": float(np.median(stats["tail"][early_mid])) if early_mid.any() else 0.0,
    }


def apply_labeller(stats: dict[str, np.ndarray], th: dict[str, float], lp) -> pd.DataFrame:
    shift = _signed_label(stats["s"], (th["shift_lo"], th["shift_hi"]), LABELS["shift"])
    vol = _signed_label(stats["r"], (th["vol_lo"], th["vol_hi"]), LABELS["vol"])
    zs = _smooth(stats["z"])
    shape = np.array([shape_label(z, lp.osc_sign_changes, lp.osc_rel_step, lp.trend_share) for z in zs])
    c, tail, q, mass = stats["c"], stats["tail"], stats["q"], stats["mass"]
    persist = np.where(tail >= th["tail_median"], "PERSIST", "FADE")
    lag = np.where(c < 1 / 3, np.char.add("EARLY-", persist.astype(str)),
                   np.where(c < 2 / 3, np.char.add("MID-", persist.astype(str)), "LATE"))
    lag = np.where((mass <= 1e-6) | (q < th["q_diffuse"]), "DIFFUSE", lag)
    return pd.DataFrame({"shift": shift, "vol": vol, "shape": shape, "lag": lag.astype(str)})


def label_primitives(windows: pd.DataFrame, raw: dict) -> tuple[pd.DataFrame, dict]:
    """Ground-truth primitives recomputed from the realised y (never from the sampling parameters)."""
    lp = parse("tess", raw).labeller
    x, y, y_no = (np.stack(windows[c].to_numpy()).astype(float) for c in ("x", "y", "y_no_event"))
    stats = primitive_stats(x, y, y_no)
    train = (windows["split"] == "train").to_numpy()
    th = fit_thresholds(stats, train, lp)
    labels = apply_labeller(stats, th, lp)
    # merge labels rarer than min_label_share (train) into the primitive's default label
    merged = {}
    for prim in PRIMITIVES:
        share = labels.loc[train, prim].value_counts(normalize=True)
        rare = [lab for lab in LABELS[prim] if share.get(lab, 0.0) < lp.min_label_share and lab != DEFAULT[prim]]
        if rare:
            labels[prim] = labels[prim].where(~labels[prim].isin(rare), DEFAULT[prim])
        merged[prim] = rare
    hist = {prim: {k: int(v) for k, v in labels.loc[train, prim].value_counts().items()} for prim in PRIMITIVES}
    log.info("tess train label histogram: %s (merged: %s)", hist, merged)
    out = pd.concat([windows[["window_id", "split"]].reset_index(drop=True), labels], axis=1)
    for k in ("s", "r", "c", "tail", "q"):
        out[f"stat_{k}"] = stats[k]
    return out, {"thresholds": th, "train_histogram": hist, "merged_labels": merged}


# ----------------------------------------------------------------------------------------------- texts
def _phrase(rng: np.random.Generator, group: str) -> str:
    bank = BANK[group]
    return bank[rng.integers(len(bank))]


def _hedge(rng, phrase: str, rate: float) -> str:
    return f"{rng.choice(['may', 'could', 'might'])} {phrase}" if rng.random() < rate else phrase


def _lag_phrase(rng, label: str) -> str:
    return " ".join(_phrase(rng, g) for g in LAG_GROUPS[label])


def _direction(shift: str) -> str:
    return "up" if "RISE" in shift else "down" if "DROP" in shift else "flat"


def render_text(rng: np.random.Generator, labels: dict[str, str], level: str, hedge_rate: float,
                distractor_rate: float) -> tuple[str, int, int]:
    """Text for one window at one compression level; returns (text, narrative start, narrative end)."""
    shift = _hedge(rng, _phrase(rng, labels["shift"]), hedge_rate)
    if labels["shift"] == "STABLE" and rng.random() < 0.3:  # negated cues: "no surge" means STABLE
        shift = f"not {_phrase(rng, 'STRONG-RISE' if rng.random() < 0.5 else 'STRONG-DROP')}"
    vol = _phrase(rng, labels["vol"])
    shape = _phrase(rng, labels["shape"])
    lag = _lag_phrase(rng, labels["lag"])
    if level == "A":
        narrative = f"Analysts expect the series to {shift}, and it should {vol}; the path should {shape}, {lag}."
    elif level == "B":
        narrative = f"Level: {shift}. Noise: {vol}. Path: {shape}. Timing: {lag}."
    elif level == "C":
        narrative = f"Level: {shift}. Noise: {vol}. Path: {shape}."
    elif level == "D":
        narrative = f"Level: {shift}. Noise: {vol}."
    else:
        narrative = f"Outlook: {DIRECTION[_direction(labels['shift'])][0]}."
    if level != "A":
        return narrative, 0, len(narrative)
    k = rng.poisson(distractor_rate)
    ds = [DISTRACTORS[i] for i in rng.integers(len(DISTRACTORS), size=k)]
    pos = rng.integers(k + 1)
    before, after = " ".join(ds[:pos]), " ".join(ds[pos:])
    start = len(before) + (1 if before else 0)
    text = " ".join(s for s in (before, narrative, after) if s)
    return text, start, start + len(narrative)


def render_texts(windows: pd.DataFrame, gt: pd.DataFrame, raw: dict) -> pd.DataFrame:
    """Texts at every level; with probability rho from the true primitives, else from random ones."""
    p = parse("tess", raw)
    d = p.data
    if d.source == "files":
        texts = pd.read_parquet(d.texts_path)
        missing = {"window_id", "level", "text"} - set(texts.columns)
        if missing:
            raise ValueError(f"tess texts file {d.texts_path}: missing columns {sorted(missing)}")
        texts = texts.copy()
        texts["narrative_start"] = texts.get("narrative_start", 0)
        texts["narrative_end"] = texts.get("narrative_end", texts["text"].str.len())
        texts["from_truth"] = texts.get("from_truth", True)
        return texts
    rng = np.random.default_rng(d.data_seed + 1)
    rows = []
    gt_rows = gt.set_index("window_id")
    for wid in windows["window_id"]:
        truth = rng.random() < d.reliability
        g = gt_rows.loc[wid]
        labels = {prim: (g[prim] if truth else LABELS[prim][rng.integers(len(LABELS[prim]))]) for prim in PRIMITIVES}
        for level in LEVELS:
            text, a, b = render_text(rng, labels, level, d.hedge_rate, d.distractor_rate)
            rows.append({"window_id": int(wid), "level": level, "text": text, "narrative_start": a,
                         "narrative_end": b, "from_truth": bool(truth),
                         **{f"text_{prim}": labels[prim] for prim in PRIMITIVES}})
    return pd.DataFrame(rows)
