"""`recm`: data.advdiff → train.<variant> (one node per variant: RECM, its rule variants and every
baseline; each trains all ε × seeds) → evaluate.symmetry_gap (data level) / evaluate.layer_gaps (per
layer, on the strict nets) → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.recm.data import make_data
    from pipelines.recm.evaluate import data_gaps, layer_gaps, make_plots, report
    from pipelines.recm.train import train_variant

    P = "params:recm"
    variants = list(method_config("recm").get("variants") or {})   # this run's env + --params
    outputs = {v: [f"fit_{v}", f"hist_{v}_json", f"{v}_model"] for v in variants}
    gathered = {**{f"fit_{v}": f"fit_{v}" for v in variants}, **{f"hist_{v}": f"hist_{v}_json" for v in variants}}
    lg_inputs = {"dataset": "data_advdiff", "p": P, **({"strict_models": "strict_model"} if "strict" in variants else {})}
    return pipeline(
        [
            node(make_data, P, "data_advdiff", name="data.advdiff", tags=["data"]),
            *[variant_node(train_variant, v, ["data_advdiff", P], outputs[v]) for v in variants],
            node(data_gaps, ["data_advdiff", P], "symmetry_gap", name="evaluate.symmetry_gap", tags=["evaluate"]),
            node(layer_gaps, lg_inputs, "layer_gaps", name="evaluate.layer_gaps", tags=["evaluate"]),
            node(make_plots, {"p": P, "gaps": "symmetry_gap", "lgaps": "layer_gaps", **gathered}, "plots",
                 name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "gaps": "symmetry_gap", "lgaps": "layer_gaps", "plots": "plots", **gathered},
                 "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="recm",
        parameters={P: P},
    )
