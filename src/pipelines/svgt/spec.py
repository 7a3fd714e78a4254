"""`svgt`: data.corpus → train.backbone (the unaligned LM, once) → train.value (value stages 1-2, per seed)
→ train.<variant> (SVGT's stage 3, its ablations and the baselines; each evaluates itself; train.caa /
train.iti report one row variant per coefficient) → evaluate; declared here, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.svgt.data import make_corpus
from pipelines.svgt.evaluate import DERIVED, make_plots
from pipelines.svgt.params import Params
from pipelines.svgt.train import row_variants, train_backbone, train_value, train_variant

NEEDS_VALUE = ("svgt", "svgt_dz0")


def _inputs(p: Params, variant: str) -> dict[str, str]:
    ins = {"corpus": "corpus", "backbone": "backbone_model"}
    if variant in NEEDS_VALUE:
        ins.update(value_states="value_model", value_log="value_fitlog_json")
    if variant == "no_intervention":
        ins["backbone_log"] = "backbone_fitlog_json"
    return ins


SPEC = Method(
    name="svgt",
    params=Params,
    data=[
        Data(make_corpus, "params", "corpus", name="corpus"),
        Data(
            train_backbone,
            ["corpus", "params"],
            ["backbone_model", "backbone_fitlog_json"],
            name="backbone",
            stage="train",
        ),
        Data(
            train_value,
            ["corpus", "backbone_model", "params"],
            ["value_model", "value_fitlog_json"],
            name="value",
            stage="train",
        ),
    ],
    train=Train(train_variant, _inputs, artifacts="json"),
    reports=lambda p: [r for v in p.variants for r in row_variants(p, v)],
    derived=DERIVED,
    plots=make_plots,
)
