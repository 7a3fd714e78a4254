"""Threads, seeding and device choice: the one place nodes get them from (the node preamble).

Thread policy (docs/threads.md): a node's CPU budget is the CPUs this process may use (its affinity mask and
its cgroup CPU quota) divided by the number of runs or workers sharing them (``PIPELINES_CONCURRENCY``, set
by ``kedro sweep`` and by the pool runner's workers; 1 otherwise), or ``PIPELINES_THREADS`` where a
scheduler (a Ray task) or the user fixed it. ``threads: all`` takes the budget; ``threads: auto`` takes it
only when the method declares that its models scale (``MethodParams.threads_scale``), else 1 thread: tiny
models lose more to the threads' synchronisation than they gain. An integer in the parameters wins.
OpenMP's wait policy is made passive on the package import (``pipelines/__init__.py``) before torch loads.
Each node's count is recorded (by node name, ``core.runctx``), so the report says what every variant used,
also when it ran in a worker process or a Ray task.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from pipelines.core.cpus import _cgroup_quota_cpus, usable_cpus  # noqa: F401 (re-exported)

CONCURRENCY_ENV = "PIPELINES_CONCURRENCY"
THREADS_ENV = "PIPELINES_THREADS"  # what `auto` means in a Ray task: the CPUs Ray reserved for it

# What the last node preamble chose: the report and MLflow record it.
_chosen: dict[str, Any] = {}


def concurrency() -> int:
    """How many runs share this machine's CPUs (``PIPELINES_CONCURRENCY``, default 1)."""
    raw = os.environ.get(CONCURRENCY_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        raise ValueError(f"{CONCURRENCY_ENV}={raw!r} is not an integer") from None


def cpu_budget() -> int:
    """The CPUs one node may use: ``PIPELINES_THREADS`` where a scheduler or the user set it, else usable
    CPUs // concurrency (at least 1)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{THREADS_ENV}={raw!r} is not a positive integer")
        return int(raw)
    return max(1, usable_cpus() // concurrency())


def resolve_threads(spec: int | str | None, scales: bool = False) -> int:
    """``all`` → the node's CPU budget (:func:`cpu_budget`); ``auto``/None → the budget when the method's
    models scale (``scales``), else 1 thread, or ``PIPELINES_THREADS`` where a scheduler or the user fixed
    it; an integer is taken as it is."""
    if spec is None or spec == "auto":
        if os.environ.get(THREADS_ENV, "").strip():
            return cpu_budget()
        return cpu_budget() if scales else 1
    if spec == "all":
        return cpu_budget()
    return int(spec)


def params_scale(params: Any) -> bool:
    """Whether a method's params declare that its models scale with threads (``threads_scale()``)."""
    f = getattr(params, "threads_scale", None)
    return bool(f()) if callable(f) else False


def set_threads(spec: int | str | None = "auto", scales: bool = False) -> int:
    """Fix torch's intra-op threads from a ``threads`` setting; returns the number used (recorded for the
    running node, see core.runctx.record_node_threads)."""
    from pipelines.core.runctx import current_node, record_node_threads

    n = resolve_threads(spec, scales)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    setting = str(spec if spec is not None else "auto")
    _chosen.update(threads=torch.get_num_threads(), threads_setting=setting)
    record_node_threads(current_node.get(), _chosen["threads"], setting)
    return _chosen["threads"]


def thread_record() -> dict[str, Any]:
    """Threads and OpenMP wait policy of this run (the report and the MLflow parent run carry it).

    ``threads_by_node``: what each node's preamble chose, wherever the node ran (this process, a pool
    worker, a Ray task); ``threads``: what the train nodes used (the largest count when they differ), else
    this process's last choice; ``workers``: the worker processes the runner used (0: all in this process)."""
    import pipelines
    from pipelines.core.runctx import node_threads, run_workers

    by_node = node_threads()
    train = [r["threads"] for name, r in by_node.items() if ".train." in f".{name}"]
    n = max(train) if train else _chosen.get("threads", torch.get_num_threads())
    settings = [r["setting"] for name, r in by_node.items() if ".train." in f".{name}"]
    setting = settings[0] if settings else _chosen.get("threads_setting", "auto")
    return {
        "threads": n,
        "threads_setting": setting,
        "threads_by_node": {k: r["threads"] for k, r in sorted(by_node.items())},
        "workers": run_workers(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default",
        "omp_wait_policy_source": "user" if pipelines.OMP_WAIT_POLICY_SET_BY_USER else "platform",
        "usable_cpus": usable_cpus(),
        "concurrency": concurrency(),
    }


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch Generator for explicit sampling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def get_device(prefer: str = "auto") -> torch.device:
    """``cuda`` when a GPU is visible and (inside a Ray task) Ray assigned one to us, else ``cpu``.

    Node code never sets CUDA_VISIBLE_DEVICES: Ray does that for the task it schedules. The rule
    is the runner's (``pipelines.core.runner.assigned_device``), so the two can never disagree."""
    from pipelines.core.runner import assigned_device

    if prefer == "cpu":
        return torch.device("cpu")
    if assigned_device() == "cpu":
        if prefer == "cuda":
            raise RuntimeError("device 'cuda' was asked for but no GPU is visible / assigned to this task")
        return torch.device("cpu")
    return torch.device("cuda")


def node_setup(params: Any = None, seed: int | None = None, device: str | None = None) -> torch.device:
    """The node preamble, in one place: threads from ``params.threads`` (``auto`` by default), the
    seed (when given) and the device (``params.device`` or ``device``, ``auto`` by default).

    Every node that runs torch code starts with ``device = node_setup(p)`` (or ``node_setup(p, seed)``)."""
    set_threads(getattr(params, "threads", "auto") if params is not None else "auto", params_scale(params))
    if seed is not None:
        seed_everything(int(seed))
    return get_device(device or getattr(params, "device", None) or "auto")


def to_cpu(obj):
    """Recursively move tensors in dicts / lists / tuples to the CPU (node outputs must be CPU)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


__all__ = [
    "CONCURRENCY_ENV",
    "THREADS_ENV",
    "concurrency",
    "cpu_budget",
    "get_device",
    "node_setup",
    "params_scale",
    "resolve_threads",
    "seed_everything",
    "set_threads",
    "thread_record",
    "to_cpu",
    "usable_cpus",
]
