"""A run's results never depend on the tracking store, and every run's end is recorded.

**Lost tracking.** Every MLflow call the platform makes during a ``kedro run`` (kedro-mlflow's hooks, the
typed parameters, the plots, the report and its variant runs, closing the run) goes through
:func:`guarded`. The first call that fails (a server stopped or unreachable, a store that errors) logs one
warning line and turns MLflow off for the rest of the run: the pipeline finishes and saves its report
locally, and the CLI ends with one line saying what was not logged and how to log it later
(``kedro report log <report.json>``, :func:`pipelines.core.mlflow_logging.relog_report`). MLflow's own
HTTP retries are bounded (:data:`HTTP_BOUNDS`, set only where the user has not set them), so a lost
server is noticed within a minute instead of after minutes of silent retries per call.

**Process ownership.** A run's parent MLflow run carries the process that owns it (``process.host``,
``process.pid``, ``process.started``). A process killed with SIGKILL (OOM killer, ``kill -9``, a lost
machine) cannot end its run; the next ``kedro run`` in the project ends such runs KILLED
(:func:`reap_dead_runs`): same host, and the pid is gone, a zombie, or now a different process (its start
time differs).

Imports nothing heavy at module level (``settings`` imports this for every ``kedro`` command).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kedro.framework.hooks import hook_impl

log = logging.getLogger(__name__)

# MLflow's defaults (7 retries, backoff factor 2, 120 s timeout) make each call to a lost server wait
# minutes; with these a refused connection fails in ~2 s and a server that does not answer in ~32 s.
HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}

PROCESS_TAGS = ("process.host", "process.pid", "process.started")
RELOG_HINT = "kedro report log"

_lock = threading.RLock()
_state: dict[str, Any] = {"lost": None, "unlogged": [], "reports": []}


def bound_http_requests(environ: dict | None = None) -> dict[str, str]:
    """Set :data:`HTTP_BOUNDS` in ``environ`` (default ``os.environ``) where the user has not; returns
    those set."""
    environ = os.environ if environ is None else environ
    out = {}
    for key, value in HTTP_BOUNDS.items():
        if key not in environ:
            environ[key] = out[key] = value
    return out


# ---------------------------------------------------------------------------------------- lost tracking
def reset() -> None:
    """A new run: tracking on again (called by the project's ``kedro run``)."""
    with _lock:
        _state.update(lost=None, unlogged=[], reports=[])


def lost() -> str | None:
    """Why tracking was turned off in this run (None while it works)."""
    return _state["lost"]


def unlogged() -> list[str]:
    return list(_state["unlogged"])


def saved_reports() -> list[str]:
    return list(_state["reports"])


def note_report(path: str) -> None:
    with _lock:
        if path not in _state["reports"]:
            _state["reports"].append(path)


def _note(what: str) -> None:
    with _lock:
        if what not in _state["unlogged"]:
            _state["unlogged"].append(what)


def _cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    low = text.lower()
    if "connection refused" in low or "failed to establish a new connection" in low:
        return "connection refused"
    if "timed out" in low or "timeout" in low:
        return f"no answer within {os.environ.get('MLFLOW_HTTP_REQUEST_TIMEOUT', '120')} s"
    if "max retries exceeded" in low or "remotedisconnected" in low or "connection aborted" in low:
        return "connection lost"
    return text if len(text) <= 160 else text[:157] + "..."


def _uri() -> str:
    try:
        import mlflow

        return mlflow.get_tracking_uri()
    except Exception:  # noqa: BLE001
        return os.environ.get("MLFLOW_TRACKING_URI", "the tracking store")


def guarded(what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, unless tracking was lost in this run (then ``what`` is noted as not
    logged). An exception from ``fn`` turns tracking off (one warning line, the first time) and returns
    None: nothing MLflow does decides the run's results. KeyboardInterrupt / SystemExit pass."""
    if _state["lost"] is not None:
        _note(what)
        return None
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any tracking failure: the run goes on without MLflow
        with _lock:
            first = _state["lost"] is None
            if first:
                _state["lost"] = f"{_uri()}: {_cause(exc)}"
            _note(what)
        if first:
            log.warning(
                "MLflow tracking failed while logging %s (%s); the run goes on without MLflow and "
                "saves its report locally",
                what,
                _state["lost"],
            )
        return None


def drop_active_runs() -> None:
    """Forget this thread's active MLflow runs without asking the store (it is gone)."""
    try:
        from mlflow.tracking import fluent

        fluent._active_run_stack.get().clear()
        os.environ.pop("MLFLOW_RUN_ID", None)
    except Exception:  # noqa: BLE001 - MLflow internals moved: end_run would only fail again
        pass


def summary_line() -> str | None:
    """The one line the CLI ends a run with when tracking was lost (None when it was not)."""
    if _state["lost"] is None:
        return None
    reports = saved_reports()
    where = (
        f"the report is saved at {', '.join(reports)}; log it later with `{RELOG_HINT} {' '.join(reports)}`"
        if reports
        else "no report was saved"
    )
    return f"MLflow tracking lost ({_state['lost']}): not logged: {', '.join(unlogged()) or 'nothing'}; {where}"


class GuardedMlflowHook:
    """kedro-mlflow's hook behind :func:`guarded` (registered in ``settings.HOOKS`` in place of its entry
    point; the hook itself, and so mlflow, is imported at the first session, not with every command)."""

    def __init__(self) -> None:
        self._inner = None

    def _hook(self):
        if self._inner is None:
            from kedro_mlflow.framework.hooks.mlflow_hook import MlflowHook

            self._inner = MlflowHook()
        return self._inner

    @hook_impl
    def after_context_created(self, context) -> None:
        guarded("the experiment", self._hook().after_context_created, context)

    @hook_impl
    def after_catalog_created(self, catalog, conf_catalog, conf_creds, parameters, save_version, load_versions) -> None:
        guarded(
            "metric datasets",
            self._hook().after_catalog_created,
            catalog,
            conf_catalog,
            conf_creds,
            parameters,
            save_version,
            load_versions,
        )

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        guarded("the run", self._hook().before_pipeline_run, run_params, pipeline, catalog)

    @hook_impl
    def before_node_run(self, node, catalog, inputs, is_async) -> None:
        guarded("parameters", self._hook().before_node_run, node, catalog, inputs, is_async)

    @hook_impl
    def after_pipeline_run(self, run_params, pipeline, catalog) -> None:
        guarded("the run's end", self._hook().after_pipeline_run, run_params, pipeline, catalog)

    @hook_impl
    def on_pipeline_error(self, error, run_params, pipeline, catalog) -> None:
        guarded("the run's end", self._hook().on_pipeline_error, error, run_params, pipeline, catalog)


# ------------------------------------------------------------------------------------ process ownership
def process_started(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, 0.01 s), from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 (starttime), counted after the ")" of the name
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return round(btime + ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def process_tags() -> dict[str, str]:
    """This process as run tags: host, pid, start time."""
    pid = os.getpid()
    started = process_started(pid)
    return {
        "process.host": socket.gethostname(),
        "process.pid": str(pid),
        "process.started": "" if started is None else f"{started:.2f}",
    }


def process_gone(tags: Mapping[str, str], host: str | None = None) -> bool:
    """Whether the process a run's tags name is certainly gone: same host, and its pid does not exist,
    is a zombie, or belongs to a process that started at another time. Another host: never (unknown)."""
    if tags.get("process.host") != (host or socket.gethostname()):
        return False
    try:
        pid = int(tags.get("process.pid", ""))
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, owned by someone else
    if _zombie(pid):
        return True
    recorded, now = tags.get("process.started"), process_started(pid)
    if recorded and now is not None:
        try:
            return abs(float(recorded) - now) > 1.0
        except ValueError:
            return False
    return False


def _experiment_ids(client) -> list[str]:
    from mlflow.entities import ViewType

    ids, token = [], None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        ids += [e.experiment_id for e in page]
        token = getattr(page, "token", None)
        if not token:
            return ids


def reap_dead_runs(tracking_uri: str) -> list[str]:
    """End KILLED every RUNNING run of this host whose owning process is gone (and its RUNNING child
    runs); returns their ids. A sqlite store that does not exist yet has no runs (nothing is created)."""
    if tracking_uri.startswith("sqlite:///") and not os.path.exists(tracking_uri[len("sqlite:///") :]):
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    host = socket.gethostname()
    ids = _experiment_ids(client)
    killed: list[str] = []
    for i in range(0, len(ids), 100):
        chunk = ids[i : i + 100]
        runs = client.search_runs(
            chunk, filter_string=f"attributes.status = 'RUNNING' and tags.`process.host` = '{host}'", max_results=1000
        )
        for run in runs:
            tags = run.data.tags
            if not process_gone(tags, host):
                continue
            run_id = run.info.run_id
            children = client.search_runs(
                [run.info.experiment_id],
                filter_string=f"attributes.status = 'RUNNING' and tags.`mlflow.parentRunId` = '{run_id}'",
            )
            for child in children:
                client.set_terminated(child.info.run_id, "KILLED")
            client.set_tag(run_id, "ended_by", f"a later kedro run: process {tags['process.pid']} on {host} was gone")
            client.set_terminated(run_id, "KILLED")
            killed.append(run_id)
            log.info(
                "MLflow run %s (%s) marked KILLED: its process %s on %s is gone",
                run_id,
                run.info.run_name,
                tags["process.pid"],
                host,
            )
    return killed


def find_parent_run(tracking_uri: str, experiment: str, save_version: str) -> str | None:
    """The id of the newest parent run of ``experiment`` that saved under ``save_version``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.save_version = '{save_version}'",
        order_by=["attributes.start_time DESC"],
        max_results=50,
    )
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents[0].info.run_id if parents else None
