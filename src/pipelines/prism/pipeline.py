"""`prism`: task + noise calibration → train.<variant> (one node per variant; the ε grid and the gauge
stress test run inside each) → evaluate.report / evaluate.plots."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.prism.data import calibrate_noise, make_task
    from pipelines.prism.evaluate import make_plots, report
    from pipelines.prism.train import train_variant

    P = "params:prism"
    variants = method_config("prism").get("variants") or []   # this run's env + --params
    results = {v: f"results_{v}_json" for v in variants}
    return pipeline(
        [
            node(make_task, P, "task_tensors", name="data.task", tags=["data"]),
            node(calibrate_noise, [P, "task_tensors"], "noise_json", name="data.noise_calibration", tags=["data"]),
            *[variant_node(train_variant, v, ["task_tensors", "noise_json", P], results[v]) for v in variants],
            node(make_plots, {"p": P, "task": "task_tensors", **results}, "plots", name="evaluate.plots",
                 tags=["evaluate"]),
            node(report, {"p": P, "task": "task_tensors", "noise": "noise_json", "plots": "plots", **results},
                 "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="prism",
        parameters={P: P},
    )
