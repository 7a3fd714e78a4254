"""Typed parameters of `featjnd`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationInfo, field_validator, model_validator

from pipelines.core.api import Fraction, MethodParams, Probability, Strict

N_DIGITS = 1797  # sklearn's bundled load_digits


class Data(Strict):
    # digits_canvas: seeded canvases built from sklearn's bundled digits; tensor_file: a user's .pt file
    source: Literal["digits_canvas", "tensor_file"] = "digits_canvas"
    path: str | None = None
    n_train: int = Field(default=1200, ge=20)
    n_val: int = Field(default=300, ge=10)
    n_test: int = Field(default=297, ge=10)
    test_renders: PositiveInt = 2
    canvas: int = Field(default=32, ge=16, le=256)
    upsample: int = Field(default=2, ge=1, le=8)
    clutter: Probability = 0.1
    n_strokes: int = Field(default=2, ge=0, le=20)

    @model_validator(mode="after")
    def _check(self) -> "Data":
        if self.source == "digits_canvas":
            if self.n_train + self.n_val + self.n_test > N_DIGITS:
                raise ValueError(f"n_train + n_val + n_test must be <= {N_DIGITS} (the bundled digits)")
            if self.canvas < 8 * self.upsample:
                raise ValueError("canvas must be >= 8 * upsample (the digit must fit)")
        elif not self.path:
            raise ValueError("path is required when source is 'tensor_file'")
        return self


class Backbone(Strict):
    widths: list[int] = Field(default=[16, 32, 64, 64], min_length=4, max_length=4)
    epochs: PositiveInt = 12
    lr: PositiveFloat = 2e-3
    batch_size: PositiveInt = 64


class Estimator(Strict):
    hidden: PositiveInt = 32
    k_samples: PositiveInt = 2
    epochs: PositiveInt = 8
    lr: PositiveFloat = 2e-3
    batch_size: PositiveInt = 64
    lambda_m: PositiveFloat = 0.05
    tau: PositiveFloat = 0.05
    rho: Fraction = 0.05
    eta: PositiveFloat = 0.05
    mu_init: PositiveFloat = 1.0
    j_max: PositiveFloat = 10.0
    noise_dist: Literal["gaussian", "uniform"] = "gaussian"
    magnitude_metric: Literal["mean_log", "l2"] = "mean_log"
    calib_steps: PositiveInt = 10
    calib_draws: PositiveInt = 2


class Evaluation(Strict):
    def steps_for(self, split: str) -> list[float]:
        """The quantization budgets Δ0 at ``split``: its own grid if it has one, else quant_steps."""
        return self.quant_steps_by_split.get(split, self.quant_steps)

    snr_db: list[float] = Field(default=[10.0, 5.0, 0.0, -5.0], min_length=1)
    quant_steps: list[float] = Field(default=[2.0, 3.0, 4.0], min_length=1)
    # per-split budget grid replacing quant_steps at that split (e.g. {s1: [1.75, 2.0, 2.25]}); a split
    # not named uses quant_steps
    quant_steps_by_split: dict[Literal["s1", "s2"], list[float]] = Field(default_factory=dict)
    token_aggregation: Literal["mean", "rms", "geomean"] = "mean"
    q_clip: PositiveFloat = 10.0
    sal_eps: PositiveFloat = 0.1
    occlusion_images: NonNegativeInt = 64
    occlusion_patch: PositiveInt = 2
    plot_examples: int = Field(default=8, ge=1, le=32)
    maps_saved: PositiveInt = 64

    @model_validator(mode="after")
    def _check(self) -> "Evaluation":
        if any(d <= 0 for d in self.quant_steps):
            raise ValueError("quant_steps must all be > 0")
        for sp, grid in self.quant_steps_by_split.items():
            if not grid or any(d <= 0 for d in grid) or len(set(grid)) != len(grid):
                raise ValueError(f"quant_steps_by_split.{sp} must be a non-empty list of distinct steps > 0")
        if len(set(self.snr_db)) != len(self.snr_db):
            raise ValueError("snr_db has duplicates")
        return self


# One FeatJND estimator per split point; each is a variant with its own nodes `train.<variant>` and
# `evaluate.<variant>` (E1–E3 with that split's fit-free controls).
Variant = Literal["estimator_s1", "estimator_s2"]


def split_of(variant: str) -> str:
    """``estimator_s1`` → ``s1``: the split point a variant's estimator is trained at."""
    return variant.removeprefix("estimator_")


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.path": "pt"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "tensor_file"}
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data
    backbone: Backbone
    variants: list[Variant] = Field(min_length=1)
    estimator: Estimator
    evaluation: Evaluation

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[str], info: ValidationInfo) -> list[str]:
        # a claim on a split whose estimator is not run would only fail at the report: refuse it here
        have = {split_of(x) for x in v}
        for c in [*(info.data.get("claims") or []), *(info.data.get("gates") or [])]:
            m = re.search(r"(?:^|\.)(s\d)_", c.metric)
            if m and m.group(1) not in have:
                raise ValueError(
                    f"claim '{c.id}' reads split {m.group(1)}, but estimator_{m.group(1)} is not among the variants"
                )
        return v

    def planned_variants(self) -> None:
        """The report's row is ``featjnd`` with one metric set per split; claims are checked per split above."""
        return None
