"""`ntk_feynman`: data.inputs → train.<variant> (theory variants and one Monte-Carlo node per activation, all
independent) → evaluate.compare → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.ntk_feynman.data import make_inputs
    from pipelines.ntk_feynman.evaluate import compare, make_plots, report
    from pipelines.ntk_feynman.train import train_variant

    P = "params:ntk_feynman"
    variants = method_config("ntk_feynman").get("variants") or []   # this run's env + --params
    stats = {v: f"stats_{v}" for v in variants}
    return pipeline(
        [
            node(make_inputs, P, "inputs_json", name="data.inputs", tags=["data"]),
            *[variant_node(train_variant, v, ["inputs_json", P], stats[v]) for v in variants],
            node(compare, {"inputs": "inputs_json", "p": P, **stats}, "comparison", name="evaluate.compare",
                 tags=["evaluate"]),
            node(make_plots, {"comparison": "comparison", "p": P}, "plots", name="evaluate.plots",
                 tags=["evaluate"]),
            node(report, {"inputs": "inputs_json", "comparison": "comparison", "plots": "plots", "p": P, **stats},
                 "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="ntk_feynman",
        parameters={P: P},
    )
