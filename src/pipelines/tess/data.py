"""Data stage of TESS: the `tess_synth` semi-synthetic generator (card: Small-scale reproduction), the
ground-truth primitive labeller (paper's TESS space, thresholds fit on train only) and the text ladder A–E."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.tess.lexicon import BANK, DEFAULT, DIRECTION, DISTRACTORS, LABELS, LAG_GROUPS, PRIMITIVES
from pipelines.tess.params import Params
from pipelines.tess.paraphrases import open_bank

log = logging.getLogger(__name__)
TEMPLATES = ("ramp_up", "ramp_down", "bump", "dip", "oscillation")
LEVELS = ("A", "B", "C", "D", "E")


# ----------------------------------------------------------------------------------------------- generator
def _template(name: str, tau: np.ndarray, span: int) -> np.ndarray:
    u = tau / max(span, 1)
    return {
        "ramp_up": u,
        "ramp_down": -u,
        "bump": np.sin(np.pi * u),
        "dip": -np.sin(np.pi * u),
        "oscillation": np.sin(2 * np.pi * tau / 6.0),
    }[name]


def generate_windows(p: Params) -> pd.DataFrame:
    """One window per series: history x (L), future y (H), the no-event future and the event path.

    The event happens inside the forecast window, so the history cannot reveal it; the no-event
    continuation shares the noise draws, so ``event_path = y - y_no_event`` is the realised event.
    With ``data.source: files`` the user's windows are loaded and checked instead (L, H from the file)."""
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
    return pd.DataFrame(
        {
            "window_id": ids,
            "split": split,
            "x": list(base[:, :L].astype("float32")),
            "y": list(y.astype("float32")),
            "y_no_event": list(y_no.astype("float32")),
            "has_event": has_event,
            "gen_shift": np.where(has_event, shift_mult, 0.0),
            "gen_vol": np.where(has_event, vol_mult, 1.0),
            "gen_template": np.where(has_event, template, "none"),
            "gen_onset": np.where(has_event, onset, -1),
            "gen_decay": np.where(has_event, decay, "none"),
        }
    )


USER_WINDOWS = "tess.user_windows"
USER_TEXTS = "tess.user_texts"
WINDOWS_SCHEMA = TableSchema(
    USER_WINDOWS,
    {"window_id": "int", "split": "str", "x": "array", "y": "array"},
    min_rows=3,
    no_missing=("window_id", "split", "x", "y"),
    unique=("window_id",),
    allowed={"split": ("train", "val", "test")},
    covers={"split": ("train", "test")},
    lengths={"x": None, "y": None},
)  # one history length L, one horizon H
TEXTS_SCHEMA = TableSchema(
    USER_TEXTS,
    {"window_id": "int", "level": "str", "text": "str"},
    no_missing=("window_id", "level", "text"),
    allowed={"level": LEVELS},
    unique=(("window_id", "level"),),
)


def _read_user_table(path: str, key: str) -> pd.DataFrame:
    return read_user_file(path, key=key, kind="parquet")


def check_user_windows(df: pd.DataFrame, dataset: str = USER_WINDOWS) -> pd.DataFrame:
    """Columns and kinds and what the method needs (:data:`WINDOWS_SCHEMA`): unique ids, known splits, one
    history length and one horizon for every window, a train and a test split; an optional counterfactual
    ``y_no_event`` of the horizon's length."""
    schema = WINDOWS_SCHEMA.refine(dataset=dataset)
    if "y_no_event" in df:
        schema = schema.refine(columns={"y_no_event": "array"}, lengths={"y_no_event": "y"})
    return schema.check(df)


def load_user_windows(path: str) -> pd.DataFrame:
    """User windows (README: 'Bring your own data'): parquet with window_id, split, x, y (lists)."""
    df = check_user_windows(_read_user_table(path, "tess.data.windows_path")).copy()
    df["x"] = [np.asarray(v, "float32") for v in df["x"]]
    df["y"] = [np.asarray(v, "float32") for v in df["y"]]
    if "y_no_event" not in df:  # without a counterfactual the event path is the deviation from the history mean
        df["y_no_event"] = [np.full(len(y), np.mean(x), dtype="float32") for x, y in zip(df.x, df.y)]
    else:
        df["y_no_event"] = [np.asarray(v, "float32") for v in df["y_no_event"]]
    log.info(
        "tess: user windows from %s: %d windows, history L = %d, horizon H = %d (data.history / "
        "data.horizon are not used)",
        path,
        len(df),
        len(df["x"].iloc[0]),
        len(df["y"].iloc[0]),
    )
    return df.sort_values("window_id").reset_index(drop=True)


def check_user_texts(texts: pd.DataFrame, windows: pd.DataFrame, dataset: str = USER_TEXTS) -> pd.DataFrame:
    """Columns, kinds, known levels, one text per (window_id, level) (:data:`TEXTS_SCHEMA`), then: one
    level-A text for every window (the levels B–E are optional)."""
    TEXTS_SCHEMA.refine(dataset=dataset).check(texts)
    have_a = set(texts.loc[texts["level"] == "A", "window_id"])
    missing = [int(w) for w in windows["window_id"] if w not in have_a]
    if missing:
        raise InputDataError(
            f"dataset '{dataset}': column 'window_id' lacks a level-A text for {len(missing)} "
            f"window(s), e.g. {missing[:3]}"
        )
    return texts


# ----------------------------------------------------------------------------------------------- labeller
def primitive_stats(x: np.ndarray, y: np.ndarray, y_no: np.ndarray) -> dict[str, np.ndarray]:
    """Continuous statistics per window, in RevIN units (divided by std of the history)."""
    sx = x.std(1) + 1e-8
    s = (y.mean(1) - x.mean(1)) / sx
    r = np.log((np.diff(y, axis=1).std(1) + 1e-8) / (np.diff(x, axis=1).std(1) + 1e-8))
    a = np.abs(y - y_no) / sx[:, None]  # realised event path a_t >= 0
    H = y.shape[1]
    tt = np.arange(1, H + 1)
    mass = a.sum(1)
    safe = np.where(mass > 1e-6, mass, 1.0)
    c = (a * tt).sum(1) / (H * safe)
    tail = a[:, -(H // 3) :].sum(1) / safe
    q = a.max(1) / safe
    return {"s": s, "r": r, "c": c, "tail": tail, "q": q, "mass": mass, "z": (y - y_no) / sx[:, None]}


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
    lag = np.where(
        c < 1 / 3,
        np.char.add("EARLY-", persist.astype(str)),
        np.where(c < 2 / 3, np.char.add("MID-", persist.astype(str)), "LATE"),
    )
    lag = np.where((mass <= 1e-6) | (q < th["q_diffuse"]), "DIFFUSE", lag)
    return pd.DataFrame({"shift": shift, "vol": vol, "shape": shape, "lag": lag.astype(str)})


def label_primitives(windows: pd.DataFrame, p: Params) -> tuple[pd.DataFrame, dict]:
    """Ground-truth primitives recomputed from the realised y (never from the sampling parameters)."""
    lp = p.labeller
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
    info = {
        "thresholds": th,
        "train_histogram": hist,
        "merged_labels": merged,
        "history_used": int(x.shape[1]),
        "horizon_used": int(y.shape[1]),
    }
    return out, info


# ----------------------------------------------------------------------------------------------- texts
class PhrasePicker:
    """Draws the phrase of one cue slot. The bank phrase is always drawn from the main generator (so the
    main stream, and with it every train/val text, is the same whatever the unseen share); for a test
    window, with probability ``share`` (from a second generator) it is replaced by an unseen paraphrase."""

    def __init__(self, rng_open: np.random.Generator | None = None, share: float = 0.0):
        self.rng_open, self.share = rng_open, share
        self.unseen: set[str] = set()  # primitives whose phrase was replaced in the current text

    def __call__(self, rng: np.random.Generator, group: str, prim: str) -> str:
        bank = BANK[group]
        phrase = bank[rng.integers(len(bank))]
        if self.rng_open is not None and self.share > 0 and self.rng_open.random() < self.share:
            alt = open_bank()[group]
            phrase = alt[self.rng_open.integers(len(alt))]
            self.unseen.add(prim)
        return phrase


def _hedge(rng, phrase: str, rate: float) -> str:
    return f"{rng.choice(['may', 'could', 'might'])} {phrase}" if rng.random() < rate else phrase


def _direction(shift: str) -> str:
    return "up" if "RISE" in shift else "down" if "DROP" in shift else "flat"


def render_text(
    rng: np.random.Generator,
    labels: dict[str, str],
    level: str,
    hedge_rate: float,
    distractor_rate: float,
    pick: PhrasePicker | None = None,
) -> tuple[str, int, int]:
    """Text for one window at one compression level; returns (text, narrative start, narrative end)."""
    pick = pick or PhrasePicker()
    shift = _hedge(rng, pick(rng, labels["shift"], "shift"), hedge_rate)
    if labels["shift"] == "STABLE" and rng.random() < 0.3:  # negated cues: "no surge" means STABLE
        shift = f"not {pick(rng, 'STRONG-RISE' if rng.random() < 0.5 else 'STRONG-DROP', 'shift')}"
    vol = pick(rng, labels["vol"], "vol")
    shape = pick(rng, labels["shape"], "shape")
    lag = " ".join(pick(rng, g, "lag") for g in LAG_GROUPS[labels["lag"]])
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


def render_texts(windows: pd.DataFrame, gt: pd.DataFrame, p: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Texts at every level; with probability rho from the true primitives, else from random ones.

    Two renderings of the same windows: ``texts`` (every window; a share ``data.unseen_paraphrase_share`` of
    the test windows' cue phrases are paraphrases the train split never uses) and ``texts_seen`` (the test
    windows only, every cue phrase from the bank the train split uses: the closed-vocabulary condition).
    Both consume the main generator identically, so train and val texts are the same in both and the two
    test renderings differ only in the replaced phrases. ``texts_seen`` is empty for user data."""
    d = p.data
    if d.source == "files":
        texts = check_user_texts(_read_user_table(d.texts_path, "tess.data.texts_path"), windows).copy()
        texts = texts[texts["window_id"].isin(set(windows["window_id"]))]
        if "narrative_start" not in texts:
            texts["narrative_start"] = 0
        if "narrative_end" not in texts:
            texts["narrative_end"] = texts["text"].str.len()
        if "from_truth" not in texts:
            texts["from_truth"] = True
        return texts.reset_index(drop=True), texts.iloc[:0].copy()
    rng = np.random.default_rng(d.data_seed + 1)
    rng_open = np.random.default_rng(d.data_seed + 2)  # only test windows draw from it
    rows, seen_rows = [], []
    gt_rows = gt.set_index("window_id")
    split = dict(zip(windows["window_id"], windows["split"]))
    for wid in windows["window_id"]:
        truth = rng.random() < d.reliability
        g = gt_rows.loc[wid]
        labels = {prim: (g[prim] if truth else LABELS[prim][rng.integers(len(LABELS[prim]))]) for prim in PRIMITIVES}
        test = split[wid] == "test"
        for level in LEVELS:
            meta = {
                "window_id": int(wid),
                "level": level,
                "from_truth": bool(truth),
                **{f"text_{prim}": labels[prim] for prim in PRIMITIVES},
            }
            if test:  # the closed-vocabulary rendering, same main draws
                state = rng.bit_generator.state
                text, a, b = render_text(rng, labels, level, d.hedge_rate, d.distractor_rate)
                seen_rows.append(
                    {
                        **meta,
                        "text": text,
                        "narrative_start": a,
                        "narrative_end": b,
                        **{f"unseen_{prim}": False for prim in PRIMITIVES},
                    }
                )
                rng.bit_generator.state = state
            pick = PhrasePicker(rng_open if test else None, d.unseen_paraphrase_share)
            text, a, b = render_text(rng, labels, level, d.hedge_rate, d.distractor_rate, pick)
            rows.append(
                {
                    **meta,
                    "text": text,
                    "narrative_start": a,
                    "narrative_end": b,
                    **{f"unseen_{prim}": prim in pick.unseen for prim in PRIMITIVES},
                }
            )
    cols = [
        "window_id",
        "level",
        "text",
        "narrative_start",
        "narrative_end",
        "from_truth",
        *(f"text_{prim}" for prim in PRIMITIVES),
        *(f"unseen_{prim}" for prim in PRIMITIVES),
    ]
    return pd.DataFrame(rows)[cols], pd.DataFrame(seen_rows, columns=cols)
