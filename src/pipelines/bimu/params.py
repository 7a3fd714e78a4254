"""Typed parameters of `bimu`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipelines.core.params import MethodParams, Strict, known_names

# permuted-task stream
CONTINUAL = ("bimu", "bayesbinn", "bayesbinn_official", "online", "mesu", "ste_adam", "metaplastic")
# active querying on the imbalanced stream: variation ratio, predictive entropy or epistemic (mutual
# information) thresholds, random at equal budget, query-all
ACTIVE = ("al_vr", "al_entropy", "al_epistemic", "al_random", "al_all")
VARIANTS = CONTINUAL + ACTIVE


class Data(Strict):
    source: Literal["digits", "file"] = "digits"
    user_path: str | None = None        # full env: CSV with label, split (train/test), x0..x{D-1}
    test_fraction: float = Field(gt=0, lt=1)
    split_seed: int = 2026

    @model_validator(mode="after")
    def _path(self):
        if self.source == "file" and not self.user_path:
            raise ValueError("user_path: data.source 'file' needs a CSV path")
        return self


class Model(Strict):
    hidden: int = Field(ge=2)
    k_train: int = Field(ge=1, le=64)     # MC samples of the relaxed forward pass per example
    k_eval: int = Field(ge=1, le=256)     # hard Bernoulli samples at test time
    tau: float = Field(gt=0)              # concrete-relaxation temperature
    noise_block: int = Field(ge=1)        # steps of relaxation noise pre-sampled at once


class Continual(Strict):
    n_tasks: int = Field(ge=3)
    n_per_task: int = Field(ge=10)        # training samples per task, one pass at batch size 1
    plasticity_window: list[int] = Field(min_length=2, max_length=2)   # tasks [a, b] (1-based) of the best

    @model_validator(mode="after")
    def _window(self):
        a, b = self.plasticity_window
        if not 1 <= a <= b:
            raise ValueError(f"plasticity_window: need 1 <= a <= b, got {self.plasticity_window}")
        return self


class Bimu(Strict):
    lm: float = Field(gt=0)               # ℓ_m, loss multiplier
    eta: float = Field(gt=0)
    eta_max: float = Field(gt=0)
    kappa: float = Field(ge=0)
    n_mem: float = Field(gt=0)            # N, memory horizon of the relaxation toward the prior
    relaxation: bool = True


class BayesBinn(Strict):
    lr: float = Field(gt=0)
    prior_strength: float = Field(ge=0)


class Online(Strict):
    lr: float = Field(gt=0)


class Mesu(Strict):
    lr_mu: float = Field(gt=0)
    lr_sigma: float = Field(gt=0)
    sigma_prior: float = Field(gt=0)
    sigma_init: float = Field(gt=0)
    n_mem: float = Field(gt=0)
    grad_clamp: float = Field(gt=0)


class Ste(Strict):
    lr: float = Field(gt=0)               # Adam on the latent weights (BNN-STE and metaplasticity)
    meta_m: float = Field(gt=0)           # metaplasticity strength m (Laborieux et al.)


class Active(Strict):
    n_domains: int = Field(ge=1)
    n_per_domain: int = Field(ge=10)
    imbalance: float = Field(gt=0, le=1)  # class c has frequency ∝ imbalance^(c / (C − 1))
    brightness: float = Field(ge=0)       # domain shift: x → c x + b, b ~ U(±brightness)
    contrast: float = Field(ge=0, lt=1)   #                      c ~ U(1 ± contrast)
    budget: float = Field(gt=0, le=1)     # B, target share of queried labels
    gamma: float = Field(gt=0, le=1)      # exponent of the budget-tracking threshold
    k_query: int = Field(ge=2, le=256)    # hard samples for the variation ratio
    eval_every: int = Field(ge=1)


class Params(MethodParams):
    data: Data
    model: Model
    variants: list[str] = Field(min_length=1)       # one train.<variant> node each
    continual: Continual
    bimu: Bimu
    bayesbinn: BayesBinn
    bayesbinn_official: BayesBinn
    online: Online
    mesu: Mesu
    ste: Ste
    active: Active

    @field_validator("variants")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        return known_names(v, VARIANTS)
