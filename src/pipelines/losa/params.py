"""Typed parameters of `losa`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key (a claim naming a variant or
budget this run does not plan is stopped by core's check of the spec, before any node runs)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from pipelines.core.api import Fraction, MethodParams, Probability, Strict


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    path: str | None = None  # file source: a CSV / parquet table (README: prompt, answer, split)
    context_len: int = Field(ge=8, le=65536)  # N: filler + records before the question
    n_records: PositiveInt
    key_len: int = Field(ge=1, le=8)
    value_len: int = Field(ge=1, le=8)
    n_query_keys: PositiveInt
    n_key_symbols: int = Field(ge=2)
    n_value_symbols: int = Field(ge=2)
    n_filler_symbols: PositiveInt  # filler entropy = log2(n_filler_symbols) bits/token
    block_size: int = Field(ge=2, le=64)  # B: the answer block (one diffusion block)
    n_train: int = Field(ge=16)  # training sequences (drawn once, sampled by the loop)
    n_eval: PositiveInt  # evaluation prompts per seed
    world_seed: int = 2026  # the training set (eval prompts use the run seeds)

    @model_validator(mode="after")
    def _fits(self):
        rec = self.key_len + self.value_len
        if self.n_records * rec > self.context_len:
            raise ValueError(
                f"n_records: {self.n_records} records of {rec} tokens do not fit in context_len={self.context_len}"
            )
        if self.n_query_keys > self.n_records:
            raise ValueError(f"n_query_keys: {self.n_query_keys} exceeds n_records={self.n_records}")
        if self.n_query_keys * self.value_len > self.block_size:
            raise ValueError(
                f"n_query_keys: {self.n_query_keys} answers of {self.value_len} tokens do not fit "
                f"in block_size={self.block_size}"
            )
        if self.n_key_symbols**self.key_len < self.n_records:
            raise ValueError(f"n_key_symbols: too few distinct keys for n_records={self.n_records}")
        if self.source == "file" and not self.path:
            raise ValueError("path: data.source 'file' needs a table path")
        return self


class Model(Strict):
    d_model: int = Field(ge=8)
    n_layers: int = Field(ge=1, le=48)
    n_heads: PositiveInt
    d_ff: NonNegativeInt = 0  # 0 → 4 · d_model
    rope_base: PositiveFloat = 10000.0
    init_std: PositiveFloat | None = None  # every linear / embedding weight ~ N(0, std²); None: d_model^-0.5


class Train(Strict):
    seed: int = 0  # the one base model of a run (eval seeds vary the prompts)
    steps: PositiveInt
    batch_size: PositiveInt
    lr: PositiveFloat
    weight_decay: NonNegativeFloat
    gamma_min: float = Field(gt=0, le=1)  # mask rate γ ~ U(gamma_min, 1]
    full_mask_share: Probability = 0.0  # share of sequences whose whole block is masked (γ = 1)
    grad_clip: PositiveFloat


class Decode(Strict):
    steps: PositiveInt  # T denoising steps per block
    page_size: PositiveInt  # P (KV page of the prefix cache)
    budgets: list[int] = Field(min_length=1)  # per-query token budgets (multiples of P)
    batch: PositiveInt  # prompts decoded together

    @model_validator(mode="after")
    def _pages(self):
        bad = [b for b in self.budgets if b < self.page_size or b % self.page_size]
        if bad:
            raise ValueError(f"budgets: {bad} are not positive multiples of page_size={self.page_size}")
        return self


class Variant(Strict):
    """One ``train.<name>`` node: a prefix-attention policy decoded with the shared base model."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    kind: Literal["dense", "quest", "sparsed", "losa"]
    budgets: list[int] | None = None  # None: decode.budgets (ignored by dense)
    rho: float = Field(default=0.5, gt=0, le=1)  # losa: active share of the block (topk / random)
    active_rule: Literal["topk", "threshold", "random"] = "topk"
    threshold: float = Field(default=0.1, ge=0, lt=1)  # losa threshold rule: δ > threshold · max δ
    union: bool = True  # losa: active tokens attend to the union of pages
    activity_signal: Literal["query", "hidden"] = "query"
    activity_reference: Literal["previous_step", "last_refresh"] = "previous_step"
    first_step_mode: Literal["all_active", "dense"] = "all_active"
    dense_fraction: float = Field(default=0.2, gt=0, le=1)  # sparsed: share of steps with full attention


class Timing(Strict):
    n_prompts: PositiveInt
    budgets: list[int] = Field(min_length=1)
    rounds: int = Field(ge=3)
    warmup: NonNegativeInt = 1
    confidence: Fraction = 0.95


class Locality(Strict):
    top_share: Fraction = 0.5  # share of block tokens whose δ mass is measured
    hist_bins: int = Field(default=40, ge=5, le=200)


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.path": "parquet"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: Data
    model: Model
    train: Train
    decode: Decode
    variants: list[Variant] = Field(min_length=1)
    timing: Timing
    locality: Locality = Locality()

    @field_validator("variants")
    @classmethod
    def _unique(cls, v: list[Variant]) -> list[Variant]:
        names = [x.name for x in v]
        reserved = {"p", "timing", "plots", "bdlm"} & set(names)
        if reserved:
            raise ValueError(f"variant name(s) {sorted(reserved)} are reserved (report inputs)")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        P = self.decode.page_size
        if self.decode.steps > self.data.block_size:
            raise ValueError(f"decode.steps: {self.decode.steps} steps exceed block_size={self.data.block_size}")
        if self.model.d_model % self.model.n_heads or (self.model.d_model // self.model.n_heads) % 2:
            raise ValueError(f"model.n_heads: d_model={self.model.d_model} must split into heads of even size")
        for key, budgets in [
            ("timing.budgets", self.timing.budgets),
            *[(f"variants.{v.name}.budgets", v.budgets or []) for v in self.variants],
        ]:
            bad = [b for b in budgets if b < P or b % P]
            if bad:
                raise ValueError(f"{key}: budgets {bad} are not positive multiples of decode.page_size={P}")
        kinds = {v.kind for v in self.variants}
        if "dense" not in kinds:
            raise ValueError("variants: a 'dense' variant is needed (the reference of every error)")
        return self

    def budgets_of(self, v: Variant) -> list[int]:
        return [] if v.kind == "dense" else list(v.budgets or self.decode.budgets)

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)
