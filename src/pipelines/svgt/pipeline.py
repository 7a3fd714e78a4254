"""`svgt`: data.corpus → train.backbone (the unaligned LM, once) → train.value (value stages 1-2, per seed)
→ train.<variant> (SVGT's stage 3, its ablations and the baselines; each evaluates itself)
→ evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node

NEEDS_VALUE = ("svgt", "svgt_dz0")


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.svgt.data import make_corpus
    from pipelines.svgt.evaluate import make_plots, report
    from pipelines.svgt.train import train_backbone, train_value, train_variant

    P = "params:svgt"
    variants = method_config("svgt").get("variants") or []   # this run's env + --params
    preds = {v: f"predictions_{v}" for v in variants}
    logs = {f"{v}__fitlog": f"{v}_fitlog_json" for v in variants}
    base = ["corpus", "backbone_model", P]
    return pipeline(
        [
            node(make_corpus, P, "corpus", name="data.corpus", tags=["data"]),
            node(train_backbone, ["corpus", P], ["backbone_model", "backbone_fitlog_json"], name="train.backbone",
                 tags=["train", "gpu"]),
            node(train_value, base, ["value_model", "value_fitlog_json"], name="train.value", tags=["train", "gpu"]),
            *[variant_node(train_variant, v, base + (["value_model"] if v in NEEDS_VALUE else []),
                           [preds[v], f"{v}_fitlog_json"]) for v in variants],
            node(make_plots, {"p": P, "value_fitlog": "value_fitlog_json", **preds, **logs}, "plots",
                 name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", "backbone_fitlog": "backbone_fitlog_json",
                          "value_fitlog": "value_fitlog_json", **preds, **logs}, "report",
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="svgt",
        parameters={P: P},
    )
