"""Platform hooks: name the running node in errors, log typed parameters to MLflow, stamp the report
with the run context and log it to MLflow (parent + one child per variant), and close MLflow runs with
the status the run ended with. Parameters are validated before the session runs (the project's
``kedro run``, then Kedro's own type-hint validation)."""
from __future__ import annotations

import logging
import time
from typing import Any

from kedro.framework.hooks import hook_impl

from pipelines.core.runctx import current_node, git_commit, runner_name

log = logging.getLogger(__name__)


def end_mlflow_runs(status: str = "FINISHED") -> None:
    """End every MLflow run still active in this process with ``status``. kedro-mlflow re-opens its run
    in every node: nothing may stay active after a run, so a second run in the same process (notebooks,
    tests) never logs into this one's parent; the CLI ends a failed or interrupted run FAILED / KILLED."""
    import sys

    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return
    while mlflow.active_run() is not None:
        mlflow.end_run(status)


def log_typed_params(inputs: dict[str, Any], logged: set[str]) -> None:
    """Log a node's typed ``params:<m>`` flattened (``m.data.n_train`` ...) to the active MLflow run,
    once per run: kedro-mlflow flattens dicts only, and Kedro now hands nodes a ``Params`` model."""
    import sys

    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return
    from pipelines.core.report import params_dict

    for name, value in inputs.items():
        if not name.startswith("params:") or name in logged or not hasattr(value, "model_dump"):
            continue
        logged.add(name)
        flat: dict[str, str] = {}

        def walk(prefix: str, v: Any) -> None:
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}.{k}", x)
            else:
                flat[prefix] = str(v)[:6000]

        walk(name[len("params:"):], params_dict(value))
        for i in range(0, len(flat), 100):   # MLflow's batch limit
            mlflow.log_params(dict(list(flat.items())[i:i + 100]))


class PlatformHooks:
    def __init__(self) -> None:
        self._ctx: dict[str, Any] = {}
        self._catalog = None
        self._load_versions: dict[str, str] = {}

    @hook_impl
    def after_catalog_created(self, catalog, load_versions) -> None:
        self._catalog, self._load_versions = catalog, dict(load_versions or {})

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline, catalog) -> None:
        self._ctx = {
            "env": run_params.get("env") or "base",
            "save_version": run_params.get("run_id"),
            "git_commit": git_commit(),
            "runner": runner_name(),
            # a run of part of the pipeline (--nodes, --from-nodes, --tags ...): its wall time is not the method's
            "partial_run": any(run_params.get(k) for k in ("node_names", "from_nodes", "to_nodes", "from_inputs",
                                                           "to_outputs", "tags", "namespaces")),
            "_t0": time.perf_counter(),
        }
        self._logged_params: set[str] = set()

    @hook_impl
    def after_pipeline_run(self) -> None:
        end_mlflow_runs()

    @hook_impl
    def on_pipeline_error(self) -> None:
        end_mlflow_runs("FAILED")

    @hook_impl
    def before_node_run(self, node, inputs: dict[str, Any]) -> None:
        current_node.set(node.name)
        log_typed_params(inputs, getattr(self, "_logged_params", set()))

    @hook_impl
    def after_node_run(self, node) -> None:
        current_node.set(None)

    @hook_impl
    def on_node_error(self, error: Exception, node) -> None:
        current_node.set(None)

    @hook_impl
    def before_dataset_saved(self, dataset_name: str, data: Any) -> None:
        # runs sharing data/ read back their own version, never a newer one another run saved
        from pipelines.core.versions import pin_own_version

        pin_own_version(self._catalog, dataset_name, self._load_versions)
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
