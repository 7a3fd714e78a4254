"""Platform hooks: name the running node in errors, log typed parameters to MLflow, stamp the report
with the run context and log it to MLflow (parent + one child per variant), and close MLflow runs with
the status the run ended with. Parameters are validated before the session runs (the project's
``kedro run``, then Kedro's own type-hint validation).

Every MLflow call goes through ``core.tracking.guarded``: a lost tracking server never changes what a
run computes or saves. The parent run is tagged with its owning process (``core.tracking``) and, for a
resumed run, ``resumed_from``; the report's parameters are saved beside it (``params.json``), so a report
saved while the server was down can be logged later with all it would have logged."""

from __future__ import annotations

import logging
import time
from typing import Any

from kedro.framework.hooks import hook_impl

from pipelines.core import tracking
from pipelines.core.runctx import DEFAULT_PIPELINE, current_node, git_commit, resume_info, runner_name

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
        if tracking.lost():  # the store is gone: forget the runs here, never wait on it again
            tracking.guarded("the run's end", lambda: None)
            tracking.drop_active_runs()
            return
        tracking.guarded("the run's end", mlflow.end_run, status)


def log_typed_params(
    inputs: dict[str, Any], logged: set[str], into: dict[str, str] | None = None, trees: dict[str, Any] | None = None
) -> None:
    """Log a node's typed ``params:<m>`` flattened (``m.data.n_train`` ...) to the active MLflow run,
    once per run: kedro-mlflow flattens dicts only, and Kedro now hands nodes a ``Params`` model.
    ``into`` collects them too (with or without MLflow), for the ``params.json`` beside the report;
    ``trees`` collects each ``m``'s nested dict (a variant's own parameters go on its child run)."""
    import sys

    mlflow = sys.modules.get("mlflow")
    active = mlflow is not None and mlflow.active_run() is not None
    if not active and into is None:
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

        tree = params_dict(value)
        walk(name[len("params:") :], tree)
        if trees is not None:
            trees[name[len("params:") :]] = tree
        if into is not None:
            into.update(flat)
        if not active:
            continue
        for i in range(0, len(flat), 100):  # MLflow's batch limit
            tracking.guarded("parameters", mlflow.log_params, dict(list(flat.items())[i : i + 100]))


def tag_owner(resumed: dict[str, Any] | None, save_version: str | None, name: str | None = None) -> None:
    """Tag the active (parent) run with its owning process, its save version and, when it resumes a
    killed run, ``resumed_from`` (and the killed run with ``resumed_by``); name it ``name``, and tag its
    experiment as classic ML training (the MLflow UI opens it on its runs, not on GenAI traces)."""
    import sys

    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return
    from pipelines.core.mlflow_logging import mark_experiment_kind

    tags = tracking.process_tags()
    if name:
        tags["mlflow.runName"] = name
    if save_version:
        tags["save_version"] = str(save_version)
    if resumed:
        tags["resumed_from"] = resumed.get("mlflow_run_id") or f"save version {resumed['save_version']}"
        tags["resumed_from_version"] = str(resumed["save_version"])
    tracking.guarded("the run's tags", mlflow.set_tags, tags)
    tracking.guarded("the experiment's kind", mark_experiment_kind, mlflow.active_run().info.experiment_id)
    if resumed and resumed.get("mlflow_run_id"):
        run_id = mlflow.active_run().info.run_id
        tracking.guarded(
            "the run's tags", mlflow.MlflowClient().set_tag, resumed["mlflow_run_id"], "resumed_by", run_id
        )


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
            "partial_run": any(
                run_params.get(k)
                for k in ("node_names", "from_nodes", "to_nodes", "from_inputs", "to_outputs", "tags", "namespaces")
            ),
            "_t0": time.perf_counter(),
        }
        self._logged_params: set[str] = set()
        self._params: dict[str, str] = {}
        self._param_trees: dict[str, Any] = {}
        self._resumed = resume_info()
        from pipelines.core.mlflow_logging import parent_run_name

        names = run_params.get("pipeline_names") or [run_params.get("pipeline_name") or "__default__"]
        shown = "+".join(DEFAULT_PIPELINE if n == "__default__" else str(n) for n in names)
        name = parent_run_name(shown, self._ctx["env"], self._ctx["save_version"])
        tag_owner(self._resumed, self._ctx["save_version"], name)

    @hook_impl
    def after_pipeline_run(self) -> None:
        end_mlflow_runs()

    @hook_impl
    def on_pipeline_error(self) -> None:
        end_mlflow_runs("FAILED")

    @hook_impl
    def before_node_run(self, node, inputs: dict[str, Any]) -> None:
        current_node.set(node.name)
        log_typed_params(
            inputs,
            getattr(self, "_logged_params", set()),
            getattr(self, "_params", None),
            getattr(self, "_param_trees", None),
        )

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
            if getattr(self, "_resumed", None):
                data["resumed_from"] = dict(self._resumed)
                data["wall_seconds_covers"] = (
                    f"this resumed run only: the nodes run {self._resumed['save_version']} had finished were "
                    f"skipped, and their time is not included"
                )

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if dataset_name.endswith(".report") and isinstance(data, dict):
            from pipelines.core.mlflow_logging import log_report

            path = self._saved_path(dataset_name)
            if path is not None:
                import json

                tracking.note_report(_shown(path))
                (path.parent / "params.json").write_text(json.dumps(getattr(self, "_params", {}), indent=1))
            run_id = tracking.guarded(
                "the report and its variant runs",
                log_report,
                data,
                getattr(self, "_param_trees", {}).get(data.get("pipeline")),
            )
            if run_id:
                log.info(
                    "report %s logged to MLflow run %s (+%d variant runs)",
                    dataset_name,
                    run_id,
                    len(data.get("variants", {})),
                )

    def _saved_path(self, dataset_name: str):
        """Where the report just saved was written (a local versioned JSON file), else None."""
        from pathlib import Path

        try:
            ds = self._catalog.get(dataset_name)
            version = self._ctx.get("save_version")
            path = Path(str(ds._get_versioned_path(version))) if version else Path(str(ds._filepath))
        except Exception:  # noqa: BLE001 - not a local versioned file: nothing to note
            return None
        return path if path.is_file() else None


def _shown(path) -> str:
    """``path`` relative to the working directory when it is below it."""
    import os

    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    except ValueError:
        return str(path)
