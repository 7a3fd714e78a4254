"""``kedro sweep``: one pipeline over a grid of parameter overrides, and how robust its claims are.

    kedro sweep --pipeline=rankcal --env=test --grid "rankcal.ece.n_bins=10,15" \\
                --grid "rankcal.models.neural.steps=30,40"           # 2 x 2 = 4 points
    kedro sweep --resume rankcal-20261201T102135-a3f0                   # rerun what did not finish ok

Each point is a full ``kedro run --pipeline=<m> --env=<env> --params=<fixed>,<point>`` in its own
process (``python -m pipelines.core.sweep run ...``: the project CLI plus two guards for runs sharing one
data folder, see "the point process" below): locally up to ``--max-parallel`` at once, or, with
``--runner-params address=local|auto|ray://...``, one Ray task per point. Each point's MLflow
runs carry the tags ``sweep_id``, ``sweep_point``, ``sweep_attempt`` and ``sweep.<key>`` (the value as
written); MLflow applies them when the run is created, from ``MLFLOW_RUN_CONTEXT``. Everything the sweep
writes is under ``data/08_reporting/<m>/sweeps/<sweep_id>/``: ``sweep.json`` (the grid and every point's
status, rewritten after each point), ``summary.parquet`` / ``summary.md`` (one row per point: swept values,
status, error, run id, wall time, headline, every claim's value and holds), ``heatmap.png`` (claims x
points) and ``logs/``; the same files go to the sweep's own MLflow run ``sweep-<sweep_id>``
(``role=sweep``, metrics ``hold_rate.<claim>``). See docs/sweeps.md.

Imports only click at module level (``kedro`` loads this with every command); mlflow, pandas,
matplotlib and ray are imported where used.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.core.cpus import usable_cpus
from pipelines.core.versions import (SESSION_LOCK_ENV, _session_lock_path, pin_own_version,  # noqa: F401
                                     unique_session_class)

import click

SCHEMA = 1
SWEEP_ID_ENV = "PIPELINES_SWEEP_ID"
SWEEP_POINT_ENV = "PIPELINES_SWEEP_POINT"
CONCURRENCY_ENV = "PIPELINES_CONCURRENCY"   # read by pipelines.core.runtime (threads = CPUs // this)
THREADS_ENV = "PIPELINES_THREADS"           # a Ray point: the CPUs Ray reserved for it
OK, FAILED, PENDING, RUNNING, INTERRUPTED = "ok", "failed", "pending", "running", "interrupted"
TRANSIENT_RETRIES = 2        # extra attempts for a point that failed on a busy / racing tracking store
LOG_CAP = 2_000_000          # characters of a point's stdout / stderr kept
_SWEEP_ID = re.compile(r"^(?P<m>[A-Za-z0-9_][\w-]*)-(?P<ts>\d{8}T\d{6})-(?P<hex>[0-9a-f]{4})$")
_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
_OPEN, _CLOSE = "[{(", "]})"
# store errors worth another attempt: sqlite busy beyond MLflow's timeout, a create-experiment race,
# a schema-migration race on a fresh database (the driver prepares the store, so these are rare)
_TRANSIENT = re.compile(r"database is locked|database table is locked|UNIQUE constraint failed: experiments"
                        r"|_alembic_tmp_|Online migration expected|TEMPORARILY_UNAVAILABLE"
                        r"|must not exist if versioning is enabled", re.I)
# Kedro's warning that a run read back a newer version of a dataset than the one it saved: another run
# (a concurrent point, or anyone's kedro run) wrote it. The point's results cannot be trusted.
_RACE = re.compile(r"Save version '[^']+' did not match load version '[^']+' for (.{0,300})")


class GridError(ValueError):
    """A --grid / --params / --runner-params value that cannot be parsed (one line)."""


class SweepInterrupted(KeyboardInterrupt):
    """SIGTERM stopped the sweep (Ctrl-C raises KeyboardInterrupt itself)."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise SweepInterrupted("terminated (SIGTERM)")


# ============================================================================================ parsing
def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets (``[] {} ()``) and quotes: ``[0,1],[2]`` -> ``['[0,1]', '[2]']``."""
    parts: list[str] = []
    cur: list[str] = []
    stack: list[str] = []
    quote: str | None = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            stack.append(_CLOSE[_OPEN.index(ch)])
        elif ch in _CLOSE:
            if not stack or stack.pop() != ch:
                raise GridError(f"unbalanced {ch!r} in {text!r}")
        elif ch == sep and not stack:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if quote:
        raise GridError(f"unclosed quote {quote} in {text!r}")
    if stack:
        raise GridError(f"unclosed bracket (expected {stack[-1]!r}) in {text!r}")
    parts.append("".join(cur).strip())
    return parts


def parse_value(text: str) -> Any:
    """A value as YAML: ``[0]`` a list, ``0.6`` a float, ``true`` a bool, ``abc`` a string."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GridError(f"value {text!r} is not valid YAML ({first})") from None


def _check_key(key: str, where: str) -> str:
    if not _KEY.match(key):
        raise GridError(f"{where}: {key!r} is not a parameter key (dotted, e.g. rankcal.ece.n_bins)")
    return key


def parse_grid(spec: str) -> tuple[str, list[str]]:
    """``"rankcal.seeds=[0],[1]"`` -> ``("rankcal.seeds", ["[0]", "[1]"])`` (values as written)."""
    key, eq, rest = spec.partition("=")
    key = key.strip()
    if not eq or not key:
        raise GridError(f"--grid {spec!r}: expected key=value1,value2,...")
    _check_key(key, "--grid")
    try:
        values = split_top_level(rest)
    except GridError as exc:
        raise GridError(f"--grid {key}: {exc}") from None
    if any(v == "" for v in values):
        raise GridError(f"--grid {key}: empty value in {rest!r}")
    seen = set()
    for v in values:
        if v in seen:
            raise GridError(f"--grid {key}: value {v!r} is given twice")
        seen.add(v)
        try:
            parse_value(v)
        except GridError as exc:
            raise GridError(f"--grid {key}: {exc}") from None
    return key, values


def parse_assignments(text: str | None, option: str) -> dict[str, str]:
    """``"a.b=1,c=[1,2]"`` -> ``{"a.b": "1", "c": "[1,2]"}`` (values as written, checked as YAML)."""
    out: dict[str, str] = {}
    if not text:
        return out
    try:
        items = split_top_level(text)
    except GridError as exc:
        raise GridError(f"{option}: {exc}") from None
    for item in items:
        if not item:
            continue
        key, eq, val = item.partition("=")
        key, val = key.strip(), val.strip()
        if not eq or not key:
            raise GridError(f"{option}: {item!r} must be key=value")
        _check_key(key, option)
        try:
            parse_value(val)
        except GridError as exc:
            raise GridError(f"{option} {key}: {exc}") from None
        out[key] = val
    return out


def expand_grid(grids: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
    """The Cartesian product of the grids, first grid slowest: a list of ``{key: value as written}``."""
    keys = [k for k, _ in grids]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise GridError(f"--grid {dup[0]} is given more than once; list all its values in one --grid")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(vals for _, vals in grids))]


def sample_points(n_points: int, n: int | None, seed: int) -> list[int]:
    """Indices of a reproducible random subset of ``n`` points (all of them if ``n`` is None or >= n_points),
    in grid order."""
    if n is None or n >= n_points:
        return list(range(n_points))
    return sorted(random.Random(seed).sample(range(n_points), n))


def new_sweep_id(pipeline: str, now: datetime | None = None) -> str:
    """``<m>-<UTC yyyymmddThhmmss>-<4 hex>``."""
    now = now or datetime.now(UTC)
    return f"{pipeline}-{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"


def pipeline_of(sweep_id: str) -> str:
    m = _SWEEP_ID.match(sweep_id)
    if not m:
        raise GridError(f"{sweep_id!r} is not a sweep id (<pipeline>-<yyyymmddThhmmss>-<4 hex>)")
    return m.group("m")


def error_line(stderr: str, returncode: int) -> str:
    """The one line that says why a point failed: the last ``Error: ...`` line of its stderr, else the
    last ``SomethingError: ...`` line (a traceback's end), else the last non-empty line."""
    lines = [ln.strip() for ln in (stderr or "").splitlines()]
    lines = [ln for ln in lines if ln and not re.match(r"^[\u2500-\u257f\s]+$", ln)]  # no box rules
    pick = next((ln for ln in reversed(lines) if ln.startswith("Error:")), None)
    if pick is None:
        pick = next((ln for ln in reversed(lines)
                     if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", ln)), None)
    if pick is None:
        pick = next((ln for ln in reversed(lines) if not ln[0] in "\u2502\u2570\u256d"), None)
    pick = pick or f"exit code {returncode}"
    return pick if len(pick) <= 400 else pick[:397] + "..."


# ============================================================================================ a point
def point_args(pipeline: str, env: str | None, params: Mapping[str, str]) -> list[str]:
    """The point's ``kedro run`` arguments. Values are passed as written; the project's ``--params``
    splits on commas outside brackets, so list values such as ``[0,1]`` survive."""
    args = ["run", f"--pipeline={pipeline}"]
    if env:
        args.append(f"--env={env}")
    if params:
        args.append("--params=" + ",".join(f"{k}={v}" for k, v in params.items()))
    return args


def _ray_node_concurrency(cpus_per_point: float, n_points: int) -> int:
    """How many points this Ray node runs at once: its CPUs // CPUs per point (capped by the points)."""
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        cpus = next((n.get("Resources", {}).get("CPU", 1.0) for n in ray.nodes()
                     if n.get("NodeID") == node_id), 1.0)
    except Exception:  # noqa: BLE001 - outside Ray or an old API: one point at a time
        return 1
    per_node = int(cpus // cpus_per_point) if cpus_per_point > 0 else n_points
    return max(1, min(n_points, per_node))


def stop_process(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (the point's `kedro run` marks its MLflow run KILLED), then SIGKILL after ``grace`` s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_point(job: Mapping[str, Any], on_start=None) -> dict[str, Any]:
    """Run one point's ``kedro run`` (``python -m pipelines.core.sweep run ...``, see above) in a subprocess,
    here or in a Ray task.

    ``job``: ``args`` (the ``kedro`` arguments: ``run --pipeline=...``), ``cwd`` (the project root; a Ray worker that
    lacks it uses its own working directory), ``env`` (added to this process' environment) and, in a
    Ray task, ``ray_cpus`` and ``n_points`` to size ``PIPELINES_CONCURRENCY`` for this node.
    ``on_start(proc)`` is called with the started process. Interrupted (a cancelled Ray task), it stops
    the subprocess before re-raising."""
    env = dict(os.environ)
    env.update(job["env"])
    if job.get("ray_cpus") is not None:
        env[CONCURRENCY_ENV] = str(_ray_node_concurrency(float(job["ray_cpus"]), int(job["n_points"])))
        env[THREADS_ENV] = str(max(1, math.floor(float(job["ray_cpus"]))))
    cwd = job["cwd"] if Path(job["cwd"]).is_dir() else os.getcwd()
    cmd = [sys.executable, "-m", "pipelines.core.sweep", *job["args"]]
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        proc = None
        rc, out, err = 127, "", f"Error: cannot start {cmd[0]}: {exc}"
    if proc is not None:
        if on_start is not None:
            on_start(proc)
        try:
            out, err = proc.communicate()
        except BaseException:
            stop_process(proc)
            raise
        rc = proc.returncode
    return {"returncode": rc, "stdout": out[-LOG_CAP:], "stderr": err[-LOG_CAP:],
            "wall_seconds": round(time.perf_counter() - t0, 3), "host": socket.gethostname(), "cwd": cwd}


# ============================================================================================ the point process
# Every point runs `python -m pipelines.core.sweep run ...`: exactly `python -m pipelines run ...` (the same
# CLI, settings and hooks). Two guards that concurrent `kedro run`s sharing one data/ folder need were found
# by running 4 points at once on this project, and now hold for every `kedro run` (core.versions):
#   1. Kedro loads an unpinned versioned dataset at the *latest* version on disk, also right after this run
#      saved it; a concurrent run's newer save was read back instead ("Save version A did not match load
#      version B"). PlatformHooks pins each dataset a run saves to that run's own save version.
#   2. The save version is the session's start time in milliseconds: two runs that start in the same
#      millisecond share it. settings.SESSION_CLASS creates sessions under a per-project file lock.
# point_main re-applies guard 2 in case a project's settings replaced the session class.
def point_main() -> int:
    """``python -m pipelines.core.sweep run ...``: the project's CLI, its session class guarded."""
    from kedro.framework.session import KedroSession

    import pipelines.settings as project_settings

    base = getattr(project_settings, "SESSION_CLASS", None) or KedroSession
    project_settings.SESSION_CLASS = unique_session_class(base)
    from pipelines.__main__ import main

    return main()


# ============================================================================================ backends
class _LocalBackend:
    """Points as subprocesses of this process, at most ``parallel`` at once."""

    def __init__(self, parallel: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.limit = parallel
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="sweep-point")
        self._futures: dict[Any, int] = {}
        self._procs: set[subprocess.Popen] = set()

    def describe(self) -> str:
        return f"local, {self.limit} at once"

    def _run(self, job: dict[str, Any]) -> dict[str, Any]:
        holder: list[subprocess.Popen] = []

        def started(proc: subprocess.Popen) -> None:
            holder.append(proc)
            self._procs.add(proc)

        try:
            return run_point(job, on_start=started)
        finally:
            for proc in holder:
                self._procs.discard(proc)

    def inflight(self) -> int:
        return len(self._futures)

    def submit(self, index: int, job: dict[str, Any]) -> None:
        self._futures[self._pool.submit(self._run, job)] = index

    def wait_one(self) -> list[tuple[int, dict[str, Any]]]:
        from concurrent.futures import FIRST_COMPLETED, wait

        done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
        return [(self._futures.pop(f), f.result()) for f in done]

    def close(self, cancel: bool = False) -> None:
        self._pool.shutdown(wait=False, cancel_futures=cancel)
        if cancel:  # points still running: SIGTERM them all, then wait (their runs end KILLED)
            procs = list(self._procs)
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                stop_process(proc)
        self._pool.shutdown(wait=True)


class _RayBackend:
    """Points as Ray tasks (``num_cpus`` each); starts a local instance for ``address=local``."""

    def __init__(self, address: str, cpus_per_point: float, max_inflight: int | None,
                 env_vars: dict[str, str]) -> None:
        import logging

        import ray

        self.address = address
        self.cpus = cpus_per_point
        self.limit = max_inflight or 1_000_000
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
            if address.strip().lower() == "local":
                kwargs.update(address="local", num_cpus=usable_cpus(), include_dashboard=False)
            else:
                kwargs["address"] = address
            ray.init(**kwargs)
            self._started = True
        self._fn = ray.remote(run_point)
        self._runtime_env = {"env_vars": env_vars}
        self._refs: dict[Any, tuple[int, float]] = {}

    def describe(self) -> str:
        import ray

        total = ray.cluster_resources().get("CPU", 0)
        return f"Ray at {self.address} ({total:g} CPUs, {self.cpus:g} per point)"

    def inflight(self) -> int:
        return len(self._refs)

    def submit(self, index: int, job: dict[str, Any]) -> None:
        ref = self._fn.options(num_cpus=self.cpus, max_retries=0, retry_exceptions=False,
                               runtime_env=self._runtime_env, name=f"sweep-point-{index}").remote(job)
        self._refs[ref] = (index, time.perf_counter())

    def wait_one(self) -> list[tuple[int, dict[str, Any]]]:
        import ray

        done, _ = ray.wait(list(self._refs), num_returns=1)
        out = []
        for ref in done:
            index, t0 = self._refs.pop(ref)
            try:
                out.append((index, ray.get(ref)))
            except Exception as exc:  # noqa: BLE001 - a lost worker / node: the point failed, not the sweep
                first = (str(exc).strip().splitlines() or [""])[0]
                out.append((index, {"returncode": -1, "stdout": "", "wall_seconds": round(time.perf_counter() - t0, 3),
                                    "stderr": f"Error: the point's Ray task failed: {type(exc).__name__}: {first}"}))
        return out

    def close(self, cancel: bool = False) -> None:
        import ray

        if cancel and self._refs:  # not force: the task's run_point stops its subprocess before it ends
            for ref in self._refs:
                ray.cancel(ref)
            ray.wait(list(self._refs), num_returns=len(self._refs), timeout=45)
        if self._started:
            ray.shutdown()


# ============================================================================================ the store
def _absolute_uri(uri: str) -> str:
    """A relative ``sqlite:///x.db`` made absolute (points run from the project root, not this cwd)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path, _, query = uri[len("sqlite:///"):].partition("?")
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
                return self.client.create_experiment(name, artifact_location=artifact_location)
            except Exception:  # noqa: BLE001 - created meanwhile by someone else: use theirs
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":  # kedro-mlflow restores it too (restore_if_deleted)
            self.client.restore_experiment(exp.experiment_id)
        return exp.experiment_id

    def point_run(self, sweep_id: str, index: int, attempt: int, stdout: str):
        """The point's top-level MLflow run (the kedro run's parent run), found by its sweep tags; if
        MLflow did not apply them, found from the run id the point logged, then tagged here."""
        filt = (f"tags.sweep_id = '{sweep_id}' and tags.sweep_point = '{index}' "
                f"and tags.sweep_attempt = '{attempt}'")
        runs = _retry(lambda: self.client.search_runs([self.experiment_id], filt, max_results=500,
                                                      order_by=["attributes.start_time DESC"]))
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
        found = _retry(lambda: self.client.search_runs(
            [self.experiment_id], f"tags.sweep_id = '{sid}' and tags.role = 'sweep'", max_results=1))
        if found:
            run_id = found[0].info.run_id
            params: list = []
        else:
            tags = {"sweep_id": sid, "role": "sweep", "pipeline": doc["pipeline"], "env": doc.get("env") or "",
                    "mlflow.runName": f"sweep-{sid}"}
            run_id = _retry(lambda: self.client.create_run(self.experiment_id, run_name=f"sweep-{sid}",
                                                           tags=tags)).info.run_id
            params = [Param("grid", json.dumps({g["key"]: g["values"] for g in doc["grid"]})[:6000]),
                      Param("points", str(len(doc["points"]))),
                      Param("fixed_params", json.dumps(doc.get("params") or {})[:6000]),
                      Param("sample", str(doc.get("sample"))), Param("seed", str(doc.get("seed")))]
        step = int(doc.get("launches", 1))
        ts = int(time.time() * 1000)
        counts = {s: sum(p["status"] == s for p in doc["points"]) for s in (OK, FAILED)}
        metrics = [Metric(f"hold_rate.{c}", r["rate"], ts, step)
                   for c, r in hold_rates(doc).items() if r["rate"] is not None]
        metrics += [Metric("points_ok", counts[OK], ts, step), Metric("points_failed", counts[FAILED], ts, step),
                    Metric("points", len(doc["points"]), ts, step)]
        for i in range(0, max(len(metrics), 1), 500):
            _retry(lambda i=i: self.client.log_batch(run_id, metrics=metrics[i:i + 500],
                                                     params=params if i == 0 else []))
        for f in files:
            if f.is_file():
                _retry(lambda f=f: self.client.log_artifact(run_id, str(f)))
        status = "FINISHED" if all(p["status"] == OK for p in doc["points"]) else "FAILED"
        _retry(lambda: self.client.set_terminated(run_id, status))
        return run_id


# ============================================================================================ results
def _num(x: Any) -> float | None:
    from pipelines.core.scoreboard import _num as num   # one finite-float reader

    return num(x)


def point_results(report: Mapping[str, Any], root: Path | None) -> dict[str, Any]:
    """What the summary keeps of a point's report: claims (value, holds) and the headline value."""
    from pipelines.core.scoreboard import headline_of

    claims = [{"id": c.get("id"), "value": _num(c.get("value")), "holds": bool(c.get("holds"))}
              for c in report.get("claims") or [] if c.get("id")]
    out: dict[str, Any] = {"claims": claims, "claims_held": sum(c["holds"] for c in claims),
                           "claims_declared": len(claims), "headline": None,
                           "save_version": report.get("save_version")}
    try:
        head, _ = headline_of(report, root)
    except Exception:  # noqa: BLE001 - a malformed headline block only loses the column
        head = None
    if head and head.get("metric"):
        metric, method = head["metric"], head.get("method")
        value = (report.get("variants") or {}).get(method, {}).get(metric)
        if value is None:
            metrics = report.get("metrics") or {}
            value = metrics.get(metric, metrics.get(f"{method}.{metric}"))
        out["headline"] = {"metric": metric, "method": method, "value": _num(value),
                           "lower_is_better": bool(head.get("lower_is_better", True))}
    return out


def claim_ids(doc: Mapping[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for p in doc["points"]:
        for c in p.get("claims") or []:
            seen.setdefault(c["id"], None)
    return list(seen)


def hold_rates(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per claim: ``held`` of ``n`` ok points that report it, and the ``rate`` (None if n = 0)."""
    out = {}
    for cid in claim_ids(doc):
        vals = [c["holds"] for p in doc["points"] if p["status"] == OK
                for c in p.get("claims") or [] if c["id"] == cid]
        out[cid] = {"held": sum(vals), "n": len(vals), "rate": (sum(vals) / len(vals)) if vals else None}
    return out


def summary_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per point: index, swept values (as written), status, error, run id, wall seconds,
    headline, claims held, then ``claim.<id>.value`` / ``claim.<id>.holds`` for every claim."""
    keys = [g["key"] for g in doc["grid"]]
    cids = claim_ids(doc)
    rows = []
    for p in doc["points"]:
        head = p.get("headline") or {}
        row: dict[str, Any] = {"point": p["index"]}
        row.update({k: p["overrides"].get(k) for k in keys})
        row.update({"status": p["status"], "error": p.get("error"), "run_id": p.get("run_id"),
                    "save_version": p.get("save_version"), "attempts": p.get("attempts", 0),
                    "wall_seconds": p.get("wall_seconds"),
                    "headline_metric": (f"{head['method']}.{head['metric']}" if head.get("metric") else None),
                    "headline": head.get("value"),
                    "claims_held": p.get("claims_held"), "claims_declared": p.get("claims_declared")})
        by_id = {c["id"]: c for c in p.get("claims") or []}
        for cid in cids:
            c = by_id.get(cid)
            row[f"claim.{cid}.value"] = c["value"] if c else None
            row[f"claim.{cid}.holds"] = c["holds"] if c else None
        rows.append(row)
    return rows


def _short(key: str, pipeline: str) -> str:
    return key[len(pipeline) + 1:] if key.startswith(pipeline + ".") else key


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _fmt(x: Any) -> str:
    v = _num(x)
    return "" if v is None else f"{v:.4g}"


def points_table(doc: Mapping[str, Any]) -> str:
    """The markdown table of points printed at the end of a sweep."""
    m = doc["pipeline"]
    keys = [g["key"] for g in doc["grid"]]
    heads = [p.get("headline") for p in doc["points"] if p.get("headline")]
    head_cols = [f"{heads[0]['method']} {heads[0]['metric']}"] if heads else []   # the headline, if declared
    cols = ["point", *(_short(k, m) for k in keys), "status", *head_cols, "claims held", "wall s", "run", "error"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for p in doc["points"]:
        held = "" if p.get("claims_declared") is None else f"{p.get('claims_held')}/{p.get('claims_declared')}"
        wall = "" if p.get("wall_seconds") is None else f"{p['wall_seconds']:.1f}"
        head = [_fmt((p.get("headline") or {}).get("value"))] if head_cols else []
        cells = [p["index"], *(p["overrides"].get(k, "") for k in keys), p["status"], *head, held, wall,
                 p.get("run_id") or "", p.get("error") or ""]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def hold_rate_table(doc: Mapping[str, Any], per_point: bool = True) -> str:
    """Claims x (hold rate, then one column per point: ✓ held, ✗ not held, – failed / no value)."""
    rates = hold_rates(doc)
    if not rates:
        return "No claim values (no point finished ok).\n"
    pts = doc["points"] if per_point else []
    cols = ["claim", "held", "hold rate", *(f"#{p['index']}" for p in pts)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for cid, r in rates.items():
        marks = []
        for p in pts:
            c = next((c for c in p.get("claims") or [] if c["id"] == cid), None)
            marks.append("–" if p["status"] != OK or c is None else ("✓" if c["holds"] else "✗"))
        rate = "n/a" if r["rate"] is None else f"{r['rate']:.0%}"
        lines.append("| " + " | ".join(_cell(x) for x in [cid, f"{r['held']}/{r['n']}", rate, *marks]) + " |")
    return "\n".join(lines) + "\n"


def summary_markdown(doc: Mapping[str, Any]) -> str:
    counts = {s: sum(p["status"] == s for p in doc["points"]) for s in (OK, FAILED, INTERRUPTED, PENDING)}
    grid = "; ".join(f"`{g['key']}` = {', '.join(g['values'])}" for g in doc["grid"])
    fixed = ", ".join(f"`{k}={v}`" for k, v in (doc.get("params") or {}).items()) or "none"
    sampled = f" (a sample of {doc['sample']} with seed {doc['seed']})" if doc.get("sample") else ""
    lines = [f"# Sweep {doc['sweep_id']}", "",
             f"Pipeline `{doc['pipeline']}`, env `{doc.get('env') or 'default'}`, {len(doc['points'])} points"
             f"{sampled}: {counts[OK]} ok, {counts[FAILED]} failed"
             + (f", {counts[INTERRUPTED] + counts[PENDING]} not run" if counts[INTERRUPTED] + counts[PENDING] else "")
             + ".", "", f"Grid: {grid}. Fixed overrides: {fixed}.", "",
             f"Runs in MLflow experiment `{doc.get('experiment')}` with tag `sweep_id = '{doc['sweep_id']}'`.", "",
             "## Points", "", points_table(doc),
             "## Claim robustness", "", "✓ held, ✗ not held, – point failed or no value. "
             "Hold rate: points where the claim holds / points that finished ok.", "",
             hold_rate_table(doc)]
    return "\n".join(lines)


def write_heatmap(doc: Mapping[str, Any], path: Path) -> None:
    """Claims x points: held (green), not held (red), point failed (grey), no value (white)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    cids = claim_ids(doc)
    pts = doc["points"]
    rates = hold_rates(doc)
    m = doc["pipeline"]
    colors = ["#9e9e9e", "#ffffff", "#d73027", "#1a9850"]  # failed, no value, not held, held
    grid = np.zeros((max(len(cids), 1), max(len(pts), 1)))
    for j, p in enumerate(pts):
        by_id = {c["id"]: c for c in p.get("claims") or []}
        for i, cid in enumerate(cids):
            if p["status"] != OK:
                grid[i, j] = 0
            elif cid not in by_id:
                grid[i, j] = 1
            else:
                grid[i, j] = 3 if by_id[cid]["holds"] else 2
    fig, ax = plt.subplots(figsize=(min(1.0 + 0.45 * len(pts), 40), min(0.8 + 0.32 * max(len(cids), 1), 40)))
    ax.imshow(grid, cmap=ListedColormap(colors), vmin=-0.5, vmax=3.5, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(pts)))
    ax.set_xticklabels([f"#{p['index']}  " + ", ".join(f"{_short(k, m)}={v}" for k, v in p["overrides"].items())
                        for p in pts], fontsize=7, rotation=50, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(len(cids)))
    ax.set_yticklabels([f"{c} ({rates[c]['held']}/{rates[c]['n']})" for c in cids], fontsize=8)
    ax.set_xticks(np.arange(-0.5, len(pts), 1), minor=True)
    ax.set_yticks(np.arange(-0.5, max(len(cids), 1), 1), minor=True)
    ax.grid(which="minor", color="#444444", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    if not cids:
        ax.text(len(pts) / 2 - 0.5, 0, "no claim values\n(no point finished ok)", ha="center", va="center",
                fontsize=8)
    ax.set_title(f"claims x points, sweep {doc['sweep_id']}\n(held / ok points after each claim)", fontsize=9,
                 loc="left")
    ax.legend(handles=[Patch(color=colors[3], label="held"), Patch(color=colors[2], label="not held"),
                       Patch(color=colors[0], label="point failed"),
                       Patch(facecolor=colors[1], edgecolor="#444444", label="no value")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_summary(doc: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """summary.parquet, summary.md and heatmap.png (and sweep.json) in ``out_dir``."""
    import pandas as pd

    rows = summary_rows(doc)
    df = pd.DataFrame(rows)
    keys = {g["key"] for g in doc["grid"]}
    for col in df.columns:
        if col in keys:
            continue   # swept values stay as written (strings)
        if col.startswith("claim.") and col.endswith(".holds"):
            df[col] = df[col].astype("boolean")
        elif (col.startswith("claim.") and col.endswith(".value")) or col in ("wall_seconds", "headline"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        elif col in ("claims_held", "claims_declared"):
            df[col] = df[col].astype("Int64")
    paths = [out_dir / "summary.parquet", out_dir / "summary.md", out_dir / "heatmap.png", out_dir / "sweep.json"]
    df.to_parquet(paths[0], index=False)
    paths[1].write_text(summary_markdown(doc))
    write_heatmap(doc, paths[2])
    save_doc(doc, out_dir)
    return paths


# ============================================================================================ sweep.json
def sweep_dir(root: Path, sweep_id: str) -> Path:
    return root / "data" / "08_reporting" / pipeline_of(sweep_id) / "sweeps" / sweep_id


def save_doc(doc: Mapping[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".sweep.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, out_dir / "sweep.json")


def load_doc(root: Path, sweep_id: str) -> dict[str, Any]:
    path = sweep_dir(root, sweep_id) / "sweep.json"
    if not path.is_file():
        raise GridError(f"sweep {sweep_id}: no {path}")
    return json.loads(path.read_text())


def resume_todo(doc: Mapping[str, Any]) -> list[int]:
    """The points ``--resume`` reruns: every one that did not finish ok (failed, interrupted, never run)."""
    return [p["index"] for p in doc["points"] if p.get("status") != OK]


def find_sweep(sweep_id: str, project: Path) -> Path | None:
    """The sweep.json of ``sweep_id`` under ``project``'s data/08_reporting, or None."""
    try:
        path = sweep_dir(project, sweep_id) / "sweep.json"
    except GridError:
        return None
    return path if path.is_file() else None


def sweep_hold_rate_markdown(sweep_id: str, project: Path) -> str:
    """The claims' hold rates over a sweep (for ``python -m pipelines.core.scoreboard --sweep <id>``)."""
    path = find_sweep(sweep_id, project)
    if path is None:
        raise SystemExit(f"scoreboard: no sweep {sweep_id!r} under {project / 'data' / '08_reporting'}")
    doc = json.loads(path.read_text())
    ok = sum(p["status"] == OK for p in doc["points"])
    return (f"# Claim hold rates: sweep {sweep_id}\n\n`{doc['pipeline']}`, {len(doc['points'])} points, "
            f"{ok} ok. Details: `{path.parent / 'summary.md'}`.\n\n" + hold_rate_table(doc, per_point=False))


# ============================================================================================ the driver
def _point_env(doc: Mapping[str, Any], p: Mapping[str, Any], tracking_uri: str, concurrency: int,
               root: Path) -> dict[str, str]:
    sid = doc["sweep_id"]
    tags = {"sweep_id": sid, "sweep_point": str(p["index"]), "sweep_attempt": str(p["attempts"]),
            **{f"sweep.{k}": v for k, v in p["overrides"].items()}}
    context: dict[str, Any] = {}
    if os.environ.get("MLFLOW_RUN_CONTEXT"):
        try:
            context = dict(json.loads(os.environ["MLFLOW_RUN_CONTEXT"]))
        except (ValueError, TypeError):
            context = {}
    env = {
        SWEEP_ID_ENV: sid,
        SWEEP_POINT_ENV: json.dumps({"sweep_id": sid, "index": p["index"], "attempt": p["attempts"],
                                     "overrides": p["overrides"]}),
        CONCURRENCY_ENV: str(concurrency),
        SESSION_LOCK_ENV: str(_session_lock_path(root)),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "KEDRO_DISABLE_TELEMETRY": "true",
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_RUN_CONTEXT": json.dumps({**context, **tags}),
        # rich wraps log lines at 80 columns when not on a terminal: wide lines keep the error line whole
        "COLUMNS": os.environ.get("COLUMNS", "200"),
    }
    if os.environ.get("MLFLOW_EXPERIMENT_NAME"):
        env["MLFLOW_EXPERIMENT_NAME"] = os.environ["MLFLOW_EXPERIMENT_NAME"]
    return env


def _point_tags(doc: Mapping[str, Any], p: Mapping[str, Any]) -> dict[str, str]:
    return {"sweep_id": doc["sweep_id"], "sweep_point": str(p["index"]), "sweep_attempt": str(p["attempts"]),
            **{f"sweep.{k}": v for k, v in p["overrides"].items()}}


def _command_line(pipeline: str, env: str | None, params: Mapping[str, str]) -> str:
    return "kedro " + " ".join(shlex.quote(a) for a in point_args(pipeline, env, params))


def _finish_point(doc: dict[str, Any], p: dict[str, Any], res: Mapping[str, Any], store: Store | None,
                  root: Path, out_dir: Path) -> None:
    """Record a finished point: status, error line, logs, its MLflow run (tagged), its report's results."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"point-{p['index']}.attempt-{p['attempts']}"
    (logs / f"{stem}.stdout.log").write_text(res.get("stdout") or "")
    (logs / f"{stem}.stderr.log").write_text(res.get("stderr") or "")
    rc = int(res.get("returncode", -1))
    p.update(status=OK if rc == 0 else FAILED, returncode=rc, wall_seconds=res.get("wall_seconds"),
             error=None if rc == 0 else error_line(res.get("stderr") or "", rc), host=res.get("host"),
             log=f"logs/{stem}.stderr.log", run_id=None, save_version=None, report=None,
             claims=[], claims_held=None, claims_declared=None, headline=None)
    run = None
    if store is not None:
        try:
            run = store.point_run(doc["sweep_id"], p["index"], p["attempts"], res.get("stdout") or "")
            if run is not None:
                store.ensure_tags(run, _point_tags(doc, p))
        except Exception as exc:  # noqa: BLE001 - the point's outcome stands; the lookup is a nicety
            click.echo(f"sweep: point {p['index']}: could not read its MLflow run ({exc})", err=True)
    if run is not None:
        p["run_id"] = run.info.run_id
        p["save_version"] = run.data.tags.get("save_version") or run.data.tags.get("run_id")
    if rc != 0:
        return
    report, where = None, None
    if p["save_version"]:
        path = root / "data" / "08_reporting" / doc["pipeline"] / "report.json" / p["save_version"] / "report.json"
        if path.is_file():
            report, where = json.loads(path.read_text()), str(path.relative_to(root))
    if report is None and run is not None and store is not None:
        report = store.report(run)
        where = f"mlflow:{run.info.run_id}/report.json" if report is not None else None
    if report is None:
        p["error"] = "finished, but its report was not found (no MLflow run with its sweep tags)"
        return
    p.update(point_results(report, root), report=where)
    p["save_version"] = p["save_version"] or report.get("save_version")


def _discard(doc: Mapping[str, Any], p: dict[str, Any], store: Store | None, root: Path, out_dir: Path,
             why: str) -> None:
    """A finished point whose results cannot be trusted: failed, its parent run re-tagged
    ``role=discarded`` (status FAILED) and its report moved out of data/08_reporting/<m>/report.json/ into
    the sweep's ``discarded/``, so neither the MLflow nor the folder scoreboard takes it as a result."""
    p.update(status=FAILED, error=why, claims=[], claims_held=None, claims_declared=None, headline=None)
    if store is not None and p.get("run_id"):
        try:
            _retry(lambda: store.client.set_tag(p["run_id"], "role", "discarded"))
            _retry(lambda: store.client.set_tag(p["run_id"], "sweep_discarded", why[:5000]))
            _retry(lambda: store.client.set_terminated(p["run_id"], "FAILED"))
        except Exception as exc:  # noqa: BLE001
            click.echo(f"sweep: point {p['index']}: could not re-tag run {p['run_id']} ({exc})", err=True)
    report = p.get("report")
    if report and not str(report).startswith("mlflow:") and (root / report).is_file():
        dest = out_dir / "discarded" / f"point-{p['index']}.attempt-{p['attempts']}.report.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(root / report, dest)
        try:
            (root / report).parent.rmdir()
        except OSError:
            pass
        p["report"] = str(dest.relative_to(root))


def run_sweep(doc: dict[str, Any], todo: list[int], root: Path, max_parallel: int | None,
              runner_params: Mapping[str, str]) -> dict[str, Any]:
    """Run the points ``todo`` of ``doc`` (updated in place, sweep.json rewritten after each point)."""
    out_dir = sweep_dir(root, doc["sweep_id"])
    out_dir.mkdir(parents=True, exist_ok=True)
    from pipelines.core import runctx

    uri = _absolute_uri(runctx.tracking_uri())
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or doc["pipeline"]
    doc.update(tracking_uri=uri, experiment=experiment, launches=int(doc.get("launches", 0)) + 1,
               updated_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    store = Store(uri, experiment, root)

    address = (runner_params.get("address") or "").strip()
    if address.lower() in ("", "none", "null", "inline"):
        parallel = max(1, min(max_parallel or usable_cpus(), len(todo) or 1))
        backend: Any = _LocalBackend(parallel)
        concurrency = parallel
    else:
        if uri.startswith("sqlite:") and address.lower() != "local":
            click.echo("sweep: points on a Ray cluster log to this machine's sqlite store only if they run "
                       "here; set MLFLOW_TRACKING_URI to the team's tracking server", err=True)
        cpus = float(parse_value(runner_params.get("num_cpus", "1")))
        backend = _RayBackend(address, cpus, max_parallel,
                              {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
                               "KEDRO_DISABLE_TELEMETRY": "true"})
        concurrency = 1  # replaced on the worker by the points its node runs at once
    points = {p["index"]: p for p in doc["points"]}
    for i in todo:
        points[i]["status"] = PENDING
    save_doc(doc, out_dir)
    click.echo(f"sweep {doc['sweep_id']}: {len(todo)} of {len(doc['points'])} point(s) of "
               f"'{doc['pipeline']}' ({backend.describe()}); writing to {out_dir}")

    queue = deque(todo)
    retries: dict[int, int] = {}
    finished = 0
    cancelled = False
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        while queue or backend.inflight():
            submitted = False
            while queue and backend.inflight() < backend.limit:
                p = points[queue.popleft()]
                p["attempts"] = int(p.get("attempts", 0)) + 1
                params = {**(doc.get("params") or {}), **p["overrides"]}
                job = {"args": point_args(doc["pipeline"], doc.get("env"), params), "cwd": str(root),
                       "env": _point_env(doc, p, uri, concurrency, root)}
                if isinstance(backend, _RayBackend):
                    job.update(ray_cpus=backend.cpus, n_points=len(todo))
                p["command"] = _command_line(doc["pipeline"], doc.get("env"), params)
                p["status"] = RUNNING
                backend.submit(p["index"], job)
                submitted = True
            if submitted:
                save_doc(doc, out_dir)
            for index, res in backend.wait_one():
                p = points[index]
                _finish_point(doc, p, res, store, root, out_dir)
                stderr = res.get("stderr") or ""
                raced = _RACE.search(" ".join(f"{res.get('stdout') or ''} {stderr}".split()))
                if raced:
                    path = re.search(r"filepath=(?:PurePosixPath\()?'([^']+)'", raced.group(1))
                    _discard(doc, p, store, root, out_dir,
                             f"Error: it read back a version of {path.group(1) if path else 'a dataset'} that a "
                             "concurrent run wrote (Kedro: save version did not match load version); its "
                             "results are discarded")
                if (p["status"] == FAILED and (raced or _TRANSIENT.search(stderr))
                        and retries.get(index, 0) < TRANSIENT_RETRIES):
                    retries[index] = retries.get(index, 0) + 1
                    click.echo(f"sweep: point {index}: {p['error']}; retrying")
                    p["status"] = PENDING
                    queue.append(index)
                    save_doc(doc, out_dir)
                    continue
                finished += 1
                values = ", ".join(f"{_short(k, doc['pipeline'])}={v}" for k, v in p["overrides"].items())
                tail = f": {p['error']}" if p["status"] == FAILED else (
                    f", claims held {p['claims_held']}/{p['claims_declared']}" if p.get("claims_declared") is not None
                    else "")
                click.echo(f"[{finished}/{len(todo)}] point {index} ({values}) {p['status']} in "
                           f"{(p.get('wall_seconds') or 0):.1f} s{tail}")
                save_doc(doc, out_dir)
    except BaseException:
        cancelled = True
        for p in doc["points"]:
            if p["status"] in (PENDING, RUNNING):
                p["status"] = INTERRUPTED
        save_doc(doc, out_dir)
        raise
    finally:
        backend.close(cancel=cancelled)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    files = write_summary(doc, out_dir)
    try:
        doc["sweep_run_id"] = store.log_sweep(doc, files)
        save_doc(doc, out_dir)
    except Exception as exc:  # noqa: BLE001 - the files on disk are the summary; MLflow is a copy
        click.echo(f"sweep: could not log the sweep run to MLflow ({exc})", err=True)
    return doc


def _sweep_command(pipeline: str, env: str | None, grids: Sequence[str], params: str | None,
                   sample: int | None, seed: int) -> str:
    args = [f"--pipeline={pipeline}"] + ([f"--env={env}"] if env else [])
    args += [a for g in grids for a in ("--grid", g)] + ([f"--params={params}"] if params else [])
    args += [f"--sample={sample}", f"--seed={seed}"] if sample else []
    return "kedro sweep " + " ".join(shlex.quote(a) for a in args)


def _project_root() -> Path:
    from pipelines.core import runctx

    return Path(runctx.project_root()).resolve()


def _check_request(root: Path, pipeline: str, env: str | None) -> None:
    from pipelines.core.registry import discover_methods

    known = discover_methods()
    if known and pipeline not in known:
        raise click.ClickException(f"pipeline '{pipeline}' is not registered; registered: {', '.join(known)}")
    if env and not (root / "conf" / env).is_dir():
        raise click.ClickException(f"env '{env}' not found: no folder {root / 'conf' / env}")
    from pipelines.core.config import CONFIG_LOADER_ARGS, check_config_files

    # every point would fail on it: the broken file's line, once, before any point starts
    check_config_files(root / "conf", env, CONFIG_LOADER_ARGS["base_env"], CONFIG_LOADER_ARGS["default_run_env"])


@click.command("sweep")
@click.option("--pipeline", "-p", "pipeline", default=None, help="The pipeline every point runs.")
@click.option("--grid", "-g", "grids", multiple=True, metavar="KEY=V1,V2,...",
              help="A parameter and its values (YAML; commas inside brackets do not split). Repeat for "
                   "more keys: the points are the Cartesian product.")
@click.option("--env", "-e", default=None, help="Kedro env of every point (e.g. test, full).")
@click.option("--params", default=None, metavar="KEY=V,...", help="Fixed overrides applied to every point.")
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="Run a random subset of N points of the grid (reproducible with --seed).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --sample.")
@click.option("--max-parallel", type=click.IntRange(min=1), default=None,
              help="Points running at once (default: usable CPUs locally; no cap on Ray).")
@click.option("--runner-params", default=None, metavar="address=local|auto|ray://...[,num_cpus=1]",
              help="Run each point as a Ray task: address=local starts a local instance, anything else "
                   "joins a cluster; num_cpus per point (default 1).")
@click.option("--resume", "resume_id", default=None, metavar="SWEEP_ID",
              help="Rerun the points of an earlier sweep that did not finish ok, then rewrite its summary.")
@click.option("--dry-run", is_flag=True, help="Print the points and their commands; run nothing.")
def sweep(pipeline: str | None, grids: tuple[str, ...], env: str | None, params: str | None,
          sample: int | None, seed: int, max_parallel: int | None, runner_params: str | None,
          resume_id: str | None, dry_run: bool) -> None:
    """Run a pipeline over a grid of parameter overrides, each point a full `kedro run` in its own process,
    and summarise how robust the claims are (data/08_reporting/<m>/sweeps/<sweep_id>/).

    \b
    kedro sweep --pipeline=rankcal --env=test --grid "rankcal.ece.n_bins=10,15" \\
                --grid "rankcal.models.neural.steps=30,40"
    kedro sweep --resume <sweep_id>
    """
    root = _project_root()
    try:
        rparams = parse_assignments(runner_params, "--runner-params")
        unknown = sorted(set(rparams) - {"address", "num_cpus"})
        if unknown:
            raise GridError(f"--runner-params: unknown key '{unknown[0]}' (address, num_cpus)")
        if "num_cpus" in rparams:
            cpus = parse_value(rparams["num_cpus"])
            if isinstance(cpus, bool) or not isinstance(cpus, int | float) or cpus <= 0:
                raise GridError("--runner-params num_cpus: expected a number > 0")
        if resume_id:
            if pipeline or grids or params or sample or env:
                raise GridError("--resume reruns a sweep as it was defined: give only --max-parallel / "
                                "--runner-params with it")
            pipeline_of(resume_id)
            doc = load_doc(root, resume_id)
            todo = resume_todo(doc)
            rparams = rparams or dict(doc.get("runner_params") or {})
            max_parallel = max_parallel or doc.get("max_parallel")
        else:
            if not pipeline:
                raise GridError("--pipeline is required (or --resume <sweep_id>)")
            if not grids:
                raise GridError("give at least one --grid KEY=V1,V2,...")
            parsed = [parse_grid(g) for g in grids]
            fixed = parse_assignments(params, "--params")
            both = sorted(set(fixed) & {k for k, _ in parsed})
            if both:
                raise GridError(f"'{both[0]}' is both swept (--grid) and fixed (--params)")
            combos = expand_grid(parsed)
            chosen = sample_points(len(combos), sample, seed)
            sid = new_sweep_id(pipeline)
            doc = {"schema": SCHEMA, "sweep_id": sid, "pipeline": pipeline, "env": env,
                   "grid": [{"key": k, "values": v} for k, v in parsed], "params": fixed,
                   "sample": sample, "seed": seed if sample else None, "grid_size": len(combos),
                   "max_parallel": max_parallel, "runner_params": rparams,
                   "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "launches": 0,
                   "command": _sweep_command(pipeline, env, grids, params, sample, seed),
                   "points": [{"index": j, "grid_index": gi, "overrides": combos[gi],
                               "values": {k: parse_value(v) for k, v in combos[gi].items()},
                               "status": PENDING, "attempts": 0} for j, gi in enumerate(chosen)]}
            todo = [p["index"] for p in doc["points"]]
    except GridError as exc:
        raise click.UsageError(str(exc)) from None
    _check_request(root, doc["pipeline"], doc.get("env"))

    if dry_run:
        click.echo(f"sweep {doc['sweep_id']} (dry run): {len(todo)} point(s)")
        for i in todo:
            p = doc["points"][i]
            click.echo(f"  #{i}: " + _command_line(doc["pipeline"], doc.get("env"),
                                                    {**(doc.get("params") or {}), **p["overrides"]}))
        return
    if not todo:
        click.echo(f"sweep {doc['sweep_id']}: every point finished ok; nothing to rerun")
    else:
        try:
            run_sweep(doc, todo, root, max_parallel, rparams)
        except KeyboardInterrupt as exc:
            why = str(exc) or "interrupted (Ctrl-C)"
            click.echo(f"Error: sweep {doc['sweep_id']} {why}; the points that did not finish are marked "
                       f"interrupted; rerun them with: kedro sweep --resume {doc['sweep_id']}", err=True)
            raise SystemExit(143 if isinstance(exc, SweepInterrupted) else 130) from None
    out_dir = sweep_dir(root, doc["sweep_id"])
    if not todo:
        write_summary(doc, out_dir)
    click.echo("")
    click.echo(points_table(doc))
    click.echo(hold_rate_table(doc, per_point=False))
    click.echo(f"summary: {out_dir / 'summary.md'} (+ summary.parquet, heatmap.png, sweep.json)")
    bad = [p for p in doc["points"] if p["status"] != OK]
    if bad:
        raise click.ClickException(f"{len(bad)} of {len(doc['points'])} point(s) did not finish ok; "
                                   f"rerun them with: kedro sweep --resume {doc['sweep_id']}")


if __name__ == "__main__":
    sys.exit(point_main())
