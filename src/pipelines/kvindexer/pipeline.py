"""`kvindexer`: data.prompts → data.base_model (trained once per run, frozen) → train.<variant> (one node per
eviction policy; the learned ones train their indexer / memory inside) → evaluate.timing (decode time
of the full vs the evicted cache, interleaved side by side in one process, hence one node) →
evaluate.plots → evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.kvindexer.data import make_prompts
    from pipelines.kvindexer.evaluate import make_plots, measure_speed, report
    from pipelines.kvindexer.train import train_base, train_variant

    P = "params:kvindexer"
    variants = method_config("kvindexer").get("variants") or []   # this run's env + --params
    res = {f"results_{v}": f"kv_results_{v}" for v in variants}
    trained = {f"trained_{v}": f"kv_trained_{v}_model" for v in variants}
    timing_in = {"p": P, "kv_eval": "kv_eval", "kv_base": "kv_base_model"}
    if "indexer_memory" in variants:
        timing_in["trained_indexer_memory"] = "kv_trained_indexer_memory_model"
    return pipeline(
        [
            node(make_prompts, P, ["kv_train", "kv_eval"], name="data.prompts", tags=["data"]),
            node(train_base, P, "kv_base_model", name="data.base_model", tags=["data", "gpu"]),
            *[variant_node(train_variant, v, ["kv_train", "kv_eval", "kv_base_model", P],
                           [f"kv_results_{v}", f"kv_trained_{v}_model"]) for v in variants],
            node(measure_speed, timing_in, "timing_json", name="evaluate.timing", tags=["evaluate", "gpu"]),
            node(make_plots, {"p": P, **res}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", "timing": "timing_json", "kv_base": "kv_base_model",
                          **res, **trained}, "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="kvindexer",
        parameters={P: P},
    )
