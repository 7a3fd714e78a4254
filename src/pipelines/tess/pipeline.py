"""TESS as a Kedro pipeline, built from the run's parameters:

data (generate → label → render texts → extract (lexicon, llm) → embed with MiniLM) → train.extractor_head
(the minilm_head extractor, a shared fit) → one ``train.<variant>`` node per variant (the method, each
extractor backend, each ablation, each baseline) → evaluate.report → evaluate.plots."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node
from pipelines.tess.data import generate_windows, label_primitives, render_texts
from pipelines.tess.embed import embed_texts
from pipelines.tess.evaluate import plots, report
from pipelines.tess.extract import extract_lexicon
from pipelines.tess.head import extract_minilm_head
from pipelines.tess.llm import extract_llm
from pipelines.tess.params import Params
from pipelines.tess.train import OFFLINE_BACKENDS, plan, train_variant, variant_inputs

P = "params:tess"


def create_pipeline(**kwargs) -> Pipeline:
    p = Params.model_validate(method_config("tess"))
    variants = list(plan(p))
    backends = [*OFFLINE_BACKENDS, *(["llm"] if p.extractor.backend == "llm" else [])]
    extractions = {f"extractions_{b}": f"extractions_{b}" for b in backends}
    outputs = {f"{kind}_{v}": f"{kind}_{v}" for v in variants for kind in ("predictions", "fit_log")}
    nodes = [
        node(generate_windows, P, "windows", name="data.generate_windows", tags=["data"]),
        node(label_primitives, ["windows", P], ["primitives_gt", "labeller_json"],
             name="data.label_primitives", tags=["data"]),
        node(render_texts, ["windows", "primitives_gt", P], ["texts", "texts_seen"], name="data.render_texts",
             tags=["data"]),
        node(extract_lexicon, ["texts", "texts_seen", P], "extractions_lexicon", name="data.extract_lexicon",
             tags=["data"]),
        node(embed_texts, ["texts", "texts_seen", "windows", P], ["text_emb_tensors", "extractions_prototype"],
             name="data.embed_texts", tags=["data"]),
        node(extract_minilm_head, ["text_emb_tensors", "primitives_gt", "windows", P], "extractions_minilm_head",
             name="train.extractor_head", tags=["train"]),
        *([node(extract_llm, ["texts", "texts_seen", "windows", P], "extractions_llm", name="data.extract_llm",
                tags=["data"])] if "llm" in backends else []),
        *[variant_node(train_variant, v, variant_inputs(v, p), [f"predictions_{v}", f"fit_log_{v}"])
          for v in variants],
        node(report, {"p": P, "windows": "windows", "gt": "primitives_gt", "texts": "texts",
                      "label_info": "labeller_json", **extractions, **outputs},
             "report", name="evaluate.report", tags=["evaluate"]),
        node(plots, {"p": P, "windows": "windows", "gt": "primitives_gt", "report": "report", **extractions,
                     **{k: v for k, v in outputs.items() if k.startswith("predictions_")}},
             "plots", name="evaluate.plots", tags=["evaluate"]),
    ]
    return pipeline(nodes, namespace="tess", parameters={P: P})
