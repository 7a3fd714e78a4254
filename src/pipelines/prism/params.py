"""Typed parameters of `prism`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""
from typing import Literal

from pydantic import Field, model_validator

from pipelines.core.params import MethodParams, Strict

Gauge = Literal["s1", "s0.1", "s10", "cond100"]


class Data(Strict):
    """The `prism_teacher` task: a confident tanh MLP teacher (the public model) whose two hidden weight
    matrices get rank-k perturbations, scaled by bisection so `flip_frac` of the labels change."""
    seed: int = Field(default=0, ge=0)
    n_in: int = Field(ge=2)
    hidden: int = Field(ge=2)
    n_classes: int = Field(ge=2)
    out_scale: float = Field(gt=0)
    perturb_rank: int = Field(ge=1)
    flip_frac: float = Field(gt=0, lt=1)
    n_train: int = Field(ge=50)
    n_test: int = Field(ge=50)
    path: str | None = None          # user table (full env): columns x0..x{d-1}, y, split


class Privacy(Strict):
    delta: float = Field(gt=0, lt=1)
    batch_size: int = Field(ge=1)    # expected (Poisson) batch size b; q = b / n_train
    epochs: int = Field(ge=1)
    clip: float = Field(gt=0)        # C, joint over all adapted modules
    main_epsilon: float = Field(gt=0)


class Lora(Strict):
    rank: int = Field(ge=1)
    init_scale: float = Field(gt=0)  # balanced init: S0 = init_scale * ||W||_2
    gauge_init: Literal["standard", "balanced"] = "standard"   # naive DP-LoRA's init in the gauge test


class Adaptive(Strict):
    beta1: float = Field(ge=0, lt=1)
    beta2: float = Field(ge=0, lt=1)
    floor: float = Field(gt=0)       # floor of the signal second moment, as a fraction of the noise energy


class VariantCfg(Strict):
    mechanism: Literal["nonprivate", "naive", "ffa", "dense", "prism"]
    optimizer: Literal["sgd", "adam", "adaptive"]
    lr: float = Field(gt=0)
    epsilons: list[float] = Field(default_factory=list)   # empty: non-private (one run)
    gauges: list[Gauge] = Field(default_factory=list)     # gauge stress test at main_epsilon


class Params(MethodParams):
    data: Data
    privacy: Privacy
    lora: Lora
    adaptive: Adaptive
    variants: list[str] = Field(min_length=1)       # one train.<variant> node each
    methods: dict[str, VariantCfg]
    dtype: Literal["float32", "float64"] = "float64"
    gauge_seeds: list[int] | None = None    # seeds that run the gauge stress test (None: all seeds)

    @model_validator(mode="after")
    def _variants_have_methods(self):
        missing = [v for v in self.variants if v not in self.methods]
        if missing:
            raise ValueError(f"variants {missing} have no entry under prism.methods")
        return self
