"""`ntk_feynman`: data.inputs → train.<variant> (theory variants and one Monte-Carlo node per sampler, all
independent; each returns its own final-layer values and its statistics table) → evaluate (the comparison of
theory and sampled nets, its metrics, plots and histories); the method's contract, built by core."""

from pipelines.core.api import Data, Fn, Method, Train
from pipelines.ntk_feynman import ddntk2, ntk2
from pipelines.ntk_feynman.data import make_inputs
from pipelines.ntk_feynman.evaluate import comparison_metrics, plots, report_extra
from pipelines.ntk_feynman.params import DDNTK_TENSORS, DNTK_TENSORS, TENSORS, THEORY_VARIANTS, Params
from pipelines.ntk_feynman.train import train_variant

# the input-indexed kinds (evaluate.ntk2_metrics): tensor names, and whether the max |z| is also given per layer
_INDEXED = {
    "ntk2": (ntk2.TENSOR_NAMES, False),
    "dntk2": (("P", "Q"), False),
    "ddntk2": (ddntk2.TENSORS, True),
    "multi": (ntk2.TENSOR_NAMES, True),
    "multi_dntk": (("P", "Q"), True),
    "multi_ddntk": (ddntk2.TENSORS, True),
}


def metric_names(p: Params, planned) -> list[str]:
    """Every metric evaluate.comparison_metrics can produce for the planned variants (the claims and gates are
    checked against these before any node runs): ``<name>.<act>`` needs ``mc_<act>``, ``dntk_<name>.<act>``
    ``mc_dntk_<act>`` (and so on per sampler), the inter-layer ratios also ``no_interlayer``."""
    planned = set(planned)
    abl = "no_interlayer" in planned
    L = p.net.depth
    out: list[str] = []
    mc_acts = [a for a in p.activations if f"mc_{a}" in planned]
    wide = max(p.mc.widths)
    pair = p.data.pair_cosine is not None or p.data.inputs_path is not None
    for act in mc_acts:
        names = [
            "agreement_excess",
            "max_abs_rel_err_large_width",
            "err_ratio_wide_vs_narrow",
            "err_slope_vs_width",
            *(f"cov_slope.{t}" for t in TENSORS),
            "cov_slope_dev",
            "infinite_width_min_z",
            "mean_ntk_max_abs_z",
            *(f"{q}_recursion" for q in ("Theta1", "K1")),
            *(f"{q}_z_n{wide}" for q in ("Theta1", "K1")),
        ]
        names += ["interlayer_error_ratio"] * abl + ["pair_agreement_excess", f"pair_mean_abs_rel_err_n{wide}"] * pair
        out += [f"{n}.{act}" for n in names]
        out += [f"mean_ntk_shift_n{w}.{act}{se}" for w in p.mc.widths for se in ("", ".se")]
        pres = [""] + [f"x{a}." for a in range(1, p.data.n_inputs)]
        out += [f"variants.mc_{act}.{pre}mean_ntk_shift_n{w}" for pre in pres for w in p.mc.widths]
        for v in THEORY_VARIANTS:
            if v in planned:
                out += [f"variants.{v}.{act}.mean_abs_rel_err{n}" for n in ("", *(f"_n{w}" for w in p.mc.widths))]
    if p.dntk is not None:
        for act in (a for a in p.activations if f"mc_dntk_{a}" in planned):
            names = [
                "dntk_max_abs_mc",
                "dntk_agreement_excess",
                "dntk_err_ratio_wide_vs_narrow",
                "dntk_err_slope_vs_width",
                "dntk_extrap_excess",
                "dntk_cov_slope_dev",
                "dntk_layer2_max_abs_z",
                "dntk_infinite_width_min_z",
                *(f"dntk_mean_abs_rel_err_n{w}" for w in p.dntk.widths),
                *(f"dntk_cov_slope.{q}" for q in DNTK_TENSORS),
                *(f"dntk_{q}_recursion" for q in DNTK_TENSORS),
                *(f"dntk_{q}_extrapolated" for q in DNTK_TENSORS),
            ] + ["dntk_interlayer_error_ratio"] * abl
            out += [f"{n}.{act}" for n in names] + [f"dntk_{q}_extrapolated.{act}.se" for q in DNTK_TENSORS]
    if p.ddntk is not None:
        ws = p.ddntk.widths
        for act in (a for a in p.activations if f"mc_ddntk_{a}" in planned):
            names = [
                "ddntk_layer2_max_abs_z",
                f"ddntk_layer2_max_abs_rel_err_n{max(ws)}",
                "ddntk_infinite_width_min_z",
                *(f"ddntk_mean_slope.{q}" for q in DDNTK_TENSORS),
                "ddntk_mean_slope_dev",
                *(f"ddntk_{q}_L{L}_n{w}" for q in DDNTK_TENSORS for w in ws),
            ]
            se = [f"ddntk_{q}_L{L}_n{w}.{act}.se" for q in DDNTK_TENSORS for w in ws]
            if L >= 3:
                names += [
                    *(f"ddntk_{q}_{k}" for q in DDNTK_TENSORS for k in ("extrapolated", "recursion")),
                    "ddntk_extrap_excess",
                    "ddntk_extrap_max_abs_z",
                    "ddntk_agreement_excess",
                    *(f"ddntk_mean_abs_rel_err_n{w}" for w in ws),
                    "ddntk_err_ratio_wide_vs_narrow",
                ]
                names += ["ddntk_interlayer_error_ratio"] * abl
                se += [f"ddntk_{q}_extrapolated.{act}.se" for q in DDNTK_TENSORS]
            out += [f"{n}.{act}" for n in names] + se
    for kind, (tensors, per_layer) in _INDEXED.items():
        block = getattr(p, kind)
        if block is None:
            continue
        for act in (a for a in p.activations if f"mc_{kind}_{a}" in planned):
            names = [f"{kind}_layer2_max_abs_z"]
            if L >= 3:
                names += [
                    f"{kind}_extrap_max_abs_z",
                    f"{kind}_extrap_excess",
                    f"{kind}_mean_abs_rel_err_n{max(block.widths)}",
                ]
                names += [f"{kind}_interlayer_error_ratio"] * abl
                names += [f"{kind}_extrap_excess.{t}.L{ell}" for ell in range(3, L + 1) for t in tensors]
                names += [f"{kind}_extrap_max_abs_z.L{ell}" for ell in range(3, L + 1)] * per_layer
            out += [f"{n}.{act}" for n in names]
    return out


SPEC = Method(
    name="ntk_feynman",
    params=Params,
    data=[Data(make_inputs, "params", "inputs_json", name="inputs")],
    train=Train(train_variant, ["inputs_json"], artifacts="json"),
    derived=[Fn(comparison_metrics, metric_names, needs_=["recursion"], inputs=["artifacts", "inputs"])],
    plots=plots,
    extra=report_extra,
    report_inputs={"inputs": "inputs_json"},
)
