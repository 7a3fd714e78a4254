"""One point: its ``kedro run`` arguments and the subprocess that runs it."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.core.sweep.base import CONCURRENCY_ENV, LOG_CAP, THREADS_ENV


def point_args(pipeline: str, env: str | None, params: Mapping[str, str]) -> list[str]:
    """The point's ``kedro run`` arguments. Values are passed as written; the project's ``--params``
    splits on commas outside brackets, so list values such as ``[0,1]`` survive."""
    args = ["run", f"--pipeline={pipeline}"]
    if env:
        args.append(f"--env={env}")
    if params:
        args.append("--params=" + ",".join(f"{k}={v}" for k, v in params.items()))
    return args


def _ray_node_concurrency(cpus_per_point: float, n_points: int) -> int:
    """How many points this Ray node runs at once: its CPUs // CPUs per point (capped by the points)."""
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        cpus = next((n.get("Resources", {}).get("CPU", 1.0) for n in ray.nodes() if n.get("NodeID") == node_id), 1.0)
    except Exception:  # noqa: BLE001 - outside Ray or an old API: one point at a time
        return 1
    per_node = int(cpus // cpus_per_point) if cpus_per_point > 0 else n_points
    return max(1, min(n_points, per_node))


def stop_process(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (the point's `kedro run` marks its MLflow run KILLED), then SIGKILL after ``grace`` s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_point(job: Mapping[str, Any], on_start=None) -> dict[str, Any]:
    """Run one point's ``kedro run`` (``python -m pipelines run ...``, see below) in a subprocess,
    here or in a Ray task.

    ``job``: ``args`` (the ``kedro`` arguments: ``run --pipeline=...``), ``cwd`` (the project root; a Ray worker that
    lacks it uses its own working directory), ``env`` (added to this process' environment) and, in a
    Ray task, ``ray_cpus`` and ``n_points`` to size ``PIPELINES_CONCURRENCY`` for this node.
    ``on_start(proc)`` is called with the started process. Interrupted (a cancelled Ray task), it stops
    the subprocess before re-raising."""
    env = dict(os.environ)
    env.update(job["env"])
    if job.get("ray_cpus") is not None:
        env[CONCURRENCY_ENV] = str(_ray_node_concurrency(float(job["ray_cpus"]), int(job["n_points"])))
        env[THREADS_ENV] = str(max(1, math.floor(float(job["ray_cpus"]))))
    cwd = job["cwd"] if Path(job["cwd"]).is_dir() else os.getcwd()
    cmd = [sys.executable, "-m", "pipelines", *job["args"]]
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        proc = None
        rc, out, err = 127, "", f"Error: cannot start {cmd[0]}: {exc}"
    if proc is not None:
        if on_start is not None:
            on_start(proc)
        try:
            out, err = proc.communicate()
        except BaseException:
            stop_process(proc)
            raise
        rc = proc.returncode
    return {
        "returncode": rc,
        "stdout": out[-LOG_CAP:],
        "stderr": err[-LOG_CAP:],
        "wall_seconds": round(time.perf_counter() - t0, 3),
        "host": socket.gethostname(),
        "cwd": cwd,
    }


# ============================================================================================ the point process
# Every point runs `python -m pipelines run ...`: the project's own CLI, settings and hooks. Two guards that
# concurrent `kedro run`s sharing one data/ folder need were found by running 4 points at once on this
# project, and hold for every `kedro run` (core.versions):
#   1. Kedro loads an unpinned versioned dataset at the *latest* version on disk, also right after this run
#      saved it; a concurrent run's newer save was read back instead ("Save version A did not match load
#      version B"). PlatformHooks pins each dataset a run saves to that run's own save version.
#   2. The save version is the session's start time in milliseconds: two runs that start in the same
#      millisecond share it. The project's settings.SESSION_CLASS creates sessions under a per-project file
#      lock (core.versions.unique_session_class).
