"""Project commands: ``kedro run`` (accepts ``--pipeline`` without deprecation noise, names the MLflow
experiment after the pipeline, turns parameter / claim errors into one line), ``kedro registry list``
(names only, imports nothing) and ``kedro method new <name>`` (the scaffold)."""
from __future__ import annotations

import json
import os
from typing import Any

import click
from kedro.framework.cli.project import run as _kedro_run
from kedro.framework.cli.utils import KedroCliError
from kedro.framework.project import settings
from kedro.utils import load_obj

from pipelines.core import runctx

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, name=__file__)
def cli() -> None:
    """Project commands."""


def _run(**kw: Any) -> dict[str, Any]:
    from kedro.io import DatasetError

    from pipelines.core.claims import ClaimError
    from pipelines.core.params import ParameterError
    from pipelines.core.runner import GPUUnavailableError, RunnerConfigError, forget_session
    from pipelines.core.errors import NonFiniteLossError

    pipeline, pipelines = kw.pop("pipeline"), kw.pop("pipelines")
    if pipeline and pipelines:
        raise KedroCliError("Options '--pipeline' and '--pipelines' cannot be used together")
    names = [pipeline] if pipeline else sorted(set(pipelines))
    runctx.set_requested_pipelines(names)
    runner_path = kw.pop("runner") or "SequentialRunner"
    runner_cls = load_obj(runner_path, "kedro.runner")
    runctx.set_runner_name(runner_cls.__name__)
    runner_kwargs = dict(kw.pop("runner_params") or {})
    if kw.pop("is_async"):
        runner_kwargs["is_async"] = True
    params = kw.pop("params")
    kw.pop("config", None)  # already applied by click's callback
    create_kwargs = {"env": kw.pop("env"), "conf_source": kw.pop("conf_source"), "runtime_params": params}
    run_kwargs = {
        "tags": tuple(kw.pop("tags")),
        "node_names": tuple(kw.pop("node_names")), "pipeline_names": names, **kw,
    }
    try:
        with settings.SESSION_CLASS.create(**create_kwargs) as session:
            return session.run(runner=runner_cls(**runner_kwargs), **run_kwargs)
    except (ParameterError, ClaimError, NonFiniteLossError, DatasetError, GPUUnavailableError,
            RunnerConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        forget_session()   # a failed before_pipeline_run skips the runner hooks' own clean-up


run = click.Command("run", params=list(_kedro_run.params), callback=_run,
                    help="Run a pipeline: `kedro run --pipeline=<method> [--env=test|full]`. "
                         "Without --pipeline it runs the flagship (tess).")
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
