"""The report every pipeline writes as ``<m>.report``: variants table, derived metrics, claims.

Nodes call :func:`build_report`; the run context (env, git commit, save version, wall time) is stamped
by ``PlatformHooks`` when the report is saved, so node functions stay pure.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pipelines.core.claims import evaluate_claims, evaluate_gates, flat_metrics, verdict_counts
from pipelines.core.stats import ESTIMATOR, Estimate, t_interval

#: a metric whose name says it is a time, a rate or a ratio of times (one dot-separated or
#: underscore-separated word of the name)
TIMING_NAME = re.compile(
    r"(^|[._])(ms|us|ns|s|sec|seconds|time|times|wall|latency|throughput|speedup|per_s|"
    r"tokens_per_s|clock|overhead)([._]|$)|_ms\b|_s\b|speedup|latency|seconds"
)


def timing_metrics(flat: Iterable[str], declared: Iterable[str] = ()) -> list[str]:
    """The keys of ``flat`` (``variants.<v>.<metric>`` or a derived metric's name) that are timings: by
    name (:data:`TIMING_NAME`) or matching one of the method's ``TIMING_METRICS`` patterns."""
    declared = tuple(declared)
    out = []
    for key in flat:
        bare = key.split(".", 2)[2] if key.startswith("variants.") and key.count(".") >= 2 else key
        if TIMING_NAME.search(bare) or any(
            fnmatch.fnmatchcase(bare, p) or fnmatch.fnmatchcase(key, p) for p in declared
        ):
            out.append(key)
    return sorted(out)


def params_dict(params: Any) -> dict[str, Any]:
    """A method's parameters as plain data (its typed ``Params`` model or an already plain mapping)."""
    if hasattr(params, "model_dump"):
        return params.model_dump(mode="json")
    return dict(params)


def params_hash(params: Any) -> str:
    params = params_dict(params)
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _clean(x: Any) -> Any:
    """JSON-safe floats (NaN/inf → None) and plain Python types."""
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy / torch scalars
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def aggregate_seeds(rows: Iterable[Mapping[str, Any]]) -> tuple[dict, dict, dict]:
    """Rows ``{"variant", "seed", <metric>: value, ...}`` → (mean, std, per-seed) tables by variant.

    std is the population std over the seeds a variant was run with (0 for one seed)."""
    per_seed: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        v = r["variant"]
        for k, val in r.items():
            if k in ("variant", "seed"):
                continue
            per_seed.setdefault(v, {}).setdefault(k, []).append(float(val))
    mean = {v: {k: sum(x) / len(x) for k, x in ms.items()} for v, ms in per_seed.items()}
    std = {
        v: {k: math.sqrt(sum((xi - mean[v][k]) ** 2 for xi in x) / len(x)) for k, x in ms.items()}
        for v, ms in per_seed.items()
    }
    return mean, std, per_seed


def thread_record() -> dict[str, Any]:
    """Threads and OpenMP wait policy this run used (from the node preamble, when torch ran)."""
    import os
    import sys

    runtime = sys.modules.get("pipelines.core.runtime")  # recorded, not configured (nor imported) here
    if runtime is not None:
        return runtime.thread_record()
    return {"threads": 1, "threads_setting": "auto", "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}


MAX_HISTORY_POINTS = 1000


def history_series(values: Any, max_points: int = MAX_HISTORY_POINTS) -> dict[str, list]:
    """One metric history as ``{"step": [...], "value": [...]}``.

    ``values`` is a sequence of numbers (step = index), a sequence of ``(step, value)`` pairs, or a mapping
    with ``step`` and ``value``. Longer series are thinned evenly to ``max_points`` (first and last kept);
    non-finite values stay (as None in JSON) so a divergence is visible, not dropped."""
    if isinstance(values, Mapping):
        steps, vals = list(values["step"]), list(values["value"])
    else:
        values = list(values.tolist() if hasattr(values, "tolist") else values)
        if values and isinstance(values[0], list | tuple):
            steps, vals = [int(s) for s, _ in values], [v for _, v in values]
        else:
            steps, vals = list(range(len(values))), values
    if len(steps) != len(vals):
        raise ValueError(f"history has {len(steps)} steps but {len(vals)} values")
    if len(steps) > max_points:
        idx = sorted({round(i * (len(steps) - 1) / (max_points - 1)) for i in range(max_points)})
        steps, vals = [steps[i] for i in idx], [vals[i] for i in idx]
    return {"step": [int(s) for s in steps], "value": [float(v) for v in vals]}


def build_report(
    pipeline: str,
    params: Any,
    rows: Iterable[Mapping[str, Any]],
    metrics: Mapping[str, Any] | None = None,
    artifacts: Iterable[str] = (),
    extra: Mapping[str, Any] | None = None,
    histories: Mapping[str, Mapping[str, Any]] | None = None,
    derived_per_seed: Mapping[str, Mapping[Any, float]] | None = None,
) -> dict[str, Any]:
    """Assemble ``<m>.report``: variants table with seed intervals, derived metrics, gates and claims.

    ``params`` is the method's ``Params`` (or its dict). Every variant metric with two or more seeds gets a
    t-interval over its seeds (core.stats); ``derived_per_seed`` maps a derived metric to its per-seed
    paired values (its value is their mean, its interval theirs); a value in ``metrics`` may be a
    ``core.stats.Estimate`` (its interval is used) or may come with ``<name>.ci_low`` / ``<name>.ci_high``.
    The gates declared in ``params['gates']`` are checked first; a claim depending on a gate that did not
    pass is ``untested``.

    ``histories`` maps a variant to ``{metric: series}`` (see :func:`history_series`): quantities that
    evolve over training. They are logged with steps to that variant's MLflow child run (the UI draws the
    curves); a key that is not a variant (e.g. ``"run"``) goes to the parent run."""
    declared_timings = tuple(getattr(type(params), "TIMING_METRICS", ()))
    params = params_dict(params)
    mean, std, per_seed = aggregate_seeds(rows)
    intervals: dict[str, Estimate] = {}
    variants_ci: dict[str, dict[str, list]] = {}
    for v, ms in per_seed.items():
        for k, xs in ms.items():
            if len(xs) >= 2:
                est = t_interval(xs)
                intervals[f"variants.{v}.{k}"] = est
                variants_ci.setdefault(v, {})[k] = [est.lo, est.hi]
    plain: dict[str, Any] = {}
    metrics_ci: dict[str, list] = {}
    for k, val in (metrics or {}).items():
        if isinstance(val, Estimate):
            plain[k] = val.value
            if val.has_interval:
                intervals[k] = val
                metrics_ci[k] = [val.lo, val.hi]
        else:
            plain[k] = val
    for k, by_seed in (derived_per_seed or {}).items():
        est = t_interval(list(by_seed.values()))
        plain[k] = est.value
        intervals[k] = est
        if est.has_interval:
            metrics_ci[k] = [est.lo, est.hi]
    values = flat_metrics(mean, plain)
    gates = evaluate_gates(params.get("gates", []), values, intervals)
    claims = evaluate_claims(params.get("claims", []), values, intervals, gates)
    return _clean(
        {
            "pipeline": pipeline,
            "seeds": list(params.get("seeds", [])),
            "params_hash": params_hash(params),
            **thread_record(),
            "variants": mean,
            "variants_std": std,
            "variants_ci": variants_ci,
            "per_seed": per_seed,
            "metrics": plain,
            "metrics_ci": metrics_ci,
            **(
                {"metrics_per_seed": {k: {str(s): x for s, x in d.items()} for k, d in derived_per_seed.items()}}
                if derived_per_seed
                else {}
            ),
            "interval": ESTIMATOR,
            # what measures the machine, not the method: comparisons of two runs leave these out
            "timing_metrics": timing_metrics(values, declared_timings),
            "gates": gates,
            "gates_passed": all(g["passed"] for g in gates),
            "claims": claims,
            "claims_held": sum(c["holds"] for c in claims),
            "claims_declared": len(claims),
            "verdicts": verdict_counts(claims),
            # the files the plots dataset writes: a figure named "x" is saved as x.png
            "artifacts": sorted(a if "." in a else f"{a}.png" for a in artifacts),
            "paper": params.get("paper"),
            "headline": params.get("headline"),
            **(
                {"histories": {v: {k: history_series(s) for k, s in h.items()} for v, h in histories.items()}}
                if histories
                else {}
            ),
            **(extra or {}),
        }
    )


def _value_cell(c: Mapping[str, Any]) -> str:
    val = "n/a" if c["value"] is None else f"{c['value']:.4g}"
    if c.get("ci") and None not in c["ci"]:
        val += f" [{c['ci'][0]:.3g}, {c['ci'][1]:.3g}]"
    elif c.get("point"):
        val += " (1 seed)"
    return val


def gates_table(report: Mapping[str, Any]) -> str:
    """The gates as a markdown table (empty string when the method declares none)."""
    gates = report.get("gates") or []
    if not gates:
        return ""
    lines = ["| gate | metric | op | threshold | value [95% CI] | passed |", "|---|---|---|---|---|---|"]
    for g in gates:
        lines.append(
            f"| {g['id']} | `{g['metric']}` | {g['op']} | {g['threshold']:g} | {_value_cell(g)} | "
            f"{'yes' if g.get('passed') else '**NO: claims untested**'} |"
        )
    return "\n".join(lines)


def claims_table(report: Mapping[str, Any]) -> str:
    """The claims as a markdown table (for READMEs, notes and the scoreboard): value with its 95% seed
    interval, and the verdict the interval decides."""
    lines = ["| claim | metric | op | threshold | value [95% CI] | verdict |", "|---|---|---|---|---|---|"]
    for c in report["claims"]:
        verdict = c.get("verdict", "holds" if c["holds"] else "fails")
        shown = {
            "holds": "holds",
            "fails": "**fails**",
            "inconclusive": "*inconclusive*",
            "untested": f"untested ({', '.join(c.get('untested_by', []))})",
        }[verdict]
        lines.append(f"| {c['id']} | `{c['metric']}` | {c['op']} | {c['threshold']:g} | {_value_cell(c)} | {shown} |")
    return "\n".join(lines)


def variants_table(report: Mapping[str, Any], metrics: Iterable[str] | None = None) -> str:
    """Variants × metrics as ``mean ± std`` markdown."""
    variants = report["variants"]
    cols = list(metrics or sorted({k for row in variants.values() for k in row}))
    lines = ["| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for v, row in variants.items():
        cells = []
        for k in cols:
            if k not in row or row[k] is None:
                cells.append("")
            else:
                s = report.get("variants_std", {}).get(v, {}).get(k)
                cells.append(f"{row[k]:.4g}" + (f" ± {s:.2g}" if s else ""))
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
