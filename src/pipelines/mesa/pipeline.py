"""`mesa`: corpus → train.base (the tiny MoE, once per run) → routing profile → OT plan (per seed) →
train.<variant> (each aligns the base model, every seed) → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.mesa.data import make_data
    from pipelines.mesa.evaluate import make_plots, report
    from pipelines.mesa.train import ot_plan, routing_profile, train_base, train_variant

    P = "params:mesa"
    variants = [v for v in (method_config("mesa").get("variants") or []) if v != "base"]
    preds = {"pred_base": "predictions_base", **{f"pred_{v}": f"predictions_{v}" for v in variants}}
    logs = {"log_base": "base_fitlog_json", **{f"log_{v}": f"{v}_fitlog_json" for v in variants}}
    shared = {"profile": "routing_profile", "plan": "ot_plan"}
    return pipeline(
        [
            node(make_data, P, ["moe_pretrain", "align_safety", "eval_sets"], name="data.corpus", tags=["data"]),
            node(train_base, ["moe_pretrain", "align_safety", "eval_sets", P],
                 ["predictions_base", "moe_base_model", "base_fitlog_json"], name="train.base", tags=["train", "gpu"]),
            node(routing_profile, ["moe_base_model", "align_safety", P], "routing_profile",
                 name="data.routing_profile", tags=["data"]),
            node(ot_plan, ["moe_base_model", "align_safety", "routing_profile", P], ["ot_plan", "duty_clusters_json"],
                 name="data.ot_plan", tags=["data"]),
            *[variant_node(train_variant, v, ["moe_base_model", "align_safety", "eval_sets", "routing_profile",
                                              "ot_plan", "duty_clusters_json", P],
                           [f"predictions_{v}", f"{v}_fitlog_json", f"moe_{v}_model"]) for v in variants],
            node(make_plots, {"p": P, **shared, **preds, **logs}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", **shared, **preds, **logs}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="mesa",
        parameters={P: P},
    )
