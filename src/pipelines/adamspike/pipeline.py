"""`adamspike`: data.fn64 → train.<variant> (one node per run configuration: the quadratic's Adam / GD runs,
the MLP's tracked headline Adam runs, its β₂ / ε ablations and GD) → evaluate.spike_events →
evaluate.plots → evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.adamspike.data import make_data
    from pipelines.adamspike.evaluate import plots, report, spike_events
    from pipelines.adamspike.train import train_variant

    P = "params:adamspike"
    variants = method_config("adamspike").get("variants") or []   # this run's env + --params
    runs = {v: f"run_{v}" for v in variants}
    return pipeline(
        [
            node(make_data, P, "fn64", name="data.fn64", tags=["data"]),
            *[variant_node(train_variant, v, ["fn64", P], runs[v]) for v in variants],
            node(spike_events, {"p": P, **runs}, "spike_events", name="evaluate.spike_events", tags=["evaluate"]),
            node(plots, {"p": P, **runs}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", "spike_table": "spike_events", **runs}, "report",
                 name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="adamspike",
        parameters={P: P},
    )
