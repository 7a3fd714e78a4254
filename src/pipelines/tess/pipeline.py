"""TESS as a Kedro pipeline: data (generate → label → texts → extract → embed) → train (baselines, TESS)
→ evaluate (report + plots). Training nodes carry `gpu` so the GPU-node runner can ship them."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.tess.data import generate_windows, label_primitives, render_texts
from pipelines.tess.embed import embed_texts
from pipelines.tess.evaluate import evaluate
from pipelines.tess.extract import extract_lexicon
from pipelines.tess.llm import extract_llm
from pipelines.tess.train import train_baselines, train_tess


def create_pipeline(**kwargs) -> Pipeline:
    P = "params:tess"
    return pipeline(
        [
            node(generate_windows, P, "windows", name="data.generate_windows", tags=["data"]),
            node(label_primitives, ["windows", P], ["primitives_gt", "labeller_json"],
                 name="data.label_primitives", tags=["data"]),
            node(render_texts, ["windows", "primitives_gt", P], "texts", name="data.render_texts", tags=["data"]),
            node(extract_lexicon, ["texts", P], "extractions_lexicon", name="data.extract_lexicon", tags=["data"]),
            node(extract_llm, ["texts", "windows", P], "extractions_llm", name="data.extract_llm", tags=["data"]),
            node(embed_texts, ["texts", "windows", P], ["text_emb_tensors", "extractions_prototype"],
                 name="data.embed_texts", tags=["data"]),
            node(train_baselines, ["windows", "texts", "text_emb_tensors", P],
                 ["predictions_baselines", "fit_log_baselines"], name="train.baselines", tags=["train", "gpu"]),
            node(train_tess, ["windows", "primitives_gt", "extractions_lexicon", "extractions_prototype",
                        "extractions_llm", P],
                 ["predictions_tess", "fit_log_tess", "gates"], name="train.tess", tags=["train", "gpu"]),
            node(evaluate, ["windows", "primitives_gt", "texts", "extractions_lexicon", "predictions_baselines",
                          "fit_log_baselines", "predictions_tess", "fit_log_tess", "gates", "labeller_json", P],
                 ["report", "plots"], name="evaluate.report", tags=["evaluate"]),
        ],
        namespace="tess",
        parameters={P: P},
    )
