"""Typed parameters of `mesa`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Probability, Strict, names_of

VARIANTS = (
    "base",
    "full_sft",
    "head_sft",
    "mesa",
    "mesa_no_route",
    "router_only",
    "random_experts",
    "greedy",
    "mesa_kappa",
)


class Data(Strict):
    seed: NonNegativeInt = 0  # the synthetic corpus (seeds vary k-means and alignment)
    n_pretrain: int = Field(ge=50)  # base-model training pool
    n_align_harmful: int = Field(ge=10)  # D_s: harmful prompts with refusal targets
    n_replay: int = Field(ge=10)  # utility replay pool of the alignment stage
    n_eval: int = Field(ge=10)  # prompts per evaluation set
    n_harm: int = Field(default=20, ge=4, le=200)  # harm tokens; the last `n_harm_heldout` never reach D_s
    n_harm_heldout: PositiveInt = 5
    n_wrappers: int = Field(default=6, ge=2, le=50)  # two-token jailbreak wrappers; the first `n_wrappers_align` in D_s
    n_wrappers_align: PositiveInt = 3
    # held-out wrappers (base training and evaluation only): "around" like the ID ones, or "prefix" (both
    # tokens before the request: a structurally different jailbreak, so OOD refusal has headroom)
    heldout_wrapper_style: Literal["around", "prefix"] = "around"
    n_templates: int = Field(default=6, ge=1, le=50)  # prompt templates per benign task and for direct requests
    n_step_tokens: int = Field(default=30, ge=3)  # vocabulary of harm-specific compliance tokens
    max_digits: int = Field(default=5, ge=3, le=12)  # copy / sort / reverse operate on 3..max_digits digits
    mix_benign: Fraction = 0.5  # base mixture: benign (half wrapped) ...
    mix_harmful_direct: Fraction = 0.2  # direct harmful → refusal; rest wrapped → comply
    align_direct_frac: Probability = 0.2  # D_s: share of direct (unwrapped) requests
    pretrain_path: str | None = None  # --env=full: user tables (README: input format)
    align_path: str | None = None
    eval_path: str | None = None

    @model_validator(mode="after")
    def _splits(self):
        if self.n_harm_heldout >= self.n_harm:
            raise ValueError(f"n_harm_heldout ({self.n_harm_heldout}) must be below n_harm ({self.n_harm})")
        if self.n_wrappers_align >= self.n_wrappers:
            raise ValueError(f"n_wrappers_align ({self.n_wrappers_align}) must be below n_wrappers ({self.n_wrappers})")
        if self.mix_benign + self.mix_harmful_direct >= 1:
            raise ValueError("mix_benign + mix_harmful_direct must leave room for wrapped harmful requests")
        if len({self.pretrain_path is None, self.align_path is None, self.eval_path is None}) > 1:
            raise ValueError("give all of pretrain_path, align_path and eval_path, or none")
        return self


class Model(Strict):
    d_model: int = Field(default=64, ge=8)
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4
    n_experts: int = Field(default=8, ge=2)
    top_k: PositiveInt = 2
    d_expert: int = Field(default=128, ge=4)  # FFN width of each expert
    max_len: int = Field(default=32, ge=8)

    @model_validator(mode="after")
    def _k(self):
        if self.top_k >= self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be below n_experts ({self.n_experts})")
        return self


class Base(Strict):
    steps: PositiveInt = 1200
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 3e-3
    weight_decay: NonNegativeFloat = 0.01
    load_balance: NonNegativeFloat = 0.01  # weight of the Switch load-balance loss (base and alignment)


class Profile(Strict):
    decision_window: int = Field(default=2, ge=1, le=8)  # last prompt positions (up to the answer marker) profiled
    n_head: PositiveInt = 2  # "head" = the current safety experts (top f_s)
    mask_top: PositiveInt = 2  # masking attack: experts masked per layer


class OT(Strict):
    n_clusters: int = Field(default=4, ge=1, le=64)  # m duty clusters (k-means of safety-token hidden states)
    eps: PositiveFloat = 0.05  # entropic regularisation
    tau: PositiveFloat = 0.1  # KL relaxation of the expert marginal
    lambda_u: NonNegativeFloat = 1.0  # utility-interference cost
    lambda_a: NonNegativeFloat = 1.0  # routing-affinity cost
    lambda_h: NonNegativeFloat = 0.5  # already-overloaded head cost
    n_sel: PositiveInt = 4  # experts selected per layer (top relaxed column mass)
    kappa: float = Field(default=0.8, gt=0, le=1)  # mesa_kappa: smallest set holding kappa of the mass
    max_iter: int = Field(default=2000, ge=10)
    tol: PositiveFloat = 1e-9


class Align(Strict):
    steps: PositiveInt = 200
    batch_size: int = Field(default=32, ge=2)  # half D_s, half utility replay
    lr: PositiveFloat = 1e-3
    mu_route: NonNegativeFloat = 0.5  # routing refinement on safety-decision tokens
    mu_keep: NonNegativeFloat = 0.5  # router KL to the original on utility tokens


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {
        "data.pretrain_path": "parquet",
        "data.align_path": "parquet",
        "data.eval_path": "parquet",
    }
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data
    model: Model = Model()
    base: Base = Base()
    profile: Profile = Profile()
    ot: OT = OT()
    align: Align = Align()
    refusal_token: str = "R1"  # first token of the refusal (safety = argmax is this)
    answer_marker: str = "=>"  # the token that ends every prompt
    variants: names_of(VARIANTS)  # one train.<variant> node each (base: train.base)

    @model_validator(mode="after")
    def _sizes(self):
        E = self.model.n_experts
        if "base" not in self.variants:
            raise ValueError("variants must include 'base' (the model every other variant aligns)")
        if self.ot.n_sel > E or self.profile.n_head > E or self.profile.mask_top >= E - self.model.top_k + 1:
            raise ValueError(
                f"ot.n_sel / profile.n_head / profile.mask_top do not fit n_experts={E}, top_k={self.model.top_k}"
            )
        if self.ot.n_sel <= self.model.top_k and any(v in self.variants for v in ("mesa", "random_experts", "greedy")):
            # |S| <= top_k: routing refinement concentrates safety on exactly those experts (card pitfall)
            raise ValueError(f"ot.n_sel ({self.ot.n_sel}) must exceed model.top_k ({self.model.top_k})")
        return self
