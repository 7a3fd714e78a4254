"""Tests of `wbmm`: the operator against independent references (per-window F.conv2d, a brute-force loop,
F.conv2d for the im2col baseline), the re-parameterisation, the interleaved timing and the intervals of
the speed metrics on known numbers, the port of the training loop onto core's fit (against the old loop),
the variant and benchmark nodes, the report through core, the method's parameter rules and bad user images. Float comparisons between different
code paths are made in float64, or against a float32 error bound scaled to the reduction length."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.wbmm.ops import (
    WBMM,
    WindowAttention,
    build_matrix,
    dw_kernel_to_table,
    relative_index,
    unfold_dwconv,
    wbmm,
)
from pipelines.wbmm.params import Params

BENCH = {"batch": [1], "channels": [4], "sizes": [14, 28], "dw_kernels": [5, 7, 13, 27], "windows": [7, 14]}
ACC = {"variants": {"wbmm_d3": ["w7", "dw3"], "dw7_d3": ["dw7", "dw3"], "dw13_d3": ["dw13", "dw3"]}}
TINY_ACC = {
    "widths": [4, 8],
    "epochs": 1,
    "batch_size": 32,
    "train_limit": 96,
    "test_size": 60,
    "speed_rounds": 6,
    "speed_warmup": 1,
}


def raw_params(**over) -> dict:
    raw = {"seeds": [0], "threads": 1, "bench": dict(BENCH), "acc": dict(ACC)}
    for k, v in over.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    return raw


def params(**over) -> Params:
    return validate(Params, raw_params(**over), "wbmm")


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
            win = xp[:, :, i : i + w, j : j + w]
            out[:, :, i : i + w, j : j + w] = F.conv2d(win, kernel, padding=w - 1, groups=c) + win
    return out[:, :, :h, :wd]


# --------------------------------------------------------------------------------------- the operator
@pytest.mark.parametrize(
    "shape,w", [((2, 3, 14, 14), 7), ((1, 4, 8, 8), 4), ((2, 2, 10, 13), 4), ((1, 3, 5, 6), 7), ((1, 2, 28, 28), 14)]
)
def test_wbmm_equals_per_window_conv2d_plus_identity(shape, w):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    table = torch.randn(shape[1], (2 * w - 1) ** 2, generator=gen, dtype=torch.float64)  # asymmetric
    index = relative_index(w)
    y = wbmm(x, build_matrix(table, index), w)
    assert y.shape == x.shape
    # float64: the two code paths (baddbmm vs per-window conv2d) agree to rounding
    torch.testing.assert_close(y, per_window_conv(x, table, w), atol=1e-12, rtol=0)
    # float32: within the error bound of a w²-term dot product plus the identity, |err| <= (n+2)·eps·Σ|x||k|,
    # against the float64 result of the same (float32-rounded) inputs, whatever the kernels' summation order
    x32, t32 = x.float(), table.float()
    y32 = wbmm(x32, build_matrix(t32, index), w).double()
    ref = per_window_conv(x32.double(), t32.double(), w)
    bound = (w * w + 2) * torch.finfo(torch.float32).eps * per_window_conv(x32.double().abs(), t32.double().abs(), w)
    assert ((y32 - ref).abs() <= bound).all(), float(((y32 - ref).abs() / bound).max())
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
    x = torch.randn(2, 5, 9, 11, generator=gen, dtype=torch.float64)
    weight = torch.randn(5, 1, 5, 5, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(unfold_dwconv(x, weight), F.conv2d(x, weight, padding=2, groups=5), atol=1e-12, rtol=0)


def test_window_attention_is_window_local():
    torch.manual_seed(0)
    attn = WindowAttention(32, 7).double().eval()
    x = torch.randn(1, 32, 14, 14, dtype=torch.float64)
    x2 = x.clone()
    x2[:, :, 0, 0] += 5.0  # inside the top-left window only
    with torch.no_grad():
        d = (attn(x2) - attn(x)).abs().sum(1)[0]
    assert d[:7, :7].max() > 1e-3
    assert d[7:, :].max() <= 1e-12 and d[:, 7:].max() <= 1e-12


# ----------------------------------------------------------------------------- timing and intervals
def _samples(times: dict[tuple, float], rounds: int = 15, jitter: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Per-round samples: a load factor common to every op of a round (what interleaving pairs away)
    times an independent jitter per op."""
    rng = np.random.default_rng(seed)
    load = rng.uniform(1.0, 3.0, rounds)
    rows = []
    for (h, op, param, mode), s in times.items():
        noise = np.exp(jitter * rng.standard_normal(rounds))
        for r in range(rounds):
            rows.append(
                {
                    "dtype": "float32",
                    "batch": 1,
                    "channels": 4,
                    "size": h,
                    "op": op,
                    "param": param,
                    "mode": mode,
                    "round": r,
                    "seconds": s * load[r] * noise[r],
                    "inner": 1,
                }
            )
    return pd.DataFrame(rows)


def _known_times() -> dict[tuple, float]:
    t = {}
    for h in (14, 28):
        for k in (5, 7, 13, 27):
            for mode, f in (("fwd", 1.0), ("fwdbwd", 3.0)):
                t[(h, "dw", k, mode)] = f * k * k / 1e4  # time ∝ k²: slope 1
        for w in (7, 14):
            for mode, f in (("fwd", 1.0), ("fwdbwd", 2.0)):
                t[(h, "wbmm", w, mode)] = f * 2e-4  # flat in w: slope 0
    return t


def test_bench_metrics_on_known_times_pair_rounds_away_the_load():
    """With a load factor shared by a round's ops, per-round ratios are exact: every interval collapses
    on the known value. Speedups t_DW / t_WBMM; slopes log-log; GFLOP ratio on the padded area."""
    from pipelines.wbmm.evaluate import bench_metrics, loglog_slope

    assert loglog_slope([1, 4, 16], [2, 4, 8]) == pytest.approx(0.5)
    var_rows, m = bench_metrics(_samples(_known_times()), params())
    for key, want in {
        "speedup.fwd.wbmm_w7_vs_dw_k7.b1_c4_h28": 4.9e-3 / 2e-4,
        "speedup.fwdbwd.wbmm_w14_vs_dw_k5.min_h_ge28": 7.5e-3 / 4e-4,
        "slope_dw_time_vs_k2.fwd.min": 1.0,
        "gflops_ratio.wbmm_w14_vs_w7.min_h_ge28": 4.0,
    }.items():
        for suffix in ("", ".ci_low", ".ci_high"):
            assert m[key + suffix] == pytest.approx(want, rel=1e-9), key + suffix
    assert m["slope_wbmm_time_vs_w2.fwd.max_h_ge28"] == pytest.approx(0.0, abs=1e-9)
    assert m["w14_faster_than_dw5.fwd.b1_c4_h14"] == 1.0  # DW k=5 2.5 ms vs WBMM 0.2 ms, decided
    names = {r["variant"] for r in var_rows}
    assert names == {"dw_k5", "dw_k7", "dw_k13", "dw_k27", "wbmm_w7", "wbmm_w14"}
    assert all("fwd_ms_b1_c4_h14" in r for r in var_rows)
    assert next(r for r in var_rows if r["variant"] == "wbmm_w7")["fwd_ms_b1_c4_h14"] == pytest.approx(
        1e3 * 2e-4 * np.median(np.random.default_rng(0).uniform(1.0, 3.0, 15))
    )


def test_intervals_cover_and_summaries_are_joint():
    """With independent jitter the interval brackets the estimate and the truth; a grid summary reads
    each config's interval at the Bonferroni level 1 − (1 − c)/m and applies the same min/max/median."""
    from pipelines.wbmm.evaluate import bench_metrics, summarise_grid

    _, m = bench_metrics(_samples(_known_times(), rounds=25, jitter=0.05, seed=1), params(bench={"rounds": 25}))
    key = "speedup.fwd.wbmm_w7_vs_dw_k7.b1_c4_h28"
    assert m[key + ".ci_low"] < m[key] < m[key + ".ci_high"]
    assert m[key + ".ci_low"] < 4.9e-3 / 2e-4 < m[key + ".ci_high"]
    seen = []

    def est(cfg, c):
        seen.append(c)
        return {14: (1.0, 0.9 - (c - 0.95), 1.1), 28: (2.0, 1.5, 2.5)}[cfg[3]]

    out = {}
    summarise_grid(out, "x", est, [("float32", 1, 4, 14), ("float32", 1, 4, 28)], 0.95)
    assert out["x.b1_c4_h14.ci_low"] == pytest.approx(0.9)
    assert (out["x.min"], out["x.min.ci_low"], out["x.min.ci_high"]) == pytest.approx((1.0, 0.9 - 0.025, 1.1))
    assert (out["x.max"], out["x.max.ci_low"], out["x.max.ci_high"]) == pytest.approx((2.0, 1.5, 2.5))
    assert (out["x.min_h_ge28"], out["x.min_h_ge28.ci_low"]) == (2.0, 1.5)
    assert sorted(set(seen)) == pytest.approx([0.95, 0.975])


def test_too_few_rounds_give_an_unbounded_interval_and_an_inconclusive_claim():
    from pipelines.core.claims import evaluate_claims
    from pipelines.wbmm.evaluate import med_ci, rat_ci

    # 5 rounds cannot give 95% (min..max misses the median with prob. 2/32); 6 can. Over 6 configs
    # (Bonferroni), 7 rounds cannot reach 1 - 0.05/6, 8 can.
    assert math.isinf(med_ci(np.arange(5.0), 0.95)[1]) and not math.isinf(med_ci(np.arange(6.0), 0.95)[1])
    assert math.isinf(med_ci(np.arange(7.0), 1 - 0.05 / 6)[1]) and not math.isinf(
        med_ci(np.arange(8.0), 1 - 0.05 / 6)[1]
    )
    assert med_ci(np.arange(5.0), 0.95) == (2.0, -math.inf, math.inf)
    assert rat_ci(np.full(6, 2.0), np.ones(6), 0.95) == (2.0, 2.0, 2.0)
    v, lo, hi = rat_ci(np.full(5, 2.0), np.ones(5), 0.95)
    [c] = evaluate_claims(
        [{"id": "a", "text": "", "metric": "r", "op": ">=", "threshold": 1.0}],
        {"r": v, "r.ci_low": lo, "r.ci_high": hi},
    )
    assert c["verdict"] == "inconclusive" and c["holds"] is False


def test_report_verdicts_follow_the_intervals():
    """Through build_report: an interval wholly above the threshold holds, wholly below fails, one that
    straddles it is inconclusive; the training-speed ratio pairs the interleaved step rounds."""
    from pipelines.core.spec import Results, make_report
    from pipelines.wbmm.train import columns

    claims = [
        {"id": "rf", "text": "", "metric": "speedup.fwd.wbmm_w7_vs_dw_k7.min", "op": ">=", "threshold": 1.0},
        {"id": "head", "text": "", "metric": "speedup.fwd.wbmm_w14_vs_dw_k5.median", "op": ">=", "threshold": 1.0},
        {"id": "mid", "text": "", "metric": "speedup.fwdbwd.wbmm_w7_vs_dw_k7.b1_c4_h14", "op": ">=", "threshold": 1.0},
        {
            "id": "train",
            "text": "",
            "metric": "ratio.train_imgs_per_s.wbmm_d3_vs_dw13_d3",
            "op": ">=",
            "threshold": 1.3,
        },
        {"id": "acc", "text": "", "metric": "diff.test_acc.wbmm_d3_minus_dw13_d3", "op": ">=", "threshold": -1.5},
    ]
    p = params(claims=claims, bench={"rounds": 15})
    t = _known_times()
    t[(14, "dw", 7, "fwdbwd")] = t[(14, "wbmm", 7, "fwdbwd")]  # equal times: with jitter the interval straddles 1
    bench = _samples(t, jitter=0.2, seed=3)
    rng = np.random.default_rng(0)
    load = rng.uniform(1, 2, 15)
    speed = pd.DataFrame(
        [
            {"variant": v, "round": r, "seconds": s * load[r], "batch_size": 64}
            for v, s in (("wbmm_d3", 0.05), ("dw13_d3", 0.1), ("dw7_d3", 0.07))
            for r in range(15)
        ]
    )
    fits = {
        f"r__{v}": Results(v).add(0, test_acc=a, fit_imgs_per_s=1.0).table()
        for v, a in (("wbmm_d3", 95.0), ("dw13_d3", 94.0), ("dw7_d3", 93.0))
    }
    arts = {"bench": {"bench": columns(bench), "env": {"clock": "wall"}}, "speed": {"speed": columns(speed)}}
    rep = make_report(
        "wbmm",
        p=p,
        **fits,
        r__operator_speed=Results("operator_speed").table(),
        r__train_speed=Results("train_speed").table(),
        a__operator_speed=arts["bench"],
        a__train_speed=arts["speed"],
        **{f"i__{k}": v for k, v in arts.items()},
    )
    verdicts = {c["id"]: c["verdict"] for c in rep["claims"]}
    assert verdicts == {"rf": "holds", "head": "holds", "mid": "inconclusive", "train": "holds", "acc": "holds"}
    assert rep["metrics"]["ratio.train_imgs_per_s.wbmm_d3_vs_dw13_d3"] == pytest.approx(2.0)
    assert rep["metrics_ci"]["ratio.train_imgs_per_s.wbmm_d3_vs_dw13_d3"] == pytest.approx([2.0, 2.0])
    assert rep["bench_env"] == {"clock": "wall"}


def test_time_group_interleaves_rounds_and_repeats_short_calls():
    from pipelines.wbmm.bench import time_group

    log = []
    calls = {k: (lambda k=k: log.append(k)) for k in "abc"}
    out = time_group(calls, lambda: None, "wall", rounds=4, warmup=0, min_sample_s=0.0, max_inner=10)
    assert {k: (len(v[0]), v[1]) for k, v in out.items()} == {k: (4, 1) for k in "abc"}
    timed = log[6:]  # after the two probe calls of each
    assert [sorted(timed[3 * r : 3 * r + 3]) for r in range(4)] == [list("abc")] * 4  # every round runs each once
    assert [timed[3 * r] for r in range(3)] == list("abc")  # in an order rotated each round
    out = time_group({"x": lambda: None}, lambda: None, "cpu", rounds=3, warmup=1, min_sample_s=1.0, max_inner=7)
    assert out["x"][1] == 7 and len(out["x"][0]) == 3


def test_grid_pads_and_caps_unfold():
    from pipelines.wbmm.bench import op_flops
    from pipelines.wbmm.data import make_grid

    grid = make_grid(params(bench={"unfold_kernels": [5, 27], "unfold_max_mb": 1.0}))
    assert set(grid[grid.op == "unfold"].param) == {5}  # k=27 at 28×28 needs > 1 MB of im2col buffer
    assert op_flops("wbmm", 4, 1, 1, 14) == 2.0 * 16 * 16 * 16  # 14 is padded to 16
    assert len(grid) == 2 * (2 * (4 + 2) + 2 * 2 + 2)


def test_run_benchmark_times_every_grid_row_in_rounds():
    from pipelines.wbmm.bench import run_benchmark
    from pipelines.wbmm.data import make_grid

    p = params(
        bench={
            "batch": [1],
            "channels": [2],
            "sizes": [14],
            "dw_kernels": [5, 7],
            "windows": [7],
            "rounds": 6,
            "warmup": 0,
            "min_sample_s": 0.0,
        },
        pairs={"matched_rf": [[7, 7]], "matched_params": [[7, 7]], "headline": [7, 5]},
    )
    grid = make_grid(p)
    bench, env = run_benchmark(grid, p)
    assert len(bench) == 6 * len(grid) and set(bench["round"]) == set(range(6))
    assert (bench["seconds"] > 0).all() and env["clock"] == "cpu" and env["rounds"] == 6


def test_timings_run_at_the_stated_thread_count_and_restore_it(monkeypatch):
    """The timing claims are defined at ``bench.threads`` intra-op threads: the timed calls run there
    whatever ``threads`` the node preamble chose, the count is restored after, and the samples, the env
    and the derived metrics record it."""
    from pipelines.wbmm import bench as bench_mod
    from pipelines.wbmm.data import make_grid, make_images
    from pipelines.wbmm.evaluate import operator_speed, train_speed_metrics

    seen = []
    real = bench_mod.interleaved_timing

    def spy(*args, **kw):
        seen.append(torch.get_num_threads())
        return real(*args, **kw)

    monkeypatch.setattr(bench_mod, "interleaved_timing", spy)
    before = torch.get_num_threads()
    try:
        p = params(
            threads=2,
            bench={
                "batch": [1],
                "channels": [2],
                "sizes": [14],
                "dw_kernels": [5, 7],
                "windows": [7],
                "rounds": 6,
                "warmup": 0,
                "min_sample_s": 0.0,
                "threads": 1,
            },
            pairs={"matched_rf": [[7, 7]], "matched_params": [[7, 7]], "headline": [7, 5]},
            acc=TINY_ACC,
        )
        bench, env = bench_mod.run_benchmark(make_grid(p), p)
        assert torch.get_num_threads() == 2  # the node's own count (threads: 2), restored
        speed = bench_mod.train_speed(make_images(p), p)
        assert torch.get_num_threads() == 2
        assert seen and set(seen) == {1}
        assert (bench["threads"] == 1).all() and (speed["threads"] == 1).all()
        assert env["timing_threads"] == 1 and env["node_threads"] == 2 and env["clock"] == "cpu"
        from pipelines.wbmm.train import columns

        assert operator_speed({}, p, {"bench": columns(bench)})["bench.timing_threads"] == 1.0
        assert train_speed_metrics({}, p, {"speed": columns(speed)})["train_step.timing_threads"] == 1.0
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------------- training (core fit)
def _old_loop(pattern, data, p, seed):
    """The pre-port private loop (reference for the port onto core.training.fit): same batches, AdamW,
    one-cycle, no gradient clipping."""
    from pipelines.core.runtime import seed_everything
    from pipelines.wbmm.model import build_net
    from pipelines.wbmm.train import accuracy, prepare

    a = p.acc
    gen = seed_everything(seed)
    xtr, ytr, xte, yte, n_classes = prepare(data, torch.device("cpu"))
    model = build_net(pattern, xtr.shape[1], n_classes, a)
    spe = math.ceil(len(ytr) / a.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.epochs * spe)
    for _ in range(a.epochs):
        model.train()
        perm = torch.randperm(len(ytr), generator=gen)
        for s in range(spe):
            idx = perm[s * a.batch_size : (s + 1) * a.batch_size]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return accuracy(model, xte, yte), model.state_dict()


def test_train_variant_through_core_fit_reproduces_the_old_loop():
    from pipelines.wbmm.data import make_images
    from pipelines.wbmm.train import train_variant

    p = params(acc={**TINY_ACC, "epochs": 2})
    images = make_images(p)
    table, states = train_variant(images, p, variant="wbmm_d3")
    assert set(table["variant"]) == {"wbmm_d3"} and set(table["seed"]) == {0}
    got = dict(zip(table["metric"], table["value"]))
    acc, ref = _old_loop(p.acc.variants["wbmm_d3"], images["0"], p, 0)
    assert got["test_acc"] == acc
    torch.testing.assert_close(states["seed0"], dict(ref))
    assert got["fit_imgs_per_s"] > 0 and got["n_params"] > 0
    # deterministic given its inputs and seeds (what --only-missing-outputs relies on)
    again, _ = train_variant(images, p, variant="wbmm_d3")
    assert dict(zip(again["metric"], again["value"]))["test_acc"] == acc


def test_train_speed_interleaves_the_nets():
    from pipelines.wbmm.bench import train_speed
    from pipelines.wbmm.data import make_images

    p = params(acc=TINY_ACC)
    speed = train_speed(make_images(p), p)
    assert len(speed) == 3 * 6 and set(speed["variant"]) == set(ACC["variants"])
    assert (speed.groupby("variant")["round"].apply(sorted) == [list(range(6))] * 3).all()
    assert (speed["batch_size"] == 32).all() and (speed["seconds"] > 0).all()


# ------------------------------------------------------------------------------------------ pipeline
def test_one_train_node_per_configured_variant_and_one_per_benchmark(monkeypatch):
    from pipelines.core import registry
    from pipelines.core.registry import load_pipeline

    names = {n.name for n in load_pipeline("wbmm").nodes}
    assert {f"wbmm.train.{v}" for v in [*ACC["variants"], "operator_speed", "train_speed"]} == {
        n for n in names if ".train." in n
    }
    assert {"wbmm.data.images", "wbmm.data.bench_grid"} <= names
    # the variant list comes from the run's parameters (env + --params)
    raw = raw_params(
        acc={"variants": {"a1": ["w7"], "b2": ["dw5"]}},
        pairs={"matched_rf": [[7, 7]], "matched_params": [[7, 13]], "headline": [14, 5]},
    )
    monkeypatch.setattr(registry, "method_config", lambda m: raw)
    pipe = load_pipeline("wbmm")
    assert {n.name for n in pipe.nodes if ".train." in n.name} == {
        "wbmm.train.a1",
        "wbmm.train.b2",
        "wbmm.train.operator_speed",
        "wbmm.train.train_speed",
    }
    one = pipe.only_nodes("wbmm.train.b2")  # what `kedro run --nodes=wbmm.train.b2` selects
    [node] = one.nodes
    assert set(node.inputs) == {"wbmm.images_tensors", "params:wbmm"}
    assert set(node.outputs) == {"wbmm.results_b2", "wbmm.b2_artifacts_tensors"}
    [bench] = pipe.only_nodes("wbmm.train.operator_speed").nodes
    assert set(bench.inputs) == {"wbmm.bench_grid", "params:wbmm"} and "gpu" in bench.tags


# ---------------------------------------------------------------------------------- bad parameters
@pytest.mark.parametrize(
    "over,key",
    [
        ({"bench": {"dw_kernels": [4, 7, 13, 27]}}, r"wbmm\.bench\.dw_kernels"),
        ({"bench": {"windows": [0, 7, 14]}}, r"wbmm\.bench\.windows"),
        ({"bench": {"rounds": 5}}, r"wbmm\.bench\.rounds: .*at least 6"),
        ({"bench": {"rounds": True}}, r"wbmm\.bench\.rounds"),
        ({"acc": {"speed_rounds": 4}}, r"wbmm\.acc: .*speed_rounds"),
        ({"pairs": {"headline": [8, 5]}}, r"wbmm\.pairs"),
        ({"pairs": {"headline": [14, 5, 3]}}, r"wbmm\.pairs\.headline"),
        ({"acc": {"variants": {"x": ["conv7"]}}}, r"wbmm\.acc\.variants"),
        ({"acc": {"variants": {"Bad-Name": ["w7"]}}}, r"wbmm\.acc\.variants"),
        ({"acc": {"epochs": 0}}, r"wbmm\.acc\.epochs"),
        ({"bench": {"modes": ["bwd"]}}, r"wbmm\.bench\.modes"),
        ({"bench": {"clock": "cpu", "threads": 2}}, r"wbmm\.bench: .*bench\.threads: 1"),
        ({"bench": {"threads": 0}}, r"wbmm\.bench\.threads"),
    ],
)
def test_bad_parameter_names_the_key(over, key):
    with pytest.raises(ParameterError, match=key):
        params(**over)


def test_parameters_of_every_env_validate_and_pairs_match_the_card():
    import yaml

    from tests.conftest import ROOT

    def load(env):
        return yaml.safe_load((ROOT / "conf" / env / "parameters_wbmm.yml").read_text())["wbmm"]

    def merge(a, b):
        return {
            k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
            for k, v in {**a, **b}.items()
        }

    base = validate(Params, load("base"), "wbmm")
    assert base.pairs.headline == [14, 5] and [7, 13] in base.pairs.matched_params
    assert list(base.acc.variants)[0] == "wbmm_d3" and base.threads == "auto"
    assert math.isclose((2 * 7 - 1) ** 2, 13 * 13)  # matched parameters: table of w=7 ↔ DW k=13
    for env in ("test", "full"):
        validate(Params, merge(load("base"), load(env)), "wbmm")


# ------------------------------------------------------------------------------------ bad user images
def _npz(tmp_path, **change):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.random((20, 8, 8)),
        "y_train": np.arange(20) % 4,
        "x_test": rng.random((6, 8, 8)),
        "y_test": np.arange(6) % 4,
    }
    for k, v in change.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    path = tmp_path / "images.npz"
    np.savez(path, **arrays)
    return path


def test_user_npz_is_loaded_resized_and_shared_by_the_seeds(tmp_path):
    from pipelines.wbmm.data import make_images

    p = params(seeds=[0, 1], acc={"data_path": str(_npz(tmp_path))})
    images = make_images(p)
    assert set(images) == {"0", "1"} and images["0"]["x_train"].shape == (20, 1, 14, 14)
    assert images["0"]["y_test"].dtype == torch.int64 and images["1"] is images["0"]


@pytest.mark.parametrize(
    "change,msg",
    [
        ({"y_test": None}, r"array 'y_test' is missing"),
        ({"y_train": (np.arange(20) % 4).astype(float)}, r"array 'y_train' should be int, got float64"),
        (
            {"x_test": np.zeros((0, 8, 8)), "y_test": np.zeros(0, int)},
            r"arrays 'x_test', 'y_test' have 0 rows, at least 1",
        ),
        ({"x_test": np.zeros((6, 64))}, r"array 'x_test' should be .*images"),
        ({"y_train": np.arange(19) % 4}, r"arrays 'x_train' \(20 rows\) and 'y_train' \(19 rows\) differ in length"),
        (
            {"x_train": np.full((20, 8, 8), "a")},
            r"array 'x_train' should be array\[number\], got elements of dtype <U1",
        ),
        (
            {"x_train": np.full((20, 8, 8), np.nan)},
            r"array 'x_train' has 1280 non-finite value\(s\) \(first at row 0\)",
        ),
        ({"y_test": -np.ones(6, int)}, r"array 'y_test' must be >= 0; 6 value\(s\) are not"),
        ({"x_test": np.zeros((6, 3, 8, 8))}, r"'x_train' images are \(8, 8\) but 'x_test' \(3, 8, 8\)"),
    ],
)
def test_bad_user_npz_stops_at_the_door_naming_dataset_and_column(tmp_path, change, msg):
    from kedro.io import DatasetError

    from pipelines.wbmm.data import make_images

    p = params(acc={"data_path": str(_npz(tmp_path, **change))})
    with pytest.raises(InputDataError, match=r"dataset 'wbmm\.acc\.data_path \(.*images\.npz\)': " + msg) as exc:
        make_images(p)
    assert isinstance(exc.value, DatasetError) and "\n" not in str(exc.value)


def test_missing_npz_is_an_input_error(tmp_path):
    from pipelines.wbmm.data import make_images

    with pytest.raises(InputDataError, match=r"wbmm\.acc\.data_path .*nope\.npz.*file not found"):
        make_images(params(acc={"data_path": str(tmp_path / "nope.npz")}))


# ------------------------------------------------------------------ the report of the --env=test run
@pytest.mark.e2e
def test_report_of_the_test_env_run(test_env_run):
    report = test_env_run("wbmm").report
    assert {"wbmm_d3", "dw7_d3", "dw13_d3", "wbmm_w7", "wbmm_w14", "dw_k5", "unfold_k5", "attn_w7"} <= set(
        report["variants"]
    )
    timing = [c for c in report["claims"] if not c["metric"].startswith(("diff.", "variants."))]
    assert [c["id"] for c in timing][:2] == ["wbmm_time_flat_in_window", "wbmm_gflops_rise_with_window"]
    for c in timing:  # every timing claim carries its interval, and its verdict follows from it
        assert c["metric"] in report["metrics_ci"] and "ci" in c, c["id"]
        assert c["verdict"] in {"holds", "fails", "inconclusive"}
    assert {"speedup_heatmap.png", "latency_float32_c4_h28.png", "train_throughput.png"} <= set(report["artifacts"])
    # timings at the stated bench.threads (1), the nets at the node's own count (issue 22)
    assert report["bench_env"]["threads"] == report["bench_env"]["timing_threads"] == report["timing_threads"] == 1
    assert report["bench_env"]["node_threads"] == report["threads"] and report["bench_env"]["rounds"] == 8
    assert report["metrics"]["bench.timing_threads"] == report["metrics"]["train_step.timing_threads"] == 1.0
