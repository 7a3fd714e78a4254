"""Typed parameters of `svgt`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import Annotated, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Probability, Strict, VariantSeeds, names_of

VARIANTS = ("svgt", "svgt_dz0", "soft_prompt", "caa", "iti", "sys_prompt", "no_intervention", "lora_sft")
WRAPPER_NAMES = (
    "plain",
    "roleplay",
    "hypothetical",
    "prefix_injection",
    "preamble",
    "translation",
    "story",
    "research",
)


class Data(Strict):
    world_seed: int = 2026
    n_topics: int = Field(default=12, ge=2, le=16)
    n_verbs: int = Field(default=10, ge=3, le=12)
    n_targets: int = Field(default=12, ge=2, le=14)
    n_new_verbs: int = Field(default=3, ge=1, le=6)
    eval_pair_fraction: Fraction = 0.3
    ood_wrappers: Annotated[names_of(WRAPPER_NAMES, "wrapper"), Field(max_length=4)] = [
        "translation",
        "story",
        "research",
    ]
    n_pretrain: int = Field(default=6000, ge=100)
    sys_fraction: Probability = 0.25
    p_harm: Probability = 0.9
    p_harm_sys: Probability = 0.4
    benign_repeats: PositiveInt = 4
    n_safe_verbs: int = Field(default=4, ge=0, le=6)  # benign look-alikes "HOW TO <safe verb> <target>"
    lookalike_fraction: Probability = 0.3  # share of benign pre-training rows
    user_path: str | None = None  # a parquet/csv corpus with the synthetic corpus's columns


class Backbone(Strict):
    d_model: int = Field(default=128, ge=8)
    n_layers: int = Field(default=4, ge=2)
    n_heads: PositiveInt = 4
    steps: PositiveInt = 600
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 2e-3
    weight_decay: NonNegativeFloat = 0.01


class Value(Strict):
    extract_layer: NonNegativeInt = 1  # read block l's output; bridge spliced after block l
    value_dim: int = Field(default=32, ge=4)
    n_layers: PositiveInt = 1
    n_heads: PositiveInt = 4
    scale_init: float = 3.0
    steps: PositiveInt = 200  # per stage
    batch_size: PositiveInt = 32
    lr_stage1: PositiveFloat = 1e-3
    lr_stage2_new: PositiveFloat = 5e-3
    lr_stage2_old: PositiveFloat = 1e-4


class Bridge(Strict):
    k: int = Field(default=4, ge=1, le=64)
    n_heads: PositiveInt = 8
    gate_init: float = -2.0
    steps: PositiveInt = 200
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 5e-4
    weight_decay: NonNegativeFloat = 1e-5
    grad_clip: PositiveFloat = 1.0
    lambda_ce: NonNegativeFloat = 0.5
    lambda_safe: NonNegativeFloat = 2.0
    lambda_reg: NonNegativeFloat = 0.1
    reg_margin: NonNegativeFloat = 0.2
    soft_prompt_lr: PositiveFloat = 5e-3  # raw vectors need a larger step than a generator


class Steering(Strict):
    caa_coefs: list[float] = Field(default=[1.0, 2.0, 4.0], min_length=1)
    iti_alphas: list[float] = Field(default=[5.0, 15.0], min_length=1)


class Lora(Strict):
    rank: PositiveInt = 4
    alpha: PositiveFloat = 8.0
    steps: PositiveInt = 200
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 1e-3


class Eval(Strict):
    max_new_tokens: PositiveInt = 5
    batch_size: PositiveInt = 512
    comparable_reduction: Probability = 0.7  # "comparable" harm reduction for CAA/ITI
    wrecked_nll_increase: NonNegativeFloat = 1.0  # nats/token that count as wrecking fluency


class Params(MethodParams, VariantSeeds):
    USER_FILES: ClassVar[dict[str, str]] = {"data.user_path": "parquet"}
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data = Data()
    backbone: Backbone = Backbone()
    value: Value = Value()
    bridge: Bridge = Bridge()
    steering: Steering = Steering()
    lora: Lora = Lora()
    eval: Eval = Eval()
    variants: names_of(VARIANTS)  # one train.<variant> node each

    def known_variants(self) -> list[str]:
        return list(VARIANTS)

    @model_validator(mode="after")
    def _layers(self):
        if self.value.extract_layer > self.backbone.n_layers - 2:
            raise ValueError(
                f"value.extract_layer={self.value.extract_layer} leaves fewer than 2 blocks above "
                f"the splice (backbone.n_layers={self.backbone.n_layers})"
            )
        if self.backbone.d_model % self.bridge.n_heads:
            raise ValueError(f"bridge.n_heads={self.bridge.n_heads} must divide backbone.d_model")
        if self.value.value_dim % self.value.n_heads:
            raise ValueError(f"value.n_heads={self.value.n_heads} must divide value.value_dim")
        if "no_intervention" not in self.variants:
            raise ValueError("variants must include 'no_intervention' (harm reductions are relative to it)")
        return self
