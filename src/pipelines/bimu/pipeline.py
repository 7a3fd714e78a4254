"""`bimu`: data.streams → train.<variant> (one node per variant: continual bimu / bayesbinn /
bayesbinn_official / online, active al_vr / al_random / al_all) → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.bimu.data import make_streams
    from pipelines.bimu.evaluate import make_plots, report
    from pipelines.bimu.train import train_variant

    P = "params:bimu"
    variants = method_config("bimu").get("variants") or []   # this run's env + --params
    results = {v: f"results_{v}_tensors" for v in variants}
    return pipeline(
        [
            node(make_streams, P, "streams_tensors", name="data.streams", tags=["data"]),
            *[variant_node(train_variant, v, ["streams_tensors", P], results[v]) for v in variants],
            node(make_plots, {"p": P, **results}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", **results}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="bimu",
        parameters={P: P},
    )
