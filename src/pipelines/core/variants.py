"""Variant-level training nodes: one ``train.<variant>`` node per variant (the method, each baseline,
each ablation), built from the parameters, so the GPU pool runs independent variants concurrently,
``kedro run --nodes=<m>.train.<variant>`` retrains one, and ``--only-missing-outputs`` resumes a
killed run from the variants that finished.

``variant_node(train_variant, "patchtst", [...inputs, "params:m"], "predictions_patchtst")`` calls
``train_variant(*inputs, variant="patchtst")``. The node's function keeps the wrapped function's
signature and type hints (without ``variant``), so Kedro's parameter validation still turns
``params:m`` into the method's ``Params``; it is a picklable object (no closure), so worker processes and Ray can ship it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kedro.pipeline import node
from kedro.pipeline.node import Node

TRAIN_TAGS = ("train", "gpu")


class VariantFunction:
    """``func`` with its ``variant`` keyword fixed: a module-level class holding a module-level function and
    a name, so it pickles by reference (worker processes, Ray) where a closure would not. Its signature and
    annotations are the wrapped function's minus that argument (Kedro's parameter validation reads them)."""

    def __init__(self, func: Callable[..., Any], variant: str, arg: str = "variant") -> None:
        sig = inspect.signature(func)
        if arg not in sig.parameters:
            raise TypeError(f"{func.__qualname__} has no '{arg}' argument to bind")
        self.func, self.variant, self.arg = func, variant, arg
        functools.update_wrapper(self, func)
        self.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != arg])
        self.__annotations__ = {k: v for k, v in getattr(func, "__annotations__", {}).items() if k != arg}
        self.__name__ = f"{func.__name__}[{variant}]"
        self.__qualname__ = f"{func.__qualname__}[{variant}]"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **{self.arg: self.variant}, **kwargs)

    def __reduce__(self):
        return (VariantFunction, (self.func, self.variant, self.arg))

    def __repr__(self) -> str:
        return f"VariantFunction({self.func.__module__}.{self.func.__qualname__}, {self.variant!r})"


def bind_variant(func: Callable[..., Any], variant: str, arg: str = "variant") -> Callable[..., Any]:
    """``func`` with its ``variant`` keyword fixed; signature and annotations kept minus that argument
    (a picklable :class:`VariantFunction`)."""
    return VariantFunction(func, variant, arg)


def variant_node(
    func: Callable[..., Any],
    variant: str,
    inputs: str | Sequence[str] | dict[str, str],
    outputs: str | Sequence[str] | dict[str, str] | None,
    *,
    stage: str = "train",
    tags: Iterable[str] = TRAIN_TAGS,
) -> Node:
    """The node ``<stage>.<variant>`` running ``func(..., variant=<variant>)``."""
    return node(bind_variant(func, variant), inputs, outputs, name=f"{stage}.{variant}", tags=list(tags))


def variant_outputs(variants: Iterable[str], pattern: str) -> dict[str, str]:
    """``{variant: pattern.format(variant=v)}``: the datasets an evaluate node gathers, by variant."""
    return {v: pattern.format(variant=v) for v in variants}


def gather(**by_variant: Any) -> dict[str, Any]:
    """Identity for an evaluate node's ``**kwargs`` of variant outputs: ``{variant: output}``."""
    return dict(by_variant)


__all__ = ["TRAIN_TAGS", "VariantFunction", "bind_variant", "gather", "variant_node", "variant_outputs"]
