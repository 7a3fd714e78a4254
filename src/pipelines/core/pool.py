"""The default runner of ``kedro run``: independent train nodes side by side in worker processes.

``PoolRunner`` keeps everything Kedro does around a node in the ``kedro run`` process (the driver): loads,
saves, hooks, kedro-mlflow logging, versioned datasets, the report. Only the function of a node tagged
``train`` (one ``train.<variant>`` per variant, and a method's shared training steps) travels to a worker
process of a small pool, with its inputs; its outputs come back and are saved here. So MLflow gets one
parent run and one child per variant exactly as with Kedro's SequentialRunner, and every dataset is read
back at the version this run wrote.

Workers: the CPUs this run may use (``core.cpus.usable_cpus() // PIPELINES_CONCURRENCY``) divided by the
threads one worker computes with (1, or ``PIPELINES_THREADS``), and never more than the train nodes that can
run at once (the largest set of train nodes none of which depends on another). Each worker's CPU share is
that budget divided by the workers, so ``threads: auto`` is 1 thread for a method with tiny models and the
share for one that declares that its models scale (``MethodParams.threads_scale``): the total never exceeds
the usable CPUs. With one worker, or one train node, the runner runs everything in this process, as
SequentialRunner does. ``--runner-params workers=N`` fixes the count; ``start_method`` picks ``forkserver``
(the default where it exists: workers fork from a clean server that has torch imported) or ``spawn``.

Each node's thread count is recorded in the report (``threads_by_node``), with the ``workers`` count.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing as mp
import os
import pickle
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kedro.framework.hooks import hook_impl
from kedro.runner.task import Task

from pipelines.core import runctx
from pipelines.core.scheduling import OffloadingRunner, load_inputs

if TYPE_CHECKING:
    from kedro.pipeline import Pipeline
    from kedro.pipeline.node import Node

log = logging.getLogger(__name__)

POOL_TAG = "train"
THREAD_ENVS = ("PIPELINES_THREADS", "PIPELINES_CONCURRENCY")
START_METHODS = ("forkserver", "spawn")


class PoolRunnerError(RuntimeError):
    """A node could not be run in a worker process; the message names the node."""


# ----------------------------------------------------------------------------------------- planning
def pooled_nodes(pipeline: Pipeline) -> list[Node]:
    """The nodes that go to workers: tagged ``train``, not generators (a generator's chunks are saved as
    they come, which needs the catalog), in the pipeline's order."""
    return [n for n in pipeline.nodes if POOL_TAG in n.tags and not inspect.isgeneratorfunction(n.func)]


def pool_width(pipeline: Pipeline, pooled: list[Node] | None = None) -> int:
    """How many pooled nodes can run at once: the largest layer when each is placed one after the deepest
    pooled node it depends on (directly or through driver nodes). Nodes of a layer never depend on each
    other, so the width is a lower bound of the largest independent set, and deterministic."""
    pooled = pooled_nodes(pipeline) if pooled is None else pooled
    if not pooled:
        return 0
    deps = pipeline.node_dependencies
    pset = set(pooled)
    depth: dict[Node, int] = {}
    for n in pipeline.nodes:  # topological order
        below = [depth[d] for d in deps[n]]
        depth[n] = max(below, default=0) + (1 if n in pset else 0)
    return max(Counter(depth[n] for n in pooled).values())


def plan_workers(
    width: int, usable: int, concurrency: int = 1, threads: int | None = None, fixed: int | None = None
) -> int:
    """Worker processes for a run: ``fixed`` if given (at most ``width``), else the run's CPUs (``usable //
    concurrency``) over the threads one worker computes with (``threads``, 1 by default), at most ``width``."""
    if width <= 0:
        return 0
    if fixed is not None:
        return max(1, min(int(fixed), width))
    total = max(1, usable // max(1, concurrency))
    return max(1, min(width, total // max(1, threads or 1)))


# ------------------------------------------------------------------------------------- worker side
def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: the driver decides, so the workers ignore it
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_in_worker(node_blob: bytes, inputs_blob: bytes, env: dict[str, str | None], cwd: str) -> bytes:
    """Body of one worker task: the node's function on its inputs, with this run's thread settings; returns
    the pickled ``(outputs, info)``, info saying where it ran and the threads each node's preamble chose."""
    import resource

    for k, v in env.items():  # a worker serves one run at a time: this run's settings, not the server's
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if os.getcwd() != cwd:
        os.chdir(cwd)
    node = pickle.loads(node_blob)
    inputs = pickle.loads(inputs_blob)
    runctx.take_node_threads()
    torch = _torch()
    if torch is not None:  # a node that never calls node_setup still computes within the share
        from pipelines.core.runtime import cpu_budget

        torch.set_num_threads(cpu_budget() if os.environ.get("PIPELINES_THREADS") else 1)
    token = runctx.current_node.set(node.name)  # the NaN guard names the node, as in the driver
    t0 = time.perf_counter()
    try:
        outputs = node.run(inputs)
    finally:
        runctx.current_node.reset(token)
    info = {
        "pid": os.getpid(),
        "seconds": round(time.perf_counter() - t0, 3),
        "threads_by_node": runctx.take_node_threads(),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if not info["threads_by_node"] and torch is not None:
        info["threads_by_node"] = {node.name: {"threads": torch.get_num_threads(), "setting": "worker"}}
    return pickle.dumps((outputs, info), protocol=pickle.HIGHEST_PROTOCOL)


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return torch


# ------------------------------------------------------------------------------------------ runner
class ThreadRecordHooks:
    """Starts each pipeline run with an empty thread record (what its nodes used, core.runctx)."""

    @hook_impl
    def before_pipeline_run(self) -> None:
        runctx.reset_thread_log()


class PoolRunner(OffloadingRunner):
    """Train nodes in worker processes, everything else in this process (see the module docstring).

    ``--runner-params workers=N`` fixes the number of workers; ``start_method=spawn|forkserver``."""

    def __init__(self, is_async: bool = False, workers: int | None = None, start_method: str | None = None) -> None:
        super().__init__(is_async=is_async)
        if workers is not None and (isinstance(workers, bool) or not str(workers).isdigit() or int(workers) < 1):
            raise ValueError(f"runner setting 'workers' (--runner-params): {workers!r} is not a positive integer")
        available = mp.get_all_start_methods()
        if start_method is not None and start_method not in START_METHODS:
            raise ValueError(
                f"runner setting 'start_method' (--runner-params): {start_method!r} is not one of "
                f"{', '.join(START_METHODS)}"
            )
        if start_method is not None and start_method not in available:
            raise ValueError(
                f"runner setting 'start_method': {start_method!r} is not available here ({', '.join(available)})"
            )
        self.workers = int(workers) if workers is not None else None
        self.start_method = start_method or ("forkserver" if "forkserver" in available else "spawn")
        self.used_workers = 0
        self.placements: dict[str, dict] = {}

    def __str__(self) -> str:
        return f"PoolRunner(workers={self.used_workers})"

    def _get_executor(self, max_workers: int) -> None:
        return None  # AbstractRunner._run then runs sequentially (the one-worker case)

    def _run(self, pipeline: Pipeline, catalog, hook_manager=None, run_id: str | None = None) -> None:
        from pipelines.core.cpus import usable_cpus
        from pipelines.core.runtime import concurrency

        pooled = pooled_nodes(pipeline)
        threads_env = os.environ.get("PIPELINES_THREADS", "").strip()
        n = plan_workers(
            pool_width(pipeline, pooled),
            usable_cpus(),
            concurrency(),
            int(threads_env) if threads_env.isdigit() else None,
            self.workers,
        )
        if n <= 1:
            self.used_workers = 0
            runctx.set_run_workers(0)
            self._logger.info(
                "PoolRunner: %s; running in this process",
                "no train node" if not pooled else "one worker's worth of CPUs or of train nodes",
            )
            super()._run(pipeline, catalog, hook_manager, run_id)
            return
        self.used_workers = n
        runctx.set_run_workers(n)
        env = {"PIPELINES_THREADS": threads_env or None, "PIPELINES_CONCURRENCY": str(concurrency() * n)}
        self._logger.info(
            "PoolRunner: %d worker processes (%s) for %d train nodes; %d usable CPUs",
            n,
            self.start_method,
            len(pooled),
            usable_cpus(),
        )
        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            # the server imports torch once (while this process runs the data nodes); workers fork from it
            ctx.set_forkserver_preload(["pipelines", "pipelines.core.runtime", "pandas"])
            from multiprocessing import forkserver

            forkserver.ensure_running()
        executor = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_worker_init)
        try:
            self._n, self._executor, self._env, self._cwd = n, executor, env, str(Path.cwd())
            self._drive(pipeline, catalog, hook_manager, run_id, set(pooled))
        except BaseException:
            _stop(executor)
            raise
        else:
            executor.shutdown(wait=True)

    # -- how a node travels (the loop is core.scheduling's) -----------------------------------------
    def _capacity(self) -> int:
        return self._n

    def _offload(self, node: Node, catalog, hook_manager, run_id) -> tuple[Future, dict[str, Any]] | None:
        return self._submit(node, catalog, hook_manager, run_id, self._executor, self._env, self._cwd)

    def _wait(self, inflight: dict) -> list:
        finished, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
        return list(finished)

    def _outputs(self, handle, node: Node, inputs, catalog, hook_manager, run_id) -> dict[str, Any]:
        return self._collect(handle, node, inputs, catalog, hook_manager, run_id)

    def _cancel(self, handles: list) -> None:
        for fut in handles:
            fut.cancel()

    def _completed(self, node: Node, seconds: float) -> None:
        p = self.placements[node.name]
        self._logger.debug(
            "Completed node: %s (worker pid %s, %.2fs, threads %s)",
            node.name,
            p["pid"],
            seconds,
            ",".join(str(r["threads"]) for r in p["threads_by_node"].values()) or "-",
        )

    def _submit(
        self,
        node: Node,
        catalog,
        hook_manager,
        run_id,
        executor: ProcessPoolExecutor,
        env: dict[str, str | None],
        cwd: str,
    ) -> tuple[Future, dict[str, Any]] | None:
        try:
            node_blob = pickle.dumps(node, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - pickling errors come in many types
            self._logger.warning(
                "PoolRunner: node '%s' cannot be sent to a worker (%s: %s); it runs in this "
                "process (node functions are module-level functions or functools.partial)",
                node.name,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            Task(
                node=node, catalog=catalog, hook_manager=hook_manager, is_async=self._is_async, run_id=run_id
            ).execute()
            return None
        inputs = load_inputs(node, catalog, hook_manager, run_id)
        try:
            blob = pickle.dumps(inputs, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            error = PoolRunnerError(
                f"node '{node.name}': its inputs cannot be sent to a worker process "
                f"({type(exc).__name__}: {exc}); run with --runner=SequentialRunner"
            )
            hook_manager.hook.on_node_error(
                error=error, node=node, catalog=catalog, inputs=inputs, is_async=False, run_id=run_id
            )
            raise error from exc
        return executor.submit(run_in_worker, node_blob, blob, env, cwd), inputs

    def _collect(self, fut: Future, node: Node, inputs, catalog, hook_manager, run_id) -> dict[str, Any]:
        try:
            outputs, info = pickle.loads(fut.result())
        except BrokenProcessPool as exc:
            error = PoolRunnerError(
                f"node '{node.name}': its worker process died or could not start (killed, out "
                "of memory, or an unimportable __main__); rerun with --only-missing-outputs to "
                "resume"
            )
            hook_manager.hook.on_node_error(
                error=error, node=node, catalog=catalog, inputs=inputs, is_async=False, run_id=run_id
            )
            raise error from exc
        except Exception as exc:
            # the node's own exception, as SequentialRunner raises it (its type kept, e.g. NonFiniteLossError)
            hook_manager.hook.on_node_error(
                error=exc, node=node, catalog=catalog, inputs=inputs, is_async=False, run_id=run_id
            )
            self._logger.error("Node '%s' failed in worker process: %s: %s", node.name, type(exc).__name__, exc)
            raise
        self.placements[node.name] = info
        runctx.merge_node_threads(info["threads_by_node"])
        hook_manager.hook.after_node_run(
            node=node, catalog=catalog, inputs=inputs, outputs=outputs, is_async=False, run_id=run_id
        )
        return outputs


def _stop(executor: ProcessPoolExecutor) -> None:
    """End the workers now (a failed or interrupted run): queued nodes are dropped, running ones killed."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)


__all__ = [
    "PoolRunner",
    "PoolRunnerError",
    "ThreadRecordHooks",
    "plan_workers",
    "pool_width",
    "pooled_nodes",
    "run_in_worker",
]
