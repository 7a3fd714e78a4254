"""Typed parameters of `adamspike`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from pipelines.core.api import Fraction, MethodParams, Strict, VariantName


class Quad(Strict):
    """The 1-D quadratic f(θ) = ½ a θ² (the 'geometry alone cannot explain it' counterexample)."""

    a: PositiveFloat = 1.0
    theta0: float = 1.0
    lr: PositiveFloat = 0.1
    steps: int = Field(default=2000, ge=10)

    @field_validator("theta0")
    @classmethod
    def _nonzero(cls, v: float) -> float:
        if v == 0:
            raise ValueError("theta0 must be non-zero (θ = 0 is already the minimum)")
        return v


class Mlp(Strict):
    """The small MLP 1 → width (tanh) → 1 on fn64 (or a user table), full-batch MSE in float64."""

    width: PositiveInt = 64
    n_points: int = Field(default=64, ge=4)  # equispaced x in [-π, π] (built-in data)
    steps: int = Field(default=12000, ge=10)
    lr: PositiveFloat = 1e-2
    data_path: str | None = None  # .parquet / .csv with float columns x, y (README)


class Variant(Strict):
    """One training run configuration (run for every seed)."""

    model: Literal["quad", "mlp"]
    optimizer: Literal["adam", "gd"] = "adam"
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: Fraction = 0.999
    eps: NonNegativeFloat = 1e-8
    track: bool = True  # MLP: Hessian-vector products every step (λ_grad, λ_max(Ĥ), λ_max(H)); quad: always


class Tracking(Strict):
    power_iters: int = Field(default=3, ge=1, le=100)  # warm-started power-iteration HVPs per step for λ_max(Ĥ)
    raw_power_iters: int = Field(default=1, ge=1, le=100)  # the same for the raw λ_max(H) (changes slowly)
    hvp: Literal["analytic", "autograd"] = "analytic"  # numpy R-operator or torch double-backward


class Spikes(Strict):
    factor: float = Field(default=10.0, gt=1)  # loss_t > factor × min(previous `window` losses)
    factor_strict: float = Field(default=100.0, gt=1)  # the stricter definition, reported beside
    window: PositiveInt = 100
    merge: NonNegativeInt = 200  # detections closer than this are one event


class Predictor(Strict):
    k: PositiveInt = 10  # consecutive steps a condition must hold for an alarm
    horizon: PositiveInt = 50  # an alarm is true if a spike is detected ≤ horizon later


class Stages(Strict):
    decoupled_ratio: Fraction = 0.1  # Σg²/Σv̂ below this: v decoupled from g²


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"mlp.data_path": "csv"}
    device: Literal["auto", "cpu", "cuda"] = "cpu"  # the 193-parameter MLP is fastest on the CPU
    quad: Quad = Field(default_factory=Quad)
    mlp: Mlp = Field(default_factory=Mlp)
    configs: dict[VariantName, Variant] = Field(min_length=1)  # every known run configuration, by variant name
    variants: list[str] = Field(min_length=1)  # the ones this run trains: one train.<variant> node each
    headline_variants: list[str] = Field(default_factory=list)  # tracked Adam runs the predictor study pools
    tracking: Tracking = Field(default_factory=Tracking)
    spikes: Spikes = Field(default_factory=Spikes)
    predictor: Predictor = Field(default_factory=Predictor)
    stages: Stages = Field(default_factory=Stages)
    history_points: int = Field(default=1000, ge=10, le=1000)  # MLflow curve points per series

    @model_validator(mode="after")
    def _consistent(self):
        unknown = [v for v in self.variants if v not in self.configs]
        if unknown:
            raise ValueError(f"variants: {unknown} not defined under configs (known: {sorted(self.configs)})")
        for v in self.headline_variants:
            if v not in self.variants:
                raise ValueError(f"headline_variants: {v!r} is not in variants {self.variants}")
            c = self.configs[v]
            if c.model != "mlp" or not c.track:
                raise ValueError(f"headline_variants: {v!r} must be a tracked mlp run (track: true)")
        return self
