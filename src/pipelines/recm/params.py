"""Typed parameters of `recm`: node functions take `Params` as a type hint, Kedro validates it before
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

from pipelines.core.api import MethodParams, Probability, Strict, VariantName


class Data(Strict):
    """Periodic advection–diffusion u_t + c(x)u_x = ν(x)u_xx; ε breaks the translation symmetry."""

    path: str | None = None  # a user parquet table (README); None: simulate
    L: int = Field(default=32, ge=4, le=256)
    eps: list[float] = Field(min_length=1)  # symmetry-breaking knob values (one dataset each)
    n_train: int = Field(default=4000, ge=16)
    n_test: int = Field(default=1000, ge=16)
    c0: NonNegativeFloat = 1.0
    nu0: NonNegativeFloat = 0.1
    dt: PositiveFloat = 4.0
    substeps: PositiveInt = 20
    n_modes: PositiveInt = 4
    max_wavenumber: PositiveInt = 6
    seed: NonNegativeInt = 1234  # the data stream (the training seeds vary init and batches)

    @field_validator("eps")
    @classmethod
    def _eps(cls, v: list[float]) -> list[float]:
        if any(e < 0 or e > 2 for e in v):
            raise ValueError(f"every ε must be in [0, 2], got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"ε values must be distinct, got {v}")
        return v


class Model(Strict):
    channels: PositiveInt = 8
    hidden: PositiveInt = 3  # hidden relaxed layers (plus the relaxed output layer)
    kernel: PositiveInt = 5
    u_init: Literal["zero", "random"] = "zero"  # the relaxed branch U (unconstrained nets always start random)

    @field_validator("kernel")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError(f"kernel must be odd (circular padding k//2 keeps the length), got {v}")
        return v


class Train(Strict):
    """The one budget every variant gets (same optimizer, steps, batch)."""

    steps: PositiveInt = 1500
    batch_size: int = Field(default=64, ge=2)
    lr: PositiveFloat = 1e-3
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    weight_decay: NonNegativeFloat = 0.0  # every variant but RPP (which sets its own)
    grad_clip: PositiveFloat | None = None
    log_every: PositiveInt = 5  # history points (θ, loss) every this many steps
    equiv_test_inputs: PositiveInt = 256  # test inputs behind equiv_error (all L-1 shifts)


class Recm(Strict):
    """The RECM rule (a reconstruction satisfying the abstract's properties)."""

    alpha: float = Field(default=0.01, gt=0, le=1)  # θ ← (1−α)θ + α s
    beta: float = Field(default=0.99, ge=0, lt=1)  # EMA of the dense-map gradients and of their norm
    theta0: Probability = 1.0  # start relaxed, as CR does
    tau: Probability = 0.05  # after training, layers with θ < τ drop U


class Variant(Strict):
    """One trained variant. kind: strict (θ ≡ 0), unconstrained (dense maps only), fixed (θ ≡ theta),
    rpp (θ ≡ 1, weight decay wd_u on U and wd_e on E), cr (θ linear 1 → 0 plus penalty·‖P⊥U‖², branch
    dropped at the end), recm (θ by the RECM rule ``rule``)."""

    kind: Literal["strict", "unconstrained", "fixed", "rpp", "cr", "recm"]
    theta: Probability | None = None
    wd_u: NonNegativeFloat = 1e-3
    wd_e: NonNegativeFloat = 1e-5
    penalty: NonNegativeFloat = 1e-2
    rule: Literal["two_ema", "single_ema", "grad_at_eq", "branch_violation"] = "two_ema"
    shuffle_targets: bool = False  # control: targets permuted across training samples (θ must decay too)

    @model_validator(mode="after")
    def _theta_for_fixed(self) -> Variant:
        if self.kind == "fixed" and self.theta is None:
            raise ValueError("kind 'fixed' needs theta")
        return self


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.path": "parquet"}
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data
    model: Model = Field(default_factory=Model)
    train: Train = Field(default_factory=Train)
    recm: Recm = Field(default_factory=Recm)
    variants: dict[VariantName, Variant] = Field(min_length=1)  # one train.<variant> node each
    plot_seed: int = 0
