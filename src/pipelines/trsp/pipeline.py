"""`trsp`: data.instances, data.road_graph → train.<variant> (one node per placement algorithm) → evaluate.metrics →
evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.trsp.data import make_graph, make_instances
    from pipelines.trsp.evaluate import gather, make_plots, report
    from pipelines.trsp.train import train_variant

    P = "params:trsp"
    variants = method_config("trsp").get("variants") or []   # this run's env + --params
    solutions = {v: f"solutions_{v}" for v in variants}
    return pipeline(
        [
            node(make_instances, P, "instances", name="data.instances", tags=["data"]),
            node(make_graph, P, "road_graph", name="data.road_graph", tags=["data"]),
            *[variant_node(train_variant, v, ["instances", "road_graph", P], solutions[v]) for v in variants],
            node(gather, solutions, "metrics", name="evaluate.metrics", tags=["evaluate"]),
            node(make_plots, {"instances": "instances", "metrics": "metrics", "p": P}, "plots",
                 name="evaluate.plots", tags=["evaluate"]),
            node(report, {"metrics": "metrics", "p": P, "plots": "plots"}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="trsp",
        parameters={P: P},
    )
