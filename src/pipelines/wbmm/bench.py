"""The operator benchmark of the paper's speed study (§4, Fig. 1 and the operator tables): depthwise
convolution vs WBMM (and, as sweeps, an im2col depthwise conv and Swin windowed attention), all ops of
one (dtype, B, C, H) config measured in the same process, interleaved round-robin, median of repeats.

Only ratios from one run are meant to be compared: absolute times depend on the machine and its load.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import math
import statistics
import time
import zlib
from collections.abc import Callable

import pandas as pd
import torch
from torch import nn

from pipelines.core.params import parse
from pipelines.core.runtime import get_device, set_threads
from pipelines.wbmm.ops import (WBMM, WindowAttention, build_matrix, relative_index, unfold_buffer_mb,
                                unfold_dwconv, window_partition, window_reverse)

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**30


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
    return {"malloc_tuned": ok_mmap and ok_trim, "libc": str(name), "mmap_threshold": MMAP_THRESHOLD,
            "trim_threshold": TRIM_THRESHOLD}


def backend_info(device: torch.device) -> dict[str, object]:
    """Versions and flags the DW path depends on (torch switches DW algorithms by k and backend)."""
    info: dict[str, object] = {
        "torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()),
    }
    cfg = torch.__config__.show()
    for line in cfg.splitlines():
        if "MKL-DNN" in line or "oneDNN" in line:
            info["onednn"] = line.strip().lstrip("- ")
    if device.type == "cuda":
        info.update({"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version(), "cudnn_benchmark": torch.backends.cudnn.benchmark})
    return info


def timing_clock(choice: str, device: torch.device, threads: int) -> str:
    """'auto': this process's CPU time on a 1-thread CPU run (on a shared machine it is what an idle core
    would take, while wall time also counts the waits for other jobs' time slices), else wall time
    (GPU: after a synchronize; several CPU threads: CPU time would add the threads up)."""
    if choice != "auto":
        if choice == "cpu" and (device.type != "cpu" or threads != 1):
            raise ValueError("parameter wbmm.bench.clock: 'cpu' needs device cpu and threads: 1")
        return choice
    return "cpu" if device.type == "cpu" and threads == 1 else "wall"


def padded(size: int, w: int) -> int:
    return math.ceil(size / w) * w


def op_flops(op: str, param: int, batch: int, channels: int, size: int) -> float:
    """Multiply-adds ×2 of one forward; WBMM counts the zero-padded area (it computes it)."""
    if op == "wbmm":
        return 2.0 * batch * channels * padded(size, param) ** 2 * param**2
    if op in ("dw", "unfold"):
        return 2.0 * batch * channels * size * size * param**2
    return float("nan")


def make_grid(raw: dict) -> pd.DataFrame:
    """One row per measurement of the benchmark: (dtype, batch, channels, size, op, param, mode)."""
    p = parse("wbmm", raw).bench
    rows = []
    for dtype, b, c, h in itertools.product(p.dtypes, p.batch, p.channels, p.sizes):
        ops = [("dw", k) for k in p.dw_kernels] + [("wbmm", w) for w in p.windows]
        ops += [("unfold", k) for k in p.unfold_kernels if unfold_buffer_mb(b, c, h, k) <= p.unfold_max_mb]
        ops += [("attn", w) for w in p.attn_windows]
        for (op, param), mode in itertools.product(ops, p.modes):
            rows.append({"dtype": dtype, "batch": b, "channels": c, "size": h, "op": op, "param": param,
                         "mode": mode})
        # the two parts of WBMM's forward the paper's cost discussion separates
        for w in p.windows:
            rows.append({"dtype": dtype, "batch": b, "channels": c, "size": h, "op": "wbmm_build_m", "param": w,
                         "mode": "fwd"})
            rows.append({"dtype": dtype, "batch": b, "channels": c, "size": h, "op": "wbmm_reshape", "param": w,
                         "mode": "fwd"})
    return pd.DataFrame(rows)


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
    if op == "dw":
        mod: nn.Module = nn.Conv2d(c, c, param, padding=param // 2, groups=c, bias=False)
    elif op == "wbmm":
        mod = WBMM(c, param)
    elif op == "attn":
        mod = WindowAttention(c, param)
    elif op == "unfold":
        weight = nn.Parameter(torch.randn(c, 1, param, param, device=dev, dtype=dt) * 0.1)
        mod = None  # functional
    else:
        raise ValueError(f"unknown op {op!r}")
    if op == "unfold":
        if mode == "fwd":
            return lambda: unfold_dwconv(x, weight.detach())
        xg = x.detach().clone().requires_grad_(True)

        def unfold_step() -> None:
            weight.grad, xg.grad = None, None
            unfold_dwconv(xg, weight).backward(grad)
        return unfold_step
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


def _time_interleaved(calls: dict[tuple, Callable[[], object]], sync: Callable[[], None], warmup: int,
                      min_reps: int, min_total_s: float, max_reps: int, max_call_s: float,
                      clock: str = "wall") -> dict[tuple, dict]:
    """Warm every call up, pick its repeat count from its warm-up time, then time all calls round-robin
    (rotating the start so no op always follows the same one) and keep median and quartiles of the
    chosen clock ('wall' or 'cpu' = this process's CPU time); the wall-clock median is kept as well."""
    pick = 1 if clock == "cpu" else 0
    def once(fn: Callable[[], object]) -> tuple[float, float]:
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync()
        return time.perf_counter() - t0, time.process_time() - c0

    warm: dict[tuple, float] = {}
    for _ in range(warmup):
        for key, fn in calls.items():
            warm[key] = once(fn)[pick]
    reps = {}
    for key, t in warm.items():
        n = min_reps if t > max_call_s else max(min_reps, math.ceil(min_total_s / max(t, 1e-9)))
        reps[key] = min(n, max(max_reps, min_reps))
    times: dict[tuple, list[float]] = {k: [] for k in calls}
    walls: dict[tuple, list[float]] = {k: [] for k in calls}
    keys = list(calls)
    for r in range(max(reps.values())):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            if r < reps[key]:
                wall, cpu = once(calls[key])
                times[key].append(cpu if pick else wall)
                walls[key].append(wall)
    out = {}
    for key, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        out[key] = {"ms": 1e3 * statistics.median(ts), "p25_ms": 1e3 * q[0], "p75_ms": 1e3 * q[2],
                    "reps": len(ts), "warmup_ms": 1e3 * warm[key],
                    "wall_ms": 1e3 * statistics.median(walls[key])}
    return out


def run_benchmark(grid: pd.DataFrame, raw: dict) -> tuple[pd.DataFrame, dict]:
    """Time every row of ``grid`` on this process's device; returns the rows with ``ms`` (median),
    quartiles, repeat count and effective GFLOP/s, and the backend/allocator settings used."""
    p = parse("wbmm", raw)
    set_threads(p.threads)
    device = get_device(p.device)
    env = tune_malloc() if (p.malloc_tuning and device.type == "cpu") else {"malloc_tuned": False}
    env.update(backend_info(device))
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock = timing_clock(p.bench.clock, device, torch.get_num_threads())
    env["clock"] = clock
    results = []
    for (dtype, b, c, h), rows in grid.groupby(["dtype", "batch", "channels", "size"], sort=False):
        seed = p.seeds[0] * 1_000_003 + zlib.crc32(f"{dtype}-{b}-{c}-{h}".encode())
        gen = torch.Generator().manual_seed(seed)
        dt = getattr(torch, dtype)
        x = torch.randn(b, c, h, h, generator=gen).to(device=device, dtype=dt)
        grad = torch.randn(b, c, h, h, generator=gen).to(device=device, dtype=dt)
        torch.manual_seed(seed)  # module initialisations
        calls = {(r.op, int(r.param), r.mode): _callable(r.op, int(r.param), r.mode, x, grad)
                 for r in rows.itertuples()}
        with torch.no_grad():
            fwd = {k: v for k, v in calls.items() if k[2] == "fwd"}
            timed = _time_interleaved(fwd, sync, p.bench.warmup, p.bench.min_reps, p.bench.min_total_s,
                                      p.bench.max_reps, p.bench.max_call_s, clock) if fwd else {}
        bwd = {k: v for k, v in calls.items() if k[2] == "fwdbwd"}
        if bwd:
            timed.update(_time_interleaved(bwd, sync, p.bench.warmup, p.bench.min_reps, p.bench.min_total_s,
                                           p.bench.max_reps, p.bench.max_call_s, clock))
        for (op, param, mode), t in timed.items():
            flops = op_flops(op, param, b, c, h) if mode == "fwd" else float("nan")
            results.append({"dtype": dtype, "batch": int(b), "channels": int(c), "size": int(h), "op": op,
                            "param": param, "mode": mode, **t,
                            "padded_size": padded(int(h), param) if op.startswith("wbmm") or op == "attn" else int(h),
                            "gflops_effective": flops / (t["ms"] * 1e-3) / 1e9})
        del calls, x, grad
    return pd.DataFrame(results), env
