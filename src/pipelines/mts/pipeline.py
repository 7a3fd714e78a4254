"""`mts`: data.pool → data.features (offline SD_* / pre_* features) → train.<variant> (one node per
variant: baselines and the meta-learned selectors) and evaluate.gsnr (the meta-gradient GSNR vs batch
size) → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.mts.data import make_pool
    from pipelines.mts.evaluate import make_plots, report
    from pipelines.mts.gsnr import measure_gsnr
    from pipelines.mts.train import make_features, train_variant

    P = "params:mts"
    variants = method_config("mts").get("variants") or []   # this run's env + --params
    outs = {**{f"w__{v}": f"weights_{v}" for v in variants}, **{f"m__{v}": f"metrics_{v}_json" for v in variants}}
    return pipeline(
        [
            node(make_pool, P, "pool", name="data.pool", tags=["data"]),
            node(make_features, ["pool", P], "features", name="data.features", tags=["data"]),
            *[variant_node(train_variant, v, ["pool", "features", P], [f"weights_{v}", f"metrics_{v}_json"])
              for v in variants],
            node(measure_gsnr, ["pool", "features", P], "gsnr", name="evaluate.gsnr", tags=["evaluate"]),
            node(make_plots, {"p": P, "gsnr": "gsnr", **outs}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "gsnr": "gsnr", "plots": "plots", **outs}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="mts",
        parameters={P: P},
    )
