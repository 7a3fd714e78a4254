"""`medtpe`: corpus → base BPE → EHR stays → MedTPE merges (per seed) → train.original (the base model,
once per run) and train.<variant> (each adapts it) → data.timing (one node: interleaved measurements)
→ evaluate; declared here, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.medtpe.data import general_corpus, make_ehr
from pipelines.medtpe.evaluate import derived, make_plots, report_extra, timing
from pipelines.medtpe.params import Params
from pipelines.medtpe.train import build_tpes, train_bpe_node, train_original, train_variant

SHARED = ["ehr", "bpe_base_json", "tpe_merges_json", "base_lm_model"]

SPEC = Method(
    name="medtpe",
    params=Params,
    data=[
        Data(general_corpus, "params", "general_corpus", name="general_corpus"),
        Data(train_bpe_node, ["general_corpus", "params"], "bpe_base_json", name="bpe"),
        Data(make_ehr, "params", "ehr", name="ehr"),
        Data(build_tpes, ["ehr", "bpe_base_json", "params"], "tpe_merges_json", name="tpe"),
        Data(
            train_original,
            ["ehr", "bpe_base_json", "params"],
            ["results_original", "predictions_original", "base_lm_model", "original_fitlog_json"],
            name="original",
            stage="train",
        ),
        Data(timing, [*SHARED, "params"], "timing_json", name="timing"),
    ],
    train=Train(train_variant, SHARED, artifacts="json"),
    results_from={"original": "results_original"},
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs={"timing": "timing_json", "tpes": "tpe_merges_json", "original": "predictions_original"},
)
