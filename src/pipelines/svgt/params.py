"""Typed parameters of `svgt`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipelines.core.params import MethodParams, Strict, VariantSeeds, known_names

VARIANTS = ("svgt", "svgt_dz0", "soft_prompt", "caa", "iti", "sys_prompt", "no_intervention", "lora_sft")
WRAPPER_NAMES = ("plain", "roleplay", "hypothetical", "prefix_injection", "preamble", "translation", "story",
                 "research")


class Data(Strict):
    world_seed: int = 2026
    n_topics: int = Field(default=12, ge=2, le=16)
    n_verbs: int = Field(default=10, ge=3, le=12)
    n_targets: int = Field(default=12, ge=2, le=14)
    n_new_verbs: int = Field(default=3, ge=1, le=6)
    eval_pair_fraction: float = Field(default=0.3, gt=0, lt=1)
    ood_wrappers: list[str] = Field(default=["translation", "story", "research"], min_length=1, max_length=4)
    n_pretrain: int = Field(default=6000, ge=100)
    sys_fraction: float = Field(default=0.25, ge=0, le=1)
    p_harm: float = Field(default=0.9, ge=0, le=1)
    p_harm_sys: float = Field(default=0.4, ge=0, le=1)
    benign_repeats: int = Field(default=4, ge=1)
    n_safe_verbs: int = Field(default=4, ge=0, le=6)      # benign look-alikes "HOW TO <safe verb> <target>"
    lookalike_fraction: float = Field(default=0.3, ge=0, le=1)   # share of benign pre-training rows
    user_path: str | None = None           # a parquet/csv corpus with the synthetic corpus's columns

    @field_validator("ood_wrappers")
    @classmethod
    def _known(cls, v):
        return known_names(v, WRAPPER_NAMES, "wrapper")


class Backbone(Strict):
    d_model: int = Field(default=128, ge=8)
    n_layers: int = Field(default=4, ge=2)
    n_heads: int = Field(default=4, ge=1)
    steps: int = Field(default=600, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=2e-3, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)


class Value(Strict):
    extract_layer: int = Field(default=1, ge=0)       # read block l's output; bridge spliced after block l
    value_dim: int = Field(default=32, ge=4)
    n_layers: int = Field(default=1, ge=1)
    n_heads: int = Field(default=4, ge=1)
    scale_init: float = 3.0
    steps: int = Field(default=200, ge=1)             # per stage
    batch_size: int = Field(default=32, ge=1)
    lr_stage1: float = Field(default=1e-3, gt=0)
    lr_stage2_new: float = Field(default=5e-3, gt=0)
    lr_stage2_old: float = Field(default=1e-4, gt=0)


class Bridge(Strict):
    k: int = Field(default=4, ge=1, le=64)
    n_heads: int = Field(default=8, ge=1)
    gate_init: float = -2.0
    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=5e-4, gt=0)
    weight_decay: float = Field(default=1e-5, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    lambda_ce: float = Field(default=0.5, ge=0)
    lambda_safe: float = Field(default=2.0, ge=0)
    lambda_reg: float = Field(default=0.1, ge=0)
    reg_margin: float = Field(default=0.2, ge=0)
    soft_prompt_lr: float = Field(default=5e-3, gt=0)  # raw vectors need a larger step than a generator


class Steering(Strict):
    caa_coefs: list[float] = Field(default=[1.0, 2.0, 4.0], min_length=1)
    iti_alphas: list[float] = Field(default=[5.0, 15.0], min_length=1)


class Lora(Strict):
    rank: int = Field(default=4, ge=1)
    alpha: float = Field(default=8.0, gt=0)
    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=1e-3, gt=0)


class Eval(Strict):
    max_new_tokens: int = Field(default=5, ge=1)
    batch_size: int = Field(default=512, ge=1)
    comparable_reduction: float = Field(default=0.7, ge=0, le=1)  # "comparable" harm reduction for CAA/ITI
    wrecked_nll_increase: float = Field(default=1.0, ge=0)        # nats/token that count as wrecking fluency


class Params(MethodParams, VariantSeeds):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data = Data()
    backbone: Backbone = Backbone()
    value: Value = Value()
    bridge: Bridge = Bridge()
    steering: Steering = Steering()
    lora: Lora = Lora()
    eval: Eval = Eval()
    variants: list[str] = Field(min_length=1)       # one train.<variant> node each

    @field_validator("variants")
    @classmethod
    def _variants(cls, v):
        return known_names(v, VARIANTS)

    def known_variants(self) -> list[str]:
        return list(VARIANTS)

    @model_validator(mode="after")
    def _layers(self):
        if self.value.extract_layer > self.backbone.n_layers - 2:
            raise ValueError(f"value.extract_layer={self.value.extract_layer} leaves fewer than 2 blocks above "
                             f"the splice (backbone.n_layers={self.backbone.n_layers})")
        if self.backbone.d_model % self.bridge.n_heads:
            raise ValueError(f"bridge.n_heads={self.bridge.n_heads} must divide backbone.d_model")
        if self.value.value_dim % self.value.n_heads:
            raise ValueError(f"value.n_heads={self.value.n_heads} must divide value.value_dim")
        if "no_intervention" not in self.variants:
            raise ValueError("variants must include 'no_intervention' (harm reductions are relative to it)")
        return self
