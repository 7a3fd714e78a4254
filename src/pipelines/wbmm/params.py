"""Typed parameters of `wbmm` (Kedro validates ``params:wbmm`` into :class:`Params` before any node runs;
a bad value stops the run with one line naming its key)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
)

from pipelines.core.api import MethodParams, Strict, VariantName

MIXER_RE = re.compile(r"^(w|dw)([1-9][0-9]*)$")

Pair = Annotated[list[int], Field(min_length=2, max_length=2)]  # (window w, DW kernel k)


def _odd(values: list[int]) -> list[int]:
    bad = [k for k in values if k % 2 == 0]
    if bad:
        raise ValueError(f"depthwise kernels must be odd (padding k//2 keeps the size), got {bad}")
    return values


def _check_rounds(n: int, confidence: float, key: str) -> None:
    """n rounds must be able to give a median interval of this confidence: the widest, (min, max) of n
    values, misses the median with probability 2·2⁻ⁿ."""
    if 2.0 * 0.5**n > 1.0 - confidence + 1e-12:
        need = next(k for k in range(1, 64) if 2.0 * 0.5**k <= 1.0 - confidence + 1e-12)
        raise ValueError(f"{n} {key} cannot give a {confidence:g} interval (at least {need} needed)")


class Bench(Strict):
    """The operator grid: every (dtype, B, C, H) config times every op below, interleaved in rounds."""

    batch: list[int] = Field(min_length=1)
    channels: list[int] = Field(min_length=1)
    sizes: list[int] = Field(min_length=1)  # H = W
    dw_kernels: list[int] = Field(min_length=1)
    windows: list[int] = Field(min_length=1)
    unfold_kernels: list[int] = Field(default_factory=list)  # im2col strawman (sweep)
    unfold_max_mb: PositiveFloat = 256  # skip unfold configs whose im2col buffer is larger
    attn_windows: list[int] = Field(default_factory=list)  # Swin windowed attention (sweep)
    dtypes: list[Literal["float32", "float16", "bfloat16"]] = Field(default_factory=lambda: ["float32"])
    modes: list[Literal["fwd", "fwdbwd"]] = Field(default_factory=lambda: ["fwd", "fwdbwd"])
    clock: Literal["auto", "wall", "cpu"] = "auto"  # auto: process CPU time on 1-thread CPU runs, else wall
    # the intra-op thread count every timing (operator grid and training step) runs at: part of the timing
    # claims' definition, set inside the timing code and restored after (the nets train at `threads`)
    threads: PositiveInt = 1
    confidence: float = Field(default=0.95, gt=0.5, lt=1)  # of every timing interval (grid summaries: joint)
    rounds: int = Field(default=15, ge=3)  # interleaved rounds = paired samples behind every interval
    warmup: NonNegativeInt = 1  # untimed interleaved rounds before the timed ones
    min_sample_s: NonNegativeFloat = 0.002  # a sample repeats a short op until it lasts this long
    max_inner: PositiveInt = 100  # at most this many calls per sample
    slope_dw_kernels: list[int] = Field(default_factory=lambda: [7, 9, 13, 17, 27])

    @field_validator("batch", "channels", "sizes", "windows", "attn_windows")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError(f"values must be >= 1, got {v}")
        return v

    @field_validator("rounds")
    @classmethod
    def _rounds_reach_confidence(cls, v: int, info: ValidationInfo) -> int:
        if "confidence" in info.data:
            _check_rounds(v, info.data["confidence"], "rounds")
        return v

    @field_validator("dw_kernels", "unfold_kernels", "slope_dw_kernels")
    @classmethod
    def _odd_kernels(cls, v: list[int]) -> list[int]:
        return _odd(v)


class Pairs(Strict):
    """The reported (w, k) pairs: speedup = t_DW(k) / t_WBMM(w), paired round by round."""

    matched_rf: list[Pair] = Field(default_factory=lambda: [[7, 7], [14, 13]])
    matched_params: list[Pair] = Field(default_factory=lambda: [[7, 13], [14, 27]])
    headline: Pair = Field(default_factory=lambda: [14, 5])


class Acc(Strict):
    """The small accuracy check: a 2-stage net whose stages alternate the mixers of a variant."""

    data_path: str | None = None  # .npz with x_train, y_train, x_test, y_test (see README); None = digits
    size: int = Field(default=14, ge=7)  # images are bilinearly resized to size×size
    test_size: int = Field(default=540, ge=10)
    train_limit: int | None = Field(default=None, ge=10)  # use only the first n training images (tests)
    widths: Annotated[list[int], Field(min_length=2, max_length=2)] = Field(default_factory=lambda: [16, 32])
    blocks: PositiveInt = 2
    ffn_ratio: PositiveInt = 2
    layer_scale_init: PositiveFloat = 1.0
    variants: dict[VariantName, list[str]] = Field(min_length=1)  # name → mixer pattern cycled over a stage's blocks
    epochs: PositiveInt = 6
    batch_size: int = Field(default=64, ge=2)
    lr: PositiveFloat = 2e-3
    weight_decay: NonNegativeFloat = 0.05
    speed_rounds: int = Field(default=31, ge=3)  # interleaved training-step rounds (evaluate.train_speed)
    speed_warmup: NonNegativeInt = 3

    @field_validator("widths")
    @classmethod
    def _widths(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError(f"widths must be >= 1, got {v}")
        return v

    @field_validator("variants")
    @classmethod
    def _mixers(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, pattern in v.items():
            if not pattern:
                raise ValueError(f"variant {name!r}: empty mixer pattern")
            for m in pattern:
                match = MIXER_RE.match(m)
                if not match:
                    raise ValueError(f"variant {name!r}: mixer {m!r} is not 'w<window>' or 'dw<odd kernel>'")
                if match.group(1) == "dw" and int(match.group(2)) % 2 == 0:
                    raise ValueError(f"variant {name!r}: depthwise kernel in {m!r} must be odd")
        return v


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"acc.data_path": "npz"}
    # measured operator speeds and their ratios
    TIMING_METRICS = ("gflops_effective*", "gflops_ratio*", "jump_dw_*", "w14_faster_than_dw5*")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    malloc_tuning: bool = True  # raise glibc's mmap/trim thresholds before timing (see README)
    bench: Bench
    pairs: Pairs = Field(default_factory=Pairs)
    acc: Acc

    @field_validator("acc")
    @classmethod
    def _speed_rounds_reach_confidence(cls, acc: Acc, info: ValidationInfo) -> Acc:
        bench = info.data.get("bench")
        if bench is not None:
            _check_rounds(acc.speed_rounds, bench.confidence, "speed_rounds")
        return acc

    @field_validator("bench")
    @classmethod
    def _cpu_clock_single_thread(cls, bench: Bench, info: ValidationInfo) -> Bench:
        if bench.clock == "cpu" and bench.threads != 1:
            raise ValueError("clock 'cpu' (process CPU time) measures latency only with bench.threads: 1")
        return bench

    @field_validator("pairs")
    @classmethod
    def _pairs_in_grid(cls, pairs: Pairs, info: ValidationInfo) -> Pairs:
        bench = info.data.get("bench")
        if bench is None:  # bench itself failed; its error is reported
            return pairs
        for w, k in [*pairs.matched_rf, *pairs.matched_params, pairs.headline]:
            if w not in bench.windows:
                raise ValueError(f"window {w} is not in bench.windows {bench.windows}")
            if k not in bench.dw_kernels:
                raise ValueError(f"kernel {k} is not in bench.dw_kernels {bench.dw_kernels}")
        return pairs
