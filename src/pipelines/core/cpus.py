"""The CPUs this process may use, without importing torch (the sweep driver and the runtime share it)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def _cgroup_quota_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by a cgroup CPU quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``), None if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on: affinity mask, capped by the cgroup quota (at least 1)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota_cpus()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)
