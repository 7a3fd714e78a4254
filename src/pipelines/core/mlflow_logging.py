"""Log a report to MLflow: the parent run (tags, derived metrics, claims, report.json) and one child
run per variant carrying the same metric names, so the UI's Compare shows variants side by side.
:func:`relog_report` logs a report saved earlier (a run whose tracking server was lost) the same way,
with its parameters and plots: ``kedro report log <report.json>``."""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _finite(d: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in d.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, int | float) and math.isfinite(v):
            out[k] = float(v)
    return out


def _log_histories(run_id: str, series: Mapping[str, Mapping[str, list]]) -> None:
    """Metric histories with their steps (non-finite points skipped: MLflow stores floats only)."""
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    batch = [Metric(f"history.{name}", float(v), now, int(s))
             for name, h in series.items() for s, v in zip(h["step"], h["value"])
             if v is not None and math.isfinite(v)]
    client = MlflowClient()
    for i in range(0, len(batch), 1000):  # MLflow's per-batch limit
        client.log_batch(run_id, metrics=batch[i:i + 1000])


def log_report(report: Mapping[str, Any]) -> str | None:
    """Log into the active run (the parent kedro-mlflow started); returns its id, or None if none."""
    import mlflow

    parent = mlflow.active_run()
    if parent is None:
        return None
    m = report["pipeline"]
    tags = {"pipeline": m, "role": "parent"}
    for key in ("env", "git_commit", "params_hash", "save_version", "threads", "threads_setting",
                "omp_wait_policy", "runner"):
        if report.get(key) is not None:
            tags[key] = str(report[key])
    mlflow.set_tags(tags)
    metrics = _finite(report.get("metrics", {}))
    metrics.update({f"claim.{c['id']}": float(c["holds"]) for c in report.get("claims", [])})
    metrics.update({f"gate.{g['id']}": float(g["passed"]) for g in report.get("gates", [])})
    from pipelines.core.claims import verdict_counts

    counts = report.get("verdicts") or verdict_counts(report.get("claims", []))
    metrics.update({f"claims_{k}": float(n) for k, n in counts.items()})
    tags["verdicts"] = " ".join(f"{k}={n}" for k, n in counts.items())
    mlflow.set_tags({"verdicts": tags["verdicts"]})
    metrics.update(_finite({"claims_held": report.get("claims_held"), "wall_seconds": report.get("wall_seconds")}))
    mlflow.log_metrics(metrics)
    mlflow.log_dict(dict(report), "report.json")
    histories = report.get("histories") or {}
    for key, series in histories.items():
        if key not in report["variants"]:
            _log_histories(parent.info.run_id, series)
    stds = report.get("variants_std", {})
    for variant, row in report["variants"].items():
        # no `with`: a failure must not be followed by end_run's own call to a lost server (the run's
        # clean-up forgets the child, core.tracking)
        child = mlflow.start_run(run_name=variant, nested=True, experiment_id=parent.info.experiment_id,
                                 tags={**{k: v for k, v in tags.items() if k != "role"}, "role": "variant",
                                       "variant": variant})
        values = _finite(row)
        values.update({f"{k}_std": v for k, v in _finite(stds.get(variant, {})).items()})
        mlflow.log_metrics(values)
        if variant in histories:
            _log_histories(child.info.run_id, histories[variant])
        mlflow.end_run()
    return parent.info.run_id


class RelogError(ValueError):
    """A file that cannot be logged as a report (one line, naming the file)."""


def _read_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise RelogError(f"{path}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise RelogError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(report, dict) or not isinstance(report.get("pipeline"), str) \
            or not isinstance(report.get("variants"), dict):
        raise RelogError(f"{path}: not a pipeline report (it needs 'pipeline' and 'variants')")
    return report


def _plots_dir(report: Path) -> Path | None:
    """The folder holding the PNGs saved with ``report`` (same save version): the versioned plots dataset
    writes ``data/08_reporting/<m>/plots/<version>/plots/*.png`` (Kedro's ``<filepath>/<version>/<name>``);
    a flat ``plots/<version>/*.png`` is read too."""
    if len(report.parents) <= 2:
        return None
    version_dir = report.parents[2] / "plots" / report.parent.name
    for d in (version_dir / "plots", version_dir):
        if d.is_dir() and any(d.glob("*.png")):
            return d
    return None


def relog_report(path: Path, tracking_uri: str, experiment: str | None = None) -> dict[str, Any]:
    """Log the report saved at ``path`` (``data/08_reporting/<m>/report.json/<version>/report.json``) as
    a new parent run with one child per variant, its parameters (``params.json`` beside it) and its plots
    (``data/08_reporting/<m>/plots/<version>/``). The run its own ``kedro run`` left RUNNING on that store
    (the server was lost) is ended FAILED and tagged ``relogged_as``. Returns what was logged."""
    import mlflow
    from mlflow.tracking import MlflowClient

    path = Path(path).resolve()
    report = _read_report(path)
    m = report["pipeline"]
    version = str(report.get("save_version") or path.parent.name)
    plots = _plots_dir(path)
    params_file = path.parent / "params.json"
    params = json.loads(params_file.read_text()) if params_file.is_file() else {}
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or m
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        location = None
        if tracking_uri.startswith("sqlite:///"):   # as the project's own runs: mlartifacts beside the db
            location = (Path(tracking_uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
        exp_id = client.create_experiment(name, artifact_location=location)
    else:
        exp_id = exp.experiment_id
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp_id)
    stale = [r for r in client.search_runs([exp_id], filter_string=f"tags.save_version = '{version}' and "
                                                                   f"attributes.status = 'RUNNING'")
             if "mlflow.parentRunId" not in r.data.tags]
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        with mlflow.start_run(experiment_id=exp_id, run_name=m,
                              tags={"relogged_from": str(path), "save_version": version}) as run:
            items = list(params.items())
            for i in range(0, len(items), 100):   # MLflow's batch limit
                mlflow.log_params(dict(items[i:i + 100]))
            log_report(report)
            pngs = sorted(plots.glob("*.png")) if plots is not None and plots.is_dir() else []
            if pngs:
                mlflow.log_artifacts(str(plots), artifact_path="plots")
            run_id = run.info.run_id
    finally:
        mlflow.set_tracking_uri(previous)
    for r in stale:
        client.set_tag(r.info.run_id, "relogged_as", run_id)
        client.set_terminated(r.info.run_id, "FAILED")
    return {"run_id": run_id, "experiment": name, "variants": len(report["variants"]), "plots": len(pngs),
            "params": len(params), "ended": [r.info.run_id for r in stale]}
