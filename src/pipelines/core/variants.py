"""Variant-level training nodes: one ``train.<variant>`` node per variant (the method, each baseline,
each ablation), built from the parameters, so the GPU pool runs independent variants concurrently,
``kedro run --nodes=<m>.train.<variant>`` retrains one, and ``--only-missing-outputs`` resumes a
killed run from the variants that finished.

``variant_node(train_variant, "patchtst", [...inputs, "params:m"], "predictions_patchtst")`` calls
``train_variant(*inputs, variant="patchtst")``. The node's function keeps the wrapped function's
signature and type hints (without ``variant``), so Kedro's parameter validation still turns
``params:m`` into the method's ``Params``; it is a module-level function's closure, so Ray can ship it.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kedro.pipeline import node
from kedro.pipeline.node import Node

TRAIN_TAGS = ("train", "gpu")


def bind_variant(func: Callable[..., Any], variant: str, arg: str = "variant") -> Callable[..., Any]:
    """``func`` with its ``variant`` keyword fixed; signature and annotations kept minus that argument."""
    sig = inspect.signature(func)
    if arg not in sig.parameters:
        raise TypeError(f"{func.__qualname__} has no '{arg}' argument to bind")

    @functools.wraps(func)
    def bound(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **{arg: variant}, **kwargs)

    bound.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != arg])
    bound.__annotations__ = {k: v for k, v in getattr(func, "__annotations__", {}).items() if k != arg}
    bound.__name__ = f"{func.__name__}[{variant}]"
    bound.__qualname__ = f"{func.__qualname__}[{variant}]"
    bound.variant = variant
    return bound


def variant_node(func: Callable[..., Any], variant: str, inputs: str | Sequence[str] | dict[str, str],
                 outputs: str | Sequence[str] | dict[str, str] | None, *, stage: str = "train",
                 tags: Iterable[str] = TRAIN_TAGS) -> Node:
    """The node ``<stage>.<variant>`` running ``func(..., variant=<variant>)``."""
    return node(bind_variant(func, variant), inputs, outputs, name=f"{stage}.{variant}", tags=list(tags))


def variant_outputs(variants: Iterable[str], pattern: str) -> dict[str, str]:
    """``{variant: pattern.format(variant=v)}``: the datasets an evaluate node gathers, by variant."""
    return {v: pattern.format(variant=v) for v in variants}


def gather(**by_variant: Any) -> dict[str, Any]:
    """Identity for an evaluate node's ``**kwargs`` of variant outputs: ``{variant: output}``."""
    return dict(by_variant)


__all__ = ["TRAIN_TAGS", "bind_variant", "gather", "variant_node", "variant_outputs"]
