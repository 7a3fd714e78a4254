"""`featjnd`: digits canvas → backbone CNN → FeatJND estimators at S1 and S2 → E1–E3 per split → report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.featjnd.data import make_images
from pipelines.featjnd.evaluate import evaluate_s1, evaluate_s2, make_report
from pipelines.featjnd.train import train_backbone, train_estimator_s1, train_estimator_s2


def create_pipeline(**kwargs) -> Pipeline:
    p = "params:featjnd"
    return pipeline(
        [
            node(make_images, p, "images_tensors", name="data.make_images", tags=["data"]),
            node(train_backbone, ["images_tensors", p], "backbone_model", name="train.backbone",
                 tags=["train", "gpu"]),
            node(train_estimator_s1, ["images_tensors", "backbone_model", p], "estimator_s1_model",
                 name="train.estimator_s1", tags=["train", "gpu"]),
            node(train_estimator_s2, ["images_tensors", "backbone_model", p], "estimator_s2_model",
                 name="train.estimator_s2", tags=["train", "gpu"]),
            node(evaluate_s1, ["images_tensors", "backbone_model", "estimator_s1_model", p],
                 ["results_s1", "maps_s1_tensors"], name="evaluate.split_s1", tags=["evaluate"]),
            node(evaluate_s2, ["images_tensors", "backbone_model", "estimator_s2_model", p],
                 ["results_s2", "maps_s2_tensors"], name="evaluate.split_s2", tags=["evaluate"]),
            node(make_report, ["results_s1", "results_s2", "maps_s1_tensors", "maps_s2_tensors",
                               "estimator_s1_model", "estimator_s2_model", p], ["report", "plots"],
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="featjnd",
        parameters={p: p},
    )
