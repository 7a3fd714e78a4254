"""`losa`: data.tasks → data.bdlm (the one base block-diffusion LM of a run) → train.<variant> (one node per
prefix-attention policy: dense, quest, sparsed, losa and its ablations; each decodes every eval seed and
budget with the base model) → evaluate.timing (dense / Quest / LoSA attention time, interleaved side by
side in one process) → evaluate.plots → evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.losa.bench import measure_timing
    from pipelines.losa.data import make_tasks
    from pipelines.losa.evaluate import make_plots, report
    from pipelines.losa.train import decode_variant, train_base

    P = "params:losa"
    variants = [v["name"] for v in method_config("losa").get("variants") or []]   # this run's env + --params
    out = {v: [f"results_{v}", f"traces_{v}_json"] for v in variants}
    return pipeline(
        [
            node(make_tasks, P, "tasks_tensors", name="data.tasks", tags=["data"]),
            node(train_base, ["tasks_tensors", P], "bdlm_model", name="data.bdlm", tags=["data", "gpu"]),
            *[variant_node(decode_variant, v, ["tasks_tensors", "bdlm_model", P], out[v]) for v in variants],
            node(measure_timing, ["tasks_tensors", "bdlm_model", P], "timing_json", name="evaluate.timing",
                 tags=["evaluate", "gpu"]),
            node(make_plots, {"p": P, "timing": "timing_json", "bdlm": "bdlm_model",
                              **{f"results_{v}": out[v][0] for v in variants},
                              **{f"traces_{v}": out[v][1] for v in variants}},
                 "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "timing": "timing_json", "plots": "plots", "bdlm": "bdlm_model",
                          **{v: out[v][0] for v in variants}},
                 "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="losa",
        parameters={P: P},
    )
