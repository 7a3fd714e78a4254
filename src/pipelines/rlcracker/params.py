"""Typed parameters of `rlcracker`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipelines.core.params import MethodParams, Strict, known_names

VARIANTS = ("no_attack", "sft_paraphrase", "random_sub30", "random_sub50", "regenerate", "rlcracker",
            "grpo_sem_only", "oracle_rl")
RL_VARIANTS = ("rlcracker", "grpo_sem_only", "oracle_rl")
Scheme = Literal["unigram", "kgw"]


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    seed: int = Field(default=0, ge=0)              # the language, the corpus and the shared models
    n_concepts: int = Field(default=40, ge=2, le=10_000)
    n_synonyms: int = Field(default=4, ge=2, le=16)
    synonym_pref: list[float] = Field(default=[0.55, 0.25, 0.12, 0.08])   # Zipf-like human preference
    n_topics: int = Field(default=8, ge=1, le=1000)
    transition_logit_std: float = Field(default=2.0, gt=0)
    answer_len: int = Field(default=32, ge=4, le=512)      # one chunk (short text) in tokens
    long_chunks: int = Field(default=8, ge=1, le=64)        # a long text is this many chunks
    n_lm_train: int = Field(default=4000, ge=8)             # question → answer pairs (generator, attacker SFT)
    n_wm_train: int = Field(default=100, ge=2)              # watermarked texts the attacker trains on
    n_test: int = Field(default=60, ge=2)                   # test texts per length
    n_null: int = Field(default=100, ge=2)                  # unwatermarked texts per length (FPR calibration)
    corpus_path: str | None = None                          # source=file: parquet (split, question, answer)
    lexicon_path: str | None = None                         # source=file: parquet (token, concept[, pref])

    @model_validator(mode="after")
    def _check(self):
        if len(self.synonym_pref) != self.n_synonyms:
            raise ValueError(f"synonym_pref has {len(self.synonym_pref)} entries but n_synonyms is "
                             f"{self.n_synonyms}")
        if any(x <= 0 for x in self.synonym_pref):
            raise ValueError("synonym_pref entries must be > 0")
        if self.source == "file" and not (self.corpus_path and self.lexicon_path):
            raise ValueError("source 'file' needs corpus_path and lexicon_path")
        return self


class Watermark(Strict):
    train_scheme: Scheme = "unigram"                # the texts the RL attackers train on
    eval_schemes: list[Scheme] = Field(default=["unigram", "kgw"], min_length=1)
    gamma: float = Field(default=0.5, gt=0, lt=1)
    delta: float = Field(default=2.0, ge=0)
    kgw_context: int = Field(default=1, ge=1, le=8)   # h previous tokens seed KGW's green list (repo: 4)
    key: int = Field(default=15485863, ge=1)
    z_threshold: float = Field(default=4.0, gt=0)
    fpr: float = Field(default=0.01, gt=0, lt=1)      # calibrated threshold on unwatermarked texts

    @field_validator("eval_schemes")
    @classmethod
    def _schemes(cls, v):
        return known_names(v, ("unigram", "kgw"), "scheme")


class ModelCfg(Strict):
    d_model: int = Field(default=64, ge=8)
    n_layers: int = Field(default=2, ge=1)
    n_heads: int = Field(default=4, ge=1)
    max_len: int = Field(default=192, ge=16)


class LMTrain(Strict):
    steps: int = Field(ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=3e-3, gt=0)


class SFT(LMTrain):
    paraphrase_fraction: float = Field(default=0.75, ge=0, le=1)   # the rest is [Q] question → answer
    copy_prob: float = Field(default=0.7, ge=0, le=1)              # keep the source synonym


class RL(Strict):
    updates: int = Field(default=80, ge=1)
    prompts_per_update: int = Field(default=4, ge=1)
    group_size: int = Field(default=8, ge=2)
    temperature: float = Field(default=0.7, gt=0)
    max_new_factor: float = Field(default=1.25, ge=1.0, le=4.0)    # rewrite budget / source length
    lr: float = Field(default=3e-4, gt=0)
    schedule: Literal["constant", "cosine"] = "constant"   # cosine: the repo's (warm-up 0.1, min-lr ratio 0.1)
    beta: float = Field(default=0.04, ge=0)
    w_kl: float = Field(default=0.9, ge=0)
    w_sem: float = Field(default=15.0, ge=0)
    w_ppl: float = Field(default=0.1, ge=0)
    sem_threshold: float = Field(default=0.85, gt=0, lt=1)        # s0 of the sigmoid semantic reward
    grad_clip: float = Field(default=1.0, gt=0)
    adv_eps: float = Field(default=1e-4, gt=0)
    oracle_z_weight: float = Field(default=0.25, ge=0)            # oracle_rl: r_sem − w·z (detector access)
    ablation_seeds: int = Field(default=1, ge=1)                  # grpo_sem_only / oracle_rl run this many seeds


class Eval(Strict):
    temperature: float = Field(default=0.7, gt=0)
    success_sim: float = Field(default=0.85, gt=0, le=1)         # joint success: z < threshold and s ≥ this
    repo_sim: float = Field(default=0.7, gt=0, le=1)             # the repo's success: s > 0.7
    batch_size: int = Field(default=512, ge=1)


class Params(MethodParams):
    data: Data = Data()
    watermark: Watermark = Watermark()
    model: ModelCfg = ModelCfg()
    generator: LMTrain
    attacker: SFT
    rl: RL = RL()
    eval: Eval = Eval()
    variants: list[str] = Field(min_length=1)       # one train.<variant> node each

    @field_validator("variants")
    @classmethod
    def _variants(cls, v):
        return known_names(v, VARIANTS)
