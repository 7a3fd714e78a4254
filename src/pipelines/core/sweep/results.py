"""What a sweep keeps: each point's results, hold rates, the summary tables and heatmap, ``sweep.json``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.core.headline import finite as _num  # one finite-float reader
from pipelines.core.sweep.base import FAILED, INTERRUPTED, OK, PENDING, GridError
from pipelines.core.sweep.grid import pipeline_of


def point_results(report: Mapping[str, Any], root: Path | None) -> dict[str, Any]:
    """What the summary keeps of a point's report: claims (value, holds) and the headline value."""
    from pipelines.core.headline import headline_of

    claims = [
        {"id": c.get("id"), "value": _num(c.get("value")), "holds": bool(c.get("holds"))}
        for c in report.get("claims") or []
        if c.get("id")
    ]
    out: dict[str, Any] = {
        "claims": claims,
        "claims_held": sum(c["holds"] for c in claims),
        "claims_declared": len(claims),
        "headline": None,
        "save_version": report.get("save_version"),
    }
    try:
        head, _ = headline_of(report, root)
    except Exception:  # noqa: BLE001 - a malformed headline block only loses the column
        head = None
    if head and head.get("metric"):
        metric, method = head["metric"], head.get("method")
        value = (report.get("variants") or {}).get(method, {}).get(metric)
        if value is None:
            metrics = report.get("metrics") or {}
            value = metrics.get(metric, metrics.get(f"{method}.{metric}"))
        out["headline"] = {
            "metric": metric,
            "method": method,
            "value": _num(value),
            "lower_is_better": bool(head.get("lower_is_better", True)),
        }
    return out


def claim_ids(doc: Mapping[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for p in doc["points"]:
        for c in p.get("claims") or []:
            seen.setdefault(c["id"], None)
    return list(seen)


def hold_rates(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per claim: ``held`` of ``n`` ok points that report it, and the ``rate`` (None if n = 0)."""
    out = {}
    for cid in claim_ids(doc):
        vals = [c["holds"] for p in doc["points"] if p["status"] == OK for c in p.get("claims") or [] if c["id"] == cid]
        out[cid] = {"held": sum(vals), "n": len(vals), "rate": (sum(vals) / len(vals)) if vals else None}
    return out


def summary_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per point: index, swept values (as written), status, error, run id, wall seconds,
    headline, claims held, then ``claim.<id>.value`` / ``claim.<id>.holds`` for every claim."""
    keys = [g["key"] for g in doc["grid"]]
    cids = claim_ids(doc)
    rows = []
    for p in doc["points"]:
        head = p.get("headline") or {}
        row: dict[str, Any] = {"point": p["index"]}
        row.update({k: p["overrides"].get(k) for k in keys})
        row.update(
            {
                "status": p["status"],
                "error": p.get("error"),
                "run_id": p.get("run_id"),
                "save_version": p.get("save_version"),
                "attempts": p.get("attempts", 0),
                "wall_seconds": p.get("wall_seconds"),
                "headline_metric": (f"{head['method']}.{head['metric']}" if head.get("metric") else None),
                "headline": head.get("value"),
                "claims_held": p.get("claims_held"),
                "claims_declared": p.get("claims_declared"),
            }
        )
        by_id = {c["id"]: c for c in p.get("claims") or []}
        for cid in cids:
            c = by_id.get(cid)
            row[f"claim.{cid}.value"] = c["value"] if c else None
            row[f"claim.{cid}.holds"] = c["holds"] if c else None
        rows.append(row)
    return rows


def _short(key: str, pipeline: str) -> str:
    return key[len(pipeline) + 1 :] if key.startswith(pipeline + ".") else key


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _fmt(x: Any) -> str:
    v = _num(x)
    return "" if v is None else f"{v:.4g}"


def points_table(doc: Mapping[str, Any]) -> str:
    """The markdown table of points printed at the end of a sweep."""
    m = doc["pipeline"]
    keys = [g["key"] for g in doc["grid"]]
    heads = [p.get("headline") for p in doc["points"] if p.get("headline")]
    head_cols = [f"{heads[0]['method']} {heads[0]['metric']}"] if heads else []  # the headline, if declared
    cols = ["point", *(_short(k, m) for k in keys), "status", *head_cols, "claims held", "wall s", "run", "error"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for p in doc["points"]:
        held = "" if p.get("claims_declared") is None else f"{p.get('claims_held')}/{p.get('claims_declared')}"
        wall = "" if p.get("wall_seconds") is None else f"{p['wall_seconds']:.1f}"
        head = [_fmt((p.get("headline") or {}).get("value"))] if head_cols else []
        cells = [
            p["index"],
            *(p["overrides"].get(k, "") for k in keys),
            p["status"],
            *head,
            held,
            wall,
            p.get("run_id") or "",
            p.get("error") or "",
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def hold_rate_table(doc: Mapping[str, Any], per_point: bool = True) -> str:
    """Claims x (hold rate, then one column per point: ✓ held, ✗ not held, – failed / no value)."""
    rates = hold_rates(doc)
    if not rates:
        return "No claim values (no point finished ok).\n"
    pts = doc["points"] if per_point else []
    cols = ["claim", "held", "hold rate", *(f"#{p['index']}" for p in pts)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for cid, r in rates.items():
        marks = []
        for p in pts:
            c = next((c for c in p.get("claims") or [] if c["id"] == cid), None)
            marks.append("–" if p["status"] != OK or c is None else ("✓" if c["holds"] else "✗"))
        rate = "n/a" if r["rate"] is None else f"{r['rate']:.0%}"
        lines.append("| " + " | ".join(_cell(x) for x in [cid, f"{r['held']}/{r['n']}", rate, *marks]) + " |")
    return "\n".join(lines) + "\n"


def summary_markdown(doc: Mapping[str, Any]) -> str:
    counts = {s: sum(p["status"] == s for p in doc["points"]) for s in (OK, FAILED, INTERRUPTED, PENDING)}
    grid = "; ".join(f"`{g['key']}` = {', '.join(g['values'])}" for g in doc["grid"])
    fixed = ", ".join(f"`{k}={v}`" for k, v in (doc.get("params") or {}).items()) or "none"
    sampled = f" (a sample of {doc['sample']} with seed {doc['seed']})" if doc.get("sample") else ""
    lines = [
        f"# Sweep {doc['sweep_id']}",
        "",
        f"Pipeline `{doc['pipeline']}`, env `{doc.get('env') or 'default'}`, {len(doc['points'])} points"
        f"{sampled}: {counts[OK]} ok, {counts[FAILED]} failed"
        + (f", {counts[INTERRUPTED] + counts[PENDING]} not run" if counts[INTERRUPTED] + counts[PENDING] else "")
        + ".",
        "",
        f"Grid: {grid}. Fixed overrides: {fixed}.",
        "",
        f"Runs in MLflow experiment `{doc.get('experiment')}` with tag `sweep_id = '{doc['sweep_id']}'`.",
        "",
        "## Points",
        "",
        points_table(doc),
        "## Claim robustness",
        "",
        "✓ held, ✗ not held, – point failed or no value. "
        "Hold rate: points where the claim holds / points that finished ok.",
        "",
        hold_rate_table(doc),
    ]
    return "\n".join(lines)


def write_heatmap(doc: Mapping[str, Any], path: Path) -> None:
    """Claims x points: held (green), not held (red), point failed (grey), no value (white)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    cids = claim_ids(doc)
    pts = doc["points"]
    rates = hold_rates(doc)
    m = doc["pipeline"]
    colors = ["#9e9e9e", "#ffffff", "#d73027", "#1a9850"]  # failed, no value, not held, held
    grid = np.zeros((max(len(cids), 1), max(len(pts), 1)))
    for j, p in enumerate(pts):
        by_id = {c["id"]: c for c in p.get("claims") or []}
        for i, cid in enumerate(cids):
            if p["status"] != OK:
                grid[i, j] = 0
            elif cid not in by_id:
                grid[i, j] = 1
            else:
                grid[i, j] = 3 if by_id[cid]["holds"] else 2
    fig, ax = plt.subplots(figsize=(min(1.0 + 0.45 * len(pts), 40), min(0.8 + 0.32 * max(len(cids), 1), 40)))
    ax.imshow(grid, cmap=ListedColormap(colors), vmin=-0.5, vmax=3.5, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(pts)))
    ax.set_xticklabels(
        [f"#{p['index']}  " + ", ".join(f"{_short(k, m)}={v}" for k, v in p["overrides"].items()) for p in pts],
        fontsize=7,
        rotation=50,
        ha="right",
        rotation_mode="anchor",
    )
    ax.set_yticks(range(len(cids)))
    ax.set_yticklabels([f"{c} ({rates[c]['held']}/{rates[c]['n']})" for c in cids], fontsize=8)
    ax.set_xticks(np.arange(-0.5, len(pts), 1), minor=True)
    ax.set_yticks(np.arange(-0.5, max(len(cids), 1), 1), minor=True)
    ax.grid(which="minor", color="#444444", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    if not cids:
        ax.text(len(pts) / 2 - 0.5, 0, "no claim values\n(no point finished ok)", ha="center", va="center", fontsize=8)
    ax.set_title(
        f"claims x points, sweep {doc['sweep_id']}\n(held / ok points after each claim)", fontsize=9, loc="left"
    )
    ax.legend(
        handles=[
            Patch(color=colors[3], label="held"),
            Patch(color=colors[2], label="not held"),
            Patch(color=colors[0], label="point failed"),
            Patch(facecolor=colors[1], edgecolor="#444444", label="no value"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_summary(doc: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """summary.parquet, summary.md and heatmap.png (and sweep.json) in ``out_dir``."""
    import pandas as pd

    rows = summary_rows(doc)
    df = pd.DataFrame(rows)
    keys = {g["key"] for g in doc["grid"]}
    for col in df.columns:
        if col in keys:
            continue  # swept values stay as written (strings)
        if col.startswith("claim.") and col.endswith(".holds"):
            df[col] = df[col].astype("boolean")
        elif (col.startswith("claim.") and col.endswith(".value")) or col in ("wall_seconds", "headline"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        elif col in ("claims_held", "claims_declared"):
            df[col] = df[col].astype("Int64")
    paths = [out_dir / "summary.parquet", out_dir / "summary.md", out_dir / "heatmap.png", out_dir / "sweep.json"]
    df.to_parquet(paths[0], index=False)
    paths[1].write_text(summary_markdown(doc))
    write_heatmap(doc, paths[2])
    save_doc(doc, out_dir)
    return paths


# ============================================================================================ sweep.json
def sweep_dir(root: Path, sweep_id: str) -> Path:
    return root / "data" / "08_reporting" / pipeline_of(sweep_id) / "sweeps" / sweep_id


def save_doc(doc: Mapping[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".sweep.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, out_dir / "sweep.json")


def load_doc(root: Path, sweep_id: str) -> dict[str, Any]:
    path = sweep_dir(root, sweep_id) / "sweep.json"
    if not path.is_file():
        raise GridError(f"sweep {sweep_id}: no {path}")
    return json.loads(path.read_text())


def resume_todo(doc: Mapping[str, Any]) -> list[int]:
    """The points ``--resume`` reruns: every one that did not finish ok (failed, interrupted, never run)."""
    return [p["index"] for p in doc["points"] if p.get("status") != OK]


def find_sweep(sweep_id: str, project: Path) -> Path | None:
    """The sweep.json of ``sweep_id`` under ``project``'s data/08_reporting, or None."""
    try:
        path = sweep_dir(project, sweep_id) / "sweep.json"
    except GridError:
        return None
    return path if path.is_file() else None


def sweep_hold_rate_markdown(sweep_id: str, project: Path) -> str:
    """The claims' hold rates over a sweep (for ``python -m pipelines.core.scoreboard --sweep <id>``)."""
    path = find_sweep(sweep_id, project)
    if path is None:
        raise SystemExit(f"scoreboard: no sweep {sweep_id!r} under {project / 'data' / '08_reporting'}")
    doc = json.loads(path.read_text())
    ok = sum(p["status"] == OK for p in doc["points"])
    return (
        f"# Claim hold rates: sweep {sweep_id}\n\n`{doc['pipeline']}`, {len(doc['points'])} points, "
        f"{ok} ok. Details: `{path.parent / 'summary.md'}`.\n\n" + hold_rate_table(doc, per_point=False)
    )
