"""Typed parameters of `kvindexer`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import MethodParams, Strict, TinyTransformerParams

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "vt")
POLICIES = ("full_kv", "streamingllm", "h2o", "snapkv", "random", "oracle", "indexer", "indexer_memory", "h2o_memory")


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    eval_path: str | None = None  # source=file: a parquet table of prompts (README, "Input format")
    context_len: int = Field(ge=32, le=4096)  # N: context tokens (BOS + haystack + needles)
    n_keys: int = Field(ge=4, le=64)  # key vocabulary
    n_values: int = Field(ge=8, le=256)  # value vocabulary (a needle's 4 values are distinct)
    n_filler: int = Field(ge=8, le=1024)  # haystack vocabulary
    n_values_per_needle: int = Field(default=4, ge=1, le=8)
    n_needles_multi: int = Field(default=4, ge=2, le=8)
    multikey_distinct_values: bool = False  # niah_multikey needles share no value (README: why)
    n_train: int = Field(ge=8)  # indexer / memory training prompts per seed
    n_eval: int = Field(ge=4)  # evaluation prompts per seed and task

    @model_validator(mode="after")
    def _check(self):
        if self.source == "file" and not self.eval_path:
            raise ValueError("data.eval_path is required when data.source is 'file'")
        if self.n_values_per_needle > self.n_values:
            raise ValueError("data.n_values_per_needle must be <= data.n_values")
        if self.multikey_distinct_values and self.n_needles_multi * self.n_values_per_needle > self.n_values:
            raise ValueError(
                f"data.multikey_distinct_values: {self.n_needles_multi} needles x "
                f"{self.n_values_per_needle} distinct values exceed data.n_values={self.n_values}"
            )
        return self


class Model(TinyTransformerParams):
    """The base model's sizes (core's TinyTransformerParams block: d_model, n_layers, n_heads, d_ff, dropout) and
    its training."""

    seed: NonNegativeInt = 0  # the base model is trained once per run
    steps: PositiveInt
    batch_size: PositiveInt
    lr: float = Field(gt=0, le=1.0)
    weight_decay: NonNegativeFloat = 0.01
    init_path: str | None = None  # a saved base state dict (skips training)
    cache_dir: str | None = None  # trained base models kept here, keyed by a hash of what determines them
    attn_init_std: PositiveFloat | None = None  # None: d_model^-0.5 (core's 0.02 plateaus)


class Protocol(Strict):
    chunk: int = Field(ge=4)  # c: streaming prefill chunk
    n_sink: NonNegativeInt
    recent: NonNegativeInt  # w: most recent tokens always kept
    budgets: list[int] = Field(min_length=1)  # C: cached tokens per layer after each eviction
    snap_window: PositiveInt = 8  # SnapKV observation window (last queries of a chunk)
    snap_kernel: PositiveInt = 5  # SnapKV average-pool kernel (odd)

    @model_validator(mode="after")
    def _check(self):
        if self.snap_kernel % 2 == 0:
            raise ValueError("protocol.snap_kernel must be odd")
        for b in self.budgets:
            if b < self.n_sink + self.recent + 1:
                raise ValueError(f"protocol.budgets: {b} leaves no room beyond n_sink + recent")
        return self


class Indexer(Strict):
    heads: int = Field(ge=1, le=64)  # H_I
    dim: int = Field(ge=2, le=1024)
    steps: PositiveInt
    batch_size: PositiveInt
    lr: float = Field(gt=0, le=1.0)
    rollout_size: PositiveInt = 128  # prompts streamed by the current indexer per refresh
    refresh_every: PositiveInt = 50  # steps between rollouts (targets on the surviving cache)


class Memory(Strict):
    dim: int = Field(ge=2, le=1024)  # feature size of the per-head state (dim x d_head)
    steps: PositiveInt
    batch_size: PositiveInt
    lr: float = Field(gt=0, le=1.0)
    beta: NonNegativeFloat  # weight of the attention-output residual loss
    gate_init: float = Field(default=-4.0, le=0)  # gate bias: sigmoid(-4) = 0.018
    train_budget: PositiveInt | None = None  # None: the smallest budget


class Eval(Strict):
    tasks: list[Literal["niah_single", "niah_multikey", "niah_multivalue", "vt"]] = Field(min_length=1)
    timing_rounds: int = Field(ge=3)
    timing_budget: PositiveInt
    timing_tokens: PositiveInt = 8
    batch_size: PositiveInt = 128  # prompts per streamed evaluation batch


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.eval_path": "parquet"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    THREADS_SCALE = True  # models large enough that a second intra-op thread pays (docs/threads.md)
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    data: Data
    model: Model
    protocol: Protocol
    indexer: Indexer
    memory: Memory
    eval: Eval
    variants: list[
        Literal[
            "full_kv", "streamingllm", "h2o", "snapkv", "random", "oracle", "indexer", "indexer_memory", "h2o_memory"
        ]
    ] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self):
        if (self.model.d_model // self.model.n_heads) % 2:
            raise ValueError("model.d_model must split into n_heads heads of even size (RoPE)")
        if self.data.context_len % self.protocol.chunk:
            raise ValueError("protocol.chunk must divide data.context_len")
        return self
