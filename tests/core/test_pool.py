"""The default runner (core.pool.PoolRunner) and the thread policy: train nodes side by side in worker
processes with loads, saves and hooks in the driver, reports equal to SequentialRunner's at the same
per-node thread count, and the threads every node used recorded in the report."""

from __future__ import annotations

import os
import pickle
import re

import pytest
from kedro.framework.hooks import hook_impl

from pipelines.core import runctx
from pipelines.core.registry import discover_methods
from tests.conftest import run_kedro

METHODS = discover_methods()


# ---------------------------------------------------------------- node functions (module level: picklable)
def make(x: int) -> int:
    return x * 2


def train(d: int, scale: float, variant: str) -> dict:
    from pipelines.core.runtime import node_setup

    node_setup(None)
    import torch

    g = torch.Generator().manual_seed(len(variant))
    w = torch.randn(64, 64, generator=g)
    return {
        "variant": variant,
        "value": float((w @ w).sum()) * d * scale,
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
    }


def broken(d: int, variant: str) -> dict:
    raise ValueError(f"variant {variant} has a bad value")


def gather(**kw) -> dict:
    return dict(kw)


def _pipeline(variants=("a", "b", "c"), func=train):
    from kedro.pipeline import Pipeline, node

    from pipelines.core.variants import bind_variant

    nodes = [node(make, "x", "d", name="m.data.make", tags=["data"])]
    for v in variants:
        ins = ["d", "scale"] if func is train else ["d"]
        nodes.append(node(bind_variant(func, v), ins, f"r_{v}", name=f"m.train.{v}", tags=["train"]))
    nodes.append(
        node(gather, {f"r_{v}": f"r_{v}" for v in variants}, "rep", name="m.evaluate.report", tags=["evaluate"])
    )
    return Pipeline(nodes)


class Recorder:
    """Every hook call the driver sees, with the pid it ran in."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    @hook_impl
    def before_node_run(self, node):
        runctx.current_node.set(node.name)  # as PlatformHooks does: node_setup records under it
        self.calls.append(("before_node_run", node.name, os.getpid()))

    @hook_impl
    def after_node_run(self, node):
        self.calls.append(("after_node_run", node.name, os.getpid()))

    @hook_impl
    def on_node_error(self, node):
        self.calls.append(("on_node_error", node.name, os.getpid()))

    @hook_impl
    def after_dataset_saved(self, dataset_name):
        self.calls.append(("after_dataset_saved", dataset_name, os.getpid()))


def _run(runner, pipeline, recorder=None):
    from kedro.framework.hooks.manager import _create_hook_manager
    from kedro.io import DataCatalog, MemoryDataset

    hooks = _create_hook_manager()
    if recorder is not None:
        hooks.register(recorder)
    catalog = DataCatalog({"x": MemoryDataset(3), "scale": MemoryDataset(0.5)})
    runctx.reset_thread_log()
    runner.run(pipeline, catalog, hooks)
    return catalog.load("rep")


# --------------------------------------------------------------------------------------- planning
def test_variant_nodes_pickle_and_keep_their_signature():
    """A train.<variant> node's function pickles (a closure did not) and keeps the typed signature."""
    import inspect
    import typing

    from pipelines.core.variants import bind_variant

    f = bind_variant(train, "b")
    g = pickle.loads(pickle.dumps(f))
    assert g(2, 1.0)["variant"] == "b" and g.variant == "b"
    assert list(inspect.signature(g).parameters) == ["d", "scale"]
    assert typing.get_type_hints(g) == {"d": int, "scale": float, "return": dict}


@pytest.mark.parametrize("m", METHODS)
def test_every_train_node_of_every_pipeline_pickles(m):
    from pipelines.core.pool import pooled_nodes
    from pipelines.core.registry import load_pipeline

    nodes = pooled_nodes(load_pipeline(m))
    assert nodes, f"{m}: no train node"
    for n in nodes:
        assert pickle.loads(pickle.dumps(n)).name == n.name


def test_width_counts_train_nodes_that_can_run_at_once():
    from kedro.pipeline import Pipeline, node

    from pipelines.core.pool import pool_width, pooled_nodes

    assert pool_width(_pipeline(("a", "b", "c"))) == 3
    # base → (x, y) chained through a driver node: x and y are independent of each other, not of base
    p = Pipeline(
        [
            node(make, "x", "b0", name="m.train.base", tags=["train"]),
            node(make, "b0", "d1", name="m.data.mid", tags=["data"]),
            node(make, "d1", "x1", name="m.train.x", tags=["train"]),
            node(make, "d1", "y1", name="m.train.y", tags=["train"]),
            node(make, "y1", "z1", name="m.train.z", tags=["train"]),
        ]
    )
    assert [n.name for n in pooled_nodes(p)] == ["m.train.base", "m.train.x", "m.train.y", "m.train.z"]
    assert pool_width(p) == 2
    assert pool_width(Pipeline([node(make, "x", "d", name="m.data.make", tags=["data"])])) == 0


def test_workers_never_exceed_the_cpus_or_the_width():
    from pipelines.core.pool import plan_workers

    assert plan_workers(width=6, usable=2) == 2
    assert plan_workers(width=1, usable=16) == 1
    assert plan_workers(width=6, usable=16, concurrency=4) == 4  # a sweep running 4 points
    assert plan_workers(width=6, usable=8, threads=4) == 2  # PIPELINES_THREADS=4
    assert plan_workers(width=6, usable=2, fixed=3) == 3  # --runner-params workers=3
    assert plan_workers(width=2, usable=2, fixed=5) == 2
    assert plan_workers(width=0, usable=2) == 0


def test_auto_is_one_thread_unless_the_method_scales(monkeypatch):
    from pipelines.core import runtime

    monkeypatch.delenv("PIPELINES_THREADS", raising=False)
    monkeypatch.delenv("PIPELINES_CONCURRENCY", raising=False)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 8)
    assert runtime.resolve_threads("auto") == 1
    assert runtime.resolve_threads("auto", scales=True) == 8
    assert runtime.resolve_threads("all") == 8
    assert runtime.resolve_threads(3, scales=True) == 3
    monkeypatch.setenv("PIPELINES_CONCURRENCY", "4")  # a pool worker's share, a sweep's
    assert runtime.resolve_threads("auto", scales=True) == 2 and runtime.resolve_threads("auto") == 1
    monkeypatch.setenv("PIPELINES_THREADS", "3")  # fixed by a scheduler / the user
    assert runtime.resolve_threads("auto") == 3 and runtime.resolve_threads("all") == 3
    monkeypatch.setenv("PIPELINES_THREADS", "x")
    with pytest.raises(ValueError, match="PIPELINES_THREADS"):
        runtime.resolve_threads("auto")


def test_a_method_declares_that_it_scales():
    from pipelines.core.params import MethodParams
    from pipelines.core.registry import validated_params
    from pipelines.core.runtime import params_scale

    class Big(MethodParams):
        THREADS_SCALE = True

    assert params_scale(Big(seeds=[0])) and not params_scale(MethodParams(seeds=[0]))
    assert params_scale(validated_params("tess")) and not params_scale(validated_params("rankcal"))


def test_no_method_fixes_one_thread():
    """Tiny models get one thread from `auto`; no env of any method pins its `threads: 1` by hand (a
    method-level key, two spaces in; wbmm's `bench.threads` is the timing claims' stated thread count)."""
    from tests.conftest import ROOT

    pinned = [
        str(f.relative_to(ROOT))
        for f in (ROOT / "conf").rglob("parameters_*.yml")
        if re.search(r"^  threads:\s*1\b", f.read_text(), re.M)
    ]
    assert pinned == []


# ------------------------------------------------------------------------------------------ runner
def test_pool_runs_train_nodes_in_workers_and_everything_else_here(monkeypatch):
    from kedro.runner import SequentialRunner

    from pipelines.core.pool import PoolRunner

    monkeypatch.delenv("PIPELINES_THREADS", raising=False)
    sequential = _run(SequentialRunner(), _pipeline(), Recorder())
    seq_threads = runctx.node_threads()
    rec = Recorder()
    runner = PoolRunner(workers=2)
    pooled = _run(runner, _pipeline(), rec)
    assert runner.used_workers == 2 and runctx.run_workers() == 2
    strip = {"pid"}
    assert {v: {k: x for k, x in r.items() if k not in strip} for v, r in pooled.items()} == {
        v: {k: x for k, x in r.items() if k not in strip} for v, r in sequential.items()
    }
    worker_pids = {r["pid"] for r in pooled.values()}
    assert os.getpid() not in worker_pids and 1 <= len(worker_pids) <= 2
    assert {p["pid"] for p in runner.placements.values()} == worker_pids
    # hooks, loads and saves happen in this process, for every node, before and after it
    assert {pid for *_, pid in rec.calls} == {os.getpid()}
    for n in ("m.data.make", "m.train.a", "m.train.b", "m.train.c", "m.evaluate.report"):
        assert [c for c, name, _ in rec.calls if name == n] == ["before_node_run", "after_node_run"], n
    assert {name for c, name, _ in rec.calls if c == "after_dataset_saved"} == {"d", "r_a", "r_b", "r_c", "rep"}
    # the threads each train node's preamble chose in its worker come back to the record
    assert runctx.node_threads() == seq_threads == {f"m.train.{v}": {"threads": 1, "setting": "auto"} for v in "abc"}
    assert all(r["torch_threads"] == 1 for r in pooled.values())


def test_pool_falls_back_to_this_process_with_one_worker(monkeypatch):
    from pipelines.core.pool import PoolRunner

    runner = PoolRunner()
    monkeypatch.setattr("pipelines.core.cpus.usable_cpus", lambda: 1)
    out = _run(runner, _pipeline())
    assert runner.used_workers == 0 and {r["pid"] for r in out.values()} == {os.getpid()}


def test_a_failing_train_node_fails_the_run_with_its_own_error():
    from pipelines.core.pool import PoolRunner

    rec = Recorder()
    with pytest.raises(ValueError, match="variant [ab] has a bad value"):
        _run(PoolRunner(workers=2), _pipeline(("a", "b"), func=broken), rec)
    assert any(c == "on_node_error" and name.startswith("m.train.") for c, name, _ in rec.calls)


def test_bad_runner_settings_name_the_key():
    from pipelines.core.pool import PoolRunner

    with pytest.raises(ValueError, match="'workers'"):
        PoolRunner(workers=0)
    with pytest.raises(ValueError, match="'start_method'"):
        PoolRunner(start_method="fork")


# ------------------------------------------------------------------------- end to end, every pipeline
def non_timing_values(report: dict) -> dict:
    """What benchmarks/compare_reports.py compares (variant and derived metrics), less timings, which
    differ between any two runs."""
    flat = {f"variants.{v}.{k}": x for v, row in report["variants"].items() for k, x in row.items()}
    flat.update(report.get("metrics", {}))
    timings = set(report["timing_metrics"])
    return {k: x for k, x in flat.items() if k not in timings}


def _differences(a: dict, b: dict) -> list[str]:
    import math

    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k, "missing"), b.get(k, "missing")
        same = (x == y) or (isinstance(x, float) and isinstance(y, float) and math.isclose(x, y, rel_tol=1e-9))
        if not same:
            out.append(f"{k}: {x!r} vs {y!r}")
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("m", METHODS)
def test_default_runner_report_equals_sequential_at_the_same_threads(m, test_env_run, e2e_project, monkeypatch):
    """`kedro run` (the pool) against `--runner=SequentialRunner`: every non-timing value equal where every
    node used the same thread count. Tiny models take 1 thread either way; a method that declares that its
    models scale takes the CPUs in SequentialRunner and a worker's share in the pool, so it is compared at
    `threads=1` in both."""
    monkeypatch.delenv("PIPELINES_THREADS", raising=False)
    monkeypatch.delenv("PIPELINES_CONCURRENCY", raising=False)
    pooled = test_env_run(m).report
    assert pooled["runner"] == "PoolRunner" and isinstance(pooled["workers"], int)
    assert pooled["threads_by_node"], "no node recorded its threads"
    assert any(".train." in k for k in pooled["threads_by_node"]), pooled["threads_by_node"]
    extra = ["--runner", "SequentialRunner"]
    seq = run_kedro(e2e_project, m, "test", extra)
    assert seq.exit_code == 0, seq.output
    sequential = seq.report
    if sequential["threads_by_node"] != pooled["threads_by_node"]:
        pin = ["--params", f"{m}.threads=1"]
        again = run_kedro(e2e_project, m, "test", pin)
        assert again.exit_code == 0, again.output
        pooled = again.report
        seq = run_kedro(e2e_project, m, "test", [*extra, *pin])
        assert seq.exit_code == 0, seq.output
        sequential = seq.report
    assert sequential["runner"] == "SequentialRunner" and sequential["workers"] == 0
    assert sequential["threads_by_node"] == pooled["threads_by_node"]
    assert _differences(non_timing_values(pooled), non_timing_values(sequential)) == []
    assert [c["id"] for c in pooled["claims"]] == [c["id"] for c in sequential["claims"]]


def test_default_runs_benchmark_measures_the_process_tree_and_writes_its_table(tmp_path):
    """benchmarks/default_runs.py: peak RSS sums a process and its workers; the table lands between markers."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import default_runs
    finally:
        sys.path.pop(0)
    code = (
        "import subprocess, sys, time; b = bytearray(200 * 2**20); subprocess.run([sys.executable, '-c', "
        "'b = bytearray(200 * 2**20); import time; time.sleep(3)'])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        import time

        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, default_runs.tree_rss_mb(proc.pid))
            time.sleep(0.1)
    finally:
        proc.wait()
    assert peak > 400, peak  # both processes' 200 MB
    doc = tmp_path / "t.md"
    doc.write_text("# t\n<!-- default-runs:begin -->\nold\n<!-- default-runs:end -->\ntail\n")
    default_runs.write_table(doc, "| new |")
    assert doc.read_text() == "# t\n<!-- default-runs:begin -->\n| new |\n<!-- default-runs:end -->\ntail\n"
    assert set(default_runs.RUNNERS) == {"pool", "sequential"}
