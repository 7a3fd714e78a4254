"""Log a report to MLflow: the parent run (tags, derived metrics, claims, report.json) and one child
run per variant carrying the same metric names, so the UI's Compare shows variants side by side."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _finite(d: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in d.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, int | float) and math.isfinite(v):
            out[k] = float(v)
    return out


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
    metrics.update(_finite({"claims_held": report.get("claims_held"), "wall_seconds": report.get("wall_seconds")}))
    mlflow.log_metrics(metrics)
    mlflow.log_dict(dict(report), "report.json")
    stds = report.get("variants_std", {})
    for variant, row in report["variants"].items():
        with mlflow.start_run(run_name=variant, nested=True,
                              experiment_id=parent.info.experiment_id,
                              tags={**{k: v for k, v in tags.items() if k != "role"}, "role": "variant",
                                    "variant": variant}):
            values = _finite(row)
            values.update({f"{k}_std": v for k, v in _finite(stds.get(variant, {})).items()})
            mlflow.log_metrics(values)
    return parent.info.run_id
