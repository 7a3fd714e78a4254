"""One ``train.<variant>`` node per variant (nothing is trained: each computes its statistics; its results table
holds the variant's own final-layer values, its JSON artifact the statistics table the comparison reads).

- ``recursion`` (the method): the first-order layer recursions of V, A, B, D, F (theory.first_order);
- ``no_interlayer`` (ablation): the same with only the intra-layer term of each recursion;
- ``infinite_width`` (baseline): zero 1/n correction (the infinite-width kernel and NTK, no fluctuations);
- ``mc_<activation>``: sampled finite-width nets at every width, one stream of nets per seed, kept as block
  means of the per-net pair averages (mc.block_table);
- ``mc_dntk_<activation>``: sampled nets for the dNTK statistics P, Q (dntk.sample_dntk), block means of the two
  per-net contractions S1 / n^2 and S2 / n^2;
- ``mc_ntk2_<activation>``: sampled nets seeing the input pair, block means of the two-input NTK statistics
  (ntk2.sample_two_input); the theory variants carry the two-input tensors' recursion (ntk2.two_input_ntk_tensors);
- ``mc_dntk2_<activation>``: sampled nets seeing the input pair, block means of the two-input dNTK contractions
  (ntk2.sample_two_input_dntk); the theory variants carry the two-input P, Q recursion (ntk2.two_input_dntk);
- ``mc_ddntk2_<activation>``: sampled nets seeing the input pair, block means of the two-input ddNTK Hessian forms
  C1..C4 / n^2 per input tuple (ddntk2.sample_two_input_ddntk); the theory variants carry the two-input R, S, T, U
  recursion (ddntk2.two_input_ddntk) as columns ``dd2.<R|S|T|U>_<a1a2a3a4>``;
- ``mc_multi_<activation>``: sampled nets seeing the ``multi`` block's M inputs, block means of the M-input NTK
  statistics (multi.sample_multi); the theory variants carry their recursion (multi.multi_input_ntk_tensors);
- ``mc_multi_dntk_<activation>`` / ``mc_multi_ddntk_<activation>``: sampled nets seeing the ``multi`` block's M
  inputs, block means of the M-input dNTK contractions (multi.sample_multi_dntk) / ddNTK Hessian forms
  (ddntk2.sample_ddntk_probes); the theory variants carry the M-input P, Q (multi.multi_input_dntk, columns
  ``md.<P|Q>_<a0a1a2a3>``) / R, S, T, U (multi_ddntk.multi_input_ddntk, columns ``mdd.<R|S|T|U>_<a1a2a3a4>``) only
  when such a variant is planned (their cost);
- ``mc_ddntk_<activation>``: sampled nets for the ddNTK means R, S, T, U (ddntk.sample_ddntk), block means of the
  four per-net probe contractions C1..C4 / n^2.
The theory variants also carry the dNTK's P, Q (dntk.dntk_first_order) and the ddNTK's R, S, T, U
(ddntk.ddntk_first_order); all zero for infinite_width.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from pipelines.core.api import node_setup
from pipelines.ntk_feynman import ddntk, ddntk2, dntk, mc, multi, multi_ddntk, ntk2, theory
from pipelines.ntk_feynman.params import DDNTK_TENSORS, DNTK_TENSORS, TENSORS, Params

log = logging.getLogger(__name__)

# the two-input ddNTK's block-table columns (C1..C4 per input tuple, / n^2) and comparison quantities
DDNTK2_COLUMNS = tuple(f"c{k + 1}_{''.join(str(i + 1) for i in idx)}" for k in range(4) for idx in ddntk2.IDX4)


def ddntk2_quantity_names() -> list[str]:
    """The comparison's quantity names of the two-input ddNTK: ``dd2.<R|S|T|U>_<a1a2a3a4>`` (inputs 1, 2)."""
    return [f"dd2.{t}_{''.join(str(i + 1) for i in idx)}" for t in ddntk2.TENSORS for idx in ddntk2.IDX4]


def ddntk2_flat_row(r: dict) -> dict[str, float]:
    """R, S, T, U (2x2x2x2 each, in ``r``) as ``{"dd2.<T>_<a1a2a3a4>": value}``."""
    return dict(zip(ddntk2_quantity_names(), [float(r[t][i]) for t in ddntk2.TENSORS for i in ddntk2.IDX4]))


def ddntk2_block_row(stats: np.ndarray) -> np.ndarray:
    """(depth, len(DDNTK2_COLUMNS)) block means of :func:`ddntk2.sample_two_input_ddntk` forms."""
    return stats.mean(0).reshape(stats.shape[1], -1)


def ddntk2_pooled_blocks(blocks, n: int) -> dict[str, float]:
    """Pooled R, S, T, U (nets weighted equally) and batch-mean standard errors (one batch per block row) from
    block means (columns DDNTK2_COLUMNS, ``n_nets``) of one width n and layer, flattened as ddntk2_flat_row."""
    w = blocks["n_nets"].to_numpy(float)
    M = blocks[list(DDNTK2_COLUMNS)].to_numpy(float).reshape(-1, 4, 2, 2, 2, 2)
    est = ddntk2_flat_row(ddntk2.rstu_from_sums(np.average(M, axis=0, weights=w), n))
    per = [ddntk2_flat_row(ddntk2.rstu_from_sums(m, n)) for m in M]
    out = dict(est)
    for k in est:
        out[f"{k}_se"] = float(np.std([q[k] for q in per], ddof=1) / np.sqrt(len(M)))
    return out


# ---- the dNTK (P, Q) and ddNTK (R, S, T, U) of the multi block's M inputs: block columns, quantities, pooling
def _idx(idx) -> str:
    return "".join(str(i + 1) for i in idx)


# tag of the comparison's quantities, tensor names, the block columns' letter and number of forms per tuple
_MULTI_D = {"multi_dntk": ("md", ("P", "Q"), "s", 3), "multi_ddntk": ("mdd", ddntk2.TENSORS, "c", 4)}


def multi_d_columns(kind: str, M: int) -> tuple[str, ...]:
    """Block-mean columns of the ``kind`` ("multi_dntk" | "multi_ddntk") sampler for M inputs: ``s<k>_<a0..a3>``
    (the three dNTK contractions / n^2) or ``c<k>_<a1..a4>`` (the four ddNTK Hessian forms C1..C4 / n^2)."""
    _, _, letter, forms = _MULTI_D[kind]
    return tuple(f"{letter}{k}_{_idx(i)}" for k in range(forms) for i in np.ndindex((M,) * 4))


def multi_d_quantity_names(kind: str, M: int) -> list[str]:
    """The comparison's quantities: ``md.<P|Q>_<a0a1a2a3>`` or ``mdd.<R|S|T|U>_<a1a2a3a4>`` (inputs 1..M)."""
    tag, names, _, _ = _MULTI_D[kind]
    return [f"{tag}.{t}_{_idx(i)}" for t in names for i in np.ndindex((M,) * 4)]


def multi_d_flat_row(kind: str, r: dict, M: int) -> dict[str, float]:
    """The M^4 tensors in ``r`` (P, Q or R, S, T, U) flattened as :func:`multi_d_quantity_names`."""
    names = _MULTI_D[kind][1]
    return dict(zip(multi_d_quantity_names(kind, M), np.concatenate([np.asarray(r[t], float).ravel() for t in names])))


def _multi_d_solve(kind: str, m: np.ndarray, n: int) -> dict:
    return dict(zip("PQ", multi.pq_from_sums(m, n))) if kind == "multi_dntk" else ddntk2.rstu_from_sums(m, n)


def multi_d_pooled_blocks(kind: str, blocks, n: int, M: int) -> dict[str, float]:
    """Pooled P, Q (``multi.pq_from_sums``) or R, S, T, U (``ddntk2.rstu_from_sums``), nets weighted equally, and
    batch-mean standard errors (one batch per block row) from block means (columns :func:`multi_d_columns`,
    ``n_nets``) of one width n and layer, flattened as :func:`multi_d_flat_row`."""
    forms = _MULTI_D[kind][3]
    w = blocks["n_nets"].to_numpy(float)
    X = blocks[list(multi_d_columns(kind, M))].to_numpy(float).reshape((-1, forms) + (M,) * 4)
    est = multi_d_flat_row(kind, _multi_d_solve(kind, np.average(X, axis=0, weights=w), n), M)
    per = np.array([list(multi_d_flat_row(kind, _multi_d_solve(kind, m, n), M).values()) for m in X])
    se = np.std(per, axis=0, ddof=1) / np.sqrt(len(X))
    return {**est, **{f"{k}_se": float(v) for k, v in zip(est, se)}}


def _multi_d_theory(kind: str, p: Params, Xm: np.ndarray, variant: str, quad) -> dict:
    """{(activation, layer): flat row} of the M-input dNTK / ddNTK recursion for the activations of the planned
    ``mc_<kind>_<activation>`` variants (zeros for infinite_width)."""
    M, out = len(Xm), {}
    acts = p.block_activations(kind)
    fn = multi.multi_input_dntk if kind == "multi_dntk" else multi_ddntk.multi_input_ddntk
    for name in acts:
        spec = p.activations[name]
        if variant == "infinite_width":
            for ell in range(1, p.net.depth + 1):
                out[(name, ell)] = dict.fromkeys(multi_d_quantity_names(kind, M), 0.0)
            continue
        for r in fn(
            name,
            spec.c_w,
            spec.c_b,
            p.net.lambda_b,
            p.net.lambda_w,
            Xm,
            p.net.depth,
            interlayer=(variant != "no_interlayer"),
            quad=quad,
        ):
            out[(name, r["layer"])] = multi_d_flat_row(kind, r, M)
    return out


def _add_input0_columns(df: pd.DataFrame, extra: dict, cols: list[str]) -> pd.DataFrame:
    """``cols`` from ``extra`` {(activation, layer): {col: value}} on the rows of input 0 (NaN elsewhere)."""
    block = np.full((len(df), len(cols)), np.nan)
    for i, (a, act, ell) in enumerate(zip(df.input, df.activation, df.layer)):
        if a == 0 and (act, int(ell)) in extra:
            block[i] = [extra[(act, int(ell))][c] for c in cols]
    return pd.concat([df, pd.DataFrame(block, index=df.index, columns=cols)], axis=1)


def _set_input0_row(df: pd.DataFrame, activation: str, layer: int, vals: dict[str, float]) -> pd.DataFrame:
    """``df`` with ``vals`` {column: value} on the row of input 0, ``activation`` and ``layer``; columns it lacks
    are added first (NaN elsewhere)."""
    sel = (df.input == 0) & (df.activation == activation) & (df.layer == layer)
    missing = [k for k in vals if k not in df.columns]
    if missing:
        df = pd.concat([df, pd.DataFrame(np.nan, index=df.index, columns=missing)], axis=1)
    df.loc[sel, list(vals)] = np.array(list(vals.values()))[None, :]
    return df


def theory_table(inputs: dict, p: Params, variant: str) -> pd.DataFrame:
    quad = theory.Quad(p.quadrature.nodes_per_half, p.quadrature.half_width_sd)
    rows = []
    for a, sq in enumerate(inputs["sq_norm"]):
        for name, spec in p.activations.items():
            layers = theory.first_order(
                name,
                spec.c_w,
                spec.c_b,
                p.net.lambda_b,
                p.net.lambda_w,
                sq,
                p.net.depth,
                interlayer=(variant != "no_interlayer"),
                quad=quad,
            )
            d_layers = dntk.dntk_first_order(
                name,
                spec.c_w,
                spec.c_b,
                p.net.lambda_b,
                p.net.lambda_w,
                sq,
                p.net.depth,
                interlayer=(variant != "no_interlayer"),
                quad=quad,
            )
            dd_layers = ddntk.ddntk_first_order(
                name,
                spec.c_w,
                spec.c_b,
                p.net.lambda_b,
                p.net.lambda_w,
                sq,
                p.net.depth,
                interlayer=(variant != "no_interlayer"),
                quad=quad,
            )
            for r, rd, rdd in zip(layers, d_layers, dd_layers):
                r = {**r, **{t: rd[t] for t in DNTK_TENSORS}, **{t: rdd[t] for t in DDNTK_TENSORS}}
                if variant == "infinite_width":
                    r = {**r, **dict.fromkeys((*TENSORS, *DNTK_TENSORS, *DDNTK_TENSORS, "K1", "Theta1"), 0.0)}
                rows.append({"input": a, "activation": name, **r})
    df = pd.DataFrame(rows)
    if inputs.get("pair") is not None:
        # the two-input kernel and four-point vertex, on the rows of input 0 (the pair's first input)
        X = np.asarray(inputs["pair"])
        for name, spec in p.activations.items():
            layers = theory.two_input_vertex(
                name, spec.c_w, spec.c_b, X, p.net.depth, interlayer=(variant != "no_interlayer"), quad=quad
            )
            for r in layers:
                if variant == "infinite_width":
                    r = {**r, **dict.fromkeys(theory.VERTEX_KEYS, 0.0)}
                sel = (df.input == 0) & (df.activation == name) & (df.layer == r["layer"])
                for k, v in r.items():
                    if k != "layer":
                        df.loc[sel, k] = float(v)
            # the two-input NTK tensors V, D, A, B, F with input indices (ntk2.py), columns "2i.<T>_<ab>_<cd>"
            layers2 = ntk2.two_input_ntk_tensors(
                name,
                spec.c_w,
                spec.c_b,
                p.net.lambda_b,
                p.net.lambda_w,
                X,
                p.net.depth,
                interlayer=(variant != "no_interlayer"),
                quad=quad,
            )
            for r in layers2:
                vals = ntk2.flat_row(r)
                if variant == "infinite_width":
                    vals = dict.fromkeys(vals, 0.0)
                df = _set_input0_row(df, name, r["layer"], vals)
            if p.dntk2 is not None:
                # the two-input dNTK P, Q with input indices (ntk2.two_input_dntk), columns "2d.<P|Q>_<a0a1a2a3>"
                dl = ntk2.two_input_dntk(
                    name,
                    spec.c_w,
                    spec.c_b,
                    p.net.lambda_b,
                    p.net.lambda_w,
                    X,
                    p.net.depth,
                    interlayer=(variant != "no_interlayer"),
                    quad=quad,
                )
                for r in dl:
                    vals = ntk2.dntk2_flat_row(r["P"], r["Q"])
                    if variant == "infinite_width":
                        vals = dict.fromkeys(vals, 0.0)
                    df = _set_input0_row(df, name, r["layer"], vals)
            if p.ddntk2 is not None:
                # the two-input ddNTK R, S, T, U (ddntk2.two_input_ddntk), columns "dd2.<R|S|T|U>_<a1a2a3a4>"
                if variant == "infinite_width":
                    ddl = [
                        {"layer": ell, **{t: np.zeros((2, 2, 2, 2)) for t in ddntk2.TENSORS}}
                        for ell in range(1, p.net.depth + 1)
                    ]
                else:
                    ddl = ddntk2.two_input_ddntk(
                        name,
                        spec.c_w,
                        spec.c_b,
                        p.net.lambda_b,
                        p.net.lambda_w,
                        X,
                        p.net.depth,
                        interlayer=(variant != "no_interlayer"),
                        quad=quad,
                    )
                for r in ddl:
                    df = _set_input0_row(df, name, r["layer"], ddntk2_flat_row(r))
    if p.multi is not None and inputs.get("multi") is not None:
        # the NTK tensors of M inputs (multi.py), columns "mi.<T>_<ab>_<cd>" on the rows of input 0
        Xm = np.asarray(inputs["multi"], dtype=float)
        M = len(Xm)
        extra = {}
        for name, spec in p.activations.items():
            if variant == "infinite_width":
                names = multi.quantity_names(M)
                for ell in range(1, p.net.depth + 1):
                    extra[(name, ell)] = dict.fromkeys(names, 0.0)
                continue
            layers_m = multi.multi_input_ntk_tensors(
                name,
                spec.c_w,
                spec.c_b,
                p.net.lambda_b,
                p.net.lambda_w,
                Xm,
                p.net.depth,
                interlayer=(variant != "no_interlayer"),
                quad=quad,
            )
            for r in layers_m:
                extra[(name, r["layer"])] = multi.flat_row(r, M)
        df = _add_input0_columns(df, extra, multi.quantity_names(M))
        # the M-input dNTK / ddNTK, only for the activations of planned mc_multi_dntk_ / mc_multi_ddntk_ variants
        for kind in ("multi_dntk", "multi_ddntk"):
            if p.block_activations(kind):
                df = _add_input0_columns(
                    df, _multi_d_theory(kind, p, Xm, variant, quad), multi_d_quantity_names(kind, M)
                )
    bad = ~np.isfinite(df[["K", "Theta", *TENSORS, *DNTK_TENSORS, *DDNTK_TENSORS, "K1", "Theta1"]].to_numpy()).all(1)
    if bad.any():
        r = df[bad].iloc[0]
        raise FloatingPointError(
            f"ntk_feynman.train.{variant}: non-finite recursion for {r.activation} at layer "
            f"{int(r.layer)} (off-critical C_W, C_b?)"
        )
    return df


def mc_table(inputs: dict, p: Params, activation: str) -> pd.DataFrame:
    spec = p.activations[activation]
    frames = []
    for seed in p.seeds:
        device = node_setup(p, int(seed))  # cuda when a GPU node runs this task, else cpu
        for _wi, width in enumerate(p.mc.widths):
            for a, x in enumerate(inputs["x"]):
                # one stream per (seed, width, input); the activations share it (common random numbers)
                stream = int(np.random.SeedSequence([int(seed), width, a]).generate_state(1)[0])
                x2 = inputs["pair"][1] if (a == 0 and inputs.get("pair") is not None) else None
                stats = mc.sample_nets(
                    activation,
                    np.asarray(x),
                    width,
                    p.net.depth,
                    p.nets(width),
                    spec.c_w,
                    spec.c_b,
                    p.net.lambda_b,
                    p.net.lambda_w,
                    stream,
                    p.mc.chunk_elems,
                    x2=x2,
                    device=device,
                )
                frames.append(mc.block_table(stats, p.mc.blocks_per_seed, input=a, seed=int(seed), width=width))
            log.info("ntk_feynman.mc_%s: seed %s width %d done", activation, seed, width)
    return pd.concat(frames, ignore_index=True)


def _block_rows(
    stats: np.ndarray, blocks: int, columns, seed: int, width: int, depth: int, reduce=lambda block: block.mean(0)
) -> list[dict]:
    """Rows of a sampler's per-net statistics [nets, depth, columns] cut into ``blocks`` contiguous blocks (the
    batch means behind the s.e.): one row per block and layer, input 0."""
    edges = np.linspace(0, len(stats), blocks + 1).round().astype(int)
    rows = []
    for blk, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        means = reduce(stats[a:b])
        for ell in range(depth):
            rows.append(
                {
                    "input": 0,
                    "seed": int(seed),
                    "width": width,
                    "block": blk,
                    "layer": ell + 1,
                    "n_nets": int(b - a),
                    **dict(zip(columns, means[ell])),
                }
            )
    return rows


def _pair(inputs: dict, variant: str) -> np.ndarray:
    if inputs.get("pair") is None:
        raise ValueError(
            f"ntk_feynman.train.{variant}: needs an input pair (data.pair_cosine is null, or "
            "data.inputs_path has one row)"
        )
    return np.asarray(inputs["pair"], dtype=float)


def _multi_inputs(inputs: dict, variant: str) -> np.ndarray:
    if inputs.get("multi") is None:
        raise ValueError(f"ntk_feynman.train.{variant}: needs the 'multi' block's inputs")
    return np.asarray(inputs["multi"], dtype=float)


def _per_width_chunk(d, width: int) -> int:
    return max(1, d.chunk_elems // (width * width))


# The per-width samplers of the mc_<kind>_<activation> variants: the params block (its widths, nets, blocks,
# chunk), the inputs the nets see, the stream tag (each sampler its own seeded stream per seed and width), the
# call, the block table's columns and the per-block reduction of the per-net statistics.
_SAMPLERS = {
    "dntk": dict(
        inputs=lambda inp, v: np.asarray(inp["x"][0]),
        tag=7,
        columns=lambda X: dntk.DNTK_COLUMNS,
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: dntk.sample_dntk(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, d.chunk_elems, device=dev, probes=d.probes
        ),
    ),
    "ddntk": dict(
        inputs=lambda inp, v: np.asarray(inp["x"][0]),
        tag=11,
        columns=lambda X: ddntk.DDNTK_COLUMNS,
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: ddntk.sample_ddntk(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, d.chunk_elems, device=dev
        ),
    ),
    "ntk2": dict(
        inputs=_pair,
        tag=13,
        columns=lambda X: ntk2.COLUMNS,
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: ntk2.sample_two_input(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, d.chunk_elems
        ),
    ),
    "dntk2": dict(
        inputs=_pair,
        tag=17,
        columns=lambda X: ntk2.DNTK2_COLUMNS,
        reduce=ntk2.dntk2_block_row,
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: ntk2.sample_two_input_dntk(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, chunk=_per_width_chunk(d, w)
        ),
    ),
    "multi": dict(
        inputs=_multi_inputs,
        tag=19,
        columns=lambda X: multi.columns(len(X)),
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: multi.sample_multi(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, d.chunk_elems
        ),
    ),
    "multi_dntk": dict(
        inputs=_multi_inputs,
        tag=29,
        columns=lambda X: multi_d_columns("multi_dntk", len(X)),
        reduce=lambda block: block.mean(0).reshape(block.shape[1], -1),
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: multi.sample_multi_dntk(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, chunk=_per_width_chunk(d, w)
        ),
    ),
    "multi_ddntk": dict(
        inputs=_multi_inputs,
        tag=31,
        columns=lambda X: multi_d_columns("multi_ddntk", len(X)),
        reduce=lambda block: block.mean(0).reshape(block.shape[1], -1),
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: ddntk2.sample_ddntk_probes(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, chunk=_per_width_chunk(d, w)
        ),
    ),
    "ddntk2": dict(
        inputs=_pair,
        tag=23,
        columns=lambda X: DDNTK2_COLUMNS,
        reduce=ddntk2_block_row,
        sample=lambda act, X, w, n, s, lb, lw, st, d, dev: ddntk2.sample_two_input_ddntk(
            act, X, w, *n, s.c_w, s.c_b, lb, lw, st, chunk=_per_width_chunk(d, w)
        ),
    ),
}


def sampler_table(inputs: dict, p: Params, kind: str, activation: str) -> pd.DataFrame:
    """Block means of one ``mc_<kind>_<activation>`` sampler's per-net statistics per seed, width and layer
    (rows of input 0); the ``kind`` params block gives widths, nets per seed, blocks and chunking."""
    cfg, variant = _SAMPLERS[kind], f"mc_{kind}_{activation}"
    X = cfg["inputs"](inputs, variant)
    spec, d = p.activations[activation], getattr(p, kind)
    frames = []
    for seed in p.seeds:
        device = node_setup(p, int(seed))
        for width in d.widths:
            stream = int(np.random.SeedSequence([int(seed), width, 0, cfg["tag"]]).generate_state(1)[0])
            stats = cfg["sample"](
                activation,
                X,
                width,
                (p.net.depth, p.block_nets(kind, width)),
                spec,
                p.net.lambda_b,
                p.net.lambda_w,
                stream,
                d,
                device,
            )
            frames += _block_rows(
                stats,
                d.blocks_per_seed,
                cfg["columns"](X),
                seed,
                width,
                p.net.depth,
                reduce=cfg.get("reduce", lambda block: block.mean(0)),
            )
            log.info("ntk_feynman.%s: seed %s width %d done", variant, seed, width)
    return pd.DataFrame(frames)


def variant_kind(variant: str) -> str | None:
    """The sampler kind of ``mc_<kind>_<activation>`` (the longest matching: mc_multi_dntk_relu is multi_dntk's,
    not multi's), "mc" for ``mc_<activation>``, None for a theory variant."""
    kind = max((k for k in _SAMPLERS if variant.startswith(f"mc_{k}_")), key=len, default=None)
    return kind if kind is not None else ("mc" if variant.startswith("mc_") else None)


def variant_stats(inputs: dict, p: Params, variant: str) -> pd.DataFrame:
    """The variant's statistics table (with ``runtime_s`` as a column): the theory table of a theory variant,
    the block means of a sampler."""
    node_setup(p)
    t0 = time.perf_counter()
    kind = variant_kind(variant)
    if kind == "mc":
        df = mc_table(inputs, p, variant[3:])
    elif kind is not None:
        df = sampler_table(inputs, p, kind, variant[len(kind) + 4 :])
    else:
        df = theory_table(inputs, p, variant)
    df["runtime_s"] = time.perf_counter() - t0
    return df


def n_prev(layer: int, width: int, n0: int) -> int:
    """The width that multiplies a layer's covariances: the previous layer's (n0 for layer 1)."""
    return n0 if layer == 1 else width


def pooled_rows(blocks: pd.DataFrame, n0: int, by: tuple[str, ...] = ("input", "width", "layer")) -> pd.DataFrame:
    rows = []
    for key, d in blocks.groupby(list(by), sort=True):
        key = dict(zip(by, key))
        rows.append({**key, **mc.pooled_blocks(d, n_prev(int(key["layer"]), int(key["width"]), n0))})
    return pd.DataFrame(rows)


THEORY_ROW = ("K", "Theta", *TENSORS, *DNTK_TENSORS, *DDNTK_TENSORS, "K1", "Theta1")


def results_table(p: Params, variant: str, df: pd.DataFrame, n0: int) -> pd.DataFrame:
    """The variant's own metrics (what needs no other variant), the long table: per seed for a sampler (its
    final-layer estimates per width, pooled over that seed's blocks; ``runtime_s``), one row (the first seed)
    for a theory variant (its final-layer values per activation). The comparisons with other variants are
    derived metrics (evaluate.comparison_metrics)."""
    from pipelines.core.api import Results

    res, L = Results(variant), p.net.depth
    runtime = float(df.runtime_s.iloc[0])
    kind = variant_kind(variant)
    if kind is None:
        res.add(int(p.seeds[0]), runtime_s=runtime)
        for act in df.activation.unique():
            last = df[(df.activation == act) & (df.layer == L) & (df.input == 0)].iloc[0]
            res.add(int(p.seeds[0]), **{f"{act}.{q}": float(last[q]) for q in THEORY_ROW})
        return res.table()
    for seed in sorted(int(s) for s in df.seed.unique()):
        res.add(seed, runtime_s=runtime)
    final = df[df.layer == L]
    if kind == "mc":
        for seed, d in pooled_rows(final, n0, by=("seed", "input", "width", "layer")).groupby("seed"):
            for r in d.itertuples():
                pre = "" if r.input == 0 else f"x{r.input}."
                res.add(int(seed), **{f"{pre}{t}_n{r.width}": float(getattr(r, t)) for t in TENSORS})
    elif kind in ("dntk", "ddntk"):
        for seed, bs in final.groupby("seed"):
            for width, d in bs.groupby("width"):
                if kind == "dntk":
                    est = dntk.pooled_dntk(d, int(width), n_prev(L, int(width), n0))
                    res.add(int(seed), **{f"{q}_n{width}": est[q] for q in DNTK_TENSORS})
                else:
                    est = ddntk.pooled_ddntk(d, int(width), n_prev(L, int(width), n0))
                    res.add(int(seed), **{f"{q}_L{L}_n{width}": est[q] for q in DDNTK_TENSORS})
    return res.table()


def stats_json(df: pd.DataFrame) -> dict:
    """A statistics table as JSON (column order, values exact: floats round-trip through their repr)."""
    return {"columns": list(df.columns), "data": {c: df[c].tolist() for c in df.columns}}


def stats_frame(obj: dict) -> pd.DataFrame:
    return pd.DataFrame({c: obj["data"][c] for c in obj["columns"]}, columns=obj["columns"])


def train_variant(inputs: dict, p: Params, variant: str):
    """``train.<variant>``: the variant's statistics (variant_stats) as its results table (results_table) and,
    for the comparison (evaluate), the statistics table itself (JSON)."""
    df = variant_stats(inputs, p, variant)
    return results_table(p, variant, df, int(inputs["n0"])), stats_json(df)
