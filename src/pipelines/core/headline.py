"""A report's headline (the one number the scoreboard, the sweep summary and the MLflow parent run show)
and the finite-float reader they share. Imports no method, no torch, no mlflow.

The headline is the report's optional ``headline`` block ``{metric, method, lower_is_better, baselines,
tolerance}`` (and ``paper``), else the same keys in ``conf/base/parameters_<m>.yml``, else inferred from the
first claim on ``relative_gain.<metric>.<a>_vs_<b>`` or on ``variants.<v>.<metric>``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def finite(x: Any) -> float | None:
    """``x`` as a float, None when it is missing, not a number, NaN or infinite."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _params_file_block(pipeline: str, project: Path | None) -> dict[str, Any]:
    """``headline`` / ``paper`` from conf/base/parameters_<m>.yml, if the project declares them there."""
    if project is None:
        return {}
    path = project / "conf" / "base" / f"parameters_{pipeline}.yml"
    if not path.is_file():
        return {}
    try:
        import yaml

        block = (yaml.safe_load(path.read_text()) or {}).get(pipeline) or {}
    except Exception:  # noqa: BLE001 - an unreadable file only loses the declaration
        return {}
    return {k: block[k] for k in ("headline", "paper") if k in block}


def infer_headline(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """A headline from the first claim that names a variant metric; None if no claim does."""
    variants = report.get("variants") or {}
    for c in report.get("claims") or []:
        parts = str(c.get("metric", "")).split(".")
        if parts[0] == "relative_gain" and len(parts) >= 3 and "_vs_" in parts[-1]:
            metric, method = ".".join(parts[1:-1]), parts[-1].split("_vs_")[0]
            if method in variants and metric in variants[method]:
                return {"metric": metric, "method": method, "lower_is_better": True, "inferred": True}
        if parts[0] == "variants" and len(parts) >= 3:
            # variant names may hold dots (rankcal's "pl_truth.pl_lin"): the longest one that is a variant
            for k in range(len(parts) - 1, 1, -1):
                v, metric = ".".join(parts[1:k]), ".".join(parts[k:])
                if v in variants and metric in (variants[v] or {}):
                    # "method >= threshold" means higher is better, and vice versa
                    return {
                        "metric": metric,
                        "method": v,
                        "lower_is_better": c.get("op") in ("<=", "<"),
                        "inferred": True,
                    }
    return None


def headline_of(report: Mapping[str, Any], project: Path | None = None) -> tuple[dict[str, Any] | None, str | None]:
    declared = _params_file_block(report["pipeline"], project)
    head = report.get("headline") or declared.get("headline") or infer_headline(report)
    paper = report.get("paper") or declared.get("paper")
    if head is not None:
        head = {"lower_is_better": True, **head}
        if not head.get("method"):
            head["method"] = report["pipeline"]
    return head, paper


def headline_values(report: Mapping[str, Any], head: Mapping[str, Any] | None) -> dict[str, Any]:
    """The headline's numbers in a report: the method's value and seed std, the best baseline (among the
    declared ``baselines``, else every other variant) and its value, and the relative gain (> 0: the method
    is better). Missing or non-finite values are None."""
    out: dict[str, Any] = {
        "method_value": None,
        "method_std": None,
        "best_baseline": None,
        "best_baseline_value": None,
        "relative_gain": None,
    }
    if not head:
        return out
    variants, stds = report.get("variants") or {}, report.get("variants_std") or {}
    metric, method, lower = head["metric"], head["method"], bool(head.get("lower_is_better", True))
    out["method_value"] = finite((variants.get(method) or {}).get(metric))
    out["method_std"] = finite((stds.get(method) or {}).get(metric))
    allowed = set(head.get("baselines") or variants)  # a declared list narrows "best baseline"
    baselines = {v: finite(vals.get(metric)) for v, vals in variants.items() if v != method and v in allowed}
    baselines = {v: x for v, x in baselines.items() if x is not None}
    if baselines:
        best = (min if lower else max)(baselines, key=baselines.get)
        out["best_baseline"], out["best_baseline_value"] = best, baselines[best]
        if out["method_value"] is not None:
            out["relative_gain"] = gain(out["method_value"], baselines[best], lower)
    return out


def gain(method: float, baseline: float, lower_is_better: bool) -> float | None:
    """core.metrics.relative_gain, None where it is undefined (a zero baseline)."""
    from pipelines.core.metrics import relative_gain

    g = relative_gain(method=method, baseline=baseline, lower_is_better=lower_is_better)
    return g if math.isfinite(g) else None
