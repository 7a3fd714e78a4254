"""`mesa`: corpus → train.base (the tiny MoE, once per run) → routing profile → OT plan (per seed) →
train.<variant> (each aligns the base model, every seed) → evaluate; declared here, built by core."""

from pipelines.core.api import Data, Diff, Fn, Method, Ratio, Train
from pipelines.mesa.data import make_data
from pipelines.mesa.evaluate import COMPARE, base_masking_loss, make_plots, ot_mass_names, ot_masses, report_extra
from pipelines.mesa.params import Params
from pipelines.mesa.train import ot_plan, routing_profile, train_base, train_variant

SHARED = ["moe_base_model", "align_safety", "eval_sets", "routing_profile", "ot_plan", "duty_clusters_json"]

SPEC = Method(
    name="mesa",
    params=Params,
    data=[
        Data(make_data, "params", ["moe_pretrain", "align_safety", "eval_sets"], name="corpus"),
        Data(
            train_base,
            ["moe_pretrain", "align_safety", "eval_sets", "params"],
            ["results_base", "moe_base_model", "base_fitlog_json"],
            name="base",
            stage="train",
        ),
        Data(routing_profile, ["moe_base_model", "align_safety", "params"], "routing_profile", name="routing_profile"),
        Data(
            ot_plan,
            ["moe_base_model", "align_safety", "routing_profile", "params"],
            ["ot_plan", "duty_clusters_json"],
            name="ot_plan",
        ),
    ],
    train=Train(train_variant, SHARED, artifacts="tensors"),
    results_from={"base": "results_base"},
    derived=[
        *(Diff(m, a, b, name=f"delta.{m}.{a}_minus_{b}") for m, a, b in COMPARE),
        Fn(base_masking_loss, ["delta.safety_rate_direct.base_minus_base_masked"], needs_=["base"]),
        Ratio("safety_coverage_k80", "mesa", "head_sft", name="ratio.safety_coverage_k80.mesa_over_head_sft"),
        Fn(ot_masses, ot_mass_names, inputs=["plan"]),
    ],
    plots=make_plots,
    extra=report_extra,
    report_inputs={"plan": "ot_plan", "profile": "routing_profile", "base_log": "base_fitlog_json"},
)
