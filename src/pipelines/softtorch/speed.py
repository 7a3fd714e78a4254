"""`data.speed`: forward+backward time of soft sort vs n for every method, measured side by side in
one process with core's interleaved timer (each round runs every method once, in a rotated order, so
load bursts hit all alike); the speed ratios come from paired per-round ratios (core.metrics.ratio_ci).
This stays one node because the ratios are only meaningful when measured interleaved (the metrics:
evaluate.speed_metrics)."""

import pandas as pd
import torch

from pipelines.core.api import interleaved_timing, node_setup
from pipelines.softtorch import softops as so
from pipelines.softtorch.params import Params


def _fwdbwd(method: str, n: int, p: Params, seed: int):
    g = torch.Generator().manual_seed(seed + n)
    x = torch.randn(n, generator=g, dtype=torch.float32)
    w = torch.randn(n, generator=g, dtype=torch.float32)
    mode = "c0" if method == "fast_soft_sort" else "smooth"

    def call():
        xx = x.clone().requires_grad_(True)
        # OT runs exactly speed.ot_iters Sinkhorn iterations (ot_tol = 0: no early stop)
        out = so.sort(xx, softness=p.speed.softness, mode=mode, method=method, ot_iters=p.speed.ot_iters, ot_tol=0.0)
        (out * w).sum().backward()
        return xx.grad

    return call


def speed_benchmark(p: Params) -> pd.DataFrame:
    node_setup(p, 0)
    methods = list(so.SORT_METHODS)
    cap = {"ot": p.speed.max_n_ot, "sorting_network": p.speed.max_n_network}
    rows = []
    for n in sorted(set(p.speed.ns) | {p.speed.ratio_n_ot, p.speed.ratio_n_quadratic}):
        fns = {m: _fwdbwd(m, n, p, 0) for m in methods if n <= cap.get(m, n)}
        times = interleaved_timing(fns, rounds=p.speed.rounds, warmup=1)
        for m, t in times.items():
            rows += [{"n": n, "method": m, "round": i, "seconds": float(v)} for i, v in enumerate(t)]
    return pd.DataFrame(rows)
