"""`wbmm`: data (benchmark grid, images) → one ``train.<variant>`` node per tiny-net variant, and the two
interleaved speed benchmarks (operators; the nets' training step), each one node because what it compares
must run side by side in one process → ``evaluate.report`` → ``evaluate.plots``."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node
from pipelines.wbmm.bench import run_benchmark, train_speed
from pipelines.wbmm.data import make_grid, make_images
from pipelines.wbmm.evaluate import plots, report
from pipelines.wbmm.train import train_variant

SPEED_TAGS = ["evaluate", "gpu"]  # timed on the device the variants train on (a GPU node in the pool)


def configured_variants(raw: dict | None = None) -> list[str]:
    """The tiny-net variants of this run's parameters (env + --params), in their declared order."""
    raw = method_config("wbmm") if raw is None else raw
    return list(((raw or {}).get("acc") or {}).get("variants") or {})


def create_pipeline(**kwargs) -> Pipeline:
    variants = configured_variants()
    return pipeline(
        [
            node(make_grid, "params:wbmm", "bench_grid", name="data.bench_grid", tags=["data"]),
            node(make_images, "params:wbmm", "images_tensors", name="data.images", tags=["data"]),
            *[variant_node(train_variant, v, ["images_tensors", "params:wbmm"], [f"fit_{v}", f"nets_{v}_model"])
              for v in variants],
            node(run_benchmark, ["bench_grid", "params:wbmm"], ["bench_results", "bench_env_json"],
                 name="evaluate.operator_speed", tags=SPEED_TAGS),
            node(train_speed, ["images_tensors", "params:wbmm"], "train_speed", name="evaluate.train_speed",
                 tags=SPEED_TAGS),
            node(report, {"p": "params:wbmm", "bench": "bench_results", "bench_env": "bench_env_json",
                          "train_speed": "train_speed", **{f"fit_{v}": f"fit_{v}" for v in variants}},
                 "report", name="evaluate.report", tags=["evaluate"]),
            node(plots, ["params:wbmm", "bench_results", "train_speed", "report"], "plots",
                 name="evaluate.plots", tags=["evaluate"]),
        ],
        namespace="wbmm",
        parameters={"params:wbmm": "params:wbmm"},
    )
