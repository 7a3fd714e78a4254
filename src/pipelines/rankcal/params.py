"""Typed parameters of `rankcal`: node functions take `Params` as a type hint; Kedro validates it before
any node runs, and a bad value, or a claim naming a model the run does not fit, stops the command with one
line naming the key or the claim (core checks that a claim names a planned dataset, the demo or a declared
derived metric)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from pipelines.core.api import Fraction, MethodParams, Strict, names_of

BUILTIN_DATASETS = ("iris", "wine", "digits5", "diabetes", "linnerud", "pl_truth", "mallows_truth")
# labels m of the bundled datasets (the synthetic ones take data.synthetic.m)
BUILTIN_M = {"iris": 3, "wine": 3, "digits5": 5, "diabetes": 4, "linnerud": 3}
DEMO_VARIANTS = ("truth", "q_sub", "q_top")
MODELS = ("pl_lin", "ib_pl", "ib_mallows", "rpc_bt", "rankings_as_classes", "neural_pl", "neural_pl_ts", "uniform")


def node_variant(dataset: str) -> str:
    """The train node (variant) of a dataset: ``train.<dataset>``, ``file:<name>`` as ``file_<name>``."""
    return dataset.replace(":", "_", 1)


class Synthetic(Strict):
    n_train: int = Field(ge=20)
    n_test: int = Field(ge=20)
    n_features: PositiveInt
    m: int = Field(ge=3, le=6)
    w_std: PositiveFloat
    mallows_theta: PositiveFloat
    world_seed: int = 0


class Data(Strict):
    datasets: list[str] = Field(min_length=1)
    test_fraction: Fraction
    synthetic: Synthetic
    user_dir: str | None = None  # full env: folder of <name>.csv files, listed as "file:<name>"

    @field_validator("datasets")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        for name in v:
            if not (name in BUILTIN_DATASETS or (name.startswith("file:") and len(name) > 5)):
                raise ValueError(f"unknown dataset {name!r}: use one of {BUILTIN_DATASETS} or 'file:<name>'")
            if "." in name:  # variants are named <dataset>.<model>
                raise ValueError(f"dataset {name!r}: a name may not contain '.'")
        return v

    @model_validator(mode="after")
    def _user_dir(self):
        if any(n.startswith("file:") for n in self.datasets) and not self.user_dir:
            raise ValueError("user_dir: 'file:<name>' datasets need a folder of <name>.csv files")
        return self


class Neural(Strict):
    hidden: list[int] = Field(min_length=1)
    steps: PositiveInt
    lr: PositiveFloat
    holdout_fraction: Fraction
    min_holdout: int = Field(ge=2)
    t_min: PositiveFloat
    t_max: PositiveFloat

    @model_validator(mode="after")
    def _bounds(self):
        if self.t_max <= self.t_min:
            raise ValueError(f"t_max: must exceed t_min ({self.t_min})")
        return self


class Models(Strict):
    variants: names_of(MODELS, "model")
    l2: NonNegativeFloat
    knn_k: PositiveInt
    ib_pl_alpha: PositiveFloat
    mm_iters: PositiveInt
    mallows_theta_max: PositiveFloat
    rac_epsilon: float = Field(gt=0, lt=0.1)
    rac_max_m: int = Field(ge=2, le=6)
    neural: Neural

    @field_validator("variants")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        if "neural_pl_ts" in v and "neural_pl" not in v:
            raise ValueError("neural_pl_ts is the temperature-scaled copy of neural_pl: list both")
        return v


class Ece(Strict):
    n_bins: int = Field(ge=1, le=100)
    n_debias: PositiveInt
    n_bootstrap: NonNegativeInt
    full_cw_max_m: int = Field(ge=2, le=6)


class Demo(Strict):
    truth_weights: list[float] = Field(min_length=3, max_length=3)
    margin: Fraction
    q_floor: float = Field(ge=0, lt=1 / 6)
    n: int = Field(ge=100)

    @field_validator("truth_weights")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if min(v) <= 0:
            raise ValueError("PL weights must be positive")
        return v


class RewardModel(Strict):
    name: str = Field(pattern=r"^[a-z0-9_]+$")
    arch: Literal["linear", "mlp"]
    weight_decay: NonNegativeFloat
    steps: PositiveInt


class Rlhf(Strict):
    enabled: bool = True
    n_features: PositiveInt
    k_responses: int = Field(ge=2, le=6)
    beta: PositiveFloat
    n_pairs: list[int] = Field(min_length=1)
    n_val: int = Field(ge=10)
    n_test: int = Field(ge=20)
    hidden: list[int] = Field(min_length=1)
    lr: PositiveFloat
    models: list[RewardModel] = Field(min_length=1)
    t_min: PositiveFloat
    t_max: PositiveFloat
    world_seed: int = 0

    @field_validator("n_pairs")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        if min(v) < 10:
            raise ValueError("every training size must be >= 10 pairs")
        return v


class Params(MethodParams):
    data: Data
    models: Models
    ece: Ece
    demo: Demo
    rlhf: Rlhf
    rank_disagreement_datasets: list[str] = Field(default_factory=lambda: ["digits5", "diabetes"])
    plot_seed: int | None = None  # the seed whose extra plots/bootstrap are drawn (None: the first seed)

    @model_validator(mode="after")
    def _claims_name_run_models(self):
        """A claim or gate on ``variants.<dataset>.<model>.<metric>`` names a model this run fits on that
        dataset, or a demo predictor (core checks the dataset, the demo and the derived metrics)."""
        for c in [*self.gates, *self.claims]:
            problem = self.unplanned(c.metric)
            if problem:
                raise ValueError(
                    f"claim '{c.id}': metric '{c.metric}' {problem}; a run with other models "
                    "declares its own claims in an env (conf/<env>/parameters_rankcal.yml, "
                    "see src/pipelines/rankcal/README.md)"
                )
        return self

    @model_validator(mode="after")
    def _consistent(self):
        missing = [d for d in self.rank_disagreement_datasets if d not in self.data.datasets]
        if missing:
            raise ValueError(
                f"rank_disagreement_datasets: {missing} not in data.datasets {self.data.datasets} "
                "(give rankcal.rank_disagreement_datasets=[...] with the datasets)"
            )
        if self.plot_seed is None:  # defaults from seeds, so a sweep over seeds needs no plot_seed
            object.__setattr__(self, "plot_seed", self.seeds[0])
        elif self.plot_seed not in self.seeds:
            raise ValueError(f"plot_seed: {self.plot_seed} is not one of seeds {self.seeds}")
        return self

    def unplanned(self, metric: str) -> str | None:
        """Why ``metric`` names a model or demo predictor this run does not produce (None: it is planned,
        as far as the models go)."""
        parts = metric.split(".")
        if parts[0] != "variants" or len(parts) < 3 or parts[1] not in [*self.data.datasets, "demo"]:
            return None
        if len(parts) < 4:
            return "should read variants.<dataset>.<model>.<metric> or variants.demo.<predictor>.<metric>"
        ds, model = parts[1], parts[2]
        if ds == "demo":
            return None if model in DEMO_VARIANTS else f"names demo predictor '{model}' (one of {DEMO_VARIANTS})"
        if model not in self.models.variants:
            return f"names model '{model}', which is not in models.variants {self.models.variants}"
        m = self.data.synthetic.m if ds in ("pl_truth", "mallows_truth") else BUILTIN_M.get(ds)
        if model == "rankings_as_classes" and m is not None and m > self.models.rac_max_m:
            return (
                f"names rankings_as_classes on '{ds}' (m = {m}), which runs only for "
                f"m <= models.rac_max_m = {self.models.rac_max_m}"
            )
        return None
