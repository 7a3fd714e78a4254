"""The driver: ``kedro sweep`` (new or ``--resume``): runs the points and writes the summary."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from pipelines.core.cpus import usable_cpus
from pipelines.core.sweep.backends import _LocalBackend, _RayBackend
from pipelines.core.sweep.base import (
    _RACE,
    _TRANSIENT,
    CONCURRENCY_ENV,
    FAILED,
    INTERRUPTED,
    OK,
    PENDING,
    RUNNING,
    SCHEMA,
    SWEEP_ID_ENV,
    SWEEP_POINT_ENV,
    TRANSIENT_RETRIES,
    GridError,
    SweepInterrupted,
    _on_sigterm,
)
from pipelines.core.sweep.grid import (
    error_line,
    expand_grid,
    new_sweep_id,
    parse_assignments,
    parse_grid,
    parse_value,
    pipeline_of,
    sample_points,
)
from pipelines.core.sweep.point import point_args
from pipelines.core.sweep.results import (
    _short,
    hold_rate_table,
    load_doc,
    point_results,
    points_table,
    resume_todo,
    save_doc,
    sweep_dir,
    write_summary,
)
from pipelines.core.sweep.store import Store, _absolute_uri, _retry
from pipelines.core.versions import SESSION_LOCK_ENV, _session_lock_path


def _point_env(
    doc: Mapping[str, Any], p: Mapping[str, Any], tracking_uri: str, concurrency: int, root: Path
) -> dict[str, str]:
    sid = doc["sweep_id"]
    tags = {
        "sweep_id": sid,
        "sweep_point": str(p["index"]),
        "sweep_attempt": str(p["attempts"]),
        **{f"sweep.{k}": v for k, v in p["overrides"].items()},
    }
    context: dict[str, Any] = {}
    if os.environ.get("MLFLOW_RUN_CONTEXT"):
        try:
            context = dict(json.loads(os.environ["MLFLOW_RUN_CONTEXT"]))
        except (ValueError, TypeError):
            context = {}
    env = {
        SWEEP_ID_ENV: sid,
        SWEEP_POINT_ENV: json.dumps(
            {"sweep_id": sid, "index": p["index"], "attempt": p["attempts"], "overrides": p["overrides"]}
        ),
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
    return {
        "sweep_id": doc["sweep_id"],
        "sweep_point": str(p["index"]),
        "sweep_attempt": str(p["attempts"]),
        **{f"sweep.{k}": v for k, v in p["overrides"].items()},
    }


def _command_line(pipeline: str, env: str | None, params: Mapping[str, str]) -> str:
    return "kedro " + " ".join(shlex.quote(a) for a in point_args(pipeline, env, params))


def _finish_point(
    doc: dict[str, Any], p: dict[str, Any], res: Mapping[str, Any], store: Store | None, root: Path, out_dir: Path
) -> None:
    """Record a finished point: status, error line, logs, its MLflow run (tagged), its report's results."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"point-{p['index']}.attempt-{p['attempts']}"
    (logs / f"{stem}.stdout.log").write_text(res.get("stdout") or "")
    (logs / f"{stem}.stderr.log").write_text(res.get("stderr") or "")
    rc = int(res.get("returncode", -1))
    p.update(
        status=OK if rc == 0 else FAILED,
        returncode=rc,
        wall_seconds=res.get("wall_seconds"),
        error=None if rc == 0 else error_line(res.get("stderr") or "", rc),
        host=res.get("host"),
        log=f"logs/{stem}.stderr.log",
        run_id=None,
        save_version=None,
        report=None,
        claims=[],
        claims_held=None,
        claims_declared=None,
        headline=None,
    )
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


def _discard(
    doc: Mapping[str, Any], p: dict[str, Any], store: Store | None, root: Path, out_dir: Path, why: str
) -> None:
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


def run_sweep(
    doc: dict[str, Any], todo: list[int], root: Path, max_parallel: int | None, runner_params: Mapping[str, str]
) -> dict[str, Any]:
    """Run the points ``todo`` of ``doc`` (updated in place, sweep.json rewritten after each point)."""
    out_dir = sweep_dir(root, doc["sweep_id"])
    out_dir.mkdir(parents=True, exist_ok=True)
    from pipelines.core import runctx

    uri = _absolute_uri(runctx.tracking_uri())
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or doc["pipeline"]
    doc.update(
        tracking_uri=uri,
        experiment=experiment,
        launches=int(doc.get("launches", 0)) + 1,
        updated_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    store = Store(uri, experiment, root)

    address = (runner_params.get("address") or "").strip()
    if address.lower() in ("", "none", "null", "inline"):
        parallel = max(1, min(max_parallel or usable_cpus(), len(todo) or 1))
        backend: Any = _LocalBackend(parallel)
        concurrency = parallel
    else:
        if uri.startswith("sqlite:") and address.lower() != "local":
            click.echo(
                "sweep: points on a Ray cluster log to this machine's sqlite store only if they run "
                "here; set MLFLOW_TRACKING_URI to the team's tracking server",
                err=True,
            )
        cpus = float(parse_value(runner_params.get("num_cpus", "1")))
        backend = _RayBackend(
            address,
            cpus,
            max_parallel,
            {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), "KEDRO_DISABLE_TELEMETRY": "true"},
        )
        concurrency = 1  # replaced on the worker by the points its node runs at once
    points = {p["index"]: p for p in doc["points"]}
    for i in todo:
        points[i]["status"] = PENDING
    save_doc(doc, out_dir)
    click.echo(
        f"sweep {doc['sweep_id']}: {len(todo)} of {len(doc['points'])} point(s) of "
        f"'{doc['pipeline']}' ({backend.describe()}); writing to {out_dir}"
    )

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
                job = {
                    "args": point_args(doc["pipeline"], doc.get("env"), params),
                    "cwd": str(root),
                    "env": _point_env(doc, p, uri, concurrency, root),
                }
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
                    _discard(
                        doc,
                        p,
                        store,
                        root,
                        out_dir,
                        f"Error: it read back a version of {path.group(1) if path else 'a dataset'} that a "
                        "concurrent run wrote (Kedro: save version did not match load version); its "
                        "results are discarded",
                    )
                if (
                    p["status"] == FAILED
                    and (raced or _TRANSIENT.search(stderr))
                    and retries.get(index, 0) < TRANSIENT_RETRIES
                ):
                    retries[index] = retries.get(index, 0) + 1
                    click.echo(f"sweep: point {index}: {p['error']}; retrying")
                    p["status"] = PENDING
                    queue.append(index)
                    save_doc(doc, out_dir)
                    continue
                finished += 1
                values = ", ".join(f"{_short(k, doc['pipeline'])}={v}" for k, v in p["overrides"].items())
                tail = (
                    f": {p['error']}"
                    if p["status"] == FAILED
                    else (
                        f", claims held {p['claims_held']}/{p['claims_declared']}"
                        if p.get("claims_declared") is not None
                        else ""
                    )
                )
                click.echo(
                    f"[{finished}/{len(todo)}] point {index} ({values}) {p['status']} in "
                    f"{(p.get('wall_seconds') or 0):.1f} s{tail}"
                )
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


def _sweep_command(
    pipeline: str, env: str | None, grids: Sequence[str], params: str | None, sample: int | None, seed: int
) -> str:
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
@click.option(
    "--grid",
    "-g",
    "grids",
    multiple=True,
    metavar="KEY=V1,V2,...",
    help="A parameter and its values (YAML; commas inside brackets do not split). Repeat for "
    "more keys: the points are the Cartesian product.",
)
@click.option("--env", "-e", default=None, help="Kedro env of every point (e.g. test, full).")
@click.option("--params", default=None, metavar="KEY=V,...", help="Fixed overrides applied to every point.")
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=None,
    help="Run a random subset of N points of the grid (reproducible with --seed).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --sample.")
@click.option(
    "--max-parallel",
    type=click.IntRange(min=1),
    default=None,
    help="Points running at once (default: usable CPUs locally; no cap on Ray).",
)
@click.option(
    "--runner-params",
    default=None,
    metavar="address=local|auto|ray://...[,num_cpus=1]",
    help="Run each point as a Ray task: address=local starts a local instance, anything else "
    "joins a cluster; num_cpus per point (default 1).",
)
@click.option(
    "--resume",
    "resume_id",
    default=None,
    metavar="SWEEP_ID",
    help="Rerun the points of an earlier sweep that did not finish ok, then rewrite its summary.",
)
@click.option("--dry-run", is_flag=True, help="Print the points and their commands; run nothing.")
def sweep(
    pipeline: str | None,
    grids: tuple[str, ...],
    env: str | None,
    params: str | None,
    sample: int | None,
    seed: int,
    max_parallel: int | None,
    runner_params: str | None,
    resume_id: str | None,
    dry_run: bool,
) -> None:
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
                raise GridError(
                    "--resume reruns a sweep as it was defined: give only --max-parallel / --runner-params with it"
                )
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
            doc = {
                "schema": SCHEMA,
                "sweep_id": sid,
                "pipeline": pipeline,
                "env": env,
                "grid": [{"key": k, "values": v} for k, v in parsed],
                "params": fixed,
                "sample": sample,
                "seed": seed if sample else None,
                "grid_size": len(combos),
                "max_parallel": max_parallel,
                "runner_params": rparams,
                "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "launches": 0,
                "command": _sweep_command(pipeline, env, grids, params, sample, seed),
                "points": [
                    {
                        "index": j,
                        "grid_index": gi,
                        "overrides": combos[gi],
                        "values": {k: parse_value(v) for k, v in combos[gi].items()},
                        "status": PENDING,
                        "attempts": 0,
                    }
                    for j, gi in enumerate(chosen)
                ],
            }
            todo = [p["index"] for p in doc["points"]]
    except GridError as exc:
        raise click.UsageError(str(exc)) from None
    _check_request(root, doc["pipeline"], doc.get("env"))

    if dry_run:
        click.echo(f"sweep {doc['sweep_id']} (dry run): {len(todo)} point(s)")
        for i in todo:
            p = doc["points"][i]
            click.echo(
                f"  #{i}: "
                + _command_line(doc["pipeline"], doc.get("env"), {**(doc.get("params") or {}), **p["overrides"]})
            )
        return
    if not todo:
        click.echo(f"sweep {doc['sweep_id']}: every point finished ok; nothing to rerun")
    else:
        try:
            run_sweep(doc, todo, root, max_parallel, rparams)
        except KeyboardInterrupt as exc:
            why = str(exc) or "interrupted (Ctrl-C)"
            click.echo(
                f"Error: sweep {doc['sweep_id']} {why}; the points that did not finish are marked "
                f"interrupted; rerun them with: kedro sweep --resume {doc['sweep_id']}",
                err=True,
            )
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
        raise click.ClickException(
            f"{len(bad)} of {len(doc['points'])} point(s) did not finish ok; "
            f"rerun them with: kedro sweep --resume {doc['sweep_id']}"
        )
