"""Claims: the paper's expected outcomes, declared as data before a run and checked by one function."""
from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


class ClaimError(KeyError):
    """A claim names a metric the report does not have (an error, never a silent ``holds: false``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def flat_metrics(variants: Mapping[str, Mapping[str, float]], metrics: Mapping[str, float]) -> dict[str, float]:
    """One namespace for claims: derived metrics by name, variant metrics as ``variants.<v>.<metric>``."""
    flat = {f"variants.{v}.{k}": val for v, row in variants.items() for k, val in row.items()}
    flat.update(metrics)
    return flat


def evaluate_claims(claims: Iterable[Mapping[str, Any]], values: Mapping[str, float]) -> list[dict[str, Any]]:
    """Each claim with its measured ``value`` and ``holds``; a NaN value never holds."""
    out = []
    for c in claims:
        c = dict(c)
        if c["op"] not in OPS:
            raise ClaimError(f"claim '{c['id']}': op {c['op']!r} is not one of {sorted(OPS)}")
        if c["metric"] not in values:
            near = sorted(k for k in values if k.split(".")[-1] == c["metric"].split(".")[-1])[:5]
            hint = f"; did you mean one of {near}?" if near else ""
            raise ClaimError(f"claim '{c['id']}': metric '{c['metric']}' is not in the report{hint}")
        value = float(values[c["metric"]])
        holds = (not math.isnan(value)) and bool(OPS[c["op"]](value, float(c["threshold"])))
        out.append({**c, "threshold": float(c["threshold"]), "value": None if math.isnan(value) else value,
                    "holds": holds})
    return out
