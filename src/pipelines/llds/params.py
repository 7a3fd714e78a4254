"""Typed parameters of `llds`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipelines.core.params import MethodParams, Strict, VariantSeeds, known_names

# every variant the pipeline knows: the method, its gate ablation, the MA refinement, the baselines
VARIANTS = ("grpo", "llds", "llds_rgate", "llds_ma", "nll_pos", "grpo_kl", "grpo_hilr", "llds_hilr")


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    n_persons: int = Field(default=150, ge=8)
    n_cities: int = Field(default=40, ge=5)
    n_countries: int = Field(default=10, ge=5)
    n_orgs: int = Field(default=30, ge=5)
    p_true: float = Field(default=0.9, ge=0, le=1)        # the true fact sits in slot 1 with this probability
    n_facts: int = Field(default=3, ge=1, le=8)           # facts per info block
    ood_obs: bool = False                                 # info entities use ids the policy never emits
    n_test_per_type: int = Field(default=150, ge=1)       # greedy test episodes per question type
    n_probe: int = Field(default=200, ge=2)               # fixed probe trajectories sampled from the SFT policy
    eval_seed: int = Field(default=12345, ge=0)           # test episodes and the tool's draws during eval
    facts_path: str | None = None                         # source=file: parquet subject, relation, object
    questions_path: str | None = None                     # source=file: parquet subject, relations, answer
    test_fraction: float = Field(default=0.2, gt=0, lt=1)  # source=file: held-out questions

    @model_validator(mode="after")
    def _paths(self):
        if self.source == "file" and not (self.facts_path and self.questions_path):
            raise ValueError("facts_path: source 'file' needs facts_path and questions_path (parquet files)")
        return self


class ModelParams(Strict):
    d_model: int = Field(default=64, ge=8)
    n_layers: int = Field(default=2, ge=1)
    n_heads: int = Field(default=4, ge=1)


class SFT(Strict):
    steps: int = Field(default=600, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    corrupt: float = Field(default=0.33, ge=0, lt=1)      # fraction of gold answers replaced by a random entity
    seed: int = Field(default=0, ge=0)                    # the one shared SFT checkpoint


class RL(Strict):
    iterations: int = Field(default=100, ge=1)
    questions: int = Field(default=16, ge=1)              # prompts per rollout batch
    group_size: int = Field(default=5, ge=2)              # G rollouts per prompt
    minibatches: int = Field(default=4, ge=1)             # optimizer steps per rollout batch (π_θ ≠ π_old from the 2nd)
    temperature: float = Field(default=1.0, gt=0)
    lr: float = Field(default=1e-3, gt=0)
    high_lr: float = Field(default=3e-3, gt=0)            # *_hilr variants
    hilr_iterations: int = Field(default=30, ge=1)        # *_hilr variants (the collapse comes early)
    clip: float = Field(default=0.2, gt=0, lt=1)
    kl_coef: float = Field(default=0.001, ge=0)
    strong_kl_coef: float = Field(default=0.05, ge=0)     # grpo_kl
    entropy_coef: float = Field(default=0.001, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    adam_eps: float = Field(default=1e-8, gt=0)
    nll_coef: float = Field(default=0.2, ge=0)            # nll_pos
    eval_every: int = Field(default=10, ge=1)             # greedy test EM and probe re-scoring

    @model_validator(mode="after")
    def _split(self):
        if (self.questions * self.group_size) % self.minibatches:
            raise ValueError(f"minibatches: questions·group_size = {self.questions * self.group_size} must split "
                             f"into {self.minibatches} equal mini-batches")
        return self


class LLDS(Strict):
    lam: float = Field(default=0.2, gt=0)                 # λ (NO_REDUCE_LAMBDA)
    ma_weight: float = Field(default=0.1, ge=0)           # LLDS-MA: answer-token coefficient min(ma_weight, λ)
    ma_adaptive: bool = False                             # × max(mean valid searches − 1, 0)


class Collapse(Strict):
    drop: float = Field(default=0.5, gt=0, lt=1)          # greedy EM below drop × its running max ...
    min_max: float = Field(default=0.2, ge=0, le=1)       # ... once that max reached this


class Params(MethodParams, VariantSeeds):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data = Data()
    model: ModelParams = ModelParams()
    sft: SFT = SFT()
    rl: RL = RL()
    llds: LLDS = LLDS()
    collapse: Collapse = Collapse()
    variants: list[str] = Field(min_length=1)             # one train.<variant> node each

    @field_validator("variants")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        return known_names(v, VARIANTS)

    def known_variants(self) -> list[str]:
        return list(VARIANTS)
