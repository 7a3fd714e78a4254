"""Typed parameters of `llds`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Probability, Strict, VariantSeeds, names_of

# every variant the pipeline knows: the method, its gate ablation, the MA refinement, the baselines
VARIANTS = ("grpo", "llds", "llds_rgate", "llds_ma", "nll_pos", "grpo_kl", "grpo_hilr", "llds_hilr")


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    n_persons: int = Field(default=150, ge=8)
    n_cities: int = Field(default=40, ge=5)
    n_countries: int = Field(default=10, ge=5)
    n_orgs: int = Field(default=30, ge=5)
    p_true: Probability = 0.9  # the true fact sits in slot 1 with this probability
    n_facts: int = Field(default=3, ge=1, le=8)  # facts per info block
    ood_obs: bool = False  # info entities use ids the policy never emits
    n_test_per_type: PositiveInt = 150  # greedy test episodes per question type
    n_probe: int = Field(default=200, ge=2)  # fixed probe trajectories sampled from the SFT policy
    eval_seed: NonNegativeInt = 12345  # test episodes and the tool's draws during eval
    facts_path: str | None = None  # source=file: parquet subject, relation, object
    questions_path: str | None = None  # source=file: parquet subject, relations, answer
    test_fraction: Fraction = 0.2  # source=file: held-out questions

    @model_validator(mode="after")
    def _paths(self):
        if self.source == "file" and not (self.facts_path and self.questions_path):
            raise ValueError("facts_path: source 'file' needs facts_path and questions_path (parquet files)")
        return self


class ModelParams(Strict):
    d_model: int = Field(default=64, ge=8)
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4


class SFT(Strict):
    steps: PositiveInt = 600
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 3e-3
    corrupt: float = Field(default=0.33, ge=0, lt=1)  # fraction of gold answers replaced by a random entity
    seed: NonNegativeInt = 0  # the one shared SFT checkpoint


class RL(Strict):
    iterations: PositiveInt = 100
    questions: PositiveInt = 16  # prompts per rollout batch
    group_size: int = Field(default=5, ge=2)  # G rollouts per prompt
    minibatches: PositiveInt = 4  # optimizer steps per rollout batch (π_θ ≠ π_old from the 2nd)
    temperature: PositiveFloat = 1.0
    lr: PositiveFloat = 1e-3
    high_lr: PositiveFloat = 3e-3  # *_hilr variants
    hilr_iterations: PositiveInt = 30  # *_hilr variants (the collapse comes early)
    clip: Fraction = 0.2
    kl_coef: NonNegativeFloat = 0.001
    strong_kl_coef: NonNegativeFloat = 0.05  # grpo_kl
    entropy_coef: NonNegativeFloat = 0.001
    grad_clip: PositiveFloat = 1.0
    adam_eps: PositiveFloat = 1e-8
    nll_coef: NonNegativeFloat = 0.2  # nll_pos
    eval_every: PositiveInt = 10  # greedy test EM and probe re-scoring

    @model_validator(mode="after")
    def _split(self):
        if (self.questions * self.group_size) % self.minibatches:
            raise ValueError(
                f"minibatches: questions·group_size = {self.questions * self.group_size} must split "
                f"into {self.minibatches} equal mini-batches"
            )
        return self


class LLDS(Strict):
    lam: PositiveFloat = 0.2  # λ (NO_REDUCE_LAMBDA)
    ma_weight: NonNegativeFloat = 0.1  # LLDS-MA: answer-token coefficient min(ma_weight, λ)
    ma_adaptive: bool = False  # × max(mean valid searches − 1, 0)


class Collapse(Strict):
    drop: Fraction = 0.5  # greedy EM below drop × its running max ...
    min_max: Probability = 0.2  # ... once that max reached this


class Params(MethodParams, VariantSeeds):
    USER_FILES: ClassVar[dict[str, str]] = {"data.facts_path": "parquet", "data.questions_path": "parquet"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data = Data()
    model: ModelParams = ModelParams()
    sft: SFT = SFT()
    rl: RL = RL()
    llds: LLDS = LLDS()
    collapse: Collapse = Collapse()
    variants: names_of(VARIANTS)  # one train.<variant> node each

    def known_variants(self) -> list[str]:
        return list(VARIANTS)
