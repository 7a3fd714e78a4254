"""``kedro sweep``: one pipeline over a grid of parameter overrides, and how robust its claims are.

    kedro sweep --pipeline=rankcal --env=test --grid "rankcal.ece.n_bins=10,15" \\
                --grid "rankcal.models.neural.steps=30,40"           # 2 x 2 = 4 points
    kedro sweep --resume rankcal-20261201T102135-a3f0                   # rerun what did not finish ok

Each point is a full ``kedro run --pipeline=<m> --env=<env> --params=<fixed>,<point>`` in its own
process (``python -m pipelines run ...``: the project CLI, whose sessions carry two guards for runs sharing
one data folder, see :mod:`pipelines.core.sweep.point`): locally up to ``--max-parallel`` at once, or, with
``--runner-params address=local|auto|ray://...``, one Ray task per point. Each point's MLflow
runs carry the tags ``sweep_id``, ``sweep_point``, ``sweep_attempt`` and ``sweep.<key>`` (the value as
written); MLflow applies them when the run is created, from ``MLFLOW_RUN_CONTEXT``. Everything the sweep
writes is under ``data/08_reporting/<m>/sweeps/<sweep_id>/``: ``sweep.json`` (the grid and every point's
status, rewritten after each point), ``summary.parquet`` / ``summary.md`` (one row per point: swept values,
status, error, run id, wall time, headline, every claim's value and holds), ``heatmap.png`` (claims x
points) and ``logs/``; the same files go to the sweep's own MLflow run ``sweep-<sweep_id>``
(``role=sweep``, metrics ``hold_rate.<claim>``). See docs/sweeps.md.

The parts, one job each: ``grid`` (parsing a request), ``point`` (one point's process), ``backends`` (local
or Ray), ``results`` (what is kept: results, hold rates, summary, ``sweep.json``), ``store`` (the sweep's
MLflow run), ``driver`` (the ``kedro sweep`` command). Imports only click at module level (``kedro`` loads
this with every command); mlflow, pandas, matplotlib and ray are imported where used.
"""

from __future__ import annotations

from pipelines.core.sweep.base import FAILED, INTERRUPTED, OK, PENDING, RUNNING, GridError, SweepInterrupted
from pipelines.core.sweep.driver import run_sweep, sweep
from pipelines.core.sweep.grid import (
    error_line,
    expand_grid,
    new_sweep_id,
    parse_assignments,
    parse_grid,
    parse_value,
    pipeline_of,
    sample_points,
    split_top_level,
)
from pipelines.core.sweep.point import point_args, run_point
from pipelines.core.sweep.results import (
    hold_rate_table,
    hold_rates,
    load_doc,
    point_results,
    points_table,
    resume_todo,
    summary_markdown,
    sweep_hold_rate_markdown,
    write_summary,
)

__all__ = [
    "FAILED",
    "INTERRUPTED",
    "OK",
    "PENDING",
    "RUNNING",
    "GridError",
    "SweepInterrupted",
    "error_line",
    "expand_grid",
    "hold_rate_table",
    "hold_rates",
    "load_doc",
    "new_sweep_id",
    "parse_assignments",
    "parse_grid",
    "parse_value",
    "pipeline_of",
    "point_args",
    "point_results",
    "points_table",
    "resume_todo",
    "run_point",
    "run_sweep",
    "sample_points",
    "split_top_level",
    "summary_markdown",
    "sweep",
    "sweep_hold_rate_markdown",
    "write_summary",
]
