"""Pipeline discovery: a method is a sub-package of ``pipelines`` with a ``pipeline.py``.

Discovery reads the file system only; a method's modules are imported when its pipeline is
asked for, so ``kedro run --pipeline=x`` imports x alone and a broken method breaks only itself.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from pipelines.core.runctx import DEFAULT_PIPELINE

PACKAGE_DIR = Path(__file__).resolve().parents[1]
NOT_METHODS = {"core"}


def discover_methods() -> list[str]:
    """Names of the method sub-packages, sorted."""
    return sorted(
        p.name for p in PACKAGE_DIR.iterdir()
        if p.is_dir() and p.name not in NOT_METHODS and not p.name.startswith(("_", "."))
        and (p / "pipeline.py").is_file() and (p / "__init__.py").is_file()
    )


def load_pipeline(name: str):
    module = importlib.import_module(f"pipelines.{name}.pipeline")
    return module.create_pipeline()


class LazyPipelines(Mapping):
    """Read-only mapping name → Pipeline that imports a method on first access."""

    def __init__(self) -> None:
        self._names = discover_methods()
        self._cache: dict = {}

    def __getitem__(self, name: str):
        target = DEFAULT_PIPELINE if name == "__default__" else name
        if target not in self._names:
            raise KeyError(name)
        if target not in self._cache:
            self._cache[target] = load_pipeline(target)
        return self._cache[target]

    def __iter__(self) -> Iterator[str]:
        yield from self._names
        if DEFAULT_PIPELINE in self._names:
            yield "__default__"

    def __len__(self) -> int:
        return len(self._names) + (DEFAULT_PIPELINE in self._names)
