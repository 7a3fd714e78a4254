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
        with mlflow.start_run(run_name=variant, nested=True,
                              experiment_id=parent.info.experiment_id,
                              tags={**{k: v for k, v in tags.items() if k != "role"}, "role": "variant",
                                    "variant": variant}):
            values = _finite(row)
            values.update({f"{k}_std": v for k, v in _finite(stds.get(variant, {})).items()})
            mlflow.log_metrics(values)
            if variant in histories:
                _log_histories(mlflow.active_run().info.run_id, histories[variant])
    return parent.info.run_id
