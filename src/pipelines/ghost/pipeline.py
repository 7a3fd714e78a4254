"""`ghost`: data.corpus → data.mamba2_tiny (the SSM LM, trained ONCE per run and cached) → one
``train.<variant>`` node per pruning method (scores, pruning over the ratio grid, test perplexity) →
evaluate.loo_oracle / evaluate.decode_timing (one node: the decode speeds are interleaved) →
evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def planned_variants(raw: dict) -> list[str]:
    ev = raw.get("eval") or {}
    return [*(ev.get("main_variants") or []), *(ev.get("ablation_variants") or [])]


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.ghost.data import make_corpus
    from pipelines.ghost.evaluate import decode_timing, loo_oracle, make_plots, report
    from pipelines.ghost.train import prune_variant, train_model

    P = "params:ghost"
    variants = planned_variants(method_config("ghost"))   # this run's env + --params
    outs = {**{f"results_{v}": f"results_{v}" for v in variants},
            **{f"scores_{v}": f"scores_{v}_tensors" for v in variants}}
    return pipeline(
        [
            node(make_corpus, P, "corpus_tensors", name="data.corpus", tags=["data"]),
            node(train_model, ["corpus_tensors", P], "mamba2_tiny_model", name="data.mamba2_tiny",
                 tags=["data", "gpu"]),
            *[variant_node(prune_variant, v, ["corpus_tensors", "mamba2_tiny_model", P],
                           [f"results_{v}", f"scores_{v}_tensors"]) for v in variants],
            node(loo_oracle, ["corpus_tensors", "mamba2_tiny_model", P], "loo_tensors",
                 name="evaluate.loo_oracle", tags=["evaluate"]),
            node(decode_timing, ["corpus_tensors", "mamba2_tiny_model", "scores_ghost_tensors", P], "timing_json",
                 name="evaluate.decode_timing", tags=["evaluate"]),
            node(make_plots, {"p": P, "model_blob": "mamba2_tiny_model", "loo": "loo_tensors", **outs}, "plots",
                 name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "model_blob": "mamba2_tiny_model", "loo": "loo_tensors", "timing": "timing_json",
                          "plots": "plots", **outs}, "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="ghost",
        parameters={P: P},
    )
