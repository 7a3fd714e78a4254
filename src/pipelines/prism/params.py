"""Typed parameters of `prism`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Strict, VariantName

Gauge = Literal["s1", "s0.1", "s10", "cond100"]


class Data(Strict):
    """The `prism_teacher` task: a confident tanh MLP teacher (the public model) whose two hidden weight
    matrices get rank-k perturbations, scaled by bisection so `flip_frac` of the labels change."""

    seed: NonNegativeInt = 0
    n_in: int = Field(ge=2)
    hidden: int = Field(ge=2)
    n_classes: int = Field(ge=2)
    out_scale: PositiveFloat
    perturb_rank: PositiveInt
    flip_frac: Fraction
    n_train: int = Field(ge=50)
    n_test: int = Field(ge=50)
    path: str | None = None  # user table (full env): columns x0..x{d-1}, y, split


class Privacy(Strict):
    delta: Fraction
    batch_size: PositiveInt  # expected (Poisson) batch size b; q = b / n_train
    epochs: PositiveInt
    clip: PositiveFloat  # C, joint over all adapted modules
    main_epsilon: PositiveFloat


class Lora(Strict):
    rank: PositiveInt
    init_scale: PositiveFloat  # balanced init: S0 = init_scale * ||W||_2
    gauge_init: Literal["standard", "balanced"] = "standard"  # naive DP-LoRA's init in the gauge test


class Adaptive(Strict):
    beta1: float = Field(ge=0, lt=1)
    beta2: float = Field(ge=0, lt=1)
    floor: PositiveFloat  # floor of the signal second moment, as a fraction of the noise energy


class VariantCfg(Strict):
    mechanism: Literal["nonprivate", "naive", "ffa", "dense", "prism"]
    optimizer: Literal["sgd", "adam", "adaptive"]
    lr: PositiveFloat
    epsilons: list[float] = Field(default_factory=list)  # empty: non-private (one run)
    gauges: list[Gauge] = Field(default_factory=list)  # gauge stress test at main_epsilon


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.path": "parquet"}
    data: Data
    privacy: Privacy
    lora: Lora
    adaptive: Adaptive
    variants: list[str] = Field(min_length=1)  # one train.<variant> node each
    methods: dict[VariantName, VariantCfg]  # a configuration per variant name
    dtype: Literal["float32", "float64"] = "float64"
    gauge_seeds: list[int] | None = None  # seeds that run the gauge stress test (None: all seeds)

    @model_validator(mode="after")
    def _variants_have_methods(self):
        missing = [v for v in self.variants if v not in self.methods]
        if missing:
            raise ValueError(f"variants {missing} have no entry under prism.methods")
        return self
