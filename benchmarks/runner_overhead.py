"""GPUNodeRunner benchmark: what shipping a ``gpu`` node to Ray costs, and what running independent
``gpu`` nodes concurrently gains (issue 3; goals: <= 50 ms per dispatched node, >= 1.7x on 2 CPUs).

    python benchmarks/runner_overhead.py [--repeats 30] [--heavy-seconds 2] [--json out.json]

1. Overhead: a one-node pipeline whose node is trivial (returns its input + 1) is run ``--repeats``
   times with the inline backend and with a warm local Ray instance; the per-node overhead is the
   difference of the medians (also measured over a chain of 20 trivial nodes, divided by 20).
2. Concurrency: two independent heavy nodes (single-threaded torch matmuls, ``--heavy-seconds`` each)
   inline (one after the other) vs on a 2-CPU local Ray instance (one CPU each); speedup = inline/Ray
   wall time, median of ``--heavy-repeats`` after a warm-up run (workers already started, as on a
   shared cluster; the cold start is printed separately). ``heavy_task_overlap`` (sum of the two
   tasks' run times / wall time: 2 = fully concurrent) shows the scheduling apart from how much CPU
   the machine can spare; two nodes that mostly wait (``time.sleep``, like a driver waiting on a GPU)
   give the speedup the scheduling alone allows.
Never a timed assertion in tests: numbers depend on the machine and on who else uses it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")


def trivial(x: int) -> int:
    return x + 1


def heavy(seed: int, iters: int) -> float:
    """Single-threaded CPU work (a chain of 256x256 matmuls); returns a checksum."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(256, 256, generator=g) / 16
    b = torch.eye(256)
    for _ in range(iters):
        b = torch.tanh(a @ b)
    return float(b.sum())


def waiting(seed: int, seconds: float) -> int:
    """A node that mostly waits (as a driver does on a GPU kernel or on I/O): isolates scheduling."""
    time.sleep(seconds)
    return seed


def _catalog(values: dict):
    from kedro.io import DataCatalog, MemoryDataset

    return DataCatalog({k: MemoryDataset(v) for k, v in values.items()})


def _timed_run(runner, pipe, values: dict) -> float:
    catalog = _catalog(values)
    t0 = time.perf_counter()
    runner.run(pipe, catalog)
    return time.perf_counter() - t0


def calibrate_iters(seconds: float) -> int:
    """Matmul iterations that take about ``seconds`` here, single-threaded."""
    heavy(0, 20)  # first call pays torch's import and warm-up
    t0 = time.perf_counter()
    heavy(0, 400)
    per = (time.perf_counter() - t0) / 400
    return max(1, int(seconds / per))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--chain", type=int, default=20)
    ap.add_argument("--heavy-seconds", type=float, default=2.0)
    ap.add_argument("--heavy-repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()

    import ray
    from kedro.pipeline import node, pipeline

    from pipelines.core.runner import GPUNodeRunner

    logging.disable(logging.WARNING)  # Kedro logs every load/save at INFO: keep the timing clean
    one = pipeline([node(trivial, "x", "y", name="train.trivial", tags=["gpu"])])
    chain = pipeline([node(trivial, f"x{i}", f"x{i + 1}", name=f"train.t{i}", tags=["gpu"]) for i in range(args.chain)])
    inline = GPUNodeRunner(address=None)
    on_ray = GPUNodeRunner(address="local", allow_cpu_fallback=True)

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    try:
        cold = _timed_run(on_ray, one, {"x": 0})
        for _ in range(3):
            _timed_run(on_ray, one, {"x": 0})
        t_inline = [_timed_run(inline, one, {"x": 0}) for _ in range(args.repeats)]
        t_ray = [_timed_run(on_ray, one, {"x": 0}) for _ in range(args.repeats)]
        c_inline = statistics.median(_timed_run(inline, chain, {"x0": 0}) for _ in range(5))
        c_ray = statistics.median(_timed_run(on_ray, chain, {"x0": 0}) for _ in range(5))

        iters = calibrate_iters(args.heavy_seconds)
        two = pipeline(
            [
                node(heavy, ["params:s0", "params:iters"], "h0", name="train.heavy0", tags=["gpu"]),
                node(heavy, ["params:s1", "params:iters"], "h1", name="train.heavy1", tags=["gpu"]),
            ]
        )
        values = {"params:s0": 0, "params:s1": 1, "params:iters": iters}
        heavy_cold = _timed_run(on_ray, two, values)
        h_inline = [_timed_run(inline, two, values) for _ in range(args.heavy_repeats)]
        h_ray, overlap = [], []
        for _ in range(args.heavy_repeats):
            h_ray.append(_timed_run(on_ray, two, values))
            # > 1 means the two tasks ran at the same time (2 = fully overlapped)
            overlap.append(sum(p["seconds"] for p in on_ray.placements.values()) / h_ray[-1])
        wait2 = pipeline(
            [
                node(waiting, ["params:s0", "params:w"], "w0", name="train.wait0", tags=["gpu"]),
                node(waiting, ["params:s1", "params:w"], "w1", name="train.wait1", tags=["gpu"]),
            ]
        )
        wvalues = {"params:s0": 0, "params:s1": 1, "params:w": args.heavy_seconds}
        w_inline = _timed_run(inline, wait2, wvalues)
        w_ray = _timed_run(on_ray, wait2, wvalues)
    finally:
        ray.shutdown()

    med_i, med_r = statistics.median(t_inline), statistics.median(t_ray)
    fig = {
        "ray_version": ray.__version__,
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "ray_start_seconds": round(ray_start, 2),
        "first_dispatch_cold_seconds": round(cold, 3),
        "trivial_inline_median_ms": round(1e3 * med_i, 2),
        "trivial_ray_median_ms": round(1e3 * med_r, 2),
        "overhead_per_node_median_ms": round(1e3 * (med_r - med_i), 2),
        "overhead_per_node_p90_ms": round(1e3 * (sorted(t_ray)[int(0.9 * len(t_ray))] - med_i), 2),
        "chain_overhead_per_node_ms": round(1e3 * (c_ray - c_inline) / args.chain, 2),
        "heavy_node_iters": iters,
        "heavy_inline_seconds": round(statistics.median(h_inline), 2),
        "heavy_ray_seconds": round(statistics.median(h_ray), 2),
        "heavy_ray_cold_seconds": round(heavy_cold, 2),
        "speedup_two_heavy_nodes": round(statistics.median(h_inline) / statistics.median(h_ray), 2),
        "heavy_task_overlap": round(statistics.median(overlap), 2),
        "speedup_two_waiting_nodes": round(w_inline / w_ray, 2),
    }
    print("| figure | value |\n|---|---|")
    for k, v in fig.items():
        print(f"| {k} | {v} |")
    ok_overhead = fig["overhead_per_node_median_ms"] <= 50
    ok_speedup = fig["speedup_two_heavy_nodes"] >= 1.7
    print(
        f"\noverhead goal (<= 50 ms): {'met' if ok_overhead else 'NOT met'}; "
        f"speedup goal (>= 1.7x): {'met' if ok_speedup else 'NOT met'}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
