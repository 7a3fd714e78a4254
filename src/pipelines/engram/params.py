"""Typed parameters of `engram` (Kedro validates ``params:engram`` into :class:`Params` before any node
runs; a bad value stops the command with one line naming its key)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipelines.core.api import Fraction, MethodParams, Probability, Strict

# every edit variant (one train.<variant> node each); train.original (the metrics of the model all edits
# start from) is always built
VARIANTS = (
    "engram",
    "engram_last_layer",
    "no_pinv",
    "random_edit",
    "random_edit_data_norm",
    "retrain",
    "grad_ascent",
    "neggrad_plus",
    "finetune_retain",
)
Variant = Literal[
    "engram",
    "engram_last_layer",
    "no_pinv",
    "random_edit",
    "random_edit_data_norm",
    "retrain",
    "grad_ascent",
    "neggrad_plus",
    "finetune_retain",
]
Rcond = Annotated[float, Field(gt=0, lt=1)]
Lr = Annotated[float, Field(gt=0, le=10)]


class Data(Strict):
    """``digits``: sklearn's bundled 8×8 digits (/16); ``file``: a user CSV (README: columns ``label`` and
    ``x_*``). A constant 1 is appended to every input (it absorbs the first layer's bias)."""

    source: Literal["digits", "file"] = "digits"
    path: str | None = None
    test_fraction: Fraction = 0.3  # stratified split, one per seed
    limit: int | None = Field(default=None, ge=20)  # keep this many rows (stratified), tests only

    @model_validator(mode="after")
    def _path_for_file(self) -> Data:
        if self.source == "file" and not self.path:
            raise ValueError("source 'file' needs data.path (a CSV with columns label, x_*)")
        return self


class Model(Strict):
    """The bias-free ReLU MLP (input+1 → hidden… → classes) and its SGD recipe (momentum 0.9: core's sgd);
    retrain-from-scratch reuses it."""

    hidden: list[Annotated[int, Field(ge=1, le=4096)]] = Field(min_length=1)
    epochs: PositiveInt
    batch_size: PositiveInt
    lr: Lr
    weight_decay: NonNegativeFloat = 0.0


class Engram(Strict):
    """The closed-form estimator E_S = W Σ_S Σ_R⁺ and its experiments (E1–E5 of the README)."""

    rcond: Rcond = 1.0e-6  # pinv cutoff relative to the largest eigenvalue
    rcond_sweep: list[Rcond] = Field(default_factory=lambda: [1.0e-8, 1.0e-6, 1.0e-4])
    alpha_max: float = Field(default=1.5, gt=0, le=10)
    alpha_points: int = Field(default=16, ge=2, le=200)
    n_compose: PositiveInt = 10  # random subsets S composed from zero
    compose_max_size: PositiveInt = 5
    arithmetic_pair: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [3, 7]
    )
    no_pinv_k: PositiveInt = 8  # top-k class PCs the no-pinv ablation removes
    timing_repeats: PositiveInt = 5  # an edit is timed as the median of repeats

    @field_validator("arithmetic_pair")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if v[0] == v[1]:
            raise ValueError(f"the two classes must differ, got {v}")
        return v


class Unlearn(Strict):
    """Iterative baselines. grad_ascent, neggrad_plus and finetune_retain share one budget (``steps`` SGD
    steps of ``batch_size``) and one learning-rate grid; each picks its lr on TRAINING data only: among the
    lrs whose train-forget accuracy ends ≤ ``forget_target``, the best train-retain accuracy (none: the
    lowest train-forget accuracy)."""

    classes: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)  # classes the baselines forget
    steps: PositiveInt
    batch_size: PositiveInt
    lrs: list[Lr] = Field(min_length=1)
    forget_target: Probability = 0.10
    retain_weight: Fraction = 0.5  # NegGrad+: β·CE(retain) − (1−β)·CE(forget)
    ce_cap: PositiveFloat = 20.0  # ascent stops pushing a sample past this CE
    grad_clip: PositiveFloat | None = 1.0
    log_every: PositiveInt = 5  # train-forget/retain accuracy curve (seed 0)

    @field_validator("classes")
    @classmethod
    def _unique(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"classes repeat: {v}")
        return v


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.path": "csv"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    device: Literal["cpu"] = "cpu"  # tiny MLPs and float64 edits: everything runs on the CPU
    data: Data = Field(default_factory=Data)
    model: Model
    engram: Engram = Field(default_factory=Engram)
    unlearn: Unlearn
    variants: list[Variant] = Field(min_length=1)
    plot_seed: int | None = None  # the seed whose heatmaps are drawn (None: the first)

    def planned_variants(self) -> list[str]:
        """``original`` (train.original, the model every edit starts from) and the edit variants."""
        return ["original", *self.variants]

    @field_validator("plot_seed")
    @classmethod
    def _plot_seed_in_seeds(cls, v: int | None, info: ValidationInfo) -> int | None:
        seeds = info.data.get("seeds")
        if v is not None and seeds is not None and v not in seeds:
            raise ValueError(f"plot_seed {v} is not one of the seeds {seeds}")
        return v
