"""Metrics, plots and the report of `wbmm`: the paper's speed claims as ratios t_DW / t_WBMM from one run
(matched receptive field, matched parameters, the w=14 vs k=5 headline), the scaling slopes of time in
k² and w², effective GFLOP/s, and the accuracy / training-throughput comparison of the tiny nets."""
from __future__ import annotations

import math
from collections.abc import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

from pipelines.core.params import parse  # noqa: E402
from pipelines.core.plots import bar_plot  # noqa: E402
from pipelines.core.report import build_report  # noqa: E402

OPS = ("dw", "wbmm", "unfold", "attn")
LARGE = 28  # "large maps" of the card's claims: H ≥ 28


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


def _summaries(prefix: str, per_cfg: dict[tuple, float], out: dict[str, float]) -> None:
    """Per-config values plus min / max / median over the grid and over the large maps (H ≥ 28)."""
    vals = {k: v for k, v in per_cfg.items() if math.isfinite(v)}
    for (dtype, b, c, h), v in per_cfg.items():
        out[f"{prefix}.{cfg_name(dtype, b, c, h)}"] = v
    groups = {"": list(vals.values()), f"_h_ge{LARGE}": [v for k, v in vals.items() if k[3] >= LARGE]}
    for suffix, vs in groups.items():
        if vs:
            out[f"{prefix}.min{suffix}"] = float(np.min(vs))
            out[f"{prefix}.max{suffix}"] = float(np.max(vs))
            out[f"{prefix}.median{suffix}"] = float(np.median(vs))


def bench_metrics(bench: pd.DataFrame, raw: dict) -> tuple[list[dict], dict[str, float]]:
    """Variant rows (one per op, same metric names ``<mode>_ms_<config>``) and derived metrics."""
    p = parse("wbmm", raw)
    seed = p.seeds[0]
    t = {(r.dtype, r.batch, r.channels, r.size, r.op, r.param, r.mode): r.ms for r in bench.itertuples()}
    g = {(r.dtype, r.batch, r.channels, r.size, r.op, r.param): r.gflops_effective
         for r in bench.itertuples() if r.mode == "fwd"}
    configs = sorted({k[:4] for k in t})
    modes = [m for m in p.bench.modes]

    rows: dict[str, dict] = {}
    for (dtype, b, c, h, op, param, mode), ms in t.items():
        if op in OPS:
            rows.setdefault(op_variant(op, param), {"variant": op_variant(op, param), "seed": seed})[
                f"{mode}_ms_{cfg_name(dtype, b, c, h)}"] = ms

    m: dict[str, float] = {}
    for (dtype, b, c, h, op, param), gf in g.items():
        name = cfg_name(dtype, b, c, h)
        if op in ("dw", "wbmm"):
            m[f"gflops_effective.{op_variant(op, param)}.{name}"] = gf
        if op in ("wbmm_build_m", "wbmm_reshape"):
            m[f"{op.removeprefix('wbmm_')}_ms.wbmm_w{param}.{name}"] = t[(dtype, b, c, h, op, param, "fwd")]

    pairs = {*p.pairs.matched_rf, *p.pairs.matched_params, tuple(p.pairs.headline)}
    for w, k in sorted(pairs):
        for mode in modes:
            per = {cfg: t.get((*cfg, "dw", k, mode), math.nan) / t.get((*cfg, "wbmm", w, mode), math.nan)
                   for cfg in configs}
            _summaries(f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}", per, m)
    w, k = p.pairs.headline
    for mode in modes:
        for cfg in configs:
            s = m.get(f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}.{cfg_name(*cfg)}", math.nan)
            if math.isfinite(s):  # the card's claim_w14_faster_than_dw5_H{H}, as 0/1 per config
                m[f"w{w}_faster_than_dw{k}.{mode}.{cfg_name(*cfg)}"] = float(s > 1.0)

    kernels = sorted(set(p.bench.dw_kernels) & set(p.bench.slope_dw_kernels))
    small = [k for k in kernels if k <= 13]
    windows = sorted(p.bench.windows)
    for mode in modes:
        slope_dw, slope_dw_small, slope_w, jump = {}, {}, {}, {}
        for cfg in configs:
            slope_dw[cfg] = loglog_slope([k * k for k in kernels], [t.get((*cfg, "dw", k, mode)) or math.nan
                                                                    for k in kernels])
            slope_dw_small[cfg] = loglog_slope([k * k for k in small], [t.get((*cfg, "dw", k, mode)) or math.nan
                                                                       for k in small])
            slope_w[cfg] = loglog_slope([w * w for w in windows], [t.get((*cfg, "wbmm", w, mode)) or math.nan
                                                                   for w in windows])
            if (*cfg, "dw", 13, mode) in t and (*cfg, "dw", 17, mode) in t:
                jump[cfg] = t[(*cfg, "dw", 17, mode)] / t[(*cfg, "dw", 13, mode)]
        _summaries(f"slope_dw_time_vs_k2.{mode}", slope_dw, m)
        _summaries(f"slope_dw_time_vs_k2_k_le13.{mode}", slope_dw_small, m)
        _summaries(f"slope_wbmm_time_vs_w2.{mode}", slope_w, m)
        if jump:
            _summaries(f"jump_dw_k13_to_k17.{mode}", jump, m)
    if 7 in windows and 14 in windows:
        ratio = {cfg: g.get((*cfg, "wbmm", 14), math.nan) / g.get((*cfg, "wbmm", 7), math.nan) for cfg in configs}
        _summaries("gflops_ratio.wbmm_w14_vs_w7", ratio, m)
    return list(rows.values()), m


def acc_metrics(acc: pd.DataFrame, raw: dict) -> tuple[list[dict], dict[str, float]]:
    """Per-seed rows of the tiny nets and the method-vs-baseline ratios / differences of seed means."""
    p = parse("wbmm", raw).acc
    rows = [{k: (int(v) if k == "seed" else v) for k, v in r.items()} for r in acc.to_dict("records")]
    means = acc.groupby("variant")[["test_acc", "train_imgs_per_s"]].mean()
    m: dict[str, float] = {}
    method = next(iter(p.variants))  # the first variant is the method, the rest are its baselines
    for other in means.index:
        if other == method:
            continue
        m[f"ratio.train_imgs_per_s.{method}_vs_{other}"] = float(
            means.loc[method, "train_imgs_per_s"] / means.loc[other, "train_imgs_per_s"])
        m[f"diff.test_acc.{method}_minus_{other}"] = float(means.loc[method, "test_acc"] - means.loc[other, "test_acc"])
    return rows, m


def latency_figure(bench: pd.DataFrame, dtype: str, c: int, h: int):
    """Latency vs kernel side k (DW, unfold) or window side w (WBMM, attention), one panel per mode."""
    d = bench[(bench.dtype == dtype) & (bench.channels == c) & (bench["size"] == h) & bench.op.isin(OPS)]
    modes = list(dict.fromkeys(d["mode"]))
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for i, (op, b) in enumerate(sorted({(r.op, r.batch) for r in d[d["mode"] == mode].itertuples()})):
            s = d[(d.op == op) & (d.batch == b) & (d["mode"] == mode)].sort_values("param")
            style = "-" if op in ("dw", "unfold") else "--"
            ax.errorbar(s.param, s.ms, yerr=[s.ms - s.p25_ms, s.p75_ms - s.ms], fmt="o" + style, ms=4, capsize=2,
                        label=f"{op} B={b}", color=f"C{i}")
        ax.set(xlabel="kernel side k (DW) / window side w (WBMM)", ylabel=f"{mode} median ms (log)",
               title=f"{mode}: C={c}, H=W={h}, {dtype}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def speedup_heatmap(m: dict[str, float], raw: dict, configs: list[tuple]):
    """t_DW / t_WBMM for every reported pair × mode (rows) and config (columns); > 1 means WBMM faster."""
    p = parse("wbmm", raw)
    labels = ([(w, k, "matched RF") for w, k in p.pairs.matched_rf]
              + [(w, k, "matched params") for w, k in p.pairs.matched_params]
              + [(*p.pairs.headline, "headline")])
    rows, names = [], []
    for w, k, kind in labels:
        for mode in p.bench.modes:
            rows.append([m.get(f"speedup.{mode}.wbmm_w{w}_vs_dw_k{k}.{cfg_name(*cfg)}", math.nan) for cfg in configs])
            names.append(f"{kind}: w{w} vs k{k} ({mode})")
    vals = np.asarray(rows, float)
    logv = np.log2(vals)
    span = max(1.0, float(np.nanmax(np.abs(logv)))) if np.isfinite(logv).any() else 1.0
    fig, ax = plt.subplots(figsize=(2.5 + 0.9 * len(configs), 1.2 + 0.42 * len(names)))
    im = ax.imshow(logv, cmap="RdBu", norm=TwoSlopeNorm(0.0, -span, span), aspect="auto")
    ax.set_xticks(range(len(configs)), [cfg_name(*c) for c in configs], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for i in range(vals.shape[0]):
        for j in range(vals.shape[1]):
            if math.isfinite(vals[i, j]):
                ax.text(j, i, f"{vals[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if abs(logv[i, j]) > 0.6 * span else "black")
    ax.set_title("speedup t_DW / t_WBMM (blue: WBMM faster), one run")
    fig.colorbar(im, ax=ax, label="log2 speedup")
    fig.tight_layout()
    return fig


def gflops_figure(bench: pd.DataFrame):
    d = bench[(bench.op == "wbmm") & (bench["mode"] == "fwd")]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, ((dtype, b, c, h), s) in enumerate(d.groupby(["dtype", "batch", "channels", "size"])):
        s = s.sort_values("param")
        ax.plot(s.param, s.gflops_effective, "o-", color=f"C{i % 10}", label=cfg_name(dtype, b, c, h))
    ax.set(xlabel="window side w", ylabel="effective GFLOP/s (2·B·C·H_pad·W_pad·w² / t)",
           title="WBMM forward: throughput vs window")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def evaluate(bench: pd.DataFrame, bench_env: dict, acc: pd.DataFrame, raw: dict) -> tuple[dict, dict]:
    op_rows, m_bench = bench_metrics(bench, raw)
    acc_rows, m_acc = acc_metrics(acc, raw)
    configs = sorted({(r.dtype, r.batch, r.channels, r.size) for r in bench.itertuples()})
    figures = {}
    for dtype, c, h in sorted({(d, c, h) for d, _, c, h in configs}):
        figures[f"latency_{dtype}_c{c}_h{h}"] = latency_figure(bench, dtype, c, h)
    figures["speedup_heatmap"] = speedup_heatmap(m_bench, raw, configs)
    figures["wbmm_gflops_vs_window"] = gflops_figure(bench)
    a = acc.groupby("variant", sort=False)
    means, stds = a.mean(numeric_only=True), a.std(ddof=0, numeric_only=True).fillna(0)
    figures["accuracy"] = bar_plot(list(means.index), list(means.test_acc), list(stds.test_acc),
                                   ylabel="test accuracy (%)", title="tiny nets, mean ± std over seeds")
    figures["train_throughput"] = bar_plot(list(means.index), list(means.train_imgs_per_s),
                                           list(stds.train_imgs_per_s), ylabel="train images / s (median step)",
                                           title="tiny nets: training throughput")
    extra = {"bench_env": bench_env,
             "timing_note": f"speed numbers are medians of interleaved repeats from one run on the "
                            f"'{bench_env.get('clock', 'wall')}' clock; compare ratios, not absolute times "
                            "(machine and load dependent)"}
    report = build_report("wbmm", raw, op_rows + acc_rows, {**m_bench, **m_acc},
                          artifacts=[f"{k}.png" for k in figures], extra=extra)
    return report, figures
