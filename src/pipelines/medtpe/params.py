"""Typed parameters of `medtpe`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Strict

Variant = Literal["original", "medtpe_init", "medtpe", "medtpe_hard", "extend", "full_ft", "token_drop", "truncation"]
Task = Literal["mortality", "long_stay"]


class Data(Strict):
    seed: NonNegativeInt = 0  # the EHR cohort (seeds vary the TPE mining and SSFT)
    n_train: int = Field(ge=20)
    n_test: int = Field(ge=10)
    # per_seed: each seed scores its own disjoint shard of the n_test stays (the seed interval then carries
    # the test-sampling noise); shared: every seed scores all of them
    test_split: Literal["per_seed", "shared"] = "per_seed"
    n_events: list[int] = Field(default=[4, 8], min_length=2, max_length=2)  # events per stay, inclusive
    n_labs: int = Field(default=18, ge=4, le=18)  # lab vocabulary size
    signal_scale: PositiveFloat = 2.0
    prevalence_mortality: Fraction = 0.13
    prevalence_long_stay: Fraction = 0.3
    format: Literal["nl", "json"] = "nl"
    corpus_bytes: int = Field(default=500_000, ge=10_000)  # cap of the stdlib docstring harvest
    corpus_path: str | None = None  # --env=full: parquet with a `text` column
    ehr_path: str | None = None  # --env=full: parquet of stays (README)

    @model_validator(mode="after")
    def _events(self):
        lo, hi = self.n_events
        if not 1 <= lo <= hi <= 400:
            raise ValueError(f"n_events must be a range 1 <= low <= high <= 400, got {list(self.n_events)}")
        return self


class BPEParams(Strict):
    vocab_size: int = Field(default=4096, ge=300, le=200_000)
    min_pair_freq: PositiveInt = 2


class TPEParams(Strict):
    max_n: int = Field(default=2, ge=2, le=6)
    max_m: PositiveInt = 200
    min_freq: PositiveInt = 2
    number_filter: Literal["ngram", "text", "none"] = "ngram"
    mine_records: int = Field(default=1000, ge=10)  # training records mined per seed (a seeded subset)


class ModelParams(Strict):
    d_model: int = Field(default=64, ge=8)
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4
    max_len: int = Field(default=2048, ge=64)


class BaseTrain(Strict):
    steps: PositiveInt = 300
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 2e-3


class SSFT(Strict):
    steps: PositiveInt = 100
    batch_size: PositiveInt = 16
    lr: PositiveFloat = 5e-3
    full_ft_lr: PositiveFloat = 5e-4  # full fine-tuning (upper bound) uses a smaller lr
    pool: int = Field(default=1024, ge=8)  # training prompts with teacher targets


class Timing(Strict):
    rounds: int = Field(default=15, ge=3)
    n_records: PositiveInt = 64  # batch-64 prefill (and how many records batch 1 cycles)
    lengths: list[int] = Field(default=[128, 256, 512])  # latency-vs-length curve (tokens)


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.corpus_path": "parquet", "data.ehr_path": "parquet"}
    THREADS_SCALE = True  # models large enough that a second intra-op thread pays (docs/threads.md)
    TIMING_METRICS = ("prefill_reduction_per_token_reduction*",)  # measured prefill times
    data: Data
    bpe: BPEParams = BPEParams()
    tpe: TPEParams = TPEParams()
    model: ModelParams = ModelParams()
    base: BaseTrain = BaseTrain()
    ssft: SSFT = SSFT()
    timing: Timing = Timing()
    tasks: list[Task] = Field(default=["mortality", "long_stay"], min_length=1)
    variants: list[Variant] = Field(min_length=1)  # one train.<variant> node each

    @model_validator(mode="after")
    def _original_first(self):
        if "original" not in self.variants:
            raise ValueError("variants must include 'original' (the base model every other variant adapts)")
        return self
