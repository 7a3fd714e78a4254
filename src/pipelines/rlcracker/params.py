"""Typed parameters of `rlcracker`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Probability, Strict, names_of

VARIANTS = (
    "no_attack",
    "sft_paraphrase",
    "random_sub30",
    "random_sub50",
    "regenerate",
    "rlcracker",
    "grpo_sem_only",
    "oracle_rl",
)
RL_VARIANTS = ("rlcracker", "grpo_sem_only", "oracle_rl")
Scheme = Literal["unigram", "kgw"]


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    seed: NonNegativeInt = 0  # the language, the corpus and the shared models
    n_concepts: int = Field(default=40, ge=2, le=10_000)
    n_synonyms: int = Field(default=4, ge=2, le=16)
    synonym_pref: list[float] = Field(default=[0.55, 0.25, 0.12, 0.08])  # Zipf-like human preference
    n_topics: int = Field(default=8, ge=1, le=1000)
    transition_logit_std: PositiveFloat = 2.0
    answer_len: int = Field(default=32, ge=4, le=512)  # one chunk (short text) in tokens
    long_chunks: int = Field(default=8, ge=1, le=64)  # a long text is this many chunks
    n_lm_train: int = Field(default=4000, ge=8)  # question → answer pairs (generator, attacker SFT)
    n_wm_train: int = Field(default=100, ge=2)  # watermarked texts the attacker trains on
    n_test: int = Field(default=60, ge=2)  # test texts per length
    n_null: int = Field(default=100, ge=2)  # unwatermarked texts per length (FPR calibration)
    corpus_path: str | None = None  # source=file: parquet (split, question, answer)
    lexicon_path: str | None = None  # source=file: parquet (token, concept[, pref])

    @model_validator(mode="after")
    def _check(self):
        if len(self.synonym_pref) != self.n_synonyms:
            raise ValueError(f"synonym_pref has {len(self.synonym_pref)} entries but n_synonyms is {self.n_synonyms}")
        if any(x <= 0 for x in self.synonym_pref):
            raise ValueError("synonym_pref entries must be > 0")
        if self.source == "file" and not (self.corpus_path and self.lexicon_path):
            raise ValueError("source 'file' needs corpus_path and lexicon_path")
        return self


class Watermark(Strict):
    train_scheme: Scheme = "unigram"  # the texts the RL attackers train on
    eval_schemes: names_of(("unigram", "kgw"), "scheme") = ["unigram", "kgw"]
    gamma: Fraction = 0.5
    delta: NonNegativeFloat = 2.0
    kgw_context: int = Field(default=1, ge=1, le=8)  # h previous tokens seed KGW's green list (repo: 4)
    key: PositiveInt = 15485863
    z_threshold: PositiveFloat = 4.0
    fpr: Fraction = 0.01  # calibrated threshold on unwatermarked texts


class ModelCfg(Strict):
    d_model: int = Field(default=64, ge=8)
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4
    max_len: int = Field(default=192, ge=16)


class LMTrain(Strict):
    steps: PositiveInt
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 3e-3


class SFT(LMTrain):
    paraphrase_fraction: Probability = 0.75  # the rest is [Q] question → answer
    copy_prob: Probability = 0.7  # keep the source synonym


class RL(Strict):
    updates: PositiveInt = 80
    prompts_per_update: PositiveInt = 4
    group_size: int = Field(default=8, ge=2)
    temperature: PositiveFloat = 0.7
    max_new_factor: float = Field(default=1.25, ge=1.0, le=4.0)  # rewrite budget / source length
    lr: PositiveFloat = 3e-4
    schedule: Literal["constant", "cosine"] = "constant"  # cosine: the repo's (warm-up 0.1, min-lr ratio 0.1)
    beta: NonNegativeFloat = 0.04
    w_kl: NonNegativeFloat = 0.9
    w_sem: NonNegativeFloat = 15.0
    w_ppl: NonNegativeFloat = 0.1
    sem_threshold: Fraction = 0.85  # s0 of the sigmoid semantic reward
    grad_clip: PositiveFloat = 1.0
    adv_eps: PositiveFloat = 1e-4
    oracle_z_weight: NonNegativeFloat = 0.25  # oracle_rl: r_sem − w·z (detector access)
    ablation_seeds: PositiveInt = 1  # grpo_sem_only / oracle_rl run this many seeds


class Eval(Strict):
    temperature: PositiveFloat = 0.7
    success_sim: float = Field(default=0.85, gt=0, le=1)  # joint success: z < threshold and s ≥ this
    repo_sim: float = Field(default=0.7, gt=0, le=1)  # the repo's success: s > 0.7
    batch_size: PositiveInt = 512


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.corpus_path": "parquet", "data.lexicon_path": "parquet"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    data: Data = Data()
    watermark: Watermark = Watermark()
    model: ModelCfg = ModelCfg()
    generator: LMTrain
    attacker: SFT
    rl: RL = RL()
    eval: Eval = Eval()
    variants: names_of(VARIANTS)  # one train.<variant> node each
