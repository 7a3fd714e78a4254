"""Pipeline discovery: a method is a sub-package of ``pipelines`` with a ``spec.py`` (``SPEC``, a
``core.spec.Method``: core builds its pipeline from the validated params) or, for a hand-built pipeline,
a ``pipeline.py`` with ``create_pipeline``.

Discovery reads the file system only; a method's modules are imported when its pipeline is
asked for, so ``kedro run --pipeline=x`` imports x alone and a broken method breaks only itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipelines.core.runctx import DEFAULT_PIPELINE

PACKAGE_DIR = Path(__file__).resolve().parents[1]
NOT_METHODS = {"core"}


def discover_methods() -> list[str]:
    """Names of the method sub-packages, sorted."""
    return sorted(
        p.name
        for p in PACKAGE_DIR.iterdir()
        if p.is_dir()
        and p.name not in NOT_METHODS
        and not p.name.startswith(("_", "."))
        and ((p / "spec.py").is_file() or (p / "pipeline.py").is_file())
        and (p / "__init__.py").is_file()
    )


def has_spec(name: str) -> bool:
    return (PACKAGE_DIR / name / "spec.py").is_file()


def validated_params(method: str, spec=None) -> Any:
    """The method's params of the run being set up, validated (what the pipeline is built from)."""
    from pipelines.core.params import validate
    from pipelines.core.spec import load_spec

    spec = spec or load_spec(method)
    return validate(spec.params, method_config(method), method)


def load_pipeline(name: str):
    """``create_pipeline`` of a method: for a spec'd one, the pipeline of this run's validated params."""
    if has_spec(name):
        from pipelines.core.spec import load_spec

        spec = load_spec(name)
        return spec.pipeline(validated_params(name, spec))
    module = importlib.import_module(f"pipelines.{name}.pipeline")
    return module.create_pipeline()


def method_config(method: str, env: str | None = None, runtime_params: dict | None = None) -> dict:
    """The raw ``params:<method>`` of the run being set up (its env deep-merged over base, then its
    ``--params``): what ``create_pipeline`` reads to build one train node per variant. Outside a
    ``kedro run`` (kedro viz, registry describe) it is conf/base's, or ``env``'s when given."""
    import json

    from pipelines.core.runctx import config_cache as _CONFIG_CACHE
    from pipelines.core.runctx import run_config

    rc = run_config()
    env = env if env is not None else rc["env"]
    params = runtime_params if runtime_params is not None else rc["runtime_params"]
    key = (str(_conf_source(rc["conf_source"])), env, json.dumps(params, sort_keys=True, default=str))
    if key not in _CONFIG_CACHE:
        from kedro.config import MissingConfigException

        from pipelines.core import config as settings  # the project's loader settings, light

        loader = settings.CONFIG_LOADER_CLASS(
            conf_source=key[0], env=env, runtime_params=params, **settings.CONFIG_LOADER_ARGS
        )
        try:
            _CONFIG_CACHE[key] = dict(loader["parameters"])
        except MissingConfigException:
            _CONFIG_CACHE[key] = {}
    return _CONFIG_CACHE[key].get(method) or {}


def _conf_source(conf_source: str | None) -> Path:
    from pipelines.core.config import CONF_SOURCE
    from pipelines.core.runctx import project_root

    return Path(conf_source) if conf_source else project_root() / CONF_SOURCE


class LazyPipelines(Mapping):
    """Read-only mapping name → Pipeline that imports a method on first access."""

    def __init__(self) -> None:
        self._names = discover_methods()
        self._cache: dict = {}

    def __getitem__(self, name: str):
        import json

        from pipelines.core.runctx import project_root, run_config

        target = DEFAULT_PIPELINE if name == "__default__" else name
        if target not in self._names:
            raise KeyError(name)
        # a pipeline is built from its parameters (one train node per variant): one per run config
        key = (target, str(project_root()), json.dumps(run_config(), sort_keys=True, default=str))
        if key not in self._cache:
            self._cache[key] = load_pipeline(target)
        return self._cache[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._names
        if DEFAULT_PIPELINE in self._names:
            yield "__default__"

    def __len__(self) -> int:
        return len(self._names) + (DEFAULT_PIPELINE in self._names)
