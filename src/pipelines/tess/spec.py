"""`tess`: data (generate → label → render texts → extract (lexicon, llm) → embed with MiniLM → the
minilm_head extractor, a shared fit) → one ``train.<variant>`` node per variant (the method, each extractor
backend, each ablation, each baseline; the ridge baselines read PatchTST's predictions) → evaluate; the
method's contract, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.tess.data import generate_windows, label_primitives, render_texts
from pipelines.tess.embed import embed_texts
from pipelines.tess.evaluate import EXTRACTIONS, derived, make_plots, report_extra
from pipelines.tess.extract import extract_lexicon
from pipelines.tess.head import extract_minilm_head
from pipelines.tess.llm import extract_llm
from pipelines.tess.params import Params
from pipelines.tess.train import plan, train_variant, variant_inputs

SPEC = Method(
    name="tess",
    params=Params,
    data=[
        Data(generate_windows, "params", "windows", name="generate_windows"),
        Data(label_primitives, ["windows", "params"], ["primitives_gt", "labeller_json"], name="label_primitives"),
        Data(render_texts, ["windows", "primitives_gt", "params"], ["texts", "texts_seen"], name="render_texts"),
        Data(extract_lexicon, ["texts", "texts_seen", "params"], "extractions_lexicon", name="extract_lexicon"),
        Data(
            embed_texts,
            ["texts", "texts_seen", "windows", "params"],
            ["text_emb_tensors", "extractions_prototype"],
            name="embed_texts",
        ),
        Data(
            extract_minilm_head,
            ["text_emb_tensors", "primitives_gt", "windows", "params"],
            "extractions_minilm_head",
            name="extractor_head",
            tags=["train"],
        ),
        # an empty table unless extractor.backend is 'llm' (the node then needs an endpoint)
        Data(extract_llm, ["texts", "texts_seen", "windows", "params"], "extractions_llm", name="extract_llm"),
    ],
    train=Train(train_variant, variant_inputs, artifacts="tensors"),
    variants=lambda p: list(plan(p)),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs={
        "windows": "windows",
        "gt": "primitives_gt",
        "texts": "texts",
        "label_info": "labeller_json",
        **EXTRACTIONS,
    },
)
