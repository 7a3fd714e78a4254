"""`hypospace`: data.<domain> (observation sets + exactly enumerated admissible sets) → train.<sampler>
(one node per sampler: proposals, validated) → evaluate.metrics (V, U, R per set) → evaluate.plots /
evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node

DEFAULT_DOMAINS = ["causal", "voxel3d", "boolean"]


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.hypospace.data import domain_data
    from pipelines.hypospace.evaluate import make_plots, report, set_metrics
    from pipelines.hypospace.train import train_variant

    P = "params:hypospace"
    raw = method_config("hypospace")                     # this run's env + --params
    variants = list(raw.get("variants") or [])
    domains = list((raw.get("domains") or {}).get("enabled") or DEFAULT_DOMAINS)
    tables = {f"{d}_{t}": f"{d}_{t}" for d in domains for t in ("obs", "admissible")}
    proposals = {f"proposals_{v}": f"proposals_{v}" for v in variants}

    def data_node(d: str):
        return node(domain_data(d), P, [f"{d}_obs", f"{d}_admissible"], name=f"data.{d}", tags=["data"])

    return pipeline(
        [
            *[data_node(d) for d in domains],
            *[variant_node(train_variant, v, {"p": P, **tables}, f"proposals_{v}") for v in variants],
            node(set_metrics, {"p": P, **tables, **proposals}, "metrics", name="evaluate.metrics",
                 tags=["evaluate"]),
            node(make_plots, {"p": P, "metrics": "metrics"}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "metrics": "metrics", "plots": "plots"}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="hypospace",
        parameters={P: P},
    )
