"""Typed parameters of `mts`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import MethodParams, Probability, Strict, VariantName

BASELINES = ("real_only", "uniform", "classifier_filter", "oracle")
QUALITIES = ("good", "off_manifold", "label_noise", "mixup")


class Mix(Strict):
    """Fractions of the synthetic pool per quality type (normalised to sum 1)."""

    good: Probability
    off_manifold: Probability
    label_noise: Probability
    mixup: Probability


class Data(Strict):
    source: Literal["digits", "table"] = "digits"
    path: str | None = None  # source=table: a parquet/CSV file (README: input format)
    n_real_train: int = Field(ge=10)
    n_meta: int = Field(ge=10)
    n_test: int = Field(ge=10)
    n_syn: NonNegativeInt
    mix: Mix
    good_noise: NonNegativeFloat  # σ of the pixel noise of a "good" synthetic digit
    off_noise: NonNegativeFloat  # σ of the pixel noise of an off-manifold sample
    mixup_low: float = Field(gt=0.5, lt=1)  # λ ~ U(low, high) on the majority image
    mixup_high: float = Field(gt=0.5, le=1)

    @model_validator(mode="after")
    def _check(self):
        if self.mixup_high < self.mixup_low:
            raise ValueError("mixup_high must be >= mixup_low")
        if self.source == "table" and not self.path:
            raise ValueError("source=table needs data.path")
        return self


class Features(Strict):
    embed_dim: int = Field(ge=2, le=256)  # PCA stand-in for the generator's embedding (SD_*)
    knn: int = Field(ge=1, le=50)  # distance-weighted k-NN label agreement
    top_k: int = Field(ge=1, le=50)  # top-k same-class cosines
    pre_epochs: PositiveInt  # the no-selection run giving the pre_* dynamics


class Classifier(Strict):
    hidden: PositiveInt
    lr: PositiveFloat
    momentum: float = Field(ge=0, lt=1)
    weight_decay: NonNegativeFloat
    epochs: PositiveInt
    batch_size: PositiveInt  # the non-meta baselines' batch


class Meta(Strict):
    hidden: PositiveInt
    lr: PositiveFloat  # Adam on the meta-net
    virtual_lr: PositiveFloat  # the virtual (pseudo) step of the unroll
    meta_batch: PositiveInt
    w_floor: float = Field(ge=0, lt=1)  # w = floor + (1 − floor)·sigmoid: no collapse to 0
    grad: Literal["exact", "finite_difference"] = "exact"
    fd_eps: PositiveFloat  # ε = fd_eps / ‖g_val‖ for the finite-difference HVP


class Selector(Strict):
    """A bi-level (meta-learned) weighting variant."""

    features: Literal["loss", "full", "full_noflag"]
    batch_size: int = Field(ge=2)
    seeds: list[int] | None = None  # run on a subset of the seeds (budget), None: all
    epochs: PositiveInt | None = None  # None: classifier.epochs (equal epochs)
    lr: PositiveFloat | None = None  # None: classifier.lr (equal-steps runs scale it)


class Gsnr(Strict):
    enabled: bool = True
    seed: int = 0
    draws: int = Field(ge=4)
    batch_sizes: list[int] = Field(min_length=2)
    warm_epochs: NonNegativeInt  # θ after this many uniform epochs, φ at init
    selectors: list[str] = Field(min_length=1)  # names in `selectors`
    ratio_pair: list[int] = Field(min_length=2, max_length=2)  # (small, large) batch of the reported GSNR ratio

    @model_validator(mode="after")
    def _check(self):
        for b in self.ratio_pair:
            if b not in self.batch_sizes:
                raise ValueError(f"gsnr.ratio_pair: batch {b} is not in gsnr.batch_sizes")
        return self


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.path": "parquet"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "table"}
    data: Data
    features: Features
    classifier: Classifier
    meta: Meta
    filter_confidence: Probability  # classifier filter: keep synthetic with p(y) > this
    selectors: dict[VariantName, Selector]  # user-named selectors, each a variant when listed
    variants: list[str] = Field(min_length=1)  # one train.<variant> node each
    gsnr: Gsnr

    @model_validator(mode="after")
    def _check(self):
        for v in self.variants:
            if v not in BASELINES and v not in self.selectors:
                raise ValueError(
                    f"variants: unknown variant {v!r} (baselines {list(BASELINES)} "
                    f"or a name in selectors {sorted(self.selectors)})"
                )
        for s in self.gsnr.selectors:
            if s not in self.selectors:
                raise ValueError(f"gsnr.selectors: {s!r} is not in selectors")
        return self
