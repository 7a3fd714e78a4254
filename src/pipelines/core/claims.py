"""Claims: the paper's expected outcomes, declared as data before a run and checked by one function.

A claim on a metric that comes with an interval (``<metric>.ci_low`` / ``<metric>.ci_high`` beside it in
the report, e.g. a timing ratio from interleaved repeats) holds only when the whole interval is on the
claimed side of the threshold, fails when the whole interval is on the other side, and is
``inconclusive`` (``holds: false``) when the interval straddles the threshold."""
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


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def evaluate_claims(claims: Iterable[Mapping[str, Any]], values: Mapping[str, float]) -> list[dict[str, Any]]:
    """Each claim with its measured ``value``, ``holds`` and ``verdict`` (holds / fails / inconclusive),
    plus ``ci`` where the metric has an interval. A NaN value never holds."""
    out = []
    for c in claims:
        c = dict(c)
        if c["op"] not in OPS:
            raise ClaimError(f"claim '{c['id']}': op {c['op']!r} is not one of {sorted(OPS)}")
        if c["metric"] not in values:
            near = sorted(k for k in values if k.split(".")[-1] == c["metric"].split(".")[-1])[:5]
            hint = f"; did you mean one of {near}?" if near else ""
            raise ClaimError(f"claim '{c['id']}': metric '{c['metric']}' is not in the report{hint}")
        op, thr = OPS[c["op"]], float(c["threshold"])
        value = _num(values[c["metric"]])
        lo_key, hi_key = f"{c['metric']}.ci_low", f"{c['metric']}.ci_high"
        entry = {**c, "threshold": thr, "value": None if math.isnan(value) else value}
        if lo_key in values and hi_key in values:
            lo, hi = _num(values[lo_key]), _num(values[hi_key])
            entry["ci"] = [None if math.isnan(lo) else lo, None if math.isnan(hi) else hi]
            if math.isnan(value):
                verdict = "fails"
            elif math.isnan(lo) or math.isnan(hi):   # no interval could be formed: undecided
                verdict = "inconclusive"
            elif op(lo, thr) and op(hi, thr):
                verdict = "holds"
            elif not op(lo, thr) and not op(hi, thr):
                verdict = "fails"
            else:
                verdict = "inconclusive"
        else:
            verdict = "holds" if (not math.isnan(value) and op(value, thr)) else "fails"
        entry["holds"] = verdict == "holds"
        entry["verdict"] = verdict
        out.append(entry)
    return out
