"""`engram`: data (digits, split per seed) → train.original (the MLP every edit starts from) →
data.covariances (the original model's per-class layer statistics) → one ``train.<variant>`` node per edit
variant → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import TRAIN_TAGS, variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.engram.data import make_dataset
    from pipelines.engram.evaluate import make_plots, report
    from pipelines.engram.train import covariances, train_original, train_variant

    P = "params:engram"
    variants = method_config("engram").get("variants") or []   # this run's env + --params
    results = {"original": "results_original", **{v: f"results_{v}" for v in variants}}
    return pipeline(
        [
            node(make_dataset, P, "digits_tensors", name="data.dataset", tags=["data"]),
            node(train_original, ["digits_tensors", P], ["original_model", "results_original"],
                 name="train.original", tags=list(TRAIN_TAGS)),
            node(covariances, ["digits_tensors", "original_model", P], "covariances_tensors",
                 name="data.covariances", tags=["data"]),
            *[variant_node(train_variant, v, ["digits_tensors", "original_model", "covariances_tensors", P],
                           results[v]) for v in variants],
            node(make_plots, {"p": P, **results}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", **results}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="engram",
        parameters={P: P},
    )
