"""Typed parameters of `bimu`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Strict, names_of

# permuted-task stream
CONTINUAL = ("bimu", "bayesbinn", "bayesbinn_official", "online", "mesu", "ste_adam", "metaplastic")
# active querying on the imbalanced stream: variation ratio, predictive entropy or epistemic (mutual
# information) thresholds, random at equal budget, query-all
ACTIVE = ("al_vr", "al_entropy", "al_epistemic", "al_random", "al_all")
VARIANTS = CONTINUAL + ACTIVE


class Data(Strict):
    source: Literal["digits", "file"] = "digits"
    user_path: str | None = None  # full env: CSV with label, split (train/test), x0..x{D-1}
    test_fraction: Fraction
    split_seed: int = 2026

    @model_validator(mode="after")
    def _path(self):
        if self.source == "file" and not self.user_path:
            raise ValueError("user_path: data.source 'file' needs a CSV path")
        return self


class Model(Strict):
    hidden: int = Field(ge=2)
    k_train: int = Field(ge=1, le=64)  # MC samples of the relaxed forward pass per example
    k_eval: int = Field(ge=1, le=256)  # hard Bernoulli samples at test time
    tau: PositiveFloat  # concrete-relaxation temperature
    noise_block: PositiveInt  # steps of relaxation noise pre-sampled at once


class Continual(Strict):
    n_tasks: int = Field(ge=3)
    n_per_task: int = Field(ge=10)  # training samples per task, one pass at batch size 1
    plasticity_window: list[int] = Field(min_length=2, max_length=2)  # tasks [a, b] (1-based) of the best

    @model_validator(mode="after")
    def _window(self):
        a, b = self.plasticity_window
        if not 1 <= a <= b:
            raise ValueError(f"plasticity_window: need 1 <= a <= b, got {self.plasticity_window}")
        return self


class Bimu(Strict):
    lm: PositiveFloat  # ℓ_m, loss multiplier
    eta: PositiveFloat
    eta_max: PositiveFloat
    kappa: NonNegativeFloat
    n_mem: PositiveFloat  # N, memory horizon of the relaxation toward the prior
    relaxation: bool = True


class BayesBinn(Strict):
    lr: PositiveFloat
    prior_strength: NonNegativeFloat


class Online(Strict):
    lr: PositiveFloat


class Mesu(Strict):
    lr_mu: PositiveFloat
    lr_sigma: PositiveFloat
    sigma_prior: PositiveFloat
    sigma_init: PositiveFloat
    n_mem: PositiveFloat
    grad_clamp: PositiveFloat


class Ste(Strict):
    lr: PositiveFloat  # Adam on the latent weights (BNN-STE and metaplasticity)
    meta_m: PositiveFloat  # metaplasticity strength m (Laborieux et al.)


class Active(Strict):
    # pixels: the binary net reads the (permuted, shifted) pixels; frozen: it reads the features of a frozen
    # real-valued encoder pretrained on held-out images (the paper's frozen-CNN OpenLORIS setting)
    features: Literal["pixels", "frozen"] = "pixels"
    n_pretrain: int = Field(default=500, ge=20)  # frozen: training images held out to pretrain the encoder
    feature_dim: int = Field(default=32, ge=2)  # frozen: encoder output width
    pretrain_steps: PositiveInt = 300  # frozen: full-batch Adam steps of the encoder
    lm: PositiveFloat | None = None  # ℓ_m of the active learner (None: bimu.lm)
    n_domains: PositiveInt
    n_per_domain: int = Field(ge=10)
    imbalance: float = Field(gt=0, le=1)  # class c has frequency ∝ imbalance^(c / (C − 1))
    brightness: NonNegativeFloat  # domain shift: x → c x + b, b ~ U(±brightness)
    contrast: float = Field(ge=0, lt=1)  #                      c ~ U(1 ± contrast)
    budget: float = Field(gt=0, le=1)  # B, target share of queried labels
    gamma: float = Field(gt=0, le=1)  # exponent of the budget-tracking threshold
    k_query: int = Field(ge=2, le=256)  # hard samples for the variation ratio
    eval_every: PositiveInt


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.user_path": "csv"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    data: Data
    model: Model
    variants: names_of(VARIANTS)  # one train.<variant> node each
    continual: Continual
    bimu: Bimu
    bayesbinn: BayesBinn
    bayesbinn_official: BayesBinn
    online: Online
    mesu: Mesu
    ste: Ste
    active: Active
