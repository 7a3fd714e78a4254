"""Typed parameters of `wedlm` (validated before any node runs; an error names the key)."""

from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import MethodParams, Strict, keys_of

Regime = Literal["count", "markov", "reverse"]


class Data(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    # source=file: JSONL rows {"regime": str, "prompt": [int], "answer": [int]} with symbol ids in
    # [0, n_symbols); the pipeline adds the tags, SEP, EOS and padding (see README).
    train_path: str | None = None
    test_path: str | None = None
    regimes: list[Regime] = Field(min_length=1)
    n_symbols: int = Field(ge=4, le=100_000)
    prompt_len: int = Field(ge=4)  # fixed prompt length after left padding
    seq_len: int = Field(ge=8)  # training length L (prompt + answer + EOS + PAD tail)
    answer_len: keys_of(get_args(Regime), int)  # answer content length per regime (EOS comes after)
    min_prompt_terms: PositiveInt
    max_prompt_terms: PositiveInt
    count_stride: PositiveInt = 1
    # set: every count item draws its stride from this list (the stride must be read off the prompt's
    # last two terms, min_prompt_terms >= 2); None: every item uses count_stride
    count_strides: list[PositiveInt] | None = Field(default=None, min_length=1)
    markov_sigma: PositiveFloat
    markov_temperature: PositiveFloat
    n_test: PositiveInt
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self):
        for r in self.regimes:
            if r not in self.answer_len:
                raise ValueError(f"answer_len has no entry for regime '{r}'")
            need = self.prompt_len + self.answer_len[r] + 1
            if need > self.seq_len:
                raise ValueError(f"seq_len {self.seq_len} < prompt_len + answer_len[{r}] + 1 = {need}")
        if self.max_prompt_terms < self.min_prompt_terms or self.max_prompt_terms > self.prompt_len - 2:
            raise ValueError("max_prompt_terms must be in [min_prompt_terms, prompt_len - 2]")
        if "reverse" in self.regimes and self.answer_len["reverse"] > self.prompt_len - 2:
            raise ValueError("answer_len['reverse'] must fit in the prompt (≤ prompt_len - 2)")
        if self.count_strides and len(set(self.count_strides)) > 1 and self.min_prompt_terms < 2:
            raise ValueError(
                "count_strides with several strides needs min_prompt_terms >= 2 (the stride "
                "must be readable from the prompt)"
            )
        if self.source == "file" and not (self.train_path and self.test_path):
            raise ValueError("source 'file' needs train_path and test_path")
        return self


class Model(Strict):
    d_model: int = Field(ge=8)
    n_heads: PositiveInt
    n_layers: PositiveInt
    d_ff: int = Field(ge=8)
    rope_base: float = Field(default=10000.0, gt=1)
    init_path: str | None = None  # a state dict of this architecture (e.g. an AR backbone)

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("d_model / n_heads must be an even integer (RoPE rotates pairs)")
        return self


class Train(Strict):
    steps: PositiveInt
    batch_size: PositiveInt
    lr: float = Field(gt=0, le=1)
    weight_decay: NonNegativeFloat
    block_size: PositiveInt  # B: masking/reordering block of the prediction stream
    gamma_min: float = Field(gt=0, le=1)  # clamp of the per-block mask ratio (1/γ weights)
    ar_weight: NonNegativeFloat  # total = (L_mlm + ar_weight · L_ar) / 2
    grad_clip: PositiveFloat
    random_block_offset: bool = True  # shift block boundaries per step (windows start anywhere)
    ar_only_seeds: list[int] = Field(default_factory=list)  # the AR-only baseline's seeds (train.ar_only); [] drops it


class Decode(Strict):
    window: PositiveInt  # W
    tau: PositiveFloat  # entropy threshold (nats)
    lam: NonNegativeFloat  # distance penalty of the method config
    lam_fast: NonNegativeFloat  # the aggressive config (and block-wise)
    max_new_tokens: PositiveInt
    refill: Literal["before_forward", "after_predict"] = "before_forward"
    fallback: Literal["argmin", "leftmost"] = "argmin"


class Eval(Strict):
    taus: list[float] = Field(min_length=1)  # frontier over the threshold (streaming and block-wise)
    n_timing: PositiveInt  # prompts per regime decoded at batch 1 for wall clock
    timing_rounds: PositiveInt = 5  # the n_timing prompts split into this many interleaved rounds
    sweeps: bool = False
    sweep_lams: list[float] = Field(default_factory=lambda: [0.0, 0.02, 0.1])
    sweep_windows: list[int] = Field(default_factory=lambda: [4, 8, 16])
    sweep_fallbacks: list[Literal["argmin", "leftmost"]] = Field(default_factory=lambda: ["argmin", "leftmost"])

    @model_validator(mode="after")
    def _taus(self):
        if any(t <= 0 for t in self.taus):
            raise ValueError("taus must be > 0")
        return self


def trained_variants(p) -> list[str]:
    """The models this run trains (all in ``train.wedlm``, so that their decoders are timed side by side):
    ``wedlm`` (one model per seed, decoded four ways) and ``ar_only`` when ``train.ar_only_seeds`` is set."""
    return ["wedlm"] + (["ar_only"] if p.train.ar_only_seeds else [])


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.train_path": "jsonl", "data.test_path": "jsonl"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "file"}
    THREADS_SCALE = True  # models large enough that a second intra-op thread pays (docs/threads.md)
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    data: Data
    model: Model
    train: Train
    decode: Decode
    eval: Eval
