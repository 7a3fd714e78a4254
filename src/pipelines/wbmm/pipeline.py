"""`wbmm`: data (benchmark grid, images) → train (operator benchmark, accuracy check) → evaluate."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.wbmm.bench import make_grid, run_benchmark
from pipelines.wbmm.data import make_images
from pipelines.wbmm.evaluate import evaluate
from pipelines.wbmm.train import train_accuracy


def create_pipeline(**kwargs) -> Pipeline:
    return pipeline(
        [
            node(make_grid, "params:wbmm", "bench_grid", name="data.bench_grid", tags=["data"]),
            node(make_images, "params:wbmm", "images_tensors", name="data.images", tags=["data"]),
            node(run_benchmark, ["bench_grid", "params:wbmm"], ["bench_results", "bench_env_json"],
                 name="train.benchmark", tags=["train", "gpu"]),
            node(train_accuracy, ["images_tensors", "params:wbmm"], ["acc_results", "tiny_nets_model"],
                 name="train.accuracy", tags=["train", "gpu"]),
            node(evaluate, ["bench_results", "bench_env_json", "acc_results", "params:wbmm"], ["report", "plots"],
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="wbmm",
        parameters={"params:wbmm": "params:wbmm"},
    )
