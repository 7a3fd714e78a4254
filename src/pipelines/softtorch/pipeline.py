"""`softtorch`: data.digit_sequences → train.<method> (one node per relaxation method: accuracy vs
softness, toys, digit sorting) + evaluate.speed (interleaved timing, one node) → evaluate.plots /
evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.softtorch.data import make_digit_sequences
    from pipelines.softtorch.evaluate import make_plots, report
    from pipelines.softtorch.speed import speed_benchmark
    from pipelines.softtorch.train import train_variant

    P = "params:softtorch"
    variants = method_config("softtorch").get("variants") or []   # this run's env + --params
    results = {v: f"results_{v}" for v in variants}
    return pipeline(
        [
            node(make_digit_sequences, P, "digits_tensors", name="data.digit_sequences", tags=["data"]),
            *[variant_node(train_variant, v, ["digits_tensors", P], results[v]) for v in variants],
            node(speed_benchmark, P, "speed", name="evaluate.speed", tags=["evaluate"]),
            node(make_plots, {"p": P, "speed": "speed", **results}, "plots", name="evaluate.plots",
                 tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", "speed": "speed", **results}, "report",
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="softtorch",
        parameters={P: P},
    )
