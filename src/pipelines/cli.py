"""Project commands: ``kedro run`` (accepts ``--pipeline`` without deprecation noise, names the MLflow
experiment after the pipeline, turns parameter / claim errors into one line), ``kedro registry list``
(names only, imports nothing), ``kedro method new <name>`` (the scaffold) and ``kedro report log
<report.json>`` (log a saved report to MLflow later: a run whose tracking server was lost)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import click
from kedro.framework.cli.project import run as _kedro_run
from kedro.framework.cli.utils import KedroCliError
from kedro.framework.project import settings
from kedro.utils import load_obj

from pipelines.core import runctx

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")

# `kedro run` without --runner: independent train nodes side by side in worker processes (core.pool)
DEFAULT_RUNNER = "pipelines.core.pool.PoolRunner"


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, name=__file__)
def cli() -> None:
    """Project commands."""


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM (or Ctrl-C) stopped the run: its MLflow runs are marked KILLED."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise RunInterrupted("terminated (SIGTERM)")


def split_params(ctx: click.Context, param: click.Parameter, value: Any) -> dict[str, Any]:
    """``--params``: ``key=value`` items split on commas outside brackets and quotes, so a list value
    (``rankcal.data.datasets=[iris,wine]``) can be written; values parsed as YAML (OmegaConf's rules).
    Keys that address one list item (``m.claims.0.threshold``) are refused in one line: give the whole
    list, or, for claims, an env whose parameters declare them before the run."""
    from omegaconf import OmegaConf

    from pipelines.core.sweep import GridError, split_top_level

    if isinstance(value, dict):
        return value
    try:
        items = split_top_level(value or "")
    except GridError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    dot_list = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise click.BadParameter(f"'{item}' must be key=value", ctx=ctx, param=param)
        parts = key.split(".")
        if param.name == "params" and len(parts) > 1 and parts[1] in ("claims", "extra_claims"):
            raise click.BadParameter(
                f"'{key}': claims are declared before a run and cannot be overridden on the command line; "
                f"declare them in conf/<env>/parameters_{parts[0]}.yml and run with --env=<env>",
                ctx=ctx,
                param=param,
            )
        if any(p.isdigit() for p in parts):
            raise click.BadParameter(
                f"'{key}' addresses one item of a list; give the whole list instead "
                f"(e.g. {'.'.join(parts[: next(i for i, p in enumerate(parts) if p.isdigit())])}=[...])",
                ctx=ctx,
                param=param,
            )
        dot_list.append(f"{key}={val}")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(dot_list))
    except Exception as exc:  # noqa: BLE001 - OmegaConf's grammar errors are long
        raise click.BadParameter(str(exc).splitlines()[0], ctx=ctx, param=param) from None


def check_request(names: list[str], env: str | None, conf_source: str | None) -> None:
    """Refuse, in one line and before anything is created, an unknown pipeline or env, or an env whose
    config files are not all valid YAML (``<file>:<line>:<col>: <problem>``)."""
    from pipelines.core.registry import discover_methods
    from pipelines.core.runctx import project_root

    known = discover_methods()
    for n in names:
        if n != "__default__" and n not in known:
            raise click.ClickException(f"pipeline '{n}' is not registered; registered: {', '.join(known)}")
    if env and not conf_source:
        conf = project_root() / settings.CONF_SOURCE
        if not (conf / env).is_dir():
            envs = sorted(p.name for p in conf.iterdir() if p.is_dir()) if conf.is_dir() else []
            raise click.ClickException(f"env '{env}' not found: no folder {conf / env} (envs: {', '.join(envs)})")
    # a config file that is not valid YAML: its file, line and column in one line, before anything runs
    from pipelines.core.config import CONFIG_LOADER_ARGS, check_config_files

    check_config_files(
        Path(conf_source) if conf_source else project_root() / settings.CONF_SOURCE,
        env,
        CONFIG_LOADER_ARGS["base_env"],
        CONFIG_LOADER_ARGS["default_run_env"],
    )


def validate_params(names: list[str], raw: dict[str, dict] | None = None) -> None:
    """The requested methods' parameters against their schemas, before any MLflow run is opened (read
    with the run's config through core.registry.method_config: no context, so no hook runs twice;
    ``raw`` gives them instead, as ``{method: params}``)."""
    from pipelines.core.params import ParameterError, schema_for, validate
    from pipelines.core.registry import method_config
    from pipelines.core.runctx import DEFAULT_PIPELINE

    if raw is None:
        raw = {}
        for n in names:
            m = DEFAULT_PIPELINE if n == "__default__" else n
            if method_config(m):
                raw[m] = method_config(m)
    for n in names:
        m = DEFAULT_PIPELINE if n == "__default__" else n
        schema = schema_for(m)
        if schema is None:
            continue
        if m not in raw:
            raise ParameterError(f"parameter {m}: missing (conf/base/parameters_{m}.yml with top-level key '{m}')")
        p = validate(schema, raw[m], m)
        from pipelines.core.registry import has_spec

        if has_spec(m):  # every claim and gate names something this run produces
            from pipelines.core.spec import load_spec

            load_spec(m).check(p)


def unfinished_version(context, names: list[str]) -> tuple[str | None, list[str]]:
    """The newest save version of these pipelines' versioned datasets when it has no report (a run
    that was killed or failed), and the versioned datasets; (None, datasets) when the newest run finished.

    Kedro's ``--only-missing-outputs`` counts a versioned output as existing when *any* version exists;
    resuming means: the killed run's version, with every versioned dataset pinned to it."""
    state, version, datasets = resume_point(context, names)
    return (version if state == "unfinished" else None), datasets


def resume_point(context, names: list[str]) -> tuple[str, str | None, list[str]]:
    """(``"unfinished"``, newest version, datasets) when the newest save version has no report (a killed
    or failed run), (``"finished"``, newest version, datasets) when it has one, (``"none"``, None,
    datasets) when nothing was saved yet."""
    from kedro.framework.project import pipelines as registered
    from kedro.io import AbstractVersionedDataset

    context._pipelines_to_validate = list(names)  # else Kedro validates (and imports) every pipeline
    catalog = context.catalog
    versions: dict[str, set[str]] = {}
    datasets: list[str] = []
    reports: set[str] = set()
    for n in names:
        for ds in registered[n].datasets():
            if ds.startswith("params:") or ds == "parameters":
                continue
            obj = catalog.get(ds, fallback_to_runtime_pattern=False)
            if not isinstance(obj, AbstractVersionedDataset):
                continue
            datasets.append(ds)
            root = Path(str(obj._filepath))
            found = {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
            versions[ds] = found
            if ds.endswith(".report"):
                reports |= found
    every = set().union(*versions.values()) if versions else set()
    if not every:
        return "none", None, datasets
    newest = max(every)
    return ("finished" if newest in reports else "unfinished"), newest, datasets


def _run(**kw: Any) -> dict[str, Any]:
    import signal

    from kedro.io import DatasetError
    from kedro.validation.exceptions import ParameterValidationError

    from pipelines.core import tracking
    from pipelines.core.claims import ClaimError
    from pipelines.core.errors import NonFiniteLossError
    from pipelines.core.hooks import end_mlflow_runs
    from pipelines.core.logs import set_verbose
    from pipelines.core.params import ParameterError
    from pipelines.core.runner import GPUUnavailableError, RunnerConfigError, forget_session

    set_verbose(bool(kw.pop("verbose", False)))  # after the plugins' imports, which set their own levels
    pipeline, pipelines = kw.pop("pipeline"), kw.pop("pipelines")
    if pipeline and pipelines:
        raise KedroCliError("Options '--pipeline' and '--pipelines' cannot be used together")
    names = [pipeline] if pipeline else (sorted(set(pipelines)) or ["__default__"])
    check_request(names, kw.get("env"), kw.get("conf_source"))
    runctx.set_requested_pipelines(names)
    runner_path = kw.pop("runner") or DEFAULT_RUNNER
    runner_cls = load_obj(runner_path, "kedro.runner")
    runctx.set_runner_name(runner_cls.__name__)
    runner_kwargs = dict(kw.pop("runner_params") or {})
    if kw.pop("is_async"):
        runner_kwargs["is_async"] = True
    params = kw.pop("params")
    kw.pop("config", None)  # already applied by click's callback
    create_kwargs = {"env": kw.pop("env"), "conf_source": kw.pop("conf_source"), "runtime_params": params}
    runctx.set_run_config(create_kwargs["env"], create_kwargs["conf_source"], params)
    run_kwargs = {
        "tags": tuple(kw.pop("tags")),
        "node_names": tuple(kw.pop("node_names")),
        "pipeline_names": names,
        **kw,
    }
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    try:
        validate_params(names)
        if callable(getattr(runner_cls, "preflight", None)):  # e.g. a Ray cluster refusing this driver
            runner_cls.preflight(create_kwargs["env"], **runner_kwargs)
        tracking.reset()
        uri = runctx.tracking_uri()
        # runs whose process was killed (SIGKILL, OOM, a lost machine) could not end themselves
        tracking.guarded("the end of earlier killed runs", tracking.reap_dead_runs, uri)
        with settings.SESSION_CLASS.create(**create_kwargs) as session:
            if run_kwargs.get("only_missing_outputs"):
                state, version, versioned = resume_point(session.load_context(), names)
                if state == "finished":
                    click.echo(
                        f"Nothing to resume: the newest run of {'+'.join(names)} ({version}) finished; "
                        f"nothing was run (without --only-missing-outputs it runs again)",
                        err=True,
                    )
                    return {}
                if state == "unfinished":
                    # finish the killed run: its save version, every versioned dataset pinned to it
                    click.echo(f"Resuming run {version}: nodes whose outputs it saved are skipped", err=True)
                    session._store["session_id"] = version
                    session.session_id = version
                    run_kwargs["load_versions"] = {
                        **{d: version for d in versioned},
                        **(run_kwargs.get("load_versions") or {}),
                    }
                    runctx.set_resume(
                        version,
                        tracking.guarded(
                            "the resumed run's id", tracking.find_parent_run, uri, runctx.experiment_name(), version
                        ),
                    )
            result = session.run(runner=runner_cls(**runner_kwargs), **run_kwargs)
        line = tracking.summary_line()
        if line:  # the results are saved; what the lost tracking server did not get, in one line
            raise click.ClickException(line)
        return result
    except KeyboardInterrupt as exc:
        end_mlflow_runs("KILLED")
        why = str(exc) or "interrupted (Ctrl-C)"
        click.echo(f"Error: run {why}; its MLflow run is marked KILLED", err=True)
        raise SystemExit(143 if isinstance(exc, RunInterrupted) else 130) from None
    except (
        ParameterError,
        ClaimError,
        NonFiniteLossError,
        DatasetError,
        GPUUnavailableError,
        RunnerConfigError,
    ) as exc:
        end_mlflow_runs("FAILED")
        raise click.ClickException(str(exc)) from None
    except ParameterValidationError as exc:  # Kedro's own check, should ours ever let something through
        end_mlflow_runs("FAILED")
        raise click.ClickException(" ".join(str(exc).split())) from None
    except BaseException:
        end_mlflow_runs("FAILED")
        raise
    finally:
        forget_session()  # a failed before_pipeline_run skips the runner hooks' own clean-up
        # this run's env and --params must not shape pipelines built later in the same process
        # (a notebook, a test session): the next create_pipeline() reads the project's defaults again
        runctx.set_run_config(None, None, {})
        runctx.set_resume(None)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _run_params() -> list[click.Parameter]:
    """Kedro's ``run`` options, with ``--params`` / ``--runner-params`` split by :func:`split_params`."""
    out = []
    for p in _kedro_run.params:
        if p.name in ("params", "runner_params"):
            p = copy.copy(p)
            p.callback = split_params
        out.append(p)
    out.append(
        click.Option(
            ["-v", "--verbose"],
            is_flag=True,
            default=False,
            help="Also log every dataset load and save, each node's signature and the "
            "plugins' INFO lines (default output is a progress report).",
        )
    )
    return out


run = click.Command(
    "run",
    params=_run_params(),
    callback=_run,
    help="Run a pipeline: `kedro run --pipeline=<method> [--env=test|full]`. "
    "Without --pipeline it runs the flagship (tess).",
)
cli.add_command(run)


@cli.group()
def registry() -> None:
    """The registered pipelines."""


@registry.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (for CI matrices).")
def registry_list(as_json: bool) -> None:
    """List the method pipelines (reads folders; imports no method)."""
    from pipelines.core.registry import discover_methods

    names = discover_methods()
    click.echo(json.dumps(names) if as_json else "\n".join(f"- {n}" for n in names))


@registry.command("describe")
@click.argument("name", default="__default__")
def registry_describe(name: str) -> None:
    """List the nodes of one pipeline."""
    from pipelines.core.registry import LazyPipelines

    try:
        pipe = LazyPipelines()[name]
    except KeyError:
        raise KedroCliError(f"'{name}' pipeline not found") from None
    for n in pipe.nodes:
        click.echo(f"- {n.name}  [{', '.join(sorted(n.tags))}]")


@cli.group("report")
def report_group() -> None:
    """Saved reports."""


@report_group.command("log")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--experiment",
    default=None,
    help="MLflow experiment (default: $MLFLOW_EXPERIMENT_NAME, else the report's pipeline).",
)
@click.option(
    "--tracking-uri",
    default=None,
    help="Store to log to (default: $MLFLOW_TRACKING_URI, else <project root>/mlflow.db).",
)
def report_log(paths: tuple[Path, ...], experiment: str | None, tracking_uri: str | None) -> None:
    """Log saved reports (data/08_reporting/<m>/report.json/<version>/report.json) to MLflow: each as a
    parent run with one child run per variant, its parameters and its plots. For a run whose tracking
    server was lost: its run left RUNNING there is ended FAILED and tagged with the new run's id."""
    from pipelines.core.mlflow_logging import RelogError, relog_report

    uri = tracking_uri or runctx.tracking_uri()
    for path in paths:
        try:
            done = relog_report(path, uri, experiment)
        except RelogError as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the store refused or is unreachable: one line
            msg = " ".join(str(exc).split())
            raise click.ClickException(f"{path}: not logged to {uri}: {msg[:300]}") from None
        ended = f"; ended its earlier run {', '.join(done['ended'])} FAILED" if done["ended"] else ""
        click.echo(
            f"{path}: logged to MLflow run {done['run_id']} (experiment {done['experiment']}, {uri}): "
            f"{done['variants']} variant runs, {done['params']} parameters, {done['plots']} plots{ended}"
        )


@cli.group()
def method() -> None:
    """Create method pipelines."""


@method.command("new")
@click.argument("name")
@click.option("--title", default="", help="One line saying what the method is.")
def method_new(name: str, title: str) -> None:
    """Create src/pipelines/<name>/, its parameters (base/test/full) and its test from a template."""
    from pipelines.core.scaffold import ScaffoldError, scaffold

    try:
        created = scaffold(name, title=title)
    except ScaffoldError as exc:
        raise click.ClickException(str(exc)) from None
    for p in created:
        click.echo(f"created {p}")


def _add_sweep() -> None:
    from pipelines.core.sweep import sweep

    cli.add_command(sweep)


_add_sweep()
