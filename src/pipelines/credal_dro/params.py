"""Typed parameters of `credal_dro`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from pipelines.core.api import Fraction, MethodParams, Strict, VariantName

TASKS = ("newsvendor", "regression", "classification")

Share = Annotated[float, Field(gt=0, lt=1)]  # a probability strictly inside (0, 1)
Radius = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def _nonempty_unique(v: list) -> list:
    if len(set(v)) != len(v):
        raise ValueError(f"values must be distinct, got {v}")
    return v


class Grids(Strict):
    """Hyper-parameter grids each variant sweeps for the robustness–accuracy frontier. The *headline*
    setting of each task (``eps``/``alpha`` of the task block) is fixed in advance, never tuned on test."""

    eps: list[Share] = Field(default_factory=lambda: [0.02, 0.05, 0.1, 0.25], min_length=1)
    alpha: list[Share] = Field(default_factory=lambda: [0.01, 0.05, 0.1], min_length=1)
    rho_wasserstein: list[Radius] = Field(min_length=1)  # radii picked on the calibration split
    rho_kl: list[Radius] = Field(default_factory=lambda: [0.01, 0.05, 0.1, 0.2], min_length=1)

    @field_validator("eps", "alpha", "rho_wasserstein", "rho_kl")
    @classmethod
    def _distinct(cls, v: list[float]) -> list[float]:
        return _nonempty_unique(v)


class Newsvendor(Strict):
    """(a) Heavy-tailed newsvendor: cost h·(x − ξ)+ + b·(ξ − x)+, demand ξ ≥ 0."""

    dist: Literal["lognormal", "pareto"] = "lognormal"
    mu: float = 3.0  # lognormal: log-demand mean
    sigma: PositiveFloat = 0.8  # lognormal: log-demand std
    pareto_index: float = Field(default=2.5, gt=1)  # pareto: tail index (finite mean)
    pareto_scale: PositiveFloat = 10.0  # pareto: minimum demand
    user_path: str | None = None  # CSV with a column 'demand' (full env); None: synthetic
    n_train: int = Field(ge=10)
    n_calib: int = Field(ge=10)
    n_test: int = Field(ge=100)  # draws per test environment (common random numbers)
    h: PositiveFloat = 1.0  # holding cost per unit over-ordered
    b: PositiveFloat = 4.0  # backorder cost per unit under-ordered
    eps_t: list[Share] = Field(default_factory=lambda: [0.1, 0.2], min_length=1)  # test contamination shares
    eps: Share = 0.1  # headline contamination share of the credal set
    alpha: Share = 0.05  # headline bulk miscoverage
    n_ref_draws: int = Field(default=2000, ge=100)  # Bayesian / parametric reference draws
    prior_kappa0: PositiveFloat = 0.01  # Normal–Inverse-Gamma prior on log-demand (weak)
    prior_a0: PositiveFloat = 1.0
    prior_b0: PositiveFloat = 1.0
    grids: Grids


class Regression(Strict):
    """(b) Covariate-shifted absolute-loss regression (default: sklearn's bundled diabetes)."""

    user_path: str | None = None  # CSV: numeric feature columns + `target` (full env); None: diabetes
    target: str = "target"
    shift_feature: str = "bmi"  # train on rows below its shift_quantile, test on the rest
    shift_quantile: Fraction = 0.6
    fit_frac: Fraction = 0.6  # of the training rows, the rest calibrates the bulk
    contam_frac: float = Field(default=0.1, ge=0, lt=1)  # test targets shifted by contam_sigma·σ_y
    contam_sigma: NonNegativeFloat = 3.0
    eps: Share = 0.02
    alpha: Share = 0.05
    grids: Grids


class Classification(Strict):
    """(c) Group-shift logistic classification (synthetic, our design; the card's (c))."""

    user_path: str | None = None  # CSV: x_* features, y in {0,1} or {-1,1}, group in {0,1}, split
    n_features: int = Field(default=10, ge=8)
    n_signal: PositiveInt = 4  # features carrying ±class_mean
    class_mean: PositiveFloat = 0.5
    n_nuisance: PositiveInt = 3  # features shifted by nuisance_shift in the minority group
    nuisance_shift: float = 1.5
    extra_noise: NonNegativeFloat = 1.0  # extra noise std of the minority group
    minority_train: Share = 0.2
    minority_test: Share = 0.5
    n_train: int = Field(ge=20)
    n_calib: int = Field(ge=20)
    n_test: int = Field(ge=20)
    world_seed: int = 1234  # the fixed noise-mixing matrix
    l2: NonNegativeFloat = 1e-4  # λ‖w‖² added to every variant's objective: keeps the
    # logistic minimiser finite when a sample is separable
    eps: Share = 0.05
    alpha: Share = 0.05
    grids: Grids

    @model_validator(mode="after")
    def _fits(self) -> Classification:
        if self.n_signal + self.n_nuisance > self.n_features:
            raise ValueError(
                f"n_signal + n_nuisance = {self.n_signal + self.n_nuisance} exceeds n_features = {self.n_features}"
            )
        return self


class Variant(Strict):
    """One ``train.<variant>`` node: the method, a baseline or an ablation."""

    kind: Literal["erm", "credal", "huber", "wasserstein", "cvar", "kl"]
    reference: Literal["empirical", "bayes", "lognormal"] = "empirical"  # credal: P0 (newsvendor only)
    covariance: Literal["sample", "mcd"] = "sample"  # credal: ellipsoid scatter (b, c)
    kappa: float | None = Field(default=None, gt=1, allow_inf_nan=False)  # huber: support inflation
    beta: float | None = Field(default=None, gt=0, le=1)  # cvar: tail fraction
    tail_weight: NonNegativeFloat = 0.0  # credal: κ_t·E_P0[ℓ·1{ξ∉B}] tail stand-in
    grid: bool = True  # also sweep the frontier grid

    @model_validator(mode="after")
    def _needs(self) -> Variant:
        if self.kind == "huber" and self.kappa is None:
            raise ValueError("kind 'huber' needs kappa (> 1, finite: the full-support objective is infinite)")
        if self.kind == "cvar" and self.beta is None:
            raise ValueError("kind 'cvar' needs beta")
        if self.kind != "credal" and (self.reference != "empirical" or self.covariance != "sample" or self.tail_weight):
            raise ValueError("reference, covariance and tail_weight apply to kind 'credal' only")
        return self


class Solver(Strict):
    order: list[Literal["CLARABEL", "SCS", "HIGHS", "SCIPY"]] = Field(
        default_factory=lambda: ["CLARABEL", "SCS"], min_length=1
    )  # tried in turn until one is optimal
    # a solver's `optimal_inaccurate` (reduced tolerances) is accepted, flagged in the row and counted in
    # the report; false: it counts as a failure (next solver, then a SolverError naming the instance)
    accept_inaccurate: bool = True


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {
        "newsvendor.user_path": "csv",
        "regression.user_path": "csv",
        "classification.user_path": "csv",
    }
    newsvendor: Newsvendor
    regression: Regression
    classification: Classification
    solver: Solver = Field(default_factory=Solver)
    variants: dict[VariantName, Variant] = Field(min_length=2)  # the first is the method; one node each

    @field_validator("variants")
    @classmethod
    def _names(cls, v: dict[str, Variant]) -> dict[str, Variant]:
        if "erm" not in v or v["erm"].kind != "erm":
            raise ValueError("a variant 'erm' of kind 'erm' is the reference every gain is measured against")
        return v


def tasks_of(spec: Variant) -> tuple[str, ...]:
    """The experiments a variant applies to: the Bayesian / parametric references are newsvendor-only
    (the card runs the reference sweep on (a)); the MCD ellipsoid is an ellipsoid ablation (b, c)."""
    if spec.kind == "credal" and spec.reference != "empirical":
        return ("newsvendor",)
    if spec.kind == "credal" and spec.covariance == "mcd":
        return ("regression", "classification")
    return TASKS
