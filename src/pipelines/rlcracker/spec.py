"""`rlcracker`: corpus → train.generator (shared) → data.watermark (watermarked and null texts) →
train.attacker_sft (shared start) → train.<variant> (each attack: RL attackers train here, then every
variant rewrites and is scored, every seed) → evaluate; declared here, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.rlcracker.data import load_corpus
from pipelines.rlcracker.evaluate import derived, make_plots
from pipelines.rlcracker.params import Params
from pipelines.rlcracker.train import train_attacker_sft, train_generator, train_variant, watermark_texts

SPEC = Method(
    name="rlcracker",
    params=Params,
    data=[
        Data(load_corpus, "params", ["lexicon", "wm_corpus"], name="corpus"),
        Data(
            train_generator,
            ["lexicon", "wm_corpus", "params"],
            ["generator_model", "generator_fitlog_json"],
            name="generator",
            stage="train",
        ),
        Data(watermark_texts, ["lexicon", "wm_corpus", "generator_model", "params"], "wm_texts", name="watermark"),
        Data(
            train_attacker_sft,
            ["lexicon", "wm_corpus", "params"],
            ["attacker_sft_model", "attacker_sft_fitlog_json"],
            name="attacker_sft",
            stage="train",
        ),
    ],
    train=Train(train_variant, ["lexicon", "wm_corpus", "wm_texts", "attacker_sft_model"], artifacts="tensors"),
    derived=derived,
    plots=make_plots,
    report_inputs={"lexicon": "lexicon", "corpus": "wm_corpus", "texts": "wm_texts"},
)
