"""`wedlm`: data.tasks → train.<variant> (one node per trained model: `wedlm`, and `ar_only` when
`train.ar_only_seeds` is set; each trains its seeds and decodes the test set) → evaluate.timing (the
decoders' wall clock, interleaved side by side in one process) → evaluate.plots → evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.wedlm.data import make_tasks
    from pipelines.wedlm.evaluate import make_plots, measure_speed, report
    from pipelines.wedlm.params import trained_variants
    from pipelines.wedlm.train import train_variant

    P = "params:wedlm"
    variants = trained_variants(method_config("wedlm"))   # this run's env + --params
    out = {v: [f"{v}_model", f"fit_log_{v}", f"decodes_{v}", f"traces_{v}_json"] for v in variants}
    per_variant = {**{f"decodes_{v}": out[v][2] for v in variants}, **{f"fit_log_{v}": out[v][1] for v in variants},
                   **{f"traces_{v}": out[v][3] for v in variants}}
    return pipeline(
        [
            node(make_tasks, P, ["test", "tasks_tensors"], name="data.tasks", tags=["data"]),
            *[variant_node(train_variant, v, ["tasks_tensors", "test", P], out[v]) for v in variants],
            node(measure_speed, {"p": P, "test": "test", **{v: out[v][0] for v in variants}}, "timing",
                 name="evaluate.timing", tags=["evaluate", "gpu"]),
            node(make_plots, {"p": P, "timing": "timing", **per_variant}, "plots", name="evaluate.plots",
                 tags=["evaluate"]),
            node(report, {"p": P, "timing": "timing", "plots": "plots", **{v: out[v][2] for v in variants}},
                 "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="wedlm",
        parameters={P: P},
    )
