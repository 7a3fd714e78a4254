"""Platform hooks: validate parameters before any node runs, name the running node in errors,
stamp the report with the run context and log it to MLflow (parent + one child per variant)."""
from __future__ import annotations

import logging
import time
from typing import Any

from kedro.framework.hooks import hook_impl

from pipelines.core.runctx import current_node, git_commit, runner_name

log = logging.getLogger(__name__)


def method_namespaces(pipeline) -> list[str]:
    return sorted({n.namespace.split(".")[0] for n in pipeline.nodes if n.namespace})


def validate_pipeline_params(pipeline, catalog) -> None:
    """Validate ``params:<m>`` of every method in ``pipeline`` against its schema."""
    from pipelines.core.params import ParameterError, schema_for, validate

    for m in method_namespaces(pipeline):
        schema = schema_for(m)
        if schema is None:
            continue
        try:
            raw = catalog.load(f"params:{m}")
        except Exception:  # noqa: BLE001 - a missing parameters file is a user error worth one line
            raise ParameterError(f"parameter {m}: missing (conf/base/parameters_{m}.yml with top-level key '{m}')") from None
        validate(schema, raw, m)


def _end_mlflow_runs() -> None:
    """kedro-mlflow re-opens its run in every node; make sure nothing stays active after the run, so a
    second run in the same process (notebooks, tests) never logs into this one's parent."""
    import sys

    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return
    while mlflow.active_run() is not None:
        mlflow.end_run()


class PlatformHooks:
    def __init__(self) -> None:
        self._ctx: dict[str, Any] = {}

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline, catalog) -> None:
        self._ctx = {
            "env": run_params.get("env") or "base",
            "save_version": run_params.get("run_id"),
            "git_commit": git_commit(),
            "runner": runner_name(),
            "_t0": time.perf_counter(),
        }
        validate_pipeline_params(pipeline, catalog)

    @hook_impl
    def after_pipeline_run(self) -> None:
        _end_mlflow_runs()

    @hook_impl
    def on_pipeline_error(self) -> None:
        _end_mlflow_runs()

    @hook_impl
    def before_node_run(self, node) -> None:
        current_node.set(node.name)

    @hook_impl
    def after_node_run(self, node) -> None:
        current_node.set(None)

    @hook_impl
    def on_node_error(self, error: Exception, node) -> None:
        current_node.set(None)

    @hook_impl
    def before_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if dataset_name.endswith(".report") and isinstance(data, dict) and self._ctx:
            data.update({k: v for k, v in self._ctx.items() if not k.startswith("_")})
            data["wall_seconds"] = round(time.perf_counter() - self._ctx["_t0"], 3)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if dataset_name.endswith(".report") and isinstance(data, dict):
            from pipelines.core.mlflow_logging import log_report

            run_id = log_report(data)
            if run_id:
                log.info("report %s logged to MLflow run %s (+%d variant runs)", dataset_name, run_id,
                         len(data.get("variants", {})))
