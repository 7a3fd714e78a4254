"""`credal_dro`: data (newsvendor draws + test environments, shifted diabetes regression, group-shift
classification) → one ``train.<variant>`` node per variant, each solving all three experiments for its
variant → ``evaluate.plots`` / ``evaluate.report``."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def configured_variants(raw: dict | None = None) -> list[str]:
    """The variants of this run's parameters (env + --params), in their declared order."""
    raw = method_config("credal_dro") if raw is None else raw
    return list((raw or {}).get("variants") or {})


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.credal_dro.data import make_classification, make_newsvendor, make_regression
    from pipelines.credal_dro.evaluate import make_plots, report
    from pipelines.credal_dro.train import train_variant

    P = "params:credal_dro"
    variants = configured_variants()
    metrics = {v: f"metrics_{v}" for v in variants}
    data = ["newsvendor_samples", "newsvendor_envs", "regression_data", "classification_data"]
    return pipeline(
        [
            node(make_newsvendor, P, ["newsvendor_samples", "newsvendor_envs"], name="data.newsvendor",
                 tags=["data"]),
            node(make_regression, P, "regression_data", name="data.regression", tags=["data"]),
            node(make_classification, P, "classification_data", name="data.classification", tags=["data"]),
            *[variant_node(train_variant, v, [*data, P], metrics[v]) for v in variants],
            node(make_plots, {"p": P, **metrics}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", **metrics}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="credal_dro",
        parameters={P: P},
    )
