"""Where points run: local subprocesses, at most ``--max-parallel`` at once, or one Ray task per point."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from pipelines.core.cpus import usable_cpus
from pipelines.core.sweep.point import run_point, stop_process


class _LocalBackend:
    """Points as subprocesses of this process, at most ``parallel`` at once."""

    def __init__(self, parallel: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.limit = parallel
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="sweep-point")
        self._futures: dict[Any, int] = {}
        self._procs: set[subprocess.Popen] = set()

    def describe(self) -> str:
        return f"local, {self.limit} at once"

    def _run(self, job: dict[str, Any]) -> dict[str, Any]:
        holder: list[subprocess.Popen] = []

        def started(proc: subprocess.Popen) -> None:
            holder.append(proc)
            self._procs.add(proc)

        try:
            return run_point(job, on_start=started)
        finally:
            for proc in holder:
                self._procs.discard(proc)

    def inflight(self) -> int:
        return len(self._futures)

    def submit(self, index: int, job: dict[str, Any]) -> None:
        self._futures[self._pool.submit(self._run, job)] = index

    def wait_one(self) -> list[tuple[int, dict[str, Any]]]:
        from concurrent.futures import FIRST_COMPLETED, wait

        done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
        return [(self._futures.pop(f), f.result()) for f in done]

    def close(self, cancel: bool = False) -> None:
        self._pool.shutdown(wait=False, cancel_futures=cancel)
        if cancel:  # points still running: SIGTERM them all, then wait (their runs end KILLED)
            procs = list(self._procs)
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                stop_process(proc)
        self._pool.shutdown(wait=True)


class _RayBackend:
    """Points as Ray tasks (``num_cpus`` each); starts a local instance for ``address=local``."""

    def __init__(self, address: str, cpus_per_point: float, max_inflight: int | None, env_vars: dict[str, str]) -> None:
        import logging

        import ray

        self.address = address
        self.cpus = cpus_per_point
        self.limit = max_inflight or 1_000_000
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
            if address.strip().lower() == "local":
                kwargs.update(address="local", num_cpus=usable_cpus(), include_dashboard=False)
            else:
                kwargs["address"] = address
            ray.init(**kwargs)
            self._started = True
        self._fn = ray.remote(run_point)
        self._runtime_env = {"env_vars": env_vars}
        self._refs: dict[Any, tuple[int, float]] = {}

    def describe(self) -> str:
        import ray

        total = ray.cluster_resources().get("CPU", 0)
        return f"Ray at {self.address} ({total:g} CPUs, {self.cpus:g} per point)"

    def inflight(self) -> int:
        return len(self._refs)

    def submit(self, index: int, job: dict[str, Any]) -> None:
        ref = self._fn.options(
            num_cpus=self.cpus,
            max_retries=0,
            retry_exceptions=False,
            runtime_env=self._runtime_env,
            name=f"sweep-point-{index}",
        ).remote(job)
        self._refs[ref] = (index, time.perf_counter())

    def wait_one(self) -> list[tuple[int, dict[str, Any]]]:
        import ray

        done, _ = ray.wait(list(self._refs), num_returns=1)
        out = []
        for ref in done:
            index, t0 = self._refs.pop(ref)
            try:
                out.append((index, ray.get(ref)))
            except Exception as exc:  # noqa: BLE001 - a lost worker / node: the point failed, not the sweep
                first = (str(exc).strip().splitlines() or [""])[0]
                out.append(
                    (
                        index,
                        {
                            "returncode": -1,
                            "stdout": "",
                            "wall_seconds": round(time.perf_counter() - t0, 3),
                            "stderr": f"Error: the point's Ray task failed: {type(exc).__name__}: {first}",
                        },
                    )
                )
        return out

    def close(self, cancel: bool = False) -> None:
        import ray

        if cancel and self._refs:  # not force: the task's run_point stops its subprocess before it ends
            for ref in self._refs:
                ray.cancel(ref)
            ray.wait(list(self._refs), num_returns=len(self._refs), timeout=45)
        if self._started:
            ray.shutdown()
