"""Typed parameters of `ghost`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

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

from pipelines.core.api import MethodParams, Probability, Strict, names_of

# scorers: GHOST, its ablations and the baselines (one train.<variant> node each)
SCORERS = (
    "dense",
    "ghost",
    "ghost_separate",
    "ghost_no_recal",
    "balanced_truncation",
    "controllability",
    "observability",
    "activation_magnitude",
    "weight_magnitude",
    "random",
    "taylor",
    "fisher",
)
# data-dependent forward-statistic scorers (recalibrated layer by layer unless the variant says otherwise)
FORWARD = (
    "ghost",
    "ghost_separate",
    "ghost_no_recal",
    "balanced_truncation",
    "controllability",
    "observability",
    "activation_magnitude",
)
GRADIENT = ("taylor", "fisher")


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    kind: Literal["topic", "markov_mqar"] = "topic"  # markov_mqar: order-2 Markov + MQAR (sweeps only)
    user_file: str | None = None  # source: file → parquet with columns split (str), tokens (int array)
    vocab_size: int = Field(ge=8, le=65536)
    seq_len: int = Field(ge=16)
    n_train: int = Field(ge=8)
    n_val: int = Field(ge=4)
    n_calib: int = Field(ge=4)  # calibration pool (disjoint subsets per calibration seed)
    n_test: int = Field(ge=4)
    n_topics: PositiveInt
    topic_prob: Probability  # P(token drawn from the sequence's topic unigram)
    zipf_alpha: PositiveFloat
    n_successors: PositiveInt
    dirichlet: PositiveFloat
    world_seed: int = 2026
    mqar_fraction: Probability = 0.3  # markov_mqar: share of MQAR sequences
    mqar_pairs: PositiveInt = 16  # key-value pairs stated at the start
    mqar_values: int = Field(default=64, ge=2)  # value alphabet (chance = 1 / mqar_values)

    @model_validator(mode="after")
    def _file(self):
        if self.source == "file" and not self.user_file:
            raise ValueError("user_file: source 'file' needs a parquet file of token sequences")
        if self.kind == "markov_mqar" and (
            self.mqar_pairs + self.mqar_values > self.vocab_size or 4 * self.mqar_pairs > self.seq_len
        ):
            raise ValueError(
                "mqar_pairs: keys + values must fit in vocab_size and the pairs + as many queries in seq_len / 2"
            )
        if self.n_successors > self.vocab_size:
            raise ValueError(f"n_successors: at most vocab_size ({self.vocab_size})")
        return self


class Model(Strict):
    d_model: int = Field(ge=4)
    n_layers: PositiveInt
    d_state: int = Field(ge=2)
    n_heads: PositiveInt
    n_groups: PositiveInt
    expand: PositiveInt
    d_conv: int = Field(ge=0, le=16)
    chunk_size: PositiveInt

    @model_validator(mode="after")
    def _shapes(self):
        if (self.expand * self.d_model) % self.n_heads:
            raise ValueError(f"n_heads: expand·d_model ({self.expand * self.d_model}) must split into heads")
        if self.n_heads % self.n_groups:
            raise ValueError(f"n_groups: must divide n_heads ({self.n_heads})")
        return self


class Train(Strict):
    steps: PositiveInt
    batch_size: PositiveInt
    lr: PositiveFloat
    weight_decay: NonNegativeFloat
    seed: int = 0  # ONE model per run, cached; calibration seeds vary around it


class Prune(Strict):
    rhos: list[float] = Field(min_length=1)  # pruning ratios of every variant and seed
    extra_rhos: list[float] = Field(default_factory=list)  # first seed only (e.g. 0.25)
    mode: Literal["per_layer", "global"] = "per_layer"
    recalibrate: bool = True  # sequential layer-by-layer statistics from the pruned network
    n_calib_seqs: PositiveInt  # calibration sequences per seed (disjoint subsets of the pool)
    calib_max_topic: NonNegativeInt | None = None  # OOD calibration: topics < this only

    @field_validator("rhos", "extra_rhos")
    @classmethod
    def _range(cls, v: list[float]) -> list[float]:
        if any(not (0.0 <= r < 1.0) for r in v):
            raise ValueError(f"pruning ratios must lie in [0, 1): {v}")
        return v


class Eval(Strict):
    main_variants: names_of(SCORERS)  # every seed
    ablation_variants: names_of(SCORERS, min_length=0) = []  # first seed only
    loo_seqs: NonNegativeInt  # leave-one-channel-out oracle on layer 0 (0: off)
    eval_batch: PositiveInt
    decode_batch: PositiveInt
    decode_tokens: PositiveInt
    decode_rounds: PositiveInt
    decode_rhos: list[float] = Field(default_factory=list)

    @field_validator("decode_rhos")
    @classmethod
    def _rho(cls, v: list[float]) -> list[float]:
        if any(not (0.0 < r < 1.0) for r in v):
            raise ValueError(f"decode ratios must lie in (0, 1): {v}")
        return v


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.user_file": "parquet"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    THREADS_SCALE = True  # models large enough that a second intra-op thread pays (docs/threads.md)
    data: Data
    model: Model
    train: Train
    prune: Prune
    eval: Eval

    @model_validator(mode="after")
    def _consistent(self):
        both = set(self.eval.main_variants) & set(self.eval.ablation_variants)
        if both:
            raise ValueError(f"eval.ablation_variants: {sorted(both)} already in main_variants")
        if "dense" not in self.eval.main_variants:
            raise ValueError("eval.main_variants: 'dense' (the unpruned reference) must be listed")
        if "ghost" not in self.eval.main_variants:
            raise ValueError(
                "eval.main_variants: 'ghost' (the method; the decode benchmark truncates its masks) must be listed"
            )
        missing = [r for r in self.eval.decode_rhos if r not in self.prune.rhos]
        if missing:
            raise ValueError(f"eval.decode_rhos: {missing} not in prune.rhos {self.prune.rhos}")
        if self.data.source == "synthetic" and self.prune.n_calib_seqs * len(self.seeds) > self.data.n_calib:
            raise ValueError(
                f"prune.n_calib_seqs: {len(self.seeds)} seeds × {self.prune.n_calib_seqs} disjoint "
                f"calibration sequences exceed data.n_calib ({self.data.n_calib})"
            )
        return self

    @property
    def variants(self) -> list[str]:
        return [*self.eval.main_variants, *self.eval.ablation_variants]
