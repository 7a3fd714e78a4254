"""Threads, seeding and device choice: the one place nodes get them from (the node preamble).

Thread policy: ``threads: auto`` resolves to the CPUs this process may use (its affinity mask and its
cgroup CPU quota) divided by the number of runs sharing the machine (``PIPELINES_CONCURRENCY``, set by
``kedro sweep`` and by Ray workers; 1 otherwise). An integer in the parameters wins. OpenMP's wait policy
is made passive on the package import (``pipelines/__init__.py``) before torch loads.
"""
from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from pipelines.core.cpus import _cgroup_quota_cpus, usable_cpus  # noqa: F401 (re-exported)

CONCURRENCY_ENV = "PIPELINES_CONCURRENCY"
THREADS_ENV = "PIPELINES_THREADS"      # what `auto` means in a Ray task: the CPUs Ray reserved for it

# What the last node preamble chose: the report and MLflow record it.
_chosen: dict[str, Any] = {}


def concurrency() -> int:
    """How many runs share this machine's CPUs (``PIPELINES_CONCURRENCY``, default 1)."""
    raw = os.environ.get(CONCURRENCY_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        raise ValueError(f"{CONCURRENCY_ENV}={raw!r} is not an integer") from None


def resolve_threads(spec: int | str | None) -> int:
    """``auto``/None → usable CPUs // concurrency (at least 1), or ``PIPELINES_THREADS`` where a
    scheduler (a Ray task) set it; an integer is taken as it is."""
    if spec is None or spec == "auto":
        if os.environ.get(THREADS_ENV, "").strip().isdigit():
            return max(1, int(os.environ[THREADS_ENV]))
        return max(1, usable_cpus() // concurrency())
    return int(spec)


def set_threads(spec: int | str | None = "auto") -> int:
    """Fix torch's intra-op threads from a ``threads`` setting; returns the number used."""
    n = resolve_threads(spec)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _chosen.update(threads=torch.get_num_threads(), threads_setting=str(spec if spec is not None else "auto"))
    return _chosen["threads"]


def thread_record() -> dict[str, Any]:
    """Threads and OpenMP wait policy of this process (the report and the MLflow parent run carry it)."""
    import pipelines

    n = _chosen.get("threads", torch.get_num_threads())
    return {"threads": n, "threads_setting": _chosen.get("threads_setting", "auto"),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default",
            "omp_wait_policy_source": "user" if pipelines.OMP_WAIT_POLICY_SET_BY_USER else "platform",
            "usable_cpus": usable_cpus(), "concurrency": concurrency()}


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
    set_threads(getattr(params, "threads", "auto") if params is not None else "auto")
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


__all__ = ["CONCURRENCY_ENV", "THREADS_ENV", "concurrency", "get_device", "node_setup", "resolve_threads", "seed_everything",
           "set_threads", "thread_record", "to_cpu", "usable_cpus"]
