"""`hypospace`: data.<domain> (observation sets + exactly enumerated admissible sets) → train.<sampler>
(proposals, validated and scored per set) → evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Diff, Fn, Method, Train
from pipelines.hypospace.data import domain_data
from pipelines.hypospace.evaluate import (
    collapse,
    collapse_names,
    harness_uniform_prior,
    harness_uniform_valid,
    make_plots,
    report_extra,
)
from pipelines.hypospace.params import DOMAINS, LLM_VARIANTS, Params
from pipelines.hypospace.train import train_variant

TABLES = [f"{d}_{t}" for d in DOMAINS for t in ("obs", "admissible")]  # train_variant's argument order


def free_text_samplers(values, p: Params) -> dict[str, float]:
    """How many planned samplers answer in free text checked by the validator (the LLM samplers): the
    offline ones draw from A, so their V = 1 by construction and a validity claim on them tests nothing."""
    return {"harness.free_text_samplers": float(sum(v in LLM_VARIANTS for v in p.variants))}


def derived(p: Params) -> list:
    """The harness checks and the collapse signature (Fns over every set), and the mitigation gaps in the
    top |A| bin, per seed and paired (stratified against mode_collapse and against uniform_valid)."""
    out = [
        Fn(
            harness_uniform_valid,
            [f"harness.uniform_valid.{k}" for k in ("max_abs_z_R", "max_exact_z_R", "max_abs_U_identity_error")],
            needs_=["uniform_valid"],
            inputs=["artifacts"],
        ),
        Fn(
            harness_uniform_prior,
            [f"harness.uniform_prior.{k}" for k in ("max_abs_z_V", "max_exact_z_V")],
            needs_=["uniform_prior"],
            inputs=["artifacts"],
        ),
        Fn(collapse, collapse_names, inputs=["artifacts"]),
        Fn(free_text_samplers, ["harness.free_text_samplers"]),
    ]
    for d in p.domains.enabled:
        out += [
            Diff(
                f"R_top_{d}", "stratified", "mode_collapse", name=f"mitigation.{d}.R_top.stratified_minus_mode_collapse"
            ),
            Diff(
                f"R_top_{d}", "uniform_valid", "stratified", name=f"mitigation.{d}.R_top.uniform_valid_minus_stratified"
            ),
        ]
    return out


SPEC = Method(
    name="hypospace",
    params=Params,
    data=[Data(domain_data(d), "params", [f"{d}_obs", f"{d}_admissible"], name=d) for d in DOMAINS],
    train=Train(train_variant, TABLES, artifacts="json"),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
)
