"""Typed parameter schemas: each method declares ``Params`` (a pydantic model) in ``<m>/params.py``.

Validation happens once, before any node runs (``PlatformHooks.before_pipeline_run``): a wrong type,
a missing key, an unknown key or an out-of-range value stops the run with one line naming the key.
"""
from __future__ import annotations

import importlib
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

T = TypeVar("T", bound=BaseModel)


class ParameterError(ValueError):
    """A method's parameters do not match its schema; the message names the key."""


class Strict(BaseModel):
    """Base for every schema block: unknown keys are typos, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ClaimSpec(Strict):
    id: str = Field(pattern=r"^[a-z0-9_]+$")
    text: str
    metric: str
    op: Literal[">=", "<=", ">", "<"]
    threshold: float
    tolerance: float | None = Field(default=None, ge=0)   # scoreboard regression tolerance on the value


class Headline(Strict):
    """The one number the scoreboard shows for a method (and which variants count as baselines)."""

    metric: str
    method: str
    lower_is_better: bool = True
    baselines: list[str] | None = None
    tolerance: float | None = Field(default=None, ge=0)


class MethodParams(Strict):
    """What every method's parameters hold; a method's ``Params`` extends it."""

    seeds: list[int] = Field(min_length=1)
    threads: int = Field(default=2, ge=1, le=256)
    claims: list[ClaimSpec] = Field(default_factory=list)
    paper: str | None = None                # short citation / title, shown by the scoreboard
    headline: Headline | None = None


def _describe(err: dict[str, Any]) -> str:
    msg = err["msg"]
    if err["type"] == "missing":
        return "missing key"
    if err["type"] == "extra_forbidden":
        return "unknown key (typo?)"
    got = err.get("input")
    return f"{msg} (got {got!r})" if not isinstance(got, dict | list) else msg


def validate(schema: type[T], raw: Any, root: str) -> T:
    """Parse ``raw`` (the ``params:<root>`` dict) with ``schema`` or raise a one-line ParameterError."""
    if not isinstance(raw, dict):
        raise ParameterError(f"{root}: expected a mapping of parameters, got {type(raw).__name__}")
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join([root, *(str(p) for p in first["loc"])])
        more = len(exc.errors()) - 1
        suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
        raise ParameterError(f"parameter {key}: {_describe(first)}{suffix}") from None


def schema_for(method: str) -> type[BaseModel] | None:
    """The ``Params`` class of ``pipelines.<method>.params``, or None if the method has none."""
    try:
        module = importlib.import_module(f"pipelines.{method}.params")
    except ModuleNotFoundError as exc:
        if exc.name == f"pipelines.{method}.params":
            return None
        raise
    return getattr(module, "Params", None)


def parse(method: str, raw: Any) -> BaseModel:
    """Validated, typed parameters of ``method`` (nodes call this on their ``params:<m>`` input)."""
    schema = schema_for(method)
    if schema is None:
        raise ParameterError(f"{method}: no schema (define Params in pipelines/{method}/params.py)")
    return validate(schema, raw, method)
