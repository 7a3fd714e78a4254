"""`hobit`: data.pairs → train.<variant> (one node per batching variant, the same encoder, optimiser and
step count) → evaluate.objective_checks (the objective's submodularity and greedy's guarantee on tiny
instances) → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.hobit.checks import objective_checks
    from pipelines.hobit.data import make_pairs
    from pipelines.hobit.evaluate import make_plots, report
    from pipelines.hobit.train import train_variant

    P = "params:hobit"
    variants = list(method_config("hobit").get("variants") or {})   # this run's env + --params
    fits = {v: f"fit_{v}_json" for v in variants}
    return pipeline(
        [
            node(make_pairs, P, "pairs", name="data.pairs", tags=["data"]),
            *[variant_node(train_variant, v, ["pairs", P], [fits[v], f"batches_{v}", f"encoder_{v}_model"])
              for v in variants],
            node(objective_checks, P, "objective_checks_json", name="evaluate.objective_checks", tags=["evaluate"]),
            node(make_plots, {"p": P, **fits}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "checks": "objective_checks_json", "plots": "plots", **fits}, "report",
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="hobit",
        parameters={P: P},
    )
