"""Claims and gates: the paper's expected outcomes and the experiment's preconditions, declared as data
before a run and checked by one function.

Every claim is decided by its interval (core.stats: a t-interval over seeds, paired per seed for a derived
metric; or an interval the metric carries itself, e.g. a timing ratio's order-statistic interval): it
**holds** when the whole interval is on the claimed side of the threshold, **fails** when the whole
interval is on the other side, and is **inconclusive** when the interval straddles it. A metric measured on
one seed gives a point verdict (``"point": true``). A **gate** (same schema) is a precondition without which
the claims test nothing (the base model learned its task, a metric has headroom); a gate passes when its
value is on the claimed side, and when it does not, every claim that depends on it (all of them, unless a
claim lists ``requires``) is **untested**, never holds or fails.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

from pipelines.core.stats import Estimate

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
VERDICTS = ("holds", "fails", "inconclusive", "untested")


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


def _estimate(metric: str, values: Mapping[str, float], intervals: Mapping[str, Estimate]) -> Estimate:
    """The metric's estimate: its seed interval, else a ``.ci_low``/``.ci_high`` pair beside it."""
    value = _num(values[metric])
    lo_key, hi_key = f"{metric}.ci_low", f"{metric}.ci_high"
    if lo_key in values and hi_key in values:
        return Estimate(value, _num(values[lo_key]), _num(values[hi_key]), n=0)
    est = intervals.get(metric)
    if est is not None:
        return Estimate(value, est.lo, est.hi, est.n)
    return Estimate(value)


def _check(
    c: Mapping[str, Any], values: Mapping[str, float], intervals: Mapping[str, Estimate], kind: str
) -> dict[str, Any]:
    c = dict(c)
    if c["op"] not in OPS:
        raise ClaimError(f"{kind} '{c['id']}': op {c['op']!r} is not one of {sorted(OPS)}")
    if c["metric"] not in values:
        near = sorted(k for k in values if k.split(".")[-1] == c["metric"].split(".")[-1])[:5]
        hint = f"; did you mean one of {near}?" if near else ""
        raise ClaimError(f"{kind} '{c['id']}': metric '{c['metric']}' is not in the report{hint}")
    op, thr = OPS[c["op"]], float(c["threshold"])
    est = _estimate(c["metric"], values, intervals)
    value = est.value
    entry = {
        **{k: v for k, v in c.items() if v is not None or k not in ("requires", "tolerance")},
        "threshold": thr,
        "value": None if math.isnan(value) else value,
    }
    if est.n:
        entry["n_seeds"] = est.n
    if math.isnan(value):
        verdict = "fails"
    elif est.has_interval or (est.lo is not None or est.hi is not None):
        lo, hi = _num(est.lo), _num(est.hi)
        entry["ci"] = [None if math.isnan(lo) else lo, None if math.isnan(hi) else hi]
        if math.isnan(lo) or math.isnan(hi):  # no interval could be formed: undecided
            verdict = "inconclusive"
        elif op(lo, thr) and op(hi, thr):
            verdict = "holds"
        elif not op(lo, thr) and not op(hi, thr):
            verdict = "fails"
        else:
            verdict = "inconclusive"
    else:
        entry["point"] = True
        verdict = "holds" if op(value, thr) else "fails"
    entry["verdict"] = verdict
    entry["holds"] = verdict == "holds"
    if kind == "gate":
        entry["passed"] = not math.isnan(value) and bool(op(value, thr))
    return entry


def evaluate_gates(
    gates: Iterable[Mapping[str, Any]], values: Mapping[str, float], intervals: Mapping[str, Estimate] | None = None
) -> list[dict[str, Any]]:
    """Each gate with its value, interval, verdict and ``passed`` (its value on the claimed side)."""
    return [_check(g, values, intervals or {}, "gate") for g in gates]


def evaluate_claims(
    claims: Iterable[Mapping[str, Any]],
    values: Mapping[str, float],
    intervals: Mapping[str, Estimate] | None = None,
    gates: Iterable[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Each claim with its measured ``value``, ``ci`` (where it has one), ``verdict`` and ``holds``. A NaN
    value never holds. ``gates`` are evaluated gate entries: a claim whose gates did not all pass is
    ``untested`` (``untested_by`` names them)."""
    gates = list(gates)
    failed = {g["id"] for g in gates if not g.get("passed")}
    out = []
    for c in claims:
        entry = _check(c, values, intervals or {}, "claim")
        needs = c.get("requires")
        needs = [g["id"] for g in gates] if needs is None else list(needs)
        blocked = [g for g in needs if g in failed]
        if blocked:
            entry["measured_verdict"] = entry["verdict"]
            entry["verdict"], entry["holds"], entry["untested_by"] = "untested", False, blocked
        out.append(entry)
    return out


def verdict_counts(claims: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """``{holds, fails, inconclusive, untested}`` counts (the scoreboard's and the parent run's)."""
    counts = dict.fromkeys(VERDICTS, 0)
    for c in claims:
        v = c.get("verdict") or ("holds" if c.get("holds") else "fails")
        counts[v] = counts.get(v, 0) + 1
    return counts


__all__ = ["ClaimError", "OPS", "VERDICTS", "evaluate_claims", "evaluate_gates", "flat_metrics", "verdict_counts"]
