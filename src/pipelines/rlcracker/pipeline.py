"""`rlcracker`: corpus → train.generator (shared) → data.watermark (watermarked and null texts) →
train.attacker_sft (shared start) → train.<variant> (each attack: RL attackers train here, then every
variant rewrites and is scored) → evaluate.plots / evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def _gather_curves(**curves: dict) -> dict:
    return {v: c for v, c in curves.items() if c}


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.rlcracker.data import load_corpus
    from pipelines.rlcracker.evaluate import make_plots, report
    from pipelines.rlcracker.train import train_attacker_sft, train_generator, train_variant, watermark_texts

    P = "params:rlcracker"
    variants = method_config("rlcracker").get("variants") or []   # this run's env + --params
    attacks = {v: f"attack_{v}" for v in variants}
    curves = {v: f"{v}_curves_json" for v in variants}
    return pipeline(
        [
            node(load_corpus, P, ["lexicon", "wm_corpus"], name="data.corpus", tags=["data"]),
            node(train_generator, ["lexicon", "wm_corpus", P], ["generator_model", "generator_fitlog_json"],
                 name="train.generator", tags=["train", "gpu"]),
            node(watermark_texts, ["lexicon", "wm_corpus", "generator_model", P], "wm_texts",
                 name="data.watermark", tags=["data"]),
            node(train_attacker_sft, ["lexicon", "wm_corpus", P], ["attacker_sft_model", "attacker_sft_fitlog_json"],
                 name="train.attacker_sft", tags=["train", "gpu"]),
            *[variant_node(train_variant, v, ["lexicon", "wm_corpus", "wm_texts", "attacker_sft_model", P],
                           [attacks[v], curves[v], f"attacker_rl_{v}_model"]) for v in variants],
            node(_gather_curves, curves, "rl_curves_json", name="evaluate.curves", tags=["evaluate"]),
            node(make_plots, {"p": P, "lexicon": "lexicon", "corpus": "wm_corpus", "texts": "wm_texts",
                              "curves": "rl_curves_json", **attacks}, "plots",
                 name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", "texts": "wm_texts", "curves": "rl_curves_json", **attacks},
                 "report", name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="rlcracker",
        parameters={P: P},
    )
