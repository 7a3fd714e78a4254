"""Run context shared by the CLI, the config resolvers and the hooks (no heavy imports)."""

from __future__ import annotations

import contextvars
import os
import subprocess
from pathlib import Path

DEFAULT_PIPELINE = "tess"

_requested: list[str] = []
_runner: list[str] = []
_run_config: dict = {}  # env, conf_source and --params of the `kedro run` being set up
_resume: dict = {}  # the killed run a `kedro run --only-missing-outputs` resumes
config_cache: dict = {}  # parameters read for that run (core.registry.method_config); cleared per run
current_node: contextvars.ContextVar[str | None] = contextvars.ContextVar("current_node", default=None)
# What this run's nodes used, wherever they ran (core.runtime.set_threads in this process; the pool runner
# and GPUNodeRunner merge what their workers report): {node name: {"threads", "setting"}}, and the number
# of worker processes the runner used. Reset when a pipeline run starts (core.pool.ThreadRecordHooks).
_node_threads: dict[str, dict] = {}
_workers: list[int] = []


def record_node_threads(node: str | None, threads: int, setting: str) -> None:
    """Note that ``node`` (None: outside any node) computed with ``threads`` intra-op threads."""
    if node is not None:
        prev = _node_threads.get(node, {}).get("threads", 0)
        _node_threads[node] = {"threads": max(prev, int(threads)), "setting": setting}


def merge_node_threads(records: dict[str, dict]) -> None:
    """Records a worker process or a Ray task sent back (``{node: {"threads", "setting"}}``)."""
    for node, r in (records or {}).items():
        record_node_threads(node, r["threads"], r.get("setting", "auto"))


def node_threads() -> dict[str, dict]:
    return {k: dict(v) for k, v in _node_threads.items()}


def take_node_threads() -> dict[str, dict]:
    """This process's records, forgotten here (a worker hands them back after each node)."""
    out = node_threads()
    _node_threads.clear()
    return out


def set_run_workers(n: int) -> None:
    _workers[:] = [int(n)]


def run_workers() -> int:
    return _workers[0] if _workers else 0


def reset_thread_log() -> None:
    _node_threads.clear()
    _workers.clear()


def set_requested_pipelines(names: list[str] | None) -> None:
    """Called by the project's ``kedro run`` before the session starts."""
    _requested[:] = list(names or [])


def set_run_config(env: str | None, conf_source: str | None, runtime_params: dict | None) -> None:
    """Called by the project's ``kedro run`` (and ``kedro sweep`` points): what a pipeline built from
    its parameters (one train node per variant) must read."""
    _run_config.clear()
    config_cache.clear()  # the conf files may have changed since the last run in this process
    _run_config.update(env=env, conf_source=conf_source, runtime_params=dict(runtime_params or {}))


def run_config() -> dict:
    return {"env": None, "conf_source": None, "runtime_params": {}, **_run_config}


def set_resume(save_version: str | None, mlflow_run_id: str | None = None) -> None:
    """Called by the project's ``kedro run --only-missing-outputs`` when it resumes a killed run
    (``None`` clears it): the hooks tag the new run and stamp its report with it."""
    _resume.clear()
    if save_version:
        _resume.update(save_version=save_version, mlflow_run_id=mlflow_run_id)


def resume_info() -> dict | None:
    return dict(_resume) or None


def set_runner_name(name: str) -> None:
    _runner[:] = [name]


def runner_name() -> str:
    return _runner[0] if _runner else "SequentialRunner"


def requested_pipelines() -> list[str]:
    return list(_requested) or [DEFAULT_PIPELINE]


def experiment_name() -> str:
    """MLflow experiment for this run: ``MLFLOW_EXPERIMENT_NAME`` if set, else the pipeline name(s)."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or "+".join(
        DEFAULT_PIPELINE if n == "__default__" else n for n in requested_pipelines()
    )


def project_root() -> Path:
    """The Kedro project root (the folder holding pyproject.toml with [tool.kedro])."""
    from kedro.utils import find_kedro_project

    return find_kedro_project(Path.cwd()) or Path.cwd()


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set (a team server), else the embedded sqlite store at the root."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def artifact_location() -> str | None:
    """Artifacts of the embedded sqlite store go to <project root>/mlartifacts (not ./mlruns of the
    cwd); a tracking server decides its own artifact store (None)."""
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        return (project_root() / "mlartifacts").as_uri()
    return None


def git_commit(cwd: Path | None = None) -> str:
    """HEAD's sha, suffixed ``-dirty`` when tracked files differ; outside git (a container image) the
    ``GIT_COMMIT`` environment variable, else ``unknown``."""
    cwd = cwd or project_root()
    if not (cwd / ".git").exists() and os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("GIT_COMMIT", "unknown")
