"""The sweep's MLflow store: its own run ``sweep-<id>`` and the points' tags."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipelines.core.sweep.base import FAILED, OK
from pipelines.core.sweep.results import hold_rates


def _absolute_uri(uri: str) -> str:
    """A relative ``sqlite:///x.db`` made absolute (points run from the project root, not this cwd)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path, _, query = uri[len("sqlite:///") :].partition("?")
        if path and path != ":memory:":
            return f"sqlite:///{Path(path).resolve()}" + (f"?{query}" if query else "")
    return uri


def _retry(fn, tries: int = 6):
    """Call ``fn``, again on a transient store error (sqlite busy while points write)."""
    delay = 0.5
    for attempt in range(tries):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - MLflow wraps sqlite errors in MlflowException
            if attempt == tries - 1 or not re.search(r"locked|busy|temporarily|UNIQUE constraint", str(exc), re.I):
                raise
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
    return None


class Store:
    """The MLflow store the points log to, prepared before any point starts: a fresh sqlite database
    gets its tables and the experiment exists, so concurrent points neither race on the schema
    migration nor both create the experiment (both lose runs otherwise)."""

    def __init__(self, uri: str, experiment: str, root: Path) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        artifacts = (root / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
        self.experiment_id = _retry(lambda: self._ensure_experiment(experiment, artifacts))

    def _ensure_experiment(self, name: str, artifact_location: str | None) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                from pipelines.core.mlflow_logging import CLASSIC_ML_KIND, EXPERIMENT_KIND_TAG

                return self.client.create_experiment(
                    name, artifact_location=artifact_location, tags={EXPERIMENT_KIND_TAG: CLASSIC_ML_KIND}
                )
            except Exception:  # noqa: BLE001 - created meanwhile by someone else: use theirs
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":  # kedro-mlflow restores it too (restore_if_deleted)
            self.client.restore_experiment(exp.experiment_id)
        from pipelines.core.mlflow_logging import mark_experiment_kind

        mark_experiment_kind(exp.experiment_id, self.client)  # here, not by the concurrent points
        return exp.experiment_id

    def point_run(self, sweep_id: str, index: int, attempt: int, stdout: str):
        """The point's top-level MLflow run (the kedro run's parent run), found by its sweep tags; if
        MLflow did not apply them, found from the run id the point logged, then tagged here."""
        filt = f"tags.sweep_id = '{sweep_id}' and tags.sweep_point = '{index}' and tags.sweep_attempt = '{attempt}'"
        runs = _retry(
            lambda: self.client.search_runs(
                [self.experiment_id], filt, max_results=500, order_by=["attributes.start_time DESC"]
            )
        )
        top = [r for r in runs or [] if "mlflow.parentRunId" not in r.data.tags]
        if top:
            return top[0]
        flat = " ".join(ln.strip() for ln in stdout.splitlines())
        found = re.findall(r"Mlflow run '[^']*' - '([0-9a-f]{32})' has started", flat)
        if not found:
            return None
        try:
            return _retry(lambda: self.client.get_run(found[-1]))
        except Exception:  # noqa: BLE001 - the run is in a store this driver cannot read
            return None

    def ensure_tags(self, run, tags: Mapping[str, str]) -> None:
        for k, v in tags.items():
            if run.data.tags.get(k) != v:
                _retry(lambda k=k, v=v: self.client.set_tag(run.info.run_id, k, v))

    def report(self, run) -> dict[str, Any] | None:
        import tempfile

        try:
            with tempfile.TemporaryDirectory(prefix="sweep_") as tmp:
                path = _retry(lambda: self.client.download_artifacts(run.info.run_id, "report.json", tmp))
                return json.loads(Path(path).read_text())
        except Exception:  # noqa: BLE001 - a run without the artifact (it failed before the report)
            return None

    def log_sweep(self, doc: Mapping[str, Any], files: Iterable[Path]) -> str:
        """The sweep's own run (``sweep-<id>``, role=sweep), reused by ``--resume``."""
        from mlflow.entities import Metric, Param

        sid = doc["sweep_id"]
        found = _retry(
            lambda: self.client.search_runs(
                [self.experiment_id], f"tags.sweep_id = '{sid}' and tags.role = 'sweep'", max_results=1
            )
        )
        if found:
            run_id = found[0].info.run_id
            params: list = []
        else:
            tags = {
                "sweep_id": sid,
                "role": "sweep",
                "pipeline": doc["pipeline"],
                "env": doc.get("env") or "",
                "mlflow.runName": f"sweep-{sid}",
            }
            run_id = _retry(
                lambda: self.client.create_run(self.experiment_id, run_name=f"sweep-{sid}", tags=tags)
            ).info.run_id
            params = [
                Param("grid", json.dumps({g["key"]: g["values"] for g in doc["grid"]})[:6000]),
                Param("points", str(len(doc["points"]))),
                Param("fixed_params", json.dumps(doc.get("params") or {})[:6000]),
                Param("sample", str(doc.get("sample"))),
                Param("seed", str(doc.get("seed"))),
            ]
        step = int(doc.get("launches", 1))
        ts = int(time.time() * 1000)
        counts = {s: sum(p["status"] == s for p in doc["points"]) for s in (OK, FAILED)}
        metrics = [
            Metric(f"hold_rate.{c}", r["rate"], ts, step) for c, r in hold_rates(doc).items() if r["rate"] is not None
        ]
        metrics += [
            Metric("points_ok", counts[OK], ts, step),
            Metric("points_failed", counts[FAILED], ts, step),
            Metric("points", len(doc["points"]), ts, step),
        ]
        for i in range(0, max(len(metrics), 1), 500):
            _retry(
                lambda i=i: self.client.log_batch(run_id, metrics=metrics[i : i + 500], params=params if i == 0 else [])
            )
        for f in files:
            if f.is_file():
                _retry(lambda f=f: self.client.log_artifact(run_id, str(f)))
        status = "FINISHED" if all(p["status"] == OK for p in doc["points"]) else "FAILED"
        _retry(lambda: self.client.set_terminated(run_id, status))
        return run_id
