"""`rankcal`: data → train → evaluate for calibration in probabilistic label ranking."""
from kedro.pipeline import Pipeline, node, pipeline


def create_pipeline(**kwargs) -> Pipeline:
    # imported here so that importing a light module of this package (e.g. ranking) stays light
    from pipelines.rankcal.data import make_datasets
    from pipelines.rankcal.demo import hierarchy_demo
    from pipelines.rankcal.evaluate import calibration_table, report
    from pipelines.rankcal.rlhf import reward_model_study
    from pipelines.rankcal.train import train_label_rankers

    return pipeline(
        [
            node(make_datasets, "params:rankcal", "datasets", name="data.label_rankings", tags=["data"]),
            node(train_label_rankers, ["datasets", "params:rankcal"], "predictions_tensors",
                 name="train.label_rankers", tags=["train"]),
            node(reward_model_study, "params:rankcal", "rlhf", name="train.reward_models", tags=["train"]),
            node(calibration_table, ["predictions_tensors", "params:rankcal"], ["metrics", "bootstrap_json"],
                 name="evaluate.calibration", tags=["evaluate"]),
            node(hierarchy_demo, "params:rankcal", "demo", name="evaluate.hierarchy_demo", tags=["evaluate"]),
            node(report, ["metrics", "bootstrap_json", "demo", "rlhf", "predictions_tensors", "params:rankcal"],
                 ["report", "plots"], name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="rankcal",
        parameters={"params:rankcal": "params:rankcal"},
    )
