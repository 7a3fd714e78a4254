"""Typed parameters of `medtpe`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""
from typing import Literal

from pydantic import Field, model_validator

from pipelines.core.params import MethodParams, Strict

Variant = Literal["original", "medtpe_init", "medtpe", "medtpe_hard", "extend", "full_ft", "token_drop",
                  "truncation"]
Task = Literal["mortality", "long_stay"]


class Data(Strict):
    seed: int = Field(default=0, ge=0)              # the EHR cohort (seeds vary the TPE mining and SSFT)
    n_train: int = Field(ge=20)
    n_test: int = Field(ge=10)
    n_events: list[int] = Field(default=[4, 8], min_length=2, max_length=2)   # events per stay, inclusive
    n_labs: int = Field(default=18, ge=4, le=18)    # lab vocabulary size
    signal_scale: float = Field(default=2.0, gt=0)
    prevalence_mortality: float = Field(default=0.13, gt=0, lt=1)
    prevalence_long_stay: float = Field(default=0.3, gt=0, lt=1)
    format: Literal["nl", "json"] = "nl"
    corpus_bytes: int = Field(default=500_000, ge=10_000)   # cap of the stdlib docstring harvest
    corpus_path: str | None = None                  # --env=full: parquet with a `text` column
    ehr_path: str | None = None                     # --env=full: parquet of stays (README)

    @model_validator(mode="after")
    def _events(self):
        lo, hi = self.n_events
        if not 1 <= lo <= hi <= 400:
            raise ValueError(f"n_events must be a range 1 <= low <= high <= 400, got {list(self.n_events)}")
        return self


class BPEParams(Strict):
    vocab_size: int = Field(default=4096, ge=300, le=200_000)
    min_pair_freq: int = Field(default=2, ge=1)


class TPEParams(Strict):
    max_n: int = Field(default=2, ge=2, le=6)
    max_m: int = Field(default=200, ge=1)
    min_freq: int = Field(default=2, ge=1)
    number_filter: Literal["ngram", "text", "none"] = "ngram"
    mine_records: int = Field(default=1000, ge=10)  # training records mined per seed (a seeded subset)


class ModelParams(Strict):
    d_model: int = Field(default=64, ge=8)
    n_layers: int = Field(default=2, ge=1)
    n_heads: int = Field(default=4, ge=1)
    max_len: int = Field(default=2048, ge=64)


class BaseTrain(Strict):
    steps: int = Field(default=300, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=2e-3, gt=0)


class SSFT(Strict):
    steps: int = Field(default=100, ge=1)
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=5e-3, gt=0)
    full_ft_lr: float = Field(default=5e-4, gt=0)   # full fine-tuning (upper bound) uses a smaller lr
    pool: int = Field(default=1024, ge=8)           # training prompts with teacher targets


class Timing(Strict):
    rounds: int = Field(default=15, ge=3)
    n_records: int = Field(default=64, ge=1)        # batch-64 prefill (and how many records batch 1 cycles)
    lengths: list[int] = Field(default=[128, 256, 512])   # latency-vs-length curve (tokens)


class Params(MethodParams):
    data: Data
    bpe: BPEParams = BPEParams()
    tpe: TPEParams = TPEParams()
    model: ModelParams = ModelParams()
    base: BaseTrain = BaseTrain()
    ssft: SSFT = SSFT()
    timing: Timing = Timing()
    tasks: list[Task] = Field(default=["mortality", "long_stay"], min_length=1)
    variants: list[Variant] = Field(min_length=1)       # one train.<variant> node each

    @model_validator(mode="after")
    def _original_first(self):
        if "original" not in self.variants:
            raise ValueError("variants must include 'original' (the base model every other variant adapts)")
        return self
