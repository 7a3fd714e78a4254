"""The config loader's settings, in a light module: ``settings.py`` hands them to Kedro, and
``core.registry.method_config`` reads a run's parameters with them without importing Kedro's project
machinery (which configures logging on import). A config file that is not valid YAML is named in one
line, ``<file>:<line>:<col>: <problem>`` (:class:`ConfigFileError`), by :func:`check_config_files` before a
run or sweep starts, and by the loader should one be read later."""

from __future__ import annotations

from pathlib import Path

import click
from kedro.config import OmegaConfigLoader

from pipelines.core.runctx import artifact_location, experiment_name, tracking_uri

CONF_SOURCE = "conf"
CONFIG_SUFFIXES = (".yml", ".yaml", ".json")


class ConfigFileError(click.ClickException):
    """A config file is not valid YAML. Shown as its one line, ``<file>:<line>:<col>: <problem>`` (no
    ``Error:`` prefix, no traceback); exit code 1."""

    def show(self, file=None) -> None:
        click.echo(self.format_message(), err=True)


def yaml_error_line(path: Path | str, exc: Exception) -> str:
    """``<file>:<line>:<col>: <problem>`` (1-based, as editors count) for a YAML error of ``path``."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    context = getattr(exc, "context", None)
    what = f"{problem} ({context})" if context else problem
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"{where}: {' '.join(str(what).split())}"


def config_files(
    conf_source: Path | str, env: str | None, base_env: str = "base", default_run_env: str = "local"
) -> list[Path]:
    """The config files a run with ``env`` reads: every .yml/.yaml/.json under conf/<base> and
    conf/<env> (default env when None), hidden files and folders left out, as Kedro does."""
    root = Path(conf_source)
    out: list[Path] = []
    for e in dict.fromkeys([base_env, env or default_run_env]):
        folder = root / e
        if not folder.is_dir():
            continue
        for p in sorted(folder.rglob("*")):
            rel = p.relative_to(folder).parts
            if p.is_file() and p.suffix in CONFIG_SUFFIXES and not any(x.startswith(".") for x in rel):
                out.append(p)
    return out


def check_config_files(
    conf_source: Path | str, env: str | None, base_env: str = "base", default_run_env: str = "local"
) -> None:
    """Parse every config file of the run (as OmegaConf does: duplicate keys are errors too); the first
    that is not valid YAML raises :class:`ConfigFileError` naming its file, line and column."""
    import yaml
    from omegaconf import OmegaConf

    for p in config_files(conf_source, env, base_env, default_run_env):
        try:
            OmegaConf.load(p)
        except yaml.YAMLError as exc:
            raise ConfigFileError(yaml_error_line(p, exc)) from None


class ProjectConfigLoader(OmegaConfigLoader):
    """Kedro's OmegaConfigLoader whose YAML errors name the file in one line (:class:`ConfigFileError`)
    instead of a parser traceback chained to Kedro's own (0-based) one."""

    def __getitem__(self, key):
        import yaml

        try:
            return super().__getitem__(key)
        except yaml.YAMLError:
            check_config_files(self.conf_source, self.env, self.base_env, self.default_run_env)
            raise


CONFIG_LOADER_CLASS = ProjectConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # conf/test and conf/full hold only what differs from conf/base: deep-merge parameters and mlflow.yml
    "merge_strategy": {"parameters": "soft", "mlflow": "soft", "runner": "soft"},
    "config_patterns": {
        "mlflow": ["mlflow*", "mlflow*/**"],
        "runner": ["runner*", "runner*/**"],
    },
    # mlflow.yml reads these, so the store is <project root>/mlflow.db whatever the cwd, and the
    # experiment is named after the pipeline that `kedro run` was asked for.
    "custom_resolvers": {
        "platform.tracking_uri": tracking_uri,
        "platform.experiment": experiment_name,
        "platform.artifact_location": artifact_location,
    },
}
