"""Tests of `wbmm`: the operator against independent references (per-window F.conv2d, a brute-force loop,
F.conv2d for the im2col baseline), the re-parameterisation, the benchmark metrics on known numbers,
bad parameters, and the end-to-end --env=test run."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from pipelines.core.params import ParameterError, parse
from pipelines.wbmm.ops import (WBMM, WindowAttention, build_matrix, dw_kernel_to_table, relative_index,
                                unfold_dwconv, wbmm)

BENCH = {"batch": [1], "channels": [4], "sizes": [14, 28], "dw_kernels": [5, 7, 13, 27], "windows": [7, 14]}
ACC = {"variants": {"wbmm_d3": ["w7", "dw3"], "dw7_d3": ["dw7", "dw3"], "dw13_d3": ["dw13", "dw3"]}}


def raw_params(**over):
    raw = {"seeds": [0], "threads": 1, "bench": dict(BENCH), "acc": dict(ACC)}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return raw


def per_window_conv(x: torch.Tensor, table: torch.Tensor, w: int, flip: bool = False) -> torch.Tensor:
    """Reference: zero-pad the map to multiples of w, then for every window a depthwise F.conv2d with the
    (2w−1)² kernel R.view(C, 1, 2w−1, 2w−1) and zero padding at the window border, plus the identity."""
    b, c, h, wd = x.shape
    hp, wp = -(-h // w) * w, -(-wd // w) * w
    xp = F.pad(x, (0, wp - wd, 0, hp - h))
    kernel = table.view(c, 1, 2 * w - 1, 2 * w - 1)
    if flip:
        kernel = kernel.flip(-1, -2)
    out = torch.zeros_like(xp)
    for i in range(0, hp, w):
        for j in range(0, wp, w):
            win = xp[:, :, i:i + w, j:j + w]
            out[:, :, i:i + w, j:j + w] = F.conv2d(win, kernel, padding=w - 1, groups=c) + win
    return out[:, :, :h, :wd]


@pytest.mark.parametrize("shape,w", [((2, 3, 14, 14), 7), ((1, 4, 8, 8), 4), ((2, 2, 10, 13), 4),
                                     ((1, 3, 5, 6), 7), ((1, 2, 28, 28), 14)])
def test_wbmm_equals_per_window_conv2d_plus_identity(shape, w):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen)
    table = torch.randn(shape[1], (2 * w - 1) ** 2, generator=gen)  # asymmetric: a flip would show
    y = wbmm(x, build_matrix(table, relative_index(w)), w)
    assert y.shape == x.shape
    torch.testing.assert_close(y, per_window_conv(x, table, w), atol=1e-5, rtol=0)
    # the convention is cross-correlation: the flipped kernel is far off
    assert (y - per_window_conv(x, table, w, flip=True)).abs().max() > 1.0


def test_wbmm_matches_brute_force_loop():
    """An independent float64 loop: y[p] = x[p] + Σ_{q in p's window} x[q]·K[q − p + w − 1]."""
    rng = np.random.default_rng(1)
    c, h, w = 2, 6, 3
    x = rng.normal(size=(1, c, h, h))
    k = rng.normal(size=(c, 2 * w - 1, 2 * w - 1))
    ref = x.copy()
    for ch in range(c):
        for pr in range(h):
            for pc in range(h):
                wr, wc = pr // w * w, pc // w * w
                for qr in range(wr, wr + w):
                    for qc in range(wc, wc + w):
                        ref[0, ch, pr, pc] += x[0, ch, qr, qc] * k[ch, qr - pr + w - 1, qc - pc + w - 1]
    y = wbmm(torch.from_numpy(x), build_matrix(torch.from_numpy(k.reshape(c, -1)), relative_index(w)), w)
    np.testing.assert_allclose(y.numpy(), ref, atol=1e-12)


def test_relative_index_structure():
    w = 4
    idx = relative_index(w)
    assert idx.shape == (w * w, w * w)
    assert idx.min() == 0 and idx.max() == (2 * w - 1) ** 2 - 1
    centre = (w - 1) * (2 * w - 1) + (w - 1)
    assert torch.all(idx.diagonal() == centre)  # zero offset on the diagonal
    assert torch.all(idx + idx.T == 2 * centre)  # offsets a−b and b−a mirror around the centre


def test_module_cache_and_gradient():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)  # 5 is padded to 6 (w = 3)
    table = torch.randn(2, 25, dtype=torch.float64, requires_grad=True)
    index = relative_index(3)
    assert torch.autograd.gradcheck(lambda t, r: wbmm(t, build_matrix(r, index), 3), (x, table), fast_mode=True)
    mod = WBMM(3, 4).double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    mod.eval()
    y = mod(x).detach()
    torch.testing.assert_close(mod.cache()(x), y)
    mod.train()  # training always rebuilds M from R, so a stale cache is never used
    with torch.no_grad():
        mod.table.add_(1.0)
    assert not torch.allclose(mod(x), y)
    # init: truncated normal with std 0.02
    assert WBMM(64, 7).table.abs().max() <= 0.04 + 1e-6


def test_reparameterised_dw_kernel_equals_dw_conv_on_a_single_window():
    """Where the map equals the window, a DW k×k conv (k ≤ 2w−1) is exactly WBMM with the kernel embedded."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 7, 7, generator=gen, dtype=torch.float64)
    for k in (3, 5, 13):
        kernel = torch.randn(3, k, k, generator=gen, dtype=torch.float64)
        y = wbmm(x, build_matrix(dw_kernel_to_table(kernel, 7), relative_index(7)), 7)
        ref = F.conv2d(x, kernel.unsqueeze(1), padding=k // 2, groups=3) + x
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="at most 2w-1"):
        dw_kernel_to_table(torch.zeros(3, 15, 15), 7)


def test_unfold_dwconv_matches_conv2d():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 9, 11, generator=gen)
    weight = torch.randn(5, 1, 5, 5, generator=gen)
    torch.testing.assert_close(unfold_dwconv(x, weight), F.conv2d(x, weight, padding=2, groups=5),
                               atol=1e-5, rtol=1e-5)


def test_window_attention_is_window_local():
    torch.manual_seed(0)
    attn = WindowAttention(32, 7).eval()
    x = torch.randn(1, 32, 14, 14)
    x2 = x.clone()
    x2[:, :, 0, 0] += 5.0  # inside the top-left window only
    with torch.no_grad():
        d = (attn(x2) - attn(x)).abs().sum(1)[0]
    assert d[:7, :7].max() > 1e-3
    assert d[7:, :].max() == 0 and d[:, 7:].max() == 0


def test_bench_metrics_on_known_times():
    """Speedups are t_DW / t_WBMM of the same config; slopes are log-log fits; GFLOP ratio uses padded area."""
    from pipelines.wbmm.evaluate import bench_metrics, loglog_slope

    assert loglog_slope([1, 4, 16], [2, 4, 8]) == pytest.approx(0.5)
    raw = raw_params()
    rows = []
    for h in (14, 28):
        for k in (5, 7, 13, 27):
            for mode, f in (("fwd", 1.0), ("fwdbwd", 3.0)):
                rows.append({"dtype": "float32", "batch": 1, "channels": 4, "size": h, "op": "dw", "param": k,
                             "mode": mode, "ms": f * k * k / 10, "gflops_effective": 1.0})
        for w in (7, 14):
            for mode, f in (("fwd", 1.0), ("fwdbwd", 2.0)):
                rows.append({"dtype": "float32", "batch": 1, "channels": 4, "size": h, "op": "wbmm", "param": w,
                             "mode": mode, "ms": f * 2.0, "gflops_effective": float(w * w)})
    var_rows, m = bench_metrics(pd.DataFrame(rows), raw)
    assert m["speedup.fwd.wbmm_w7_vs_dw_k7.b1_c4_h28"] == pytest.approx(4.9 / 2.0)
    assert m["speedup.fwdbwd.wbmm_w14_vs_dw_k5.min_h_ge28"] == pytest.approx(7.5 / 4.0)
    assert m["slope_dw_time_vs_k2.fwd.min"] == pytest.approx(1.0)
    assert m["slope_wbmm_time_vs_w2.fwd.max_h_ge28"] == pytest.approx(0.0, abs=1e-9)
    assert m["gflops_ratio.wbmm_w14_vs_w7.min_h_ge28"] == pytest.approx(4.0)
    assert m["w14_faster_than_dw5.fwd.b1_c4_h14"] == 1.0
    names = {r["variant"] for r in var_rows}
    assert names == {"dw_k5", "dw_k7", "dw_k13", "dw_k27", "wbmm_w7", "wbmm_w14"}
    assert all("fwd_ms_b1_c4_h14" in r for r in var_rows)


def test_interleaved_timer_counts_reps():
    from pipelines.wbmm.bench import _time_interleaved

    calls = {("a",): lambda: sum(range(100)), ("b",): lambda: sum(range(1000))}
    out = _time_interleaved(calls, lambda: None, warmup=1, min_reps=3, min_total_s=0.0, max_reps=10,
                            max_call_s=1.0)
    assert {k: v["reps"] for k, v in out.items()} == {("a",): 3, ("b",): 3}
    assert all(v["p25_ms"] <= v["ms"] <= v["p75_ms"] for v in out.values())


def test_grid_pads_and_caps_unfold():
    from pipelines.wbmm.bench import make_grid, op_flops

    grid = make_grid(raw_params(bench={"unfold_kernels": [5, 27], "unfold_max_mb": 1.0}))
    assert set(grid[grid.op == "unfold"].param) == {5}  # k=27 at 28×28 needs > 1 MB of im2col buffer
    assert op_flops("wbmm", 4, 1, 1, 14) == 2.0 * 16 * 16 * 16  # 14 is padded to 16


@pytest.mark.parametrize("over,key", [
    ({"bench": {"dw_kernels": [4, 7, 13, 27]}}, r"wbmm\.bench\.dw_kernels"),
    ({"bench": {"windows": [0, 7, 14]}}, r"wbmm\.bench\.windows"),
    ({"pairs": {"headline": [8, 5]}}, r"wbmm\.pairs"),
    ({"acc": {"variants": {"x": ["conv7"]}}}, r"wbmm\.acc\.variants"),
    ({"acc": {"epochs": 0}}, r"wbmm\.acc\.epochs"),
    ({"bench": {"modes": ["bwd"]}}, r"wbmm\.bench\.modes"),
    ({"typo_key": 1}, r"wbmm\.typo_key"),
])
def test_bad_parameter_names_the_key(over, key):
    with pytest.raises(ParameterError, match=key):
        parse("wbmm", raw_params(**over))


def test_default_parameters_are_valid_and_pairs_match_the_card():
    import yaml

    from tests.conftest import ROOT

    raw = yaml.safe_load((ROOT / "conf" / "base" / "parameters_wbmm.yml").read_text())["wbmm"]
    p = parse("wbmm", raw)
    assert p.pairs.headline == (14, 5) and (7, 13) in p.pairs.matched_params
    assert list(p.acc.variants)[0] == "wbmm_d3"
    assert math.isclose((2 * 7 - 1) ** 2, 13 * 13)  # matched parameters: table of w=7 ↔ DW k=13


@pytest.mark.e2e
def test_end_to_end(run_pipeline):
    report = run_pipeline("wbmm").report
    assert report["env"] == "test"
    assert {"wbmm_d3", "dw7_d3", "dw13_d3", "wbmm_w7", "wbmm_w14", "dw_k5", "unfold_k5", "attn_w7"} <= set(
        report["variants"])
    assert [c["id"] for c in report["claims"]][:2] == ["wbmm_time_flat_in_window", "wbmm_gflops_rise_with_window"]
    assert all(isinstance(c["holds"], bool) for c in report["claims"])
    assert {"speedup_heatmap.png", "latency_float32_c4_h28.png"} <= set(report["artifacts"])
    assert report["bench_env"]["threads"] == report["threads"]
