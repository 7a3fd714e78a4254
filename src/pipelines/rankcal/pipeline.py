"""`rankcal`: data → train.<model> (one node per label-ranking model) and train.rm_<name> (one per
reward model of the RLHF study) → evaluate.calibration / evaluate.hierarchy_demo → evaluate.plots /
evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def planned_variants(raw: dict) -> tuple[list[str], list[str]]:
    """(label-ranking models, reward-model nodes ``rm_<name>``) of a run's raw parameters."""
    models = list((raw.get("models") or {}).get("variants") or [])
    rlhf = raw.get("rlhf") or {}
    rms = [f"rm_{m['name']}" for m in rlhf.get("models") or []] if rlhf.get("enabled", True) else []
    return models, rms


def create_pipeline(**kwargs) -> Pipeline:
    # imported here so that importing a light module of this package (e.g. ranking) stays light
    from pipelines.rankcal.data import make_datasets
    from pipelines.rankcal.demo import hierarchy_demo
    from pipelines.rankcal.evaluate import calibration_table, make_plots, report
    from pipelines.rankcal.rlhf import train_reward_model
    from pipelines.rankcal.train import temperature_scale, train_variant

    P = "params:rankcal"
    models, rms = planned_variants(method_config("rankcal"))   # this run's env + --params
    predictions = {v: f"predictions_{v}_tensors" for v in models}
    reward_models = {v: v.replace("rm_", "rlhf_", 1) for v in rms}
    train = [variant_node(temperature_scale, v, [predictions["neural_pl"], P], predictions[v])
             if v == "neural_pl_ts" else variant_node(train_variant, v, ["datasets", P], predictions[v])
             for v in models]
    return pipeline(
        [
            node(make_datasets, P, "datasets", name="data.label_rankings", tags=["data"]),
            *train,
            *[variant_node(train_reward_model, v, [P], reward_models[v]) for v in rms],
            node(calibration_table, {"datasets": "datasets", "p": P, **predictions}, ["metrics", "bootstrap_json"],
                 name="evaluate.calibration", tags=["evaluate"]),
            node(hierarchy_demo, P, "demo", name="evaluate.hierarchy_demo", tags=["evaluate"]),
            node(make_plots, {"datasets": "datasets", "demo": "demo", "p": P, **predictions, **reward_models},
                 "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"metrics": "metrics", "bootstrap": "bootstrap_json", "demo": "demo", "plots": "plots",
                          "p": P, **reward_models}, "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="rankcal",
        parameters={P: P},
    )
