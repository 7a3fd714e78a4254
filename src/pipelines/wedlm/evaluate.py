"""Decoding every variant with the trained weights and scoring it (paper §5 metrics at toy scale):
exact match per regime, forwards per token / tokens per forward, p_cache, out-of-order fills, true NLL
under the generating Markov chain; batch-1 wall clock measured side by side (interleaved rounds, ratios
with an interval); the τ frontier, the plots and the report."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import Estimate, interleaved_timing, node_setup, ratio_ci, t_interval
from pipelines.wedlm.data import layout_prompt, vocab_of
from pipelines.wedlm.decode import decode_ar, decode_parallel
from pipelines.wedlm.model import build_model
from pipelines.wedlm.params import Params

NLL_CAP = 10.0  # nats charged for a non-symbol (or impossible) token where the chain expects a symbol
WEDLM_VARIANTS = ("wedlm", "wedlm_fast", "blockwise")


def _configs(p) -> list[dict]:
    """Main variants (same weights), the τ frontier, and (eval.sweeps) the λ × W × fallback grid."""
    d = p.decode
    base = {"window": d.window, "refill": d.refill, "fallback": d.fallback}
    cfgs = [
        {"kind": "main", "variant": "ar", "decoder": "ar", "tau": math.nan, "lam": math.nan, **base},
        {"kind": "main", "variant": "wedlm", "decoder": "stream", "tau": d.tau, "lam": d.lam, **base},
        {"kind": "main", "variant": "wedlm_fast", "decoder": "stream", "tau": d.tau, "lam": d.lam_fast, **base},
        {"kind": "main", "variant": "blockwise", "decoder": "block", "tau": d.tau, "lam": d.lam_fast, **base},
    ]
    for tau in p.eval.taus:
        for dec in ("stream", "block"):
            cfgs.append(
                {
                    "kind": "frontier",
                    "variant": f"{dec}_tau{tau:g}",
                    "decoder": dec,
                    "tau": tau,
                    "lam": d.lam_fast,
                    **base,
                }
            )
    if p.eval.sweeps:
        for tau in p.eval.taus:
            for lam in p.eval.sweep_lams:
                for w in p.eval.sweep_windows:
                    for fb in p.eval.sweep_fallbacks:
                        cfgs.append(
                            {
                                "kind": "sweep",
                                "variant": f"stream_tau{tau:g}_lam{lam:g}_w{w}_{fb}",
                                "decoder": "stream",
                                "tau": tau,
                                "lam": lam,
                                "window": w,
                                "refill": d.refill,
                                "fallback": fb,
                            }
                        )
    return cfgs


def _run(model, cfg: dict, prompts: torch.Tensor, v, max_new: int):
    if cfg["decoder"] == "ar":
        return decode_ar(model, prompts, v.eos, max_new)
    return decode_parallel(
        model,
        prompts,
        v.eos,
        v.mask,
        max_new,
        cfg["window"],
        cfg["tau"],
        cfg["lam"],
        mode=cfg["decoder"],
        refill=cfg["refill"],
        fallback=cfg["fallback"],
    )


def _markov_nll(prompt: list[int], gen: list[int], answer_len: int, chain: np.ndarray) -> float:
    """Mean NLL (nats/token) of the generated answer symbols under the true chain."""
    S = chain.shape[0]
    prev, total = prompt[-1], 0.0
    body = [t for t in gen if t != -1][:answer_len]
    body += [-1] * (answer_len - len(body))  # a short answer is charged the cap for the missing tokens
    for t in body:
        ok = 0 <= t < S and 0 <= prev < S and chain[prev, t] > 0
        total += -math.log(chain[prev, t]) if ok else NLL_CAP
        prev = t
    return min(total / answer_len, NLL_CAP)


def _prompts(regime: str, df: pd.DataFrame, p: Params, v, dev) -> torch.Tensor:
    return torch.tensor([layout_prompt(regime, pr, v, p.data.prompt_len) for pr in df.prompt], device=dev)


def _load(sd: dict, p: Params, dev) -> torch.nn.Module:
    model = build_model(p, vocab_of(p).size).to(dev)
    model.load_state_dict(sd)
    return model.eval()


def decode_test(
    sd: dict, variant: str, seed: int, test: pd.DataFrame, chain: np.ndarray | None, p: Params, dev
) -> tuple[pd.DataFrame, dict]:
    """Decode the test set (each regime as one batch) with one trained model: every decoder config for
    ``wedlm`` weights (the main variants, the τ frontier, the sweep), greedy AR for ``ar_only``. Returns
    one row per (config, item) and the per-forward traces of item 0 for the main configs."""
    v, d = vocab_of(p), p.data
    max_new = p.decode.max_new_tokens
    model = _load(sd, p, dev)
    cfgs = _configs(p)
    todo = cfgs if variant == "wedlm" else [{**cfgs[0], "variant": variant}]
    rows, traces = [], {}
    for regime, df in test.groupby("regime", sort=False):
        prompts = _prompts(regime, df, p, v, dev)
        answers = [list(a) + [v.eos] for a in df.answer]
        for cfg in todo:
            r = _run(model, cfg, prompts, v, max_new)
            for k, (item, pr) in enumerate(zip(df["item"], df.prompt)):
                toks = r.tokens[k]
                gen = toks[:-1] if toks and toks[-1] == v.eos else toks
                rows.append(
                    {
                        **{c: cfg[c] for c in ("kind", "variant", "decoder", "tau", "lam", "window", "fallback")},
                        "seed": seed,
                        "regime": regime,
                        "item": int(item),
                        "tokens": toks,
                        "correct": toks == answers[k],
                        "n_gen": len(toks),
                        "forwards": r.forwards[k],
                        "processed": r.processed[k],
                        "cached": r.cached[k],
                        "fills": r.fills[k],
                        "out_of_order": r.out_of_order[k],
                        "nll": _markov_nll(list(pr), gen, d.answer_len[regime], chain)
                        if regime == "markov" and chain is not None
                        else math.nan,
                    }
                )
            if cfg["kind"] == "main":
                traces.setdefault(regime, {})[cfg["variant"]] = r.trace
    return pd.DataFrame(rows), traces


def measure_speed(p: Params, test: pd.DataFrame, **models: dict) -> pd.DataFrame:
    """Batch-1 wall clock of every main decoder, side by side in one process (so it is one node): per
    (seed, regime) the first ``eval.n_timing`` test prompts are split into ``eval.timing_rounds`` groups,
    and core.metrics.interleaved_timing decodes one group per round with every decoder, one prompt at a
    time with the KV cache, in an order rotated each round (a warm-up round first). Load that hits a round
    hits every decoder alike, so per-round ratios are paired. ``models``: ``{variant: {"seed<k>": state}}``
    (``wedlm`` weights give the ``ar``/``wedlm``/``wedlm_fast``/``blockwise`` decoders; ``ar_only`` its AR
    decoder). Returns one row per (decoder, seed, regime, round): tokens and seconds."""
    dev = node_setup(p)
    v, max_new = vocab_of(p), p.decode.max_new_tokens
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    main = [c for c in _configs(p) if c["kind"] == "main"]
    seeds = sorted({int(k[len("seed") :]) for states in models.values() for k in states})
    rows = []
    for seed in seeds:
        decoders = {}
        for variant, states in models.items():
            if f"seed{seed}" not in states:
                continue
            model = _load(states[f"seed{seed}"], p, dev)
            cfgs = main if variant == "wedlm" else [{**main[0], "variant": variant}]
            decoders.update({c["variant"]: (model, c) for c in cfgs})
        for regime, df in test.groupby("regime", sort=False):
            prompts = _prompts(regime, df.iloc[: p.eval.n_timing], p, v, dev)
            groups = np.array_split(np.arange(len(prompts)), min(p.eval.timing_rounds, len(prompts)))
            tokens: dict[str, list[int]] = {name: [] for name in decoders}

            def make(name, model, cfg):
                def run():  # call k decodes group k mod G: the warm-up takes group 0, round r group r+1
                    g = groups[len(tokens[name]) % len(groups)]
                    tokens[name].append(sum(len(_run(model, cfg, prompts[i : i + 1], v, max_new).tokens[0]) for i in g))

                return run

            secs = interleaved_timing(
                {name: make(name, *mc) for name, mc in decoders.items()}, rounds=len(groups), warmup=1, sync=sync
            )
            for name in decoders:
                for r in range(len(groups)):
                    rows.append(
                        {
                            "variant": name,
                            "seed": seed,
                            "regime": regime,
                            "round": r,
                            "group": (r + 1) % len(groups),
                            "tokens": tokens[name][r + 1],
                            "seconds": float(secs[name][r]),
                        }
                    )
    return pd.DataFrame(rows)


def _speed_ratios(timing: pd.DataFrame, regimes: list[str]) -> dict[str, float]:
    """``ratio.tokens_per_sec_<regime>.<a>_vs_<b>`` with its ``.ci_low``/``.ci_high``: the median of the
    paired per-round tokens/s ratios (the rounds of every seed) and its order-statistic 95 % interval
    (core.metrics.ratio_ci). Per regime only: the regimes' speed-ups differ by design (≈ 2× on ``count``,
    ≈ 0.35× on ``markov``), so a median pooled over them would describe none of them."""
    t = timing.assign(tps=timing.tokens / timing.seconds).pivot_table(
        index=["seed", "regime", "round"], columns="variant", values="tps"
    )
    pairs = [(a, "ar") for a in WEDLM_VARIANTS] + [("wedlm_fast", "blockwise")]
    out: dict[str, float] = {}
    for a, b in pairs:
        if a not in t or b not in t:
            continue
        for r in (r for r in regimes if r in t.index.get_level_values("regime")):
            sub = t.xs(r, level="regime")[[a, b]].dropna()
            if len(sub):
                name = f"ratio.tokens_per_sec_{r}.{a}_vs_{b}"
                out.update(ratio_ci(sub[a].to_numpy(), sub[b].to_numpy()).as_metrics(name))
    return out


def _summarise(d: pd.DataFrame) -> dict:
    fills = d["fills"].sum()
    return {
        "exact_match": 100.0 * d["correct"].mean(),
        "tokens_per_forward": d["n_gen"].sum() / d["forwards"].sum(),
        "forwards_per_token": d["forwards"].sum() / d["n_gen"].sum(),
        "p_cache": d["cached"].sum() / max(d["processed"].sum(), 1),
        "out_of_order_fills": d["out_of_order"].sum() / fills if fills else 0.0,
        "true_nll": d["nll"].mean(),
    }


def _variant_rows(dec: pd.DataFrame, timing: pd.DataFrame, regimes: list[str]) -> list[dict]:
    rows = []
    main = dec[dec.kind == "main"]
    for (variant, seed), d in main.groupby(["variant", "seed"], sort=False):
        row = {"variant": variant, "seed": int(seed)}
        row.update({k: v for k, v in _summarise(d).items() if k not in ("exact_match", "true_nll")})
        for r in regimes:
            s = _summarise(d[d.regime == r])
            row[f"exact_match_{r}"] = s["exact_match"]
            row[f"tokens_per_forward_{r}"] = s["tokens_per_forward"]
            row[f"forwards_per_token_{r}"] = s["forwards_per_token"]
            if r == "markov" and not math.isnan(s["true_nll"]):  # NaN: own data, no generating chain
                row["true_nll_markov"] = s["true_nll"]
        t = timing[(timing.variant == variant) & (timing.seed == seed)]
        row["tokens_per_sec_cpu"] = t["tokens"].sum() / t["seconds"].sum()
        for r in regimes:
            tr = t[t.regime == r]
            row[f"tokens_per_sec_cpu_{r}"] = tr["tokens"].sum() / tr["seconds"].sum()
        rows.append(row)
    by_seed = {(r["variant"], r["seed"]): r for r in rows}
    for row in rows:
        ar = by_seed.get(("ar", row["seed"]))
        if ar is None:
            continue
        for r in regimes:
            row[f"speedup_vs_ar_forwards_{r}"] = row[f"tokens_per_forward_{r}"] / ar[f"tokens_per_forward_{r}"]
            row[f"speedup_vs_ar_wallclock_{r}"] = row[f"tokens_per_sec_cpu_{r}"] / ar[f"tokens_per_sec_cpu_{r}"]
        row["speedup_vs_ar_forwards"] = row["tokens_per_forward"] / ar["tokens_per_forward"]
        row["speedup_vs_ar_wallclock"] = row["tokens_per_sec_cpu"] / ar["tokens_per_sec_cpu"]
    return rows


def _curve(dec: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Per (config, regime): metrics pooled per seed, then the mean over seeds."""
    d = dec[dec.kind == kind]
    if d.empty:
        return pd.DataFrame()
    out = []
    for (variant, regime, seed), g in d.groupby(["variant", "regime", "seed"], sort=False):
        out.append(
            {
                "variant": variant,
                "regime": regime,
                "seed": seed,
                "decoder": g.decoder.iloc[0],
                "tau": g.tau.iloc[0],
                "lam": g.lam.iloc[0],
                "window": int(g.window.iloc[0]),
                "fallback": g.fallback.iloc[0],
                **_summarise(g),
            }
        )
    keys = ["variant", "regime", "decoder", "tau", "lam", "window", "fallback"]
    return (
        pd.DataFrame(out)
        .groupby(keys, sort=False, dropna=False)
        .mean(numeric_only=True)
        .drop(columns="seed")
        .reset_index()
    )


def _plots(
    means: dict, frontier: pd.DataFrame, sweep: pd.DataFrame, traces: dict, train_log: pd.DataFrame, regimes: list[str]
) -> dict:
    import matplotlib.pyplot as plt

    from pipelines.core.api import finish, line_plot

    figs = {}
    for r in regimes:
        has_nll = (
            r == "markov"
            and "true_nll" in frontier  # own data: no chain, so exact match instead
            and frontier.loc[frontier.regime == r, "true_nll"].notna().any()
        )
        metric, ylabel = (
            ("true_nll", "true NLL (nats/token, lower is better)") if has_nll else ("exact_match", "exact match (%)")
        )
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for dec, style in (("stream", "o-"), ("block", "s--")):
            f = frontier[(frontier.regime == r) & (frontier.decoder == dec)].sort_values("tau")
            if f.empty:
                continue
            ax.plot(
                f.tokens_per_forward,
                f[metric],
                style,
                label=f"{'streaming' if dec == 'stream' else 'block-wise'} (τ sweep)",
            )
            for _, q in f.iterrows():
                ax.annotate(
                    f"τ={q.tau:g}",
                    (q.tokens_per_forward, q[metric]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        for v, mk in (("ar", "k*"), ("ar_only", "kx"), ("wedlm", "r^"), ("wedlm_fast", "gv"), ("blockwise", "bD")):
            if v in means and f"tokens_per_forward_{r}" in means[v]:
                y = means[v].get("true_nll_markov" if has_nll else f"exact_match_{r}")
                ax.plot(means[v][f"tokens_per_forward_{r}"], y, mk, ms=9, label=v)
        figs[f"frontier_{r}"] = finish(
            fig,
            ax,
            7,
            xlabel="tokens per forward (higher = faster)",
            ylabel=ylabel,
            title=f"speed vs quality on '{r}' (mean of seeds, λ={frontier.lam.dropna().iloc[0] if len(frontier) else ''})",
        )
    if not frontier.empty:
        pc = frontier.groupby(["decoder", "tau"]).p_cache.mean().unstack(0)
        figs["p_cache_vs_tau"] = line_plot(
            list(pc.index),
            {("streaming" if c == "stream" else "block-wise"): list(pc[c]) for c in pc.columns},
            "τ (nats)",
            "p_cache",
            "cache efficiency (all regimes, mean of seeds); AR = 1.0",
        )
    if traces:
        r = "count" if "count" in traces else next(iter(traces))
        fig, ax = plt.subplots(figsize=(6, 4))
        for v, tr in traces[r].items():
            ax.step([t["step"] + 1 for t in tr], [t["decided"] for t in tr], where="post", marker="o", ms=3, label=v)
        figs["decode_trace"] = finish(
            fig,
            ax,
            xlabel="forward",
            ylabel="final tokens after this forward\n(committed + leading filled run)",
            title=f"decode trace: '{r}' item 0, first seed",
        )
    if not train_log.empty:
        fig, ax = plt.subplots(figsize=(6, 4))
        for (m, s), g in train_log.groupby(["model", "seed"]):
            ax.plot(g.step, g.loss, label=f"{m} seed {s}")
        figs["training_loss"] = finish(
            fig, ax, 7, xlabel="step", ylabel="training loss", yscale="log", title="training loss"
        )
    if not sweep.empty and "count" in set(sweep.regime):
        s = sweep[sweep.regime == "count"]
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for (w, fb), g in s.groupby(["window", "fallback"]):
            ax.plot(g.tokens_per_forward, g.exact_match, "o", alpha=0.7, label=f"W={w}, {fb}")
        figs["sweep_count"] = finish(
            fig,
            ax,
            7,
            xlabel="tokens per forward",
            ylabel="exact match (%)",
            title="streaming sweep on 'count' (τ × λ)",
        )
    return figs


def _tables(p: Params, decodes: pd.DataFrame, timing: pd.DataFrame):
    regimes = list(p.data.regimes)
    rows = _variant_rows(decodes, timing, regimes)
    mean = pd.DataFrame(rows).groupby("variant").mean(numeric_only=True).to_dict("index")
    return regimes, rows, mean, _curve(decodes, "frontier"), _curve(decodes, "sweep")


# ------------------------------------------------------------------------------------- derived metrics
def timing_table(values) -> pd.DataFrame:
    """The per-round tokens/s of every decoder (``tokens_per_sec_rounds_<regime>`` curves of the table)
    as (variant, seed, regime, round, tokens, seconds) with seconds = 1 (what _speed_ratios reads)."""
    t = values.table
    t = t[t["step"].notna() & t["metric"].str.startswith("tokens_per_sec_rounds_")]
    return pd.DataFrame(
        {
            "variant": t["variant"].to_numpy(),
            "seed": t["seed"].to_numpy(),
            "regime": t["metric"].str.removeprefix("tokens_per_sec_rounds_").to_numpy(),
            "round": t["step"].astype(int).to_numpy(),
            "tokens": t["value"].to_numpy(),
            "seconds": 1.0,
        }
    )


def speed_ratios(values, p: Params) -> dict[str, float]:
    """The wall-clock ratios with their order-statistic intervals (``.ci_low`` / ``.ci_high``)."""
    return _speed_ratios(timing_table(values), list(p.data.regimes))


def speed_ratio_names(p: Params, planned) -> list[str]:
    pairs = [(a, "ar") for a in WEDLM_VARIANTS] + [("wedlm_fast", "blockwise")]
    return [
        f"ratio.tokens_per_sec_{r}.{a}_vs_{b}{sfx}"
        for a, b in pairs
        for r in p.data.regimes
        for sfx in ("", ".ci_low", ".ci_high")
    ]


def _max_estimate(values, metric: str) -> Estimate:
    """The largest seed mean over the WeDLM decoders; interval: the largest lower and upper bounds of their
    seed intervals (it holds below a threshold when every decoder's interval does)."""
    ests = [t_interval([x for _, x in sorted(values.per_seed(v, metric).items())]) for v in WEDLM_VARIANTS]
    value = max(e.value for e in ests)
    if not all(e.has_interval for e in ests):
        return Estimate(value, n=min(e.n for e in ests))
    return Estimate(value, max(e.lo for e in ests), max(e.hi for e in ests), min(e.n for e in ests))


def max_wedlm(values, p: Params) -> dict[str, Estimate]:
    out = {
        f"max_wedlm_tokens_per_forward_{r}": _max_estimate(values, f"tokens_per_forward_{r}") for r in p.data.regimes
    }
    out["max_wedlm_p_cache"] = _max_estimate(values, "p_cache")
    return out


def max_wedlm_names(p: Params, planned) -> list[str]:
    return [*(f"max_wedlm_tokens_per_forward_{r}" for r in p.data.regimes), "max_wedlm_p_cache"]


def _speed_plot(metrics: dict[str, float], regimes: list[str]):
    import matplotlib.pyplot as plt

    from pipelines.core.api import finish

    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["wedlm", "wedlm_fast", "blockwise"]
    for j, r in enumerate(regimes):
        xs, ys, lo, hi = [], [], [], []
        for i, v in enumerate(names):
            key = f"ratio.tokens_per_sec_{r}.{v}_vs_ar"
            if key in metrics:
                xs.append(i + (j - (len(regimes) - 1) / 2) * 0.2)
                ys.append(metrics[key])
                lo.append(metrics[key] - metrics[f"{key}.ci_low"])
                hi.append(metrics[f"{key}.ci_high"] - metrics[key])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=r)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names)
    return finish(
        fig,
        ax,
        ylabel="tokens/s ÷ AR (same weights)",
        title="batch-1 wall-clock speed-up vs AR\n"
        "(median of paired interleaved rounds; 95 % order-statistic interval,\n"
        "min–max when there are too few rounds)",
    )


def make_plots(p: Params, values, artifacts: dict[str, dict]) -> dict:
    """``evaluate.plots``: the speed–quality frontier per regime, p_cache against τ, a decode trace, the
    training losses, the wall-clock speed-ups with their intervals (and the sweep)."""
    a = artifacts["wedlm"]
    regimes = list(p.data.regimes)
    mean = {v: {k: values.mean(v, k) for k in values.metrics(v)} for v in values.table["variant"].unique()}
    figs = _plots(
        mean, pd.DataFrame(a["frontier"]), pd.DataFrame(a["sweep"]), a["traces"], pd.DataFrame(a["fit_log"]), regimes
    )
    figs["wallclock_speedup"] = _speed_plot(speed_ratios(values, p), regimes)
    return figs


def report_extra(p: Params, values, artifacts: dict[str, dict]) -> dict:
    """The τ frontier (and sweep) as report extras."""
    a = artifacts["wedlm"]
    return {"frontier": a["frontier"], "sweep": a["sweep"]}
