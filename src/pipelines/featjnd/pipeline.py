"""`featjnd`: digits canvas → backbone CNN (shared fit) → one FeatJND estimator per split point
(`train.estimator_<split>`) → E1–E3 per estimator (`evaluate.estimator_<split>`) → plots → report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.featjnd.data import make_images
    from pipelines.featjnd.evaluate import evaluate_variant, make_plots, make_report
    from pipelines.featjnd.train import train_backbone, train_estimator

    P = "params:featjnd"
    variants = list(method_config("featjnd").get("variants") or [])  # this run's env + --params
    model = {v: f"{v}_model" for v in variants}
    results = {v: f"results_{v}" for v in variants}
    maps = {v: f"maps_{v}_tensors" for v in variants}
    return pipeline(
        [
            node(make_images, P, "images_tensors", name="data.make_images", tags=["data"]),
            # shared fit: every estimator variant reads the same frozen backbone
            node(train_backbone, ["images_tensors", P], "backbone_model", name="train.backbone",
                 tags=["train", "gpu"]),
            *[variant_node(train_estimator, v, ["images_tensors", "backbone_model", P], model[v])
              for v in variants],
            *[variant_node(evaluate_variant, v, ["images_tensors", "backbone_model", model[v], P],
                           [results[v], maps[v]], stage="evaluate", tags=["evaluate", "gpu"])
              for v in variants],
            node(make_plots, {"p": P, **{f"results_{v}": results[v] for v in variants},
                              **{f"maps_{v}": maps[v] for v in variants},
                              **{f"model_{v}": model[v] for v in variants}},
                 "plots", name="evaluate.plots", tags=["evaluate"]),
            node(make_report, {"p": P, "plots": "plots", **results}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="featjnd",
        parameters={P: P},
    )
