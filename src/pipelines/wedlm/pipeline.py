"""`wedlm`: tasks → one model per seed (+ AR-only backbone) → decode with AR / streaming / block-wise →
report with claims and plots."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.wedlm.data import make_tasks
from pipelines.wedlm.evaluate import decode_all, report
from pipelines.wedlm.train import train_models


def create_pipeline(**kwargs) -> Pipeline:
    return pipeline(
        [
            node(make_tasks, "params:wedlm", ["test", "tasks_tensors"], name="data.make_tasks", tags=["data"]),
            node(train_models, ["tasks_tensors", "params:wedlm"], ["wedlm_model", "train_log"],
                 name="train.models", tags=["train", "gpu"]),
            node(decode_all, ["wedlm_model", "test", "tasks_tensors", "params:wedlm"],
                 ["decodes", "timing", "trace_json"], name="evaluate.decode", tags=["evaluate", "gpu"]),
            node(report, ["decodes", "timing", "trace_json", "train_log", "params:wedlm"], ["report", "plots"],
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="wedlm",
        parameters={"params:wedlm": "params:wedlm"},
    )
