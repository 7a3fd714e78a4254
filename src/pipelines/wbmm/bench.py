"""The speed measurements: the operator benchmark of the paper's speed study (§4, Fig. 1 and the operator
tables: depthwise convolution vs WBMM and, as sweeps, an im2col depthwise conv and Swin windowed attention)
and the tiny nets' training step. Each is ONE node on purpose: the ops (or nets) it compares are timed side
by side in one process, in interleaved rounds (``core.metrics.interleaved_timing``: every round runs every
op once, in a rotated order), so a burst of load hits all of them alike and every ratio is a median of
per-round ratios with an exact interval (``core.metrics.ratio_ci``). Split into one node per op, the
ratios would compare different minutes of a shared machine.

Only ratios from one run are meant to be compared: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pandas as pd
import torch
from torch import nn

from pipelines.core.api import fit, interleaved_timing, node_setup
from pipelines.wbmm.model import build_net
from pipelines.wbmm.ops import (
    WBMM,
    WindowAttention,
    build_matrix,
    relative_index,
    unfold_dwconv,
    window_partition,
    window_reverse,
)
from pipelines.wbmm.params import Params
from pipelines.wbmm.train import cross_entropy, prepare, timing_clock

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**30
KEYS = ["dtype", "batch", "channels", "size", "op", "param", "mode"]


def tune_malloc() -> dict[str, object]:
    """Raise glibc's mmap and trim thresholds, so large outputs are not fresh page-faulting mmaps on every
    call (DW k=5 measured 5.5 ms instead of 1.05 ms without this during review). Returns what was set."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        ok_mmap = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        ok_trim = bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        return {"malloc_tuned": False, "libc": str(name)}
    return {
        "malloc_tuned": ok_mmap and ok_trim,
        "libc": str(name),
        "mmap_threshold": MMAP_THRESHOLD,
        "trim_threshold": TRIM_THRESHOLD,
    }


def backend_info(device: torch.device) -> dict[str, object]:
    """Versions and flags the DW path depends on (torch switches DW algorithms by k and backend)."""
    info: dict[str, object] = {
        "torch": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()),
    }
    for line in torch.__config__.show().splitlines():
        if "MKL-DNN" in line or "oneDNN" in line:
            info["onednn"] = line.strip().lstrip("- ")
    if device.type == "cuda":
        info.update(
            {
                "gpu": torch.cuda.get_device_name(device),
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
                "cudnn_benchmark": torch.backends.cudnn.benchmark,
            }
        )
    return info


@contextmanager
def timing_threads(n: int) -> Iterator[int]:
    """torch's intra-op thread count set to ``n`` (``bench.threads``) for the timed code, and the previous
    count restored after: a timing claim is defined at a stated thread count, not at whatever ``threads:
    auto`` resolved to on the machine that ran it (its verdicts moved with it: README)."""
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _prologue(p: Params, seed: int) -> tuple[torch.device, Callable[[], None], str, dict]:
    """Node preamble of a timing node: seed / device, the allocator setting, the clock (for the thread
    count of ``bench.threads``, which the caller sets around the timed code with :func:`timing_threads`)."""
    device = node_setup(p, seed)
    env = tune_malloc() if (p.malloc_tuning and device.type == "cpu") else {"malloc_tuned": False}
    env.update(backend_info(device))
    env.update(node_threads=env["threads"], threads=p.bench.threads, timing_threads=p.bench.threads)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock = timing_clock(p.bench.clock, device, p.bench.threads)
    env["clock"] = clock
    return device, sync, clock, env


def padded(size: int, w: int) -> int:
    return math.ceil(size / w) * w


def op_flops(op: str, param: int, batch: int, channels: int, size: int) -> float:
    """Multiply-adds ×2 of one forward; WBMM counts the zero-padded area (it computes it)."""
    if op == "wbmm":
        return 2.0 * batch * channels * padded(size, param) ** 2 * param**2
    if op in ("dw", "unfold"):
        return 2.0 * batch * channels * size * size * param**2
    return float("nan")


def _callable(op: str, param: int, mode: str, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], object]:
    """A zero-argument call of one measurement. Training mode rebuilds WBMM's M from R every call and
    clears gradients (set_to_none, as an optimizer step would) so nothing accumulates across calls."""
    c = x.shape[1]
    dev, dt = x.device, x.dtype
    if op == "wbmm_build_m":
        table = torch.randn(c, (2 * param - 1) ** 2, device=dev, dtype=dt)
        index = relative_index(param, device=dev)
        return lambda: build_matrix(table, index)
    if op == "wbmm_reshape":

        def reshape() -> torch.Tensor:
            xw, shape = window_partition(x, param)
            return window_reverse(xw, param, x.shape[0], shape)

        return reshape
    if op == "unfold":
        weight = nn.Parameter(torch.randn(c, 1, param, param, device=dev, dtype=dt) * 0.1)
        if mode == "fwd":
            return lambda: unfold_dwconv(x, weight.detach())
        xg = x.detach().clone().requires_grad_(True)

        def unfold_step() -> None:
            weight.grad, xg.grad = None, None
            unfold_dwconv(xg, weight).backward(grad)

        return unfold_step
    if op == "dw":
        mod: nn.Module = nn.Conv2d(c, c, param, padding=param // 2, groups=c, bias=False)
    elif op == "wbmm":
        mod = WBMM(c, param)
    elif op == "attn":
        mod = WindowAttention(c, param)
    else:
        raise ValueError(f"unknown op {op!r}")
    mod = mod.to(device=dev, dtype=dt)
    if mode == "fwd":
        mod.eval()
        if isinstance(mod, WBMM):
            mod.cache()  # inference uses the cached dense M (build time is timed separately)
        return lambda: mod(x)
    mod.train()
    xg = x.detach().clone().requires_grad_(True)

    def step() -> None:
        for prm in mod.parameters():
            prm.grad = None
        xg.grad = None
        mod(xg).backward(grad)

    return step


def inner_count(
    fn: Callable[[], object], sync: Callable[[], None], clock: str, min_sample_s: float, max_inner: int
) -> int:
    """Calls per sample: enough that one sample lasts ``min_sample_s`` (from a warm call's time), so
    sub-millisecond ops are not timed at the clock's and the scheduler's granularity."""
    tick = time.perf_counter if clock == "wall" else time.process_time
    fn()
    sync()
    t0 = tick()
    fn()
    sync()
    t = tick() - t0
    return int(min(max_inner, max(1, math.ceil(min_sample_s / max(t, 1e-9)))))


def time_group(
    calls: dict, sync: Callable[[], None], clock: str, rounds: int, warmup: int, min_sample_s: float, max_inner: int
) -> dict:
    """``{key: (seconds per call, one value per round), inner}`` for calls timed together in interleaved
    rounds; each sample repeats its call ``inner`` times (per call, from :func:`inner_count`)."""
    inner = {k: inner_count(fn, sync, clock, min_sample_s, max_inner) for k, fn in calls.items()}
    times = interleaved_timing(calls, rounds=rounds, warmup=warmup, sync=sync, clock=clock, inner=inner)
    return {k: (times[k], inner[k]) for k in calls}


def run_benchmark(grid: pd.DataFrame, p: Params) -> tuple[pd.DataFrame, dict]:
    """Time every row of ``grid`` on this process's device: one row per (measurement, round) with the
    seconds per call of that round; and the backend/allocator/clock settings used."""
    b_ = p.bench
    device, sync, clock, env = _prologue(p, p.seeds[0])
    env.update(rounds=b_.rounds, warmup=b_.warmup, min_sample_s=b_.min_sample_s, confidence=b_.confidence)
    with timing_threads(b_.threads):
        results = _time_grid(grid, p, device, sync, clock)
    return pd.DataFrame(results), env


def _time_grid(grid: pd.DataFrame, p: Params, device: torch.device, sync: Callable[[], None], clock: str) -> list[dict]:
    b_ = p.bench
    results = []
    for (dtype, b, c, h), rows in grid.groupby(["dtype", "batch", "channels", "size"], sort=False):
        seed = p.seeds[0] * 1_000_003 + zlib.crc32(f"{dtype}-{b}-{c}-{h}".encode())
        gen = torch.Generator().manual_seed(seed)
        dt = getattr(torch, dtype)
        x = torch.randn(b, c, h, h, generator=gen).to(device=device, dtype=dt)
        grad = torch.randn(b, c, h, h, generator=gen).to(device=device, dtype=dt)
        torch.manual_seed(seed)  # module initialisations
        calls = {
            (r.op, int(r.param), r.mode): _callable(r.op, int(r.param), r.mode, x, grad) for r in rows.itertuples()
        }
        timed = {}
        for mode in dict.fromkeys(k[2] for k in calls):  # fwd under no_grad, fwd+bwd with autograd
            group = {k: v for k, v in calls.items() if k[2] == mode}
            with torch.set_grad_enabled(mode != "fwd"):
                timed.update(time_group(group, sync, clock, b_.rounds, b_.warmup, b_.min_sample_s, b_.max_inner))
        for (op, param, mode), (secs, inner) in timed.items():
            for r, s in enumerate(secs):
                results.append(
                    {
                        "dtype": dtype,
                        "batch": int(b),
                        "channels": int(c),
                        "size": int(h),
                        "op": op,
                        "param": param,
                        "mode": mode,
                        "round": r,
                        "seconds": float(s),
                        "inner": inner,
                        "threads": torch.get_num_threads(),
                    }
                )
        del calls, x, grad
    return results


def train_speed(images: dict, p: Params) -> pd.DataFrame:
    """Training-step time of every variant's tiny net, interleaved: each timed call is one step of
    ``core.training.fit`` (forward, cross-entropy, backward, AdamW with its state kept across calls) on
    the same standardised batch of ``acc.batch_size`` training images, at ``bench.threads`` intra-op threads
    (:func:`timing_threads`). One row per (variant, round)."""
    device, sync, clock, _ = _prologue(p, p.seeds[0])
    with timing_threads(p.bench.threads) as threads:
        return _train_speed(images, p, device, sync, clock, threads)


def _train_speed(
    images: dict, p: Params, device: torch.device, sync: Callable[[], None], clock: str, threads: int
) -> pd.DataFrame:
    a, seed = p.acc, p.seeds[0]
    xtr, ytr, _, yte, n_classes = prepare(images[str(seed)], device)
    xb, yb = xtr[: a.batch_size], ytr[: a.batch_size]
    fns = {}
    for variant, pattern in a.variants.items():
        torch.manual_seed(seed)
        net = build_net(pattern, xb.shape[1], n_classes, a).to(device)
        opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=a.weight_decay)

        def step(net: nn.Module = net, opt: torch.optim.Optimizer = opt, desc: str = f"{variant} step") -> None:
            fit(
                net,
                (xb, yb),
                cross_entropy,
                epochs=1,
                batch_size=None,
                optimizer=lambda _params: opt,
                grad_clip=None,
                seed=seed,
                progress=False,
                desc=desc,
            )

        fns[variant] = step
    times = interleaved_timing(fns, rounds=a.speed_rounds, warmup=a.speed_warmup, sync=sync, clock=clock)
    return pd.DataFrame(
        [
            {"variant": v, "round": r, "seconds": float(s), "batch_size": len(yb), "clock": clock, "threads": threads}
            for v, ts in times.items()
            for r, s in enumerate(ts)
        ]
    )
