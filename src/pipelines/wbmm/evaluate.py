"""Metrics, report and plots of `wbmm`. Every timing number comes from interleaved rounds and carries an
interval: speedups t_DW / t_WBMM (matched receptive field, matched parameters, the w=14 vs k=5 headline)
and the training-step ratio are medians of per-round ratios (``core.metrics.ratio_ci``); the scaling slopes
of time in k² and w² are medians of per-round log-log slopes (``median_ci``); the GFLOP/s ratio is a
constant times a time ratio. Each such metric keeps its own interval (a ``core.stats.Estimate``), from
which core's claims evaluator reports holds / fails / inconclusive; the accuracy differences are per seed,
paired (``core.spec.Diff``).

Grid summaries (``min`` / ``max`` / ``median`` over the configs, all of them or those with H ≥ 28) apply
the same monotone function to the per-config values and to the per-config interval ends, with each
config's interval at confidence 1 − (1 − c)/m for m configs (Bonferroni): if every config's interval holds
its true value, which happens with probability ≥ c, the summary's interval holds the summary's true value."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

from pipelines.core.api import (  # noqa: E402  # noqa: E402
    Diff,
    Estimate,  # noqa: E402
    Fn,
    bar_plot,  # noqa: E402
    median_ci,
    ratio_ci,
)
from pipelines.wbmm.bench import KEYS, op_flops, padded  # noqa: E402
from pipelines.wbmm.params import Params  # noqa: E402

OPS = ("dw", "wbmm", "unfold", "attn")
LARGE = 28  # "large maps" of the card's claims: H ≥ 28
NAN3 = (math.nan, math.nan, math.nan)
Est = tuple[float, float, float]  # value, interval low, interval high
Cfg = tuple[str, int, int, int]  # dtype, batch, channels, size


def op_variant(op: str, param: int) -> str:
    return f"{op}_{'k' if op in ('dw', 'unfold') else 'w'}{param}"


def cfg_name(dtype: str, b: int, c: int, h: int) -> str:
    return f"b{b}_c{c}_h{h}" + ("" if dtype == "float32" else f"_{dtype}")


def loglog_slope(x: Iterable[float], t: Iterable[float]) -> float:
    """Least-squares slope of log t on log x (NaN with fewer than two points)."""
    x, t = np.asarray(list(x), float), np.asarray(list(t), float)
    ok = np.isfinite(x) & np.isfinite(t) & (x > 0) & (t > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(t[ok]), 1)[0])


# ------------------------------------------------------------------------------------------ timings
def series(bench: pd.DataFrame) -> dict[tuple, np.ndarray]:
    """Seconds per call by round, per measurement ``(dtype, batch, channels, size, op, param, mode)``."""
    out = {}
    for key, g in bench.groupby(KEYS, sort=False):
        key = tuple(int(k) if isinstance(k, np.integer) else k for k in key)
        out[key] = g.sort_values("round")["seconds"].to_numpy(float)
    return out


def summary(bench: pd.DataFrame) -> pd.DataFrame:
    """One row per measurement: median and quartiles (ms) over the rounds, rounds, calls per sample,
    the padded size WBMM computes on and the effective GFLOP/s of the median forward."""
    rows = []
    for key, g in bench.groupby(KEYS, sort=False):
        rec = dict(zip(KEYS, key, strict=True))
        s = g["seconds"].to_numpy(float)
        ms = 1e3 * float(np.median(s))
        op, param, b, c, h = rec["op"], int(rec["param"]), int(rec["batch"]), int(rec["channels"]), int(rec["size"])
        flops = op_flops(op, param, b, c, h) if rec["mode"] == "fwd" else math.nan
        rows.append(
            {
                **rec,
                "ms": ms,
                "p25_ms": 1e3 * float(np.quantile(s, 0.25)),
                "p75_ms": 1e3 * float(np.quantile(s, 0.75)),
                "rounds": len(s),
                "inner": int(g["inner"].iloc[0]),
                "padded_size": padded(h, param) if op.startswith("wbmm") or op == "attn" else h,
                "gflops_effective": flops / (ms * 1e-3) / 1e9,
            }
        )
    return pd.DataFrame(rows)


def med_ci(x: np.ndarray, confidence: float) -> Est:
    """The median with its order-statistic interval (unbounded where the rounds cannot reach the
    confidence: a claim on it is then inconclusive)."""
    return median_ci(x, confidence)


def rat_ci(a: np.ndarray, b: np.ndarray, confidence: float) -> Est:
    """The median per-round ratio a/b with its interval, as (ratio, low, high)."""
    r = ratio_ci(a, b, confidence)
    return r.ratio, r.ci_low, r.ci_high


def _put(out: dict[str, float], name: str, est: Est) -> None:
    out[name], out[f"{name}.ci_low"], out[f"{name}.ci_high"] = (float(v) for v in est)


def summarise_grid(
    out: dict[str, float], prefix: str, estimate: Callable[[Cfg, float], Est], configs: list[Cfg], confidence: float
) -> None:
    """``<prefix>.<config>`` for every config, and ``<prefix>.{min,max,median}[_h_ge28]`` over the grid,
    each with its interval (module docstring: Bonferroni over the configs a summary reads)."""
    for cfg in configs:
        _put(out, f"{prefix}.{cfg_name(*cfg)}", estimate(cfg, confidence))
    for suffix, cfgs in {"": configs, f"_h_ge{LARGE}": [c for c in configs if c[3] >= LARGE]}.items():
        if not cfgs:
            continue
        joint = 1 - (1 - confidence) / len(cfgs)
        ests = [e for e in (estimate(c, joint) for c in cfgs) if not any(math.isnan(v) for v in e)]
        if not ests:
            continue
        cols = [np.asarray(col, float) for col in zip(*ests, strict=True)]
        for agg, fn in (("min", np.min), ("max", np.max), ("median", np.median)):
            _put(out, f"{prefix}.{agg}{suffix}", tuple(float(fn(col)) for col in cols))


def op_rows(bench: pd.DataFrame, p: Params, summ: pd.DataFrame | None = None) -> list[dict]:
    """Variant rows, one per op (metric names ``<mode>_ms_<config>``: median ms)."""
    summ = summary(bench) if summ is None else summ
    rows: dict[str, dict] = {}
    for r in summ.itertuples():
        if r.op in OPS:
            name = op_variant(r.op, int(r.param))
            rows.setdefault(name, {"variant": name, "seed": p.seeds[0]})[
                f"{r.mode}_ms_{cfg_name(r.dtype, int(r.batch), int(r.channels), int(r.size))}"
            ] = r.ms
    return list(rows.values())


def bench_metrics(bench: pd.DataFrame, p: Params) -> tuple[list[dict], dict[str, float]]:
    """Variant rows (one per op, metric names ``<mode>_ms_<config>``: median ms) and derived metrics,
    every timing ratio / slope with its interval (``<name>.ci_low`` / ``<name>.ci_high``)."""
    conf = p.bench.confidence
    t = series(bench)
    summ = summary(bench)
    configs: list[Cfg] = sorted({k[:4] for k in t})
    modes = [m for m in p.bench.modes if any(k[6] == m for k in t)]
    rows = op_rows(bench, p, summ)

    m: dict[str, float] = {}
    for r in summ[summ["mode"] == "fwd"].itertuples():
        name = cfg_name(r.dtype, int(r.batch), int(r.channels), int(r.size))
        if r.op in ("dw", "wbmm"):
            m[f"gflops_effective.{op_variant(r.op, int(r.param))}.{name}"] = r.gflops_effective
        if r.op in ("wbmm_build_m", "wbmm_reshape"):
            m[f"{r.op.removeprefix('wbmm_')}_ms.wbmm_w{int(r.param)}.{name}"] = r.ms

    def ratio(num: tuple, den: tuple, scale: float = 1.0) -> Callable[[Cfg, float], Est]:
        """Per config: scale · t(num) / t(den), paired round by round."""

        def est(cfg: Cfg, c: float) -> Est:
            a, b = t.get((*cfg, *num)), t.get((*cfg, *den))
            if a is None or b is None:
                return NAN3
            v, lo, hi = rat_ci(a, b, c)
            return scale * v, scale * lo, scale * hi

        return est

    def slope(op: str, params: list[int], mode: str) -> Callable[[Cfg, float], Est]:
        """Per config: median over rounds of the round's log-log slope of time vs param²."""

        def est(cfg: Cfg, c: float) -> Est:
            ts = [t.get((*cfg, op, q, mode)) for q in params]
            if len(params) < 2 or any(x is None for x in ts):
                return NAN3
            per_round = [loglog_slope([q * q for q in params], col) for col in np.vstack(ts).T]
            return med_ci(np.asarray(per_round), c)

        return est

    pairs = {*map(tuple, p.pairs.matched_rf), *map(tuple, p.pairs.matched_params), tuple(p.pairs.headline)}
    for w, k in sorted(pairs):
        for mode in modes:
            summarise_grid(
                m, f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}", ratio(("dw", k, mode), ("wbmm", w, mode)), configs, conf
            )
    w, k = p.pairs.headline
    for mode in modes:
        for cfg in configs:  # the card's claim_w14_faster_than_dw5_H{H} per config: 1 yes, 0 no, 0.5 undecided
            lo = m.get(f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}.{cfg_name(*cfg)}.ci_low", math.nan)
            hi = m.get(f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}.{cfg_name(*cfg)}.ci_high", math.nan)
            if math.isfinite(lo) and math.isfinite(hi):
                m[f"w{w}_faster_than_dw{k}.{mode}.{cfg_name(*cfg)}"] = 1.0 if lo > 1 else 0.0 if hi < 1 else 0.5

    kernels = sorted(set(p.bench.dw_kernels) & set(p.bench.slope_dw_kernels))
    small = [k for k in kernels if k <= 13]
    windows = sorted(p.bench.windows)
    for mode in modes:
        summarise_grid(m, f"slope_dw_time_vs_k2.{mode}", slope("dw", kernels, mode), configs, conf)
        summarise_grid(m, f"slope_dw_time_vs_k2_k_le13.{mode}", slope("dw", small, mode), configs, conf)
        summarise_grid(m, f"slope_wbmm_time_vs_w2.{mode}", slope("wbmm", windows, mode), configs, conf)
        if {13, 17} <= set(p.bench.dw_kernels):
            summarise_grid(m, f"jump_dw_k13_to_k17.{mode}", ratio(("dw", 17, mode), ("dw", 13, mode)), configs, conf)
    if {7, 14} <= set(windows) and "fwd" in modes:

        def gflops_ratio(cfg: Cfg, c: float) -> Est:  # GFLOP/s(w14)/GFLOP/s(w7) = F14/F7 · t(w7)/t(w14)
            f = op_flops("wbmm", 14, *cfg[1:]) / op_flops("wbmm", 7, *cfg[1:])
            return ratio(("wbmm", 7, "fwd"), ("wbmm", 14, "fwd"), f)(cfg, c)

        summarise_grid(m, "gflops_ratio.wbmm_w14_vs_w7", gflops_ratio, configs, conf)
    return rows, m


# ----------------------------------------------------------------------------------------- tiny nets
def speed_metrics(speed: pd.DataFrame, p: Params) -> dict[str, float]:
    """The training-speed numbers from the interleaved step benchmark, with intervals: images/s of each
    net, and the method's images/s ratio over each baseline (t_other / t_method, paired by round)."""
    m: dict[str, float] = {}
    conf = p.bench.confidence
    method = next(iter(p.acc.variants))  # the first variant is the method, the rest are its baselines
    step = {v: g.sort_values("round")["seconds"].to_numpy(float) for v, g in speed.groupby("variant")}
    batch = {v: float(g["batch_size"].iloc[0]) for v, g in speed.groupby("variant")}
    for v, s in step.items():
        _put(m, f"train_step.imgs_per_s.{v}", med_ci(batch[v] / s, conf))
    for other in p.acc.variants:
        if other != method and method in step and other in step:
            _put(m, f"ratio.train_imgs_per_s.{method}_vs_{other}", rat_ci(step[other], step[method], conf))
    return m


# ---------------------------------------------------------------------------------- derived metrics
def estimates(m: Mapping[str, float]) -> dict[str, object]:
    """``<name>`` with ``<name>.ci_low`` / ``<name>.ci_high`` → one ``Estimate`` (its own interval: an
    order-statistic one over interleaved rounds, not over seeds); other names stay point values."""
    out: dict[str, object] = {}
    for k, v in m.items():
        if k.endswith((".ci_low", ".ci_high")):
            continue
        lo, hi = m.get(f"{k}.ci_low"), m.get(f"{k}.ci_high")
        out[k] = Estimate(float(v), float(lo), float(hi), n=0) if lo is not None and hi is not None else float(v)
    return out


def _bench_frame(bench: Mapping) -> pd.DataFrame:
    return pd.DataFrame(bench["bench"])


def _speed_frame(speed: Mapping) -> pd.DataFrame:
    return pd.DataFrame(speed["speed"])


def _threads(frame: pd.DataFrame) -> float:
    """The intra-op thread count the samples were timed at (one value: ``bench.threads``)."""
    if "threads" not in frame or frame.empty:
        return float("nan")
    counts = set(frame["threads"].astype(int))
    if len(counts) != 1:
        raise ValueError(f"wbmm: timing samples at different thread counts {sorted(counts)}")
    return float(counts.pop())


def operator_speed(values, p: Params, bench: Mapping) -> dict:
    frame = _bench_frame(bench)
    return {**estimates(bench_metrics(frame, p)[1]), "bench.timing_threads": _threads(frame)}


def train_speed_metrics(values, p: Params, speed: Mapping) -> dict:
    frame = _speed_frame(speed)
    return {**estimates(speed_metrics(frame, p)), "train_step.timing_threads": _threads(frame)}


SUMMARIES = ("min", "max", "median")


def _bench_names(p: Params, planned) -> list[str]:
    """The grid summaries a claim may name (per-config names depend on the grid)."""
    b = p.bench
    suffixes = ["", f"_h_ge{LARGE}"] if any(h >= LARGE for h in b.sizes) else [""]
    prefixes = [
        f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}"
        for mode in b.modes
        for w, k in {*map(tuple, p.pairs.matched_rf), *map(tuple, p.pairs.matched_params), tuple(p.pairs.headline)}
    ]
    for mode in b.modes:
        prefixes += [
            f"slope_dw_time_vs_k2.{mode}",
            f"slope_dw_time_vs_k2_k_le13.{mode}",
            f"slope_wbmm_time_vs_w2.{mode}",
        ]
        if {13, 17} <= set(b.dw_kernels):
            prefixes.append(f"jump_dw_k13_to_k17.{mode}")
    if {7, 14} <= set(b.windows) and "fwd" in b.modes:
        prefixes.append("gflops_ratio.wbmm_w14_vs_w7")
    return ["bench.timing_threads", *(f"{x}.{agg}{sfx}" for x in prefixes for agg in SUMMARIES for sfx in suffixes)]


def _speed_names(p: Params, planned) -> list[str]:
    method, *others = list(p.acc.variants)
    return (
        ["train_step.timing_threads"]
        + [f"train_step.imgs_per_s.{v}" for v in p.acc.variants]
        + [f"ratio.train_imgs_per_s.{method}_vs_{o}" for o in others]
    )


def derived(p: Params) -> list:
    method, *others = list(p.acc.variants)
    return [
        Fn(operator_speed, _bench_names, needs_=["operator_speed"], inputs=["bench"]),
        Fn(train_speed_metrics, _speed_names, needs_=["train_speed"], inputs=["speed"]),
        *(Diff("test_acc", method, o) for o in others),
    ]


def report_extra(p: Params, values, artifacts: Mapping) -> dict:
    bench_env = (artifacts.get("operator_speed") or {}).get("env", {})
    clock = bench_env.get("clock", "wall")
    return {
        "bench_env": bench_env,
        "timing_threads": p.bench.threads,
        "timing_note": f"speed numbers come from {p.bench.rounds} (operators) and {p.acc.speed_rounds} "
        f"(training step) interleaved rounds at {p.bench.threads} intra-op thread(s) "
        f"(bench.threads) on the '{clock}' clock; ratios are medians of "
        f"per-round ratios with {p.bench.confidence:.0%} intervals (grid summaries: joint, "
        "Bonferroni); compare ratios, not absolute times (machine and load dependent)",
    }


# --------------------------------------------------------------------------------------------- plots
def latency_figure(summ: pd.DataFrame, dtype: str, c: int, h: int):
    """Latency vs kernel side k (DW, unfold) or window side w (WBMM, attention), one panel per mode."""
    d = summ[(summ.dtype == dtype) & (summ.channels == c) & (summ["size"] == h) & summ.op.isin(OPS)]
    modes = list(dict.fromkeys(d["mode"]))
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(5.2 * max(1, len(modes)), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=False):
        for i, (op, b) in enumerate(sorted({(r.op, r.batch) for r in d[d["mode"] == mode].itertuples()})):
            s = d[(d.op == op) & (d.batch == b) & (d["mode"] == mode)].sort_values("param")
            style = "-" if op in ("dw", "unfold") else "--"
            ax.errorbar(
                s.param,
                s.ms,
                yerr=[s.ms - s.p25_ms, s.p75_ms - s.ms],
                fmt="o" + style,
                ms=4,
                capsize=2,
                label=f"{op} B={b}",
                color=f"C{i}",
            )
        ax.set(
            xlabel="kernel side k (DW) / window side w (WBMM)",
            ylabel=f"{mode} median ms (log)",
            title=f"{mode}: C={c}, H=W={h}, {dtype}",
        )
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _num(x: object) -> float:
    """A metric read back from the saved report (JSON: NaN was written as null)."""
    return math.nan if x is None else float(x)


def speedup_heatmap(m: Mapping[str, float], p: Params, configs: list[Cfg]):
    """t_DW / t_WBMM for every reported pair × mode (rows) and config (columns); > 1 means WBMM faster;
    '?' marks a cell whose interval straddles 1."""
    labels = (
        [(w, k, "matched RF") for w, k in p.pairs.matched_rf]
        + [(w, k, "matched params") for w, k in p.pairs.matched_params]
        + [(*p.pairs.headline, "headline")]
    )
    vals, undecided, names = [], [], []
    for w, k, kind in labels:
        for mode in p.bench.modes:
            keys = [f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}.{cfg_name(*cfg)}" for cfg in configs]
            vals.append([_num(m.get(key)) for key in keys])
            undecided.append([_num(m.get(f"{key}.ci_low")) < 1 < _num(m.get(f"{key}.ci_high")) for key in keys])
            names.append(f"{kind}: w{w} vs k{k} ({mode})")
    vals = np.asarray(vals, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logv = np.log2(vals)
    span = max(1.0, float(np.nanmax(np.abs(logv)))) if np.isfinite(logv).any() else 1.0
    fig, ax = plt.subplots(figsize=(2.5 + 0.9 * len(configs), 1.2 + 0.42 * len(names)))
    im = ax.imshow(logv, cmap="RdBu", norm=TwoSlopeNorm(0.0, -span, span), aspect="auto")
    ax.set_xticks(range(len(configs)), [cfg_name(*c) for c in configs], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for i in range(vals.shape[0]):
        for j in range(vals.shape[1]):
            if math.isfinite(vals[i, j]):
                ax.text(
                    j,
                    i,
                    f"{vals[i, j]:.2f}" + ("?" if undecided[i][j] else ""),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if abs(logv[i, j]) > 0.6 * span else "black",
                )
    ax.set_title("speedup t_DW / t_WBMM (blue: WBMM faster; ?: interval straddles 1)")
    fig.colorbar(im, ax=ax, label="log2 speedup")
    fig.tight_layout()
    return fig


def gflops_figure(summ: pd.DataFrame):
    d = summ[(summ.op == "wbmm") & (summ["mode"] == "fwd")]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, ((dtype, b, c, h), s) in enumerate(d.groupby(["dtype", "batch", "channels", "size"])):
        s = s.sort_values("param")
        ax.plot(s.param, s.gflops_effective, "o-", color=f"C{i % 10}", label=cfg_name(dtype, b, c, h))
    ax.set(
        xlabel="window side w",
        ylabel="effective GFLOP/s (2·B·C·H_pad·W_pad·w² / t)",
        title="WBMM forward: throughput vs window",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def make_plots(p: Params, values, artifacts: Mapping) -> dict:
    """``evaluate.plots``: latency per config, the speedup heatmap, WBMM's GFLOP/s, the nets' accuracy and
    training throughput."""
    bench = _bench_frame(artifacts["operator_speed"])
    summ = summary(bench)
    configs = sorted({(r.dtype, int(r.batch), int(r.channels), int(r.size)) for r in summ.itertuples()})
    figures = {}
    for dtype, c, h in sorted({(d, c, h) for d, _, c, h in configs}):
        figures[f"latency_{dtype}_c{c}_h{h}"] = latency_figure(summ, dtype, c, h)
    figures["speedup_heatmap"] = speedup_heatmap(bench_metrics(bench, p)[1], p, configs)
    figures["wbmm_gflops_vs_window"] = gflops_figure(summ)
    nets = [v for v in p.acc.variants if values.has(v, "test_acc")]
    accs = [np.asarray(list(values.per_seed(v, "test_acc").values()), float) for v in nets]
    figures["accuracy"] = bar_plot(
        nets,
        [float(a.mean()) for a in accs],
        [float(a.std()) for a in accs],
        ylabel="test accuracy (%)",
        title="tiny nets, mean ± std over seeds",
    )
    mets = speed_metrics(_speed_frame(artifacts["train_speed"]), p)
    speed = [v for v in p.acc.variants if f"train_step.imgs_per_s.{v}" in mets]
    val = np.asarray([_num(mets[f"train_step.imgs_per_s.{v}"]) for v in speed], float)
    err = np.asarray(
        [
            [val[i] - _num(mets[f"train_step.imgs_per_s.{v}.ci_low"]) for i, v in enumerate(speed)],
            [_num(mets[f"train_step.imgs_per_s.{v}.ci_high"]) - val[i] for i, v in enumerate(speed)],
        ],
        float,
    )
    figures["train_throughput"] = bar_plot(
        speed,
        list(val),
        err if len(speed) else None,
        ylabel="train images / s (median step, interleaved)",
        title=f"tiny nets: training step, {p.bench.confidence:.0%} interval",
    )
    return figures
