"""`medtpe`: corpus → base BPE → EHR stays → MedTPE merges (per seed) → train.original (the base model,
once per run) and train.<variant> (each adapts it) → evaluate.timing (one node: interleaved measurements)
→ evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.medtpe.data import general_corpus, make_ehr
    from pipelines.medtpe.evaluate import make_plots, report, timing
    from pipelines.medtpe.train import build_tpes, train_bpe_node, train_original, train_variant

    P = "params:medtpe"
    variants = [v for v in (method_config("medtpe").get("variants") or []) if v != "original"]
    preds = {"original": "predictions_original", **{v: f"predictions_{v}" for v in variants}}
    logs = {f"{v}__fitlog": f"{v}_fitlog_json" for v in variants}
    return pipeline(
        [
            node(general_corpus, P, "general_corpus", name="data.general_corpus", tags=["data"]),
            node(train_bpe_node, ["general_corpus", P], "bpe_base_json", name="data.bpe", tags=["data"]),
            node(make_ehr, P, "ehr", name="data.ehr", tags=["data"]),
            node(build_tpes, ["ehr", "bpe_base_json", P], "tpe_merges_json", name="data.tpe", tags=["data"]),
            node(train_original, ["ehr", "bpe_base_json", P], ["predictions_original", "base_lm_model",
                                                               "original_fitlog_json"],
                 name="train.original", tags=["train", "gpu"]),
            *[variant_node(train_variant, v, ["ehr", "bpe_base_json", "tpe_merges_json", "base_lm_model", P],
                           [preds[v], f"{v}_fitlog_json"]) for v in variants],
            node(timing, ["ehr", "bpe_base_json", "tpe_merges_json", "base_lm_model", P], "timing_json",
                 name="evaluate.timing", tags=["evaluate"]),
            node(make_plots, {"p": P, "timing": "timing_json", "tpes": "tpe_merges_json", **preds}, "plots",
                 name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", "timing": "timing_json", "tpes": "tpe_merges_json",
                          "original_fitlog": "original_fitlog_json", **preds, **logs}, "report",
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="medtpe",
        parameters={P: P},
    )
