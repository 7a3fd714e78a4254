"""Constants, errors and the SIGTERM handler every part of the sweep shares."""

from __future__ import annotations

import re

SCHEMA = 1
SWEEP_ID_ENV = "PIPELINES_SWEEP_ID"
SWEEP_POINT_ENV = "PIPELINES_SWEEP_POINT"
CONCURRENCY_ENV = "PIPELINES_CONCURRENCY"  # read by pipelines.core.runtime (threads = CPUs // this)
THREADS_ENV = "PIPELINES_THREADS"  # a Ray point: the CPUs Ray reserved for it
OK, FAILED, PENDING, RUNNING, INTERRUPTED = "ok", "failed", "pending", "running", "interrupted"
TRANSIENT_RETRIES = 2  # extra attempts for a point that failed on a busy / racing tracking store
LOG_CAP = 2_000_000  # characters of a point's stdout / stderr kept
_SWEEP_ID = re.compile(r"^(?P<m>[A-Za-z0-9_][\w-]*)-(?P<ts>\d{8}T\d{6})-(?P<hex>[0-9a-f]{4})$")
_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
_OPEN, _CLOSE = "[{(", "]})"
# store errors worth another attempt: sqlite busy beyond MLflow's timeout, a create-experiment race,
# a schema-migration race on a fresh database (the driver prepares the store, so these are rare)
_TRANSIENT = re.compile(
    r"database is locked|database table is locked|UNIQUE constraint failed: experiments"
    r"|_alembic_tmp_|Online migration expected|TEMPORARILY_UNAVAILABLE"
    r"|must not exist if versioning is enabled",
    re.I,
)
# Kedro's warning that a run read back a newer version of a dataset than the one it saved: another run
# (a concurrent point, or anyone's kedro run) wrote it. The point's results cannot be trusted.
_RACE = re.compile(r"Save version '[^']+' did not match load version '[^']+' for (.{0,300})")


class GridError(ValueError):
    """A --grid / --params / --runner-params value that cannot be parsed (one line)."""


class SweepInterrupted(KeyboardInterrupt):
    """SIGTERM stopped the sweep (Ctrl-C raises KeyboardInterrupt itself)."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise SweepInterrupted("terminated (SIGTERM)")
