"""Theory vs Monte Carlo: the pooled MC estimates with batch-mean standard errors next to every theory
variant, the derived agreement / scaling / ReLU-theorem metrics, the metric histories and the plots."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.ntk_feynman import ddntk, ddntk2, dntk, multi, ntk2
from pipelines.ntk_feynman.params import DDNTK_TENSORS, DNTK_TENSORS, TENSORS, THEORY_VARIANTS, Params, variant_prefix
from pipelines.ntk_feynman.theory import VERTEX_KEYS
from pipelines.ntk_feynman.train import (
    ddntk2_pooled_blocks,
    ddntk2_quantity_names,
    multi_d_pooled_blocks,
    multi_d_quantity_names,
    n_prev,
    pooled_rows,
    stats_frame,
)

QUANTITIES = (*TENSORS, "mean_ntk", "mean_z2", "Theta1", "K1")
THEORY_OF = {**{t: t for t in TENSORS}, "mean_ntk": "Theta", "mean_z2": "K", "Theta1": "Theta1", "K1": "K1"}


def _split(outputs: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """(theory variants, kernel/NTK samplers by activation); the dNTK samplers are in :func:`_dntk_sims`."""
    th = {v: d for v, d in outputs.items() if v in THEORY_VARIANTS}
    sims = {
        v[3:]: d
        for v, d in outputs.items()
        if v.startswith("mc_")
        and not v.startswith(("mc_dntk_", "mc_ddntk_", "mc_ntk2_", "mc_dntk2_", "mc_ddntk2_", "mc_multi_"))
    }
    return th, sims


def _sims(outputs: dict[str, pd.DataFrame], kind: str) -> dict[str, pd.DataFrame]:
    """The samplers of ``mc_<kind>_<activation>`` by activation (prefixes told apart by params.variant_prefix, so
    mc_multi_dntk_relu is not mc_multi_'s and mc_dntk2_relu not mc_dntk_'s)."""
    pre = f"mc_{kind}_"
    return {v[len(pre) :]: d for v, d in outputs.items() if variant_prefix(v) == pre}


def _base(cmp: pd.DataFrame) -> pd.DataFrame:
    """The kernel/NTK rows of the comparison (without the dNTK's P, Q, the ddNTK's R, S, T, U and the two-input
    NTK tensors "2i.*", the two-input dNTK "2d.*", the two-input ddNTK "dd2.*", the M-input NTK tensors
    "mi.*", dNTK "md.*" and ddNTK "mdd.*")."""
    return cmp[
        ~cmp.quantity.isin((*DNTK_TENSORS, *DDNTK_TENSORS))
        & ~cmp.quantity.str.startswith(("2i.", "2d.", "dd2.", "mi.", "md.", "mdd."))
    ]


# The input-indexed statistics: per statistic its tensor names, the plot's y label, what a panel shows and the
# statistic's name in the suptitle.
_STATISTICS = {
    "ntk": (ntk2.TENSOR_NAMES, "sampled nets (n x cov)", "V, D, A, B, F", "NTK fluctuation tensors"),
    "dntk": (("P", "Q"), "sampled nets (n x E[dTh z])", "dNTK P, Q", "dNTK (P, Q)"),
    "ddntk": (ddntk2.TENSORS, "sampled nets (n x E[ddI], n x E[ddII])", "ddNTK R, S, T, U", "ddNTK (R, S, T, U)"),
}


def _kind_entry(prefix: str, block: str, stat: str, pair_components: int | None = None) -> tuple:
    """One ``_KINDS`` entry: the statistic ``stat`` of the input pair (``pair_components`` per layer) or, without
    it, of the multi block's M inputs."""
    names, ylabel, what, name = _STATISTICS[stat]
    if pair_components is None:
        return (
            prefix,
            block,
            names,
            ylabel,
            f"{what} of {{M}} inputs ({{n}} components/layer)",
            f"{name} of M inputs: recursion vs sampled nets",
        )
    return (
        prefix,
        block,
        names,
        ylabel,
        f"{what} of the input pair ({pair_components} components/layer)",
        f"Two-input {name}: recursion vs sampled nets",
    )


# One entry per input-indexed kind: its comparison-quantity prefix, its params block, its tensor names, and the
# plot's labels (y label, what the title shows per activation, suptitle). "{M}" is the multi block's number of
# inputs and "{n}" the number of components per layer.
_KINDS = {
    "ntk2": _kind_entry("2i.", "ntk2", "ntk", 50),
    "dntk2": _kind_entry("2d.", "dntk2", "dntk", 32),
    "ddntk2": _kind_entry("dd2.", "ddntk2", "ddntk", 64),
    "multi": _kind_entry("mi.", "multi", "ntk"),
    "multi_dntk": _kind_entry("md.", "multi_dntk", "dntk"),
    "multi_ddntk": _kind_entry("mdd.", "multi_ddntk", "ddntk"),
}
# the plot of each kind (MLflow artifact name)
_KIND_PLOTS = {
    "ntk2": "two_input_ntk",
    "dntk2": "two_input_dntk",
    "ddntk2": "two_input_ddntk",
    "multi": "multi_input_ntk",
    "multi_dntk": "multi_input_dntk",
    "multi_ddntk": "multi_input_ddntk",
}


def _kind(cmp: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The comparison rows of one input-indexed kind (quantities "<prefix>*")."""
    return cmp[cmp.quantity.str.startswith(_KINDS[kind][0])]


def _ddntk(cmp: pd.DataFrame) -> pd.DataFrame:
    return cmp[cmp.quantity.isin(DDNTK_TENSORS)]


def _dntk(cmp: pd.DataFrame) -> pd.DataFrame:
    return cmp[cmp.quantity.isin(DNTK_TENSORS)]


# per sampler kind: its comparison quantities (given the multi block's M) and its pooled estimates with batch-mean
# s.e. from the block table of one width and layer (width, previous layer's width n_prev, M)
_POOLED = {
    "dntk": (lambda M: DNTK_TENSORS, lambda d, w, npv, M: dntk.pooled_dntk(d, w, npv)),
    "ddntk": (lambda M: DDNTK_TENSORS, lambda d, w, npv, M: ddntk.pooled_ddntk(d, w, npv)),
    "ntk2": (lambda M: ntk2.quantity_names(), lambda d, w, npv, M: ntk2.pooled_blocks(d, npv)),
    "dntk2": (lambda M: ntk2.dntk2_quantity_names(), lambda d, w, npv, M: ntk2.dntk2_pooled_blocks(d, w)),
    "ddntk2": (lambda M: ddntk2_quantity_names(), lambda d, w, npv, M: ddntk2_pooled_blocks(d, w)),
    "multi": (multi.quantity_names, lambda d, w, npv, M: multi.pooled_blocks(d, npv, M)),
    "multi_dntk": (
        lambda M: multi_d_quantity_names("multi_dntk", M),
        lambda d, w, npv, M: multi_d_pooled_blocks("multi_dntk", d, w, M),
    ),
    "multi_ddntk": (
        lambda M: multi_d_quantity_names("multi_ddntk", M),
        lambda d, w, npv, M: multi_d_pooled_blocks("multi_ddntk", d, w, M),
    ),
}


def compare(inputs: dict, p: Params, **outputs: pd.DataFrame) -> pd.DataFrame:
    """One row per (activation, input, width, layer, quantity): ``mc``, ``mc_se`` (pooled over seeds) and one
    column per theory variant run (T for the tensors, Theta for mean_ntk, K for mean_z2), plus ``n_prev``."""
    theories, sims = _split(outputs)
    n0 = int(inputs["n0"])
    rows = []
    for act, blocks in sims.items():
        pooled = pooled_rows(blocks, n0)
        ref = theories.get("recursion")
        for r in pooled.to_dict("records"):
            npv = n_prev(int(r["layer"]), int(r["width"]), n0)
            inf = ref[(ref.activation == act) & (ref.input == r["input"]) & (ref.layer == r["layer"])].iloc[0]
            # the mean corrections as n_prev * (MC mean - infinite-width value)
            r["Theta1"], r["Theta1_se"] = npv * (r["mean_ntk"] - inf["Theta"]), npv * r["mean_ntk_se"]
            r["K1"], r["K1_se"] = npv * (r["mean_z2"] - inf["K"]), npv * r["mean_z2_se"]
            pair = [k for k in VERTEX_KEYS if k in r and not pd.isna(r[k])]
            for q in (*QUANTITIES, *pair):
                row = {
                    "activation": act,
                    "input": int(r["input"]),
                    "width": int(r["width"]),
                    "layer": int(r["layer"]),
                    "quantity": q,
                    "mc": r[q],
                    "mc_se": r[f"{q}_se"],
                    "n_prev": npv,
                }
                for v, t in theories.items():
                    sel = t[(t.activation == act) & (t.input == row["input"]) & (t.layer == row["layer"])]
                    row[v] = float(sel[THEORY_OF.get(q, q)].iloc[0])
                rows.append(row)
    M = len(inputs["multi"]) if inputs.get("multi") is not None else 0
    for kind, (names, pool) in _POOLED.items():
        # every layer >= 2 of each sampler against the theory variants' columns (layer 2 is exact)
        for act, blocks in _sims(outputs, kind).items():
            for (width, layer), d in blocks[blocks.layer >= 2].groupby(["width", "layer"], sort=True):
                npv = n_prev(int(layer), int(width), n0)
                est = pool(d, int(width), npv, M)
                qs = list(names(M))
                th = {
                    v: t[(t.activation == act) & (t.input == 0) & (t.layer == int(layer))].iloc[0][qs]
                    for v, t in theories.items()
                }
                for q in qs:
                    row = {
                        "activation": act,
                        "input": 0,
                        "width": int(width),
                        "layer": int(layer),
                        "quantity": q,
                        "mc": est[q],
                        "mc_se": est[f"{q}_se"],
                        "n_prev": npv,
                    }
                    for v in theories:
                        row[v] = float(th[v][q])
                    rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------- metrics
def _final(cmp: pd.DataFrame, p: Params) -> pd.DataFrame:
    return cmp[cmp.layer == p.net.depth]


def rel_errors(cmp: pd.DataFrame, p: Params, variant: str = "recursion") -> pd.DataFrame:
    """Final-layer tensor rows with ``rel_err`` = (T_mc - T_v) / |T_v| (NaN where T_v = 0) and
    ``err_vs_mc`` = |T_v - T_mc| / |T_mc| (defined for the zero-correction baseline too)."""
    d = _final(cmp, p)
    d = d[d.quantity.isin(TENSORS)].copy()
    pred = d[variant]
    d["rel_err"] = np.where(pred != 0, (d.mc - pred) / pred.abs().where(pred != 0, 1.0), np.nan)
    d["err_vs_mc"] = (pred - d.mc).abs() / d.mc.abs()
    d["excess"] = np.where(pred != 0, ((d.mc - pred).abs() - 2 * d.mc_se) / pred.abs().where(pred != 0, 1.0), np.nan)
    return d


def loglog_slope(x, y) -> float:
    x, y = np.log(np.asarray(x, float)), np.log(np.abs(np.asarray(y, float)))
    return float(np.polyfit(x, y, 1)[0])


def derived_metrics(cmp: pd.DataFrame, p: Params) -> dict[str, float]:
    out: dict[str, float] = {}
    wide, narrow = max(p.mc.widths), p.mc.narrow_width
    variants = [v for v in THEORY_VARIANTS if v in cmp.columns]
    out.update(dntk_metrics(cmp, p))
    out.update(ddntk_metrics(cmp, p))
    out.update(ntk2_metrics(cmp, p))
    out.update(ntk2_metrics(cmp, p, prefix="dntk2"))
    out.update(ntk2_metrics(cmp, p, prefix="ddntk2"))
    out.update(ntk2_metrics(cmp, p, prefix="multi"))
    out.update(ntk2_metrics(cmp, p, prefix="multi_dntk"))
    out.update(ntk2_metrics(cmp, p, prefix="multi_ddntk"))
    cmp = _base(cmp)
    for act in cmp.activation.unique():
        c = cmp[cmp.activation == act]
        e = rel_errors(c, p)
        big = e[e.width.isin(p.mc.claim_widths)]
        out[f"agreement_excess.{act}"] = float(big.excess.max())
        out[f"max_abs_rel_err_large_width.{act}"] = float(big.rel_err.abs().max())
        per_w = e.groupby("width").rel_err.apply(lambda s: s.abs().mean())
        out[f"err_ratio_wide_vs_narrow.{act}"] = float(per_w[wide] / per_w[narrow])
        fitw = per_w[per_w.index >= p.mc.slope_min_width]
        out[f"err_slope_vs_width.{act}"] = loglog_slope(fitw.index, fitw.values)
        # the raw covariances (T / n_prev) against the width: slope -1 is the 1/n scaling
        devs = []
        for t in TENSORS:
            s = e[(e.quantity == t) & (e.width >= p.mc.slope_min_width)].groupby("width").mc.mean()
            slope = loglog_slope(s.index, s.values / s.index.to_numpy(float))
            out[f"cov_slope.{t}.{act}"] = slope
            devs.append(abs(slope + 1.0))
        out[f"cov_slope_dev.{act}"] = float(max(devs))
        # the infinite-width prediction (zero correction) against the widest width's estimates
        w = e[e.width == wide]
        out[f"infinite_width_min_z.{act}"] = float((w.mc.abs() / w.mc_se).min())
        if "no_interlayer" in variants:
            a = rel_errors(c, p, "no_interlayer")
            out[f"interlayer_error_ratio.{act}"] = float(w.err_vs_mc.mean() / a[a.width == wide].err_vs_mc.mean())
        # mean diagonal NTK at the last layer against the infinite-width Theta (the ReLU theorem)
        m = _final(c, p)
        m = m[m.quantity == "mean_ntk"]
        z = (m.mc - m.recursion) / m.mc_se
        out[f"mean_ntk_max_abs_z.{act}"] = float(z.abs().max())
        for r in m[m.input == 0].itertuples():
            out[f"mean_ntk_shift_n{r.width}.{act}"] = float(r.width * (r.mc - r.recursion))
            out[f"mean_ntk_shift_n{r.width}.{act}.se"] = float(r.width * r.mc_se)
        # the two-input four-point vertex (not claimed: added after the first default run, see README)
        d = _final(c, p)
        d = d[d.quantity.isin(VERTEX_KEYS) & d.width.isin(p.mc.claim_widths)]
        if len(d):
            out[f"pair_agreement_excess.{act}"] = float(
                (((d.mc - d.recursion).abs() - 2 * d.mc_se) / d.recursion.abs()).max()
            )
            dw = d[d.width == wide]
            out[f"pair_mean_abs_rel_err_n{wide}.{act}"] = float(((dw.mc - dw.recursion) / dw.recursion).abs().mean())
        # the first-order mean corrections (not claimed: added after the first default run, see README)
        for q in ("Theta1", "K1"):
            d = _final(c, p)
            d = d[(d.quantity == q) & (d.input == 0)]
            out[f"{q}_recursion.{act}"] = float(d.recursion.iloc[0])
            w = d[d.width == wide].iloc[0]
            out[f"{q}_z_n{wide}.{act}"] = float((w.mc - w.recursion) / w.mc_se)
    return out


def _richardson(n1, t1, se1, n2, t2, se2) -> tuple[float, float]:
    """The 1/n (Richardson) extrapolation T_inf = (n2 T2 - n1 T1) / (n2 - n1) of the estimates T1 +- se1 at
    width n1 and T2 +- se2 at width n2, and its standard error."""
    return (n2 * t2 - n1 * t1) / (n2 - n1), math.hypot(n2 * se2, n1 * se1) / (n2 - n1)


def dntk_metrics(cmp: pd.DataFrame, p: Params) -> dict[str, float]:
    """The dNTK's P, Q at the last layer against the recursion: agreement at the widest width, the 1/n
    (Richardson) extrapolation of the two widest widths, the error ratio widest / narrow, the 1/n slope of the
    raw cross-correlations, the exactness at layer 2 (where the recursion holds at any width) and the
    ablation without inter-layer terms."""
    out: dict[str, float] = {}
    d_all = _dntk(cmp)
    if not len(d_all) or p.dntk is None:
        return out
    L, ws = p.net.depth, sorted(p.dntk.widths)
    wide, prev = ws[-1], ws[-2]
    for act in d_all.activation.unique():
        c = d_all[d_all.activation == act]
        last = c[c.layer == L]
        rec = last.recursion
        if float(rec.abs().max()) < 1e-12:  # e.g. a linear net: the dNTK vanishes identically
            out[f"dntk_max_abs_mc.{act}"] = float(c.mc.abs().max())
            continue
        rel = (last.mc - rec) / rec.abs()
        w = last[last.width == wide]
        out[f"dntk_agreement_excess.{act}"] = float(
            (((w.mc - w.recursion).abs() - 2 * w.mc_se) / w.recursion.abs()).max()
        )
        per_w = rel.abs().groupby(last.width).mean()
        for wd, v in per_w.items():
            out[f"dntk_mean_abs_rel_err_n{wd}.{act}"] = float(v)
        out[f"dntk_err_ratio_wide_vs_narrow.{act}"] = float(per_w[wide] / per_w[p.dntk.narrow_width])
        fit = per_w[per_w.index >= p.dntk.slope_min_width]
        out[f"dntk_err_slope_vs_width.{act}"] = loglog_slope(fit.index, fit.values)
        # 1/n extrapolation from the two widest widths: T_inf = (n2 T2 - n1 T1) / (n2 - n1)
        ex = []
        for q in DNTK_TENSORS:
            a = last[(last.quantity == q) & (last.width == prev)].iloc[0]
            b = last[(last.quantity == q) & (last.width == wide)].iloc[0]
            t_ex, se = _richardson(prev, a.mc, a.mc_se, wide, b.mc, b.mc_se)
            out[f"dntk_{q}_extrapolated.{act}"] = float(t_ex)
            out[f"dntk_{q}_extrapolated.{act}.se"] = float(se)
            out[f"dntk_{q}_recursion.{act}"] = float(b.recursion)
            ex.append((abs(t_ex - b.recursion) - 2 * se) / abs(b.recursion))
        out[f"dntk_extrap_excess.{act}"] = float(max(ex))
        # the raw cross-correlations E[dTh z] = T / n_prev against the width: slope -1 is the 1/n scaling
        devs = []
        for q in DNTK_TENSORS:
            s = last[(last.quantity == q) & (last.width >= p.dntk.slope_min_width)].sort_values("width")
            slope = loglog_slope(s.width, s.mc / s.n_prev)
            out[f"dntk_cov_slope.{q}.{act}"] = slope
            devs.append(abs(slope + 1.0))
        out[f"dntk_cov_slope_dev.{act}"] = float(max(devs))
        # layer 2: the first-order formula is exact at any width (layer 1 is Gaussian, its NTK fixed)
        l2 = c[c.layer == 2]
        out[f"dntk_layer2_max_abs_z.{act}"] = float(((l2.mc - l2.recursion) / l2.mc_se).abs().max())
        out[f"dntk_infinite_width_min_z.{act}"] = float((w.mc.abs() / w.mc_se).min())
        if "no_interlayer" in c:
            full = ((w.recursion - w.mc).abs() / w.mc.abs()).mean()
            abl = ((w.no_interlayer - w.mc).abs() / w.mc.abs()).mean()
            out[f"dntk_interlayer_error_ratio.{act}"] = float(full / abl)
    return out


def ddntk_metrics(cmp: pd.DataFrame, p: Params) -> dict[str, float]:
    """The ddNTK means: layer 2 against its exact values (z-scores, relative errors), the zero baseline's
    rejection there, the O(1/n) scaling of the raw means E[ddNTK] = T/n at the last layer, and the recursion
    (ddntk.ddntk_first_order) at the deeper layers: the 1/n (Richardson) extrapolation of the two widest widths
    against it at every layer >= 3, the agreement and mean error per width at the last layer, and the ablation
    without inter-layer terms."""
    out: dict[str, float] = {}
    d_all = _ddntk(cmp)
    if not len(d_all) or p.ddntk is None:
        return out
    L, wide = p.net.depth, max(p.ddntk.widths)
    for act in d_all.activation.unique():
        c = d_all[d_all.activation == act]
        l2 = c[c.layer == 2]
        z = (l2.mc - l2.recursion) / l2.mc_se
        out[f"ddntk_layer2_max_abs_z.{act}"] = float(z.abs().max())
        w2 = l2[l2.width == wide]
        out[f"ddntk_layer2_max_abs_rel_err_n{wide}.{act}"] = float(
            ((w2.mc - w2.recursion) / w2.recursion.abs()).abs().max()
        )
        out[f"ddntk_infinite_width_min_z.{act}"] = float((w2.mc.abs() / w2.mc_se).min())
        last = c[c.layer == L]
        devs = []
        for q in DDNTK_TENSORS:
            for r in last[last.quantity == q].itertuples():
                out[f"ddntk_{q}_L{L}_n{r.width}.{act}"] = float(r.mc)
                out[f"ddntk_{q}_L{L}_n{r.width}.{act}.se"] = float(r.mc_se)
            s = last[(last.quantity == q) & (last.width >= p.ddntk.slope_min_width)].sort_values("width")
            slope = loglog_slope(s.width, s.mc / s.n_prev)
            out[f"ddntk_mean_slope.{q}.{act}"] = slope
            devs.append(abs(slope + 1.0))
        out[f"ddntk_mean_slope_dev.{act}"] = float(max(devs))
        ws = sorted(c.width.unique())
        if float(last.recursion.abs().max()) < 1e-12 or len(ws) < 2 or L < 3:
            continue  # e.g. lambda_W = 0: the ddNTK vanishes identically
        wide_, prev = int(ws[-1]), int(ws[-2])
        # 1/n extrapolation T_inf = (n2 T2 - n1 T1) / (n2 - n1) at every layer >= 3, against the recursion
        zs = []
        for ell in range(3, L + 1):
            cl = c[c.layer == ell]
            ex = []
            for q in DDNTK_TENSORS:
                a = cl[(cl.quantity == q) & (cl.width == prev)].iloc[0]
                b = cl[(cl.quantity == q) & (cl.width == wide_)].iloc[0]
                t_ex, se = _richardson(prev, a.mc, a.mc_se, wide_, b.mc, b.mc_se)
                zs.append((t_ex - b.recursion) / se)
                if ell == L:
                    out[f"ddntk_{q}_extrapolated.{act}"] = float(t_ex)
                    out[f"ddntk_{q}_extrapolated.{act}.se"] = float(se)
                    out[f"ddntk_{q}_recursion.{act}"] = float(b.recursion)
                    ex.append((abs(t_ex - b.recursion) - 2 * se) / abs(b.recursion))
            if ell == L:
                out[f"ddntk_extrap_excess.{act}"] = float(max(ex))
        out[f"ddntk_extrap_max_abs_z.{act}"] = float(np.max(np.abs(zs)))
        w = last[last.width == wide_]
        out[f"ddntk_agreement_excess.{act}"] = float(
            (((w.mc - w.recursion).abs() - 2 * w.mc_se) / w.recursion.abs()).max()
        )
        per_w = ((last.mc - last.recursion) / last.recursion.abs()).abs().groupby(last.width).mean()
        for wd, v in per_w.items():
            out[f"ddntk_mean_abs_rel_err_n{wd}.{act}"] = float(v)
        out[f"ddntk_err_ratio_wide_vs_narrow.{act}"] = float(per_w[wide_] / per_w[ws[0]])
        if "no_interlayer" in c:
            full = ((w.recursion - w.mc).abs() / w.mc.abs()).mean()
            abl = ((w.no_interlayer - w.mc).abs() / w.mc.abs()).mean()
            out[f"ddntk_interlayer_error_ratio.{act}"] = float(full / abl)
    return out


def ntk2_metrics(cmp: pd.DataFrame, p: Params, prefix: str = "ntk2") -> dict[str, float]:
    """The two-input NTK tensors (50 components per layer): layer 2 against its exact values (z-scores), and
    at every layer >= 3 the 1/n (Richardson) extrapolation of the two widest widths against the recursion:
    its max |z| and, per tensor, the excess max_c (|T_ex,c - T_rec,c| - 2 s.e._c) / max_c |T_rec,c| (relative
    to the tensor's largest component, since single components can be near zero); and the error of the
    recursion over that of the ablation without inter-layer terms at the widest width and last layer.
    ``prefix="dntk2"``: the same metrics (names ``dntk2_*``) of the two-input dNTK's P, Q (32 components per
    layer, quantities "2d.*"); ``prefix="ddntk2"``: those (``ddntk2_*``) of the two-input ddNTK's R, S, T, U (64
    components per layer, quantities "dd2.*"); ``prefix="multi"``: those (``multi_*``) of the M-input NTK tensors
    (quantities "mi.*"); ``prefix="multi_dntk"`` / ``"multi_ddntk"``: those of the M-input dNTK's P, Q ("md.*") /
    ddNTK's R, S, T, U ("mdd.*"). For multi, ddntk2, multi_dntk and multi_ddntk the max |z| is also given per layer
    (``<prefix>_extrap_max_abs_z.L<l>.<act>``)."""
    out: dict[str, float] = {}
    d_all = _kind(cmp, prefix)
    block = getattr(p, _KINDS[prefix][1])
    names = _KINDS[prefix][2]
    tag = _KINDS[prefix][0][:-1]
    if not len(d_all) or block is None:
        return out
    L = p.net.depth
    for act in d_all.activation.unique():
        c = d_all[(d_all.activation == act) & (d_all.mc_se > 0)]
        l2 = c[c.layer == 2]
        out[f"{prefix}_layer2_max_abs_z.{act}"] = float(((l2.mc - l2.recursion) / l2.mc_se).abs().max())
        ws = sorted(c.width.unique())
        if len(ws) < 2 or L < 3:
            continue
        wide, prev = int(ws[-1]), int(ws[-2])
        zs, excess = [], []
        for ell in range(3, L + 1):
            a = c[(c.layer == ell) & (c.width == prev)].set_index("quantity")
            b = c[(c.layer == ell) & (c.width == wide)].set_index("quantity")
            a = a.loc[a.index.intersection(b.index)]
            b = b.loc[a.index]
            t_ex = (wide * b.mc - prev * a.mc) / (wide - prev)
            se = np.hypot(wide * b.mc_se, prev * a.mc_se) / (wide - prev)
            zs.extend(((t_ex - b.recursion) / se).tolist())
            if prefix in ("multi", "ddntk2", "multi_dntk", "multi_ddntk"):
                out[f"{prefix}_extrap_max_abs_z.L{ell}.{act}"] = float(((t_ex - b.recursion) / se).abs().max())
            for t in names:
                m = b.index.str.startswith(f"{tag}.{t}_")
                ex = float((((t_ex - b.recursion).abs() - 2 * se)[m]).max() / b.recursion[m].abs().max())
                excess.append(ex)
                out[f"{prefix}_extrap_excess.{t}.L{ell}.{act}"] = ex
        out[f"{prefix}_extrap_max_abs_z.{act}"] = float(np.max(np.abs(zs)))
        out[f"{prefix}_extrap_excess.{act}"] = float(max(excess))
        w = c[(c.layer == L) & (c.width == wide)]
        out[f"{prefix}_mean_abs_rel_err_n{wide}.{act}"] = float(
            (w.mc - w.recursion).abs().sum() / w.recursion.abs().sum()
        )
        if "no_interlayer" in c:
            out[f"{prefix}_interlayer_error_ratio.{act}"] = float(
                (w.recursion - w.mc).abs().sum() / (w.no_interlayer - w.mc).abs().sum()
            )
    return out


def variant_comparisons(
    cmp: pd.DataFrame, p: Params, outputs: dict[str, pd.DataFrame], n0: int
) -> dict[str, dict[int, float]]:
    """The variant metrics that compare with another variant (train.results_table has the rest), per seed, named
    ``variants.<v>.<metric>`` (they join v's rows): the MC variants' mean-NTK shift against the recursion's
    Theta per seed, the theory variants' errors against the pooled MC (the first seed's row)."""
    theories, sims = _split(outputs)
    L, wide = p.net.depth, max(p.mc.widths)
    out: dict[str, dict[int, float]] = {}
    for act, blocks in sims.items():
        per_seed = pooled_rows(blocks[blocks.layer == L], n0, by=("seed", "input", "width", "layer"))
        th = theories["recursion"]
        for seed, d in per_seed.groupby("seed"):
            for r in d.itertuples():
                pre = "" if r.input == 0 else f"x{r.input}."
                theta = float(th[(th.activation == act) & (th.input == r.input) & (th.layer == L)].Theta.iloc[0])
                out.setdefault(f"variants.mc_{act}.{pre}mean_ntk_shift_n{r.width}", {})[int(seed)] = float(
                    r.width * (r.mean_ntk - theta)
                )
    for v, t in theories.items():
        for act in t.activation.unique():
            if act in sims:
                e = rel_errors(cmp[cmp.activation == act], p, v)
                row = {f"{act}.mean_abs_rel_err_n{w}": float(s.mean()) for w, s in e.groupby("width").err_vs_mc}
                row[f"{act}.mean_abs_rel_err"] = row[f"{act}.mean_abs_rel_err_n{wide}"]
                for k, x in row.items():
                    out[f"variants.{v}.{k}"] = {int(p.seeds[0]): x}
    return out


def _sampler_curves(hv: dict, c: pd.DataFrame, tensors, L: int, z_layer: int | None = None) -> None:
    """Into ``hv``: one dNTK / ddNTK sampler's curves per tensor, from its comparison rows ``c`` (one activation):
    MC at layer L against the width (and its relative error where the recursion is nonzero), the z-scores
    against the width at ``z_layer`` (if given), and MC against the layer at the sampler's widest width."""
    dwide = int(c.width.max())
    for q in tensors:
        s = c[(c.quantity == q) & (c.layer == L)].sort_values("width")
        hv[f"{q}_L{L}_vs_width"] = list(zip(s.width.astype(int), s.mc.astype(float)))
        if (s.recursion.abs() > 0).all():
            hv[f"{q}_L{L}_rel_err_vs_width"] = list(
                zip(s.width.astype(int), ((s.mc - s.recursion) / s.recursion.abs()).astype(float))
            )
        if z_layer is not None:
            s = c[(c.quantity == q) & (c.layer == z_layer)].sort_values("width")
            hv[f"{q}_L{z_layer}_z_vs_width"] = list(
                zip(s.width.astype(int), ((s.mc - s.recursion) / s.mc_se).astype(float))
            )
        s = c[(c.quantity == q) & (c.width == dwide)].sort_values("layer")
        hv[f"{q}_n{dwide}_vs_layer"] = list(zip(s.layer.astype(int), s.mc.astype(float)))


def histories(cmp: pd.DataFrame, p: Params, outputs: dict[str, pd.DataFrame]) -> dict[str, dict]:
    """Curves with steps for MLflow: theory layer profiles (step = layer), errors and MC estimates against
    the width (step = width), MC layer profiles at the widest width (step = layer)."""
    theories, sims = _split(outputs)
    L, wide = p.net.depth, max(p.mc.widths)
    h: dict[str, dict] = {}
    for v, t in theories.items():
        hv = h.setdefault(v, {})
        t0 = t[t.input == 0]
        for act in t0.activation.unique():
            a = t0[t0.activation == act].sort_values("layer")
            for q in ("K", "Theta", *TENSORS, *DNTK_TENSORS, *DDNTK_TENSORS, "K1", "Theta1"):
                hv[f"{act}.{q}_vs_layer"] = list(zip(a.layer.astype(int), a[q].astype(float)))
            if act in sims:
                e = rel_errors(cmp[cmp.activation == act], p, v)
                e = e[e.input == 0].groupby("width").err_vs_mc.mean()
                hv[f"{act}.mean_abs_rel_err_vs_width"] = list(zip(e.index.astype(int), e.values.astype(float)))
    for act in sims:
        hv = h.setdefault(f"mc_{act}", {})
        c = cmp[(cmp.activation == act) & (cmp.input == 0)]
        for q in QUANTITIES:
            s = c[(c.quantity == q) & (c.layer == L)].sort_values("width")
            hv[f"{q}_L{L}_vs_width"] = list(zip(s.width.astype(int), s.mc.astype(float)))
            s = c[(c.quantity == q) & (c.width == wide)].sort_values("layer")
            hv[f"{q}_n{wide}_vs_layer"] = list(zip(s.layer.astype(int), s.mc.astype(float)))
        s = c[(c.quantity == "mean_ntk") & (c.layer == L)].sort_values("width")
        hv["mean_ntk_shift_vs_width"] = list(zip(s.width.astype(int), (s.width * (s.mc - s.recursion)).astype(float)))
    for kind, rows, tensors, z_layer in (
        ("dntk", _dntk(cmp), DNTK_TENSORS, None),
        ("ddntk", _ddntk(cmp), DDNTK_TENSORS, 2),
    ):
        for act in _sims(outputs, kind):
            _sampler_curves(h.setdefault(f"mc_{kind}_{act}", {}), rows[rows.activation == act], tensors, L, z_layer)
    return h


_CMP: list = []  # (artifacts, inputs, comparison) of the last call: the report node's Fn and extra share it


def comparison(p: Params, artifacts: dict, inputs: dict) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """(statistics tables by variant, the comparison) from the train nodes' JSON artifacts."""
    if _CMP and _CMP[0][0] is artifacts and _CMP[0][1] is inputs:
        return _CMP[0][2], _CMP[0][3]
    outputs = {v: stats_frame(a) for v, a in artifacts.items()}
    cmp = compare(inputs, p, **outputs)
    _CMP[:] = [(artifacts, inputs, outputs, cmp)]
    return outputs, cmp


def comparison_metrics(values, p: Params, artifacts: dict, inputs: dict) -> dict:
    """The derived metrics (point values of the pooled comparison, what the claims read) and the variant metrics
    that compare with another variant (variants.<v>.<metric>, per seed)."""
    outputs, cmp = comparison(p, artifacts, inputs)
    metrics = derived_metrics(cmp, p)
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        raise FloatingPointError(f"ntk_feynman.evaluate.report: non-finite derived metric(s) {bad[:5]}")
    return {**metrics, **variant_comparisons(cmp, p, outputs, int(inputs["n0"]))}


def plots(p: Params, values, artifacts: dict, inputs: dict) -> dict:
    return make_plots(comparison(p, artifacts, inputs)[1], p)


def report_extra(p: Params, values, artifacts: dict, inputs: dict) -> dict:
    """The inputs' summary and the metric histories (layer profiles, curves against the width: read from the
    comparison, so they are here and not in the train nodes' tables)."""
    from pipelines.core.api import history_series

    outputs, cmp = comparison(p, artifacts, inputs)
    h = histories(cmp, p, outputs)
    return {
        "inputs": {"n0": int(inputs["n0"]), "sq_norm": inputs["sq_norm"], "source": inputs["source"]},
        "histories": {v: {k: history_series(x) for k, x in hv.items()} for v, hv in h.items()},
    }


# ------------------------------------------------------------------------------------------- plots
VARIANT_STYLE = {
    "recursion": ("k", "-", "recursion (1/n, method)"),
    "no_interlayer": ("C1", "--", "no inter-layer terms (ablation)"),
    "infinite_width": ("C7", ":", "infinite width (0)"),
}


def _activation_panels(d: pd.DataFrame, rows: int = 1, panel: tuple[float, float] = (4.2, 3.8)):
    """(activations, figure, axes): a column of ``rows`` panels per activation of ``d`` (axes always 2-D);
    ``panel`` is one panel's (width, height) in inches."""
    import matplotlib.pyplot as plt

    acts = list(d.activation.unique())
    fig, axes = plt.subplots(rows, len(acts), figsize=(panel[0] * len(acts), panel[1] * rows), squeeze=False)
    return acts, fig, axes


def _finish(fig, suptitle: str, ax=None, ylabel: str | None = None, legend: int | None = None):
    """The figure with its suptitle, laid out; first the y label and the legend (font size ``legend``) of ``ax``
    (the first panel) where given."""
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if legend is not None:
        ax.legend(fontsize=legend)
    fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def _variants_and_mc(ax, s: pd.DataFrame) -> None:
    """One quantity's panel against the width (``s``: its comparison rows, sorted by width): the recursion's ±10 %
    band, a horizontal line per theory variant, and the MC estimates ±2 s.e."""
    an = float(s.recursion.iloc[0])
    ax.axhspan(an - 0.1 * abs(an), an + 0.1 * abs(an), color="0.9", label="recursion ±10%")
    for v, (col, ls, lab) in VARIANT_STYLE.items():
        if v in s:
            ax.axhline(float(s[v].iloc[0]), color=col, ls=ls, lw=1.2, label=lab)
    ax.errorbar(s.width, s.mc, yerr=2 * s.mc_se, fmt="o", color="C3", capsize=3, label="Monte Carlo ±2 s.e.")


def _tensors_vs_width(cmp: pd.DataFrame, p: Params, act: str):
    import matplotlib.pyplot as plt

    L = p.net.depth
    c = cmp[(cmp.activation == act) & (cmp.layer == L) & (cmp.input == 0)]
    fig, axes = plt.subplots(1, len(TENSORS), figsize=(3.2 * len(TENSORS), 3.4))
    for ax, t in zip(axes, TENSORS):
        _variants_and_mc(ax, c[c.quantity == t].sort_values("width"))
        ax.set_xscale("log", base=2)
        ax.set(title=f"{t}  (layer {L})", xlabel="width n")
        ax.grid(alpha=0.3)
    return _finish(fig, f"{act}: first-order tensors vs width (pooled over seeds)", axes[0], "n × covariance", 7)


def _rel_err_vs_width(cmp: pd.DataFrame, p: Params):
    acts, fig, axes = _activation_panels(cmp)
    for ax, act in zip(axes[0], acts):
        c = cmp[cmp.activation == act]
        e = rel_errors(c, p)
        e = e[e.input == 0]
        for i, t in enumerate(TENSORS):
            s = e[e.quantity == t].sort_values("width")
            ax.plot(s.width, s.rel_err.abs(), "o-", ms=3, lw=0.8, alpha=0.6, color=f"C{i}", label=f"|rel err| {t}")
        m = e.groupby("width").rel_err.apply(lambda s: s.abs().mean())
        ax.plot(m.index, m.values, "ks-", lw=2, label="mean over tensors")
        if "no_interlayer" in c:
            a = rel_errors(c, p, "no_interlayer")
            a = a[a.input == 0].groupby("width").err_vs_mc.mean()
            ax.plot(a.index, a.values, "^--", color="C1", label="ablation: |T_abl − T_mc| / |T_mc|")
        w = np.array(sorted(e.width.unique()), float)
        ax.plot(w, m.iloc[0] * w[0] / w, "k:", lw=1, label="∝ 1/n")
        ax.set(xscale="log", yscale="log", xlabel="width n", title=act)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
    return _finish(
        fig,
        f"Relative error of the first-order recursion (layer {p.net.depth}) shrinks like 1/n",
        axes[0][0],
        "|T_mc − T_recursion| / |T_recursion|",
        7,
    )


def _cov_scaling(cmp: pd.DataFrame, p: Params):
    acts, fig, axes = _activation_panels(cmp)
    for ax, act in zip(axes[0], acts):
        c = _final(cmp[(cmp.activation == act) & (cmp.input == 0)], p)
        for i, t in enumerate(TENSORS):
            s = c[c.quantity == t].sort_values("width")
            ax.errorbar(
                s.width,
                (s.mc / s.n_prev).abs(),
                yerr=2 * s.mc_se / s.n_prev,
                fmt="o",
                ms=4,
                capsize=2,
                color=f"C{i}",
                label=f"|{t}|/n (MC)",
            )
            ax.plot(s.width, (s.recursion / s.n_prev).abs(), "-", color=f"C{i}", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="width n", title=f"{act} (lines: recursion / n)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
    return _finish(
        fig, "The raw finite-width covariances scale as 1/n", axes[0][0], "|covariance| at the last layer", 7
    )


def _mean_corrections(cmp: pd.DataFrame, p: Params):
    acts, fig, axes = _activation_panels(cmp, rows=2, panel=(4.2, 3.3))
    for row, (q, lab) in enumerate((("Theta1", "n · (E[Θ̂_ii] − Θ_∞)"), ("K1", "n · (E[z_i²] − K_∞)"))):
        for ax, act in zip(axes[row], acts):
            c = cmp[(cmp.activation == act) & (cmp.quantity == q) & (cmp.input == 0)]
            for ell in sorted(c.layer.unique()):
                if ell == 1:
                    continue
                s = c[c.layer == ell].sort_values("width")
                col = f"C{ell - 2}"
                ax.errorbar(
                    s.width * (1 + 0.03 * (ell - 2)),
                    s.mc,
                    yerr=2 * s.mc_se,
                    fmt="o",
                    ms=3,
                    capsize=2,
                    color=col,
                    label=f"MC layer {ell}",
                )
                if "recursion" in s:
                    ax.axhline(
                        float(s.recursion.iloc[0]), color=col, lw=1.2, ls="-", label=f"recursion {q} layer {ell}"
                    )
            ax.axhline(0, color="k", lw=0.6, ls=":")
            ax.set_xscale("log", base=2)
            ax.set(xlabel="width n", title=f"{act}: {q}")
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel(f"{lab}  (±2 s.e.)")
    return _finish(
        fig,
        "Mean corrections: ReLU's diagonal NTK (and kernel) have none; smooth σ shift at O(1/n)",
        axes[0][0],
        legend=6,
    )


def _pair_vertex(cmp: pd.DataFrame, p: Params):
    acts, fig, axes = _activation_panels(cmp)
    for ax, act in zip(axes[0], acts):
        c = _final(cmp[(cmp.activation == act) & cmp.quantity.isin(VERTEX_KEYS)], p)
        for i, q in enumerate(VERTEX_KEYS):
            s = c[c.quantity == q].sort_values("width")
            rec = s.recursion.abs()
            ax.errorbar(
                s.width * (1 + 0.02 * (i - 2.5)),
                s.mc / s.recursion,
                yerr=2 * s.mc_se / rec,
                fmt="o-",
                ms=3,
                lw=0.8,
                capsize=2,
                color=f"C{i}",
                label=f"{q} = {float(s.recursion.iloc[0]):.3g}",
            )
        ax.axhspan(0.9, 1.1, color="0.9")
        ax.axhline(1, color="k", lw=1)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="width n", title=f"{act}, layer {p.net.depth}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, title="recursion value", title_fontsize=6)
    return _finish(
        fig,
        "Two inputs (cosine set by data.pair_cosine): four-point vertex V_(ab)(cd), MC over recursion",
        axes[0][0],
        "V_mc / V_recursion  (±2 s.e.)",
    )


def _dntk_vs_width(cmp: pd.DataFrame, p: Params):
    """P, Q at the last layer against the width (MC ±2 s.e.), the recursion (±10 % band), the ablation, and
    the 1/n extrapolation of the two widest widths."""
    import matplotlib.pyplot as plt

    d = _dntk(cmp)
    acts, L = list(d.activation.unique()), p.net.depth
    fig, axes = plt.subplots(len(acts), 2, figsize=(8.4, 3.3 * len(acts)), squeeze=False)
    for i, act in enumerate(acts):
        for j, q in enumerate(DNTK_TENSORS):
            ax = axes[i][j]
            s = d[(d.activation == act) & (d.quantity == q) & (d.layer == L)].sort_values("width")
            _variants_and_mc(ax, s)
            if len(s) >= 2:
                a, b = s.iloc[-2], s.iloc[-1]
                t_ex, se = _richardson(a.width, a.mc, a.mc_se, b.width, b.mc, b.mc_se)
                ax.errorbar(
                    [b.width * 1.6],
                    [t_ex],
                    yerr=[2 * se],
                    fmt="D",
                    color="C2",
                    capsize=3,
                    label="1/n extrapolation (two widest)",
                )
            ax.set_xscale("log", base=2)
            ax.set(title=f"{act}: dNTK {q} (layer {L})", xlabel="width n")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("n × E[dΘ̂ z]")
    return _finish(fig, "dNTK–preactivation cross-correlations P, Q vs width (pooled over seeds)", axes[0][0], legend=6)


def _dntk_scaling(cmp: pd.DataFrame, p: Params):
    """Left: |rel err| of P, Q against the width (log-log, 1/n guide). Right: the raw cross-correlations T/n."""
    import matplotlib.pyplot as plt

    d = _dntk(cmp)
    L = p.net.depth
    d = d[d.layer == L]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for k, act in enumerate(d.activation.unique()):
        for m, q in enumerate(DNTK_TENSORS):
            s = d[(d.activation == act) & (d.quantity == q)].sort_values("width")
            col, mk = f"C{k}", "os"[m]
            if (s.recursion.abs() > 0).all():
                ax1.plot(
                    s.width, ((s.mc - s.recursion) / s.recursion).abs(), mk + "-", color=col, ms=4, label=f"{act} {q}"
                )
            ax2.errorbar(
                s.width,
                (s.mc / s.n_prev).abs(),
                yerr=2 * s.mc_se / s.n_prev,
                fmt=mk,
                color=col,
                ms=4,
                capsize=2,
                label=f"{act} |{q}|/n (MC)",
            )
            ax2.plot(s.width, (s.recursion / s.n_prev).abs(), "-", color=col, lw=1)
    w = np.array(sorted(d.width.unique()), float)
    ax1.plot(w, 0.5 * w[0] / w, "k:", lw=1, label="∝ 1/n")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width n")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    ax1.set(ylabel="|T_mc − T_rec| / |T_rec|", title=f"dNTK error of the recursion (layer {L})")
    ax2.set(ylabel="|E[dΘ̂ z]| (lines: recursion / n)", title="raw cross-correlations scale as 1/n")
    fig.tight_layout()
    return fig


_EXACT_L2 = "layer profiles: recursion vs sampled nets (layer 2 is exact at any width)"


def _layer_profiles(d: pd.DataFrame, tensors, what: str, suptitle: str, panel: tuple[float, float]):
    """Each tensor against the layer, a row per activation: the recursion, the ablation, and MC at every width
    (error bars ±2 s.e.); ``panel`` is one panel's (width, height) in inches."""
    import matplotlib.pyplot as plt

    acts = list(d.activation.unique())
    widths = sorted(d.width.unique())
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(
        len(acts), len(tensors), figsize=(panel[0] * len(tensors), panel[1] * len(acts)), squeeze=False
    )
    for i, act in enumerate(acts):
        for j, q in enumerate(tensors):
            ax = axes[i][j]
            s = d[(d.activation == act) & (d.quantity == q)]
            th = s[s.width == widths[-1]].sort_values("layer")
            for v, (col, ls, lab) in VARIANT_STYLE.items():
                if v in th and v != "infinite_width":
                    ax.plot(th.layer, th[v], color=col, ls=ls, lw=1.5, label=lab)
            for k, wd in enumerate(widths):
                t = s[s.width == wd].sort_values("layer")
                ax.errorbar(
                    t.layer + 0.05 * (k - len(widths) / 2),
                    t.mc,
                    yerr=2 * t.mc_se,
                    fmt="o",
                    ms=3,
                    capsize=2,
                    color=cmap(k / max(1, len(widths) - 1)),
                    label=f"MC n={wd}",
                )
            ax.set(title=f"{act}: {what}{q}", xlabel="layer")
            ax.grid(alpha=0.3)
    return _finish(fig, suptitle, axes[0][0], legend=6)


def _ddntk_vs_width(cmp: pd.DataFrame, p: Params):
    """Rows = activations; left: layer 2, n E[ddNTK] vs width against the exact value; right: the last layer's
    n E[ddNTK] against 1/n, with the recursion at 1/n = 0 (±10 % band) and the straight 1/n extrapolation
    through the two widest widths (what is left between it and the points is the 1/n^2 part)."""
    import matplotlib.pyplot as plt

    d = _ddntk(cmp)
    L = p.net.depth
    acts = list(d.activation.unique())
    fig, axes = plt.subplots(len(acts), 2, figsize=(11, 3.6 * len(acts)), squeeze=False)
    for i, act in enumerate(acts):
        c = d[d.activation == act]
        ax = axes[i, 0]
        for j, q in enumerate(DDNTK_TENSORS):
            s = c[(c.quantity == q) & (c.layer == 2)].sort_values("width")
            ax.errorbar(
                s.width * (1 + 0.03 * (j - 1.5)),
                s.mc,
                yerr=2 * s.mc_se,
                fmt="o",
                color=f"C{j}",
                capsize=3,
                label=f"{q} MC ±2 s.e.",
            )
            ax.axhline(float(s.recursion.iloc[0]), color=f"C{j}", ls="-", lw=1)
        ax.set(
            xscale="log",
            title=f"{act}: ddNTK at layer 2 (lines: exact first order)",
            xlabel="width n",
            ylabel="n · E[ddNTK]",
        )
        ax.legend(fontsize=7)
        ax = axes[i, 1]
        for j, q in enumerate(DDNTK_TENSORS):
            s = c[(c.quantity == q) & (c.layer == L)].sort_values("width")
            x = 1.0 / s.width.to_numpy(float)
            ax.errorbar(x, s.mc, yerr=2 * s.mc_se, fmt="o", color=f"C{j}", ms=4, capsize=2, label=f"{q} MC ±2 s.e.")
            rec = float(s.recursion.iloc[0])
            ax.plot([0.0], [rec], "*", color=f"C{j}", ms=11, mec="k", label=f"{q} recursion" if j == 0 else None)
            ax.fill_between([0.0, 0.3 * x.max()], 0.9 * rec, 1.1 * rec, color=f"C{j}", alpha=0.12, lw=0)
            if len(s) >= 2:
                x1, x2, y1, y2 = x[-2], x[-1], float(s.mc.iloc[-2]), float(s.mc.iloc[-1])
                k = (y1 - y2) / (x1 - x2)
                ax.plot([0.0, x1], [y2 - k * x2, y1], ":", color=f"C{j}", lw=1)
            if "no_interlayer" in s:
                ax.plot(
                    [0.0],
                    [float(s.no_interlayer.iloc[0])],
                    "x",
                    color=f"C{j}",
                    ms=7,
                    label="no inter-layer (ablation)" if j == 0 else None,
                )
        ax.set(
            title=f"{act}: layer {L} vs 1/n (stars: recursion; dotted: 1/n extrap.)",
            xlabel="1 / n",
            ylabel="n · E[ddNTK]",
        )
        ax.set_xlim(left=-0.005)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def make_plots(comparison: pd.DataFrame, p: Params) -> dict:
    figs = {}
    base = _base(comparison)
    if len(base):
        figs = {f"tensors_vs_width_{act}": _tensors_vs_width(base, p, act) for act in base.activation.unique()}
        figs["rel_err_vs_width"] = _rel_err_vs_width(base, p)
        figs["covariance_scaling"] = _cov_scaling(base, p)
        figs["layer_profiles"] = _layer_profiles(
            base[base.input == 0],
            TENSORS,
            "",
            "Layer profiles: recursion vs sampled nets (error bars ±2 s.e.)",
            (3.0, 2.8),
        )
        figs["mean_corrections"] = _mean_corrections(base, p)
        if base.quantity.isin(VERTEX_KEYS).any():
            figs["two_input_vertex"] = _pair_vertex(base, p)
    if len(_dntk(comparison)):
        figs["dntk_vs_width"] = _dntk_vs_width(comparison, p)
        figs["dntk_scaling"] = _dntk_scaling(comparison, p)
        figs["dntk_layer_profiles"] = _layer_profiles(
            _dntk(comparison), DNTK_TENSORS, "dNTK ", "dNTK " + _EXACT_L2, (4.2, 3.0)
        )
    if len(_ddntk(comparison)):
        figs["ddntk_vs_width"] = _ddntk_vs_width(comparison, p)
        figs["ddntk_layer_profiles"] = _layer_profiles(
            _ddntk(comparison), DDNTK_TENSORS, "ddNTK ", "ddNTK " + _EXACT_L2, (3.5, 3.0)
        )
    for kind, name in _KIND_PLOTS.items():
        if len(_kind(comparison, kind)):
            figs[name] = _ntk2_plot(comparison, p, kind)
    return figs


def _symlog_ticks(lo: float, hi: float, lin: float) -> list[float]:
    """0 and the powers of ten from the linear threshold outwards within [lo, hi] (a symlog axis's default
    also labels the decades inside the narrow linear band, where their labels overlap)."""
    k0 = math.ceil(math.log10(lin))
    top = max(abs(lo), abs(hi), lin)
    decades = [10.0**k for k in range(k0, math.floor(math.log10(top)) + 1)]
    return sorted({0.0, *(d for d in decades if d <= hi), *(-d for d in decades if -d >= lo)})


def _ntk2_plot(cmp: pd.DataFrame, p: Params, kind: str = "ntk2"):
    """Per activation: every component of one input-indexed kind (``_KINDS``: the two-input or M-input NTK
    tensors V, D, A, B, F, dNTK P, Q or ddNTK R, S, T, U) at layers 2..L, sampled nets against the recursion
    (layer 2: the widest width, exact; deeper: the 1/n extrapolation of the two widest widths), ±2 s.e."""
    _, _, _, ylabel, title, suptitle = _KINDS[kind]
    d = _kind(cmp, kind)
    acts, fig, axes = _activation_panels(d, panel=(5.2, 4.6))
    for ax, act in zip(axes[0], acts):
        c = d[(d.activation == act) & (d.mc_se > 0)]
        ws = sorted(c.width.unique())
        wide, prev = int(ws[-1]), int(ws[-2]) if len(ws) > 1 else int(ws[-1])
        lo, hi = np.inf, -np.inf
        for ell, col in zip(range(2, p.net.depth + 1), ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8")):
            b = c[(c.layer == ell) & (c.width == wide)].set_index("quantity")
            if ell == 2 or prev == wide:
                y, e = b.mc, 2 * b.mc_se
                lab = f"layer {ell}, MC n = {wide}"
            else:
                a = c[(c.layer == ell) & (c.width == prev)].set_index("quantity").loc[b.index]
                y = (wide * b.mc - prev * a.mc) / (wide - prev)
                e = 2 * np.hypot(wide * b.mc_se, prev * a.mc_se) / (wide - prev)
                lab = f"layer {ell}, 1/n extrap. n = {prev}, {wide}"
            ax.errorbar(b.recursion, y, yerr=e, fmt="o", ms=3, color=col, alpha=0.7, label=lab)
            lo, hi = min(lo, b.recursion.min(), y.min()), max(hi, b.recursion.max(), y.max())
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
        lin = 1e-2 * max(abs(lo), abs(hi))
        ax.set_xscale("symlog", linthresh=lin)
        ax.set_yscale("symlog", linthresh=lin)
        ticks = _symlog_ticks(lo, hi, lin)
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_xlabel("recursion (first order)")
        ax.set_ylabel(ylabel)
        ax.set_title(
            f"{act}: " + title.format(M=p.multi.n_inputs if p.multi else "", n=c.quantity.nunique()), fontsize=8
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return _finish(fig, suptitle)
