"""The scoreboard: every registered pipeline's latest report as one table (markdown, HTML, JSON), and
the regression check against an earlier scoreboard that the nightly workflow fails on.

    python -m pipelines.core.scoreboard                              # reports under data/08_reporting
    python -m pipelines.core.scoreboard --tracking-uri sqlite:///mlflow.db
    python -m pipelines.core.scoreboard --reports nightly/ --out scoreboard/ --compare-to prev/scoreboard.json
    python -m pipelines.core.scoreboard --sweep <sweep_id>          # claims' hold rates over a kedro sweep

Sources: a folder searched recursively for ``report.json`` files (Kedro's versioned layout
``<m>/report.json/<version>/report.json`` or CI artifacts), or an MLflow store (the ``report.json``
artifact of each pipeline's latest finished parent run). A registered pipeline with no report is a
row saying "not run", never an error.

The headline of a row is the report's optional ``headline`` block
``{metric, method, lower_is_better, baselines, tolerance}`` (and ``paper``), else the same keys in
``conf/base/parameters_<m>.yml``, else inferred from the first claim on ``relative_gain.<metric>.<a>_vs_<b>``
(a relative gain is defined for lower-is-better metrics) or on ``variants.<v>.<metric>``.

Regressions (exit code 1): a claim that held in the reference and no longer holds (or has no value); a
claim's value moved against its op by more than the claim's ``tolerance`` (when declared); the headline
method value worse than the reference by more than the headline tolerance (relative, default 5%); a
pipeline that had a report and now has none. A pipeline new since the reference is a note, not a regression.
Imports no method and no torch; mlflow only when reading a store.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.core.headline import finite as _num
from pipelines.core.headline import gain, headline_of, headline_values, infer_headline  # noqa: F401 (API too)

NOT_RUN = "not run"
DEFAULT_HEADLINE_TOLERANCE = 0.05
SCHEMA_VERSION = 1


# ----------------------------------------------------------------------------------------- loading
def _is_report(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("pipeline"), str) and "variants" in obj


def _report_key(report: Mapping[str, Any], path: Path | None = None) -> tuple:
    """Newest last: Kedro save versions are UTC timestamps (lexically ordered); mtime breaks ties."""
    return (str(report.get("save_version") or ""), path.stat().st_mtime if path else 0.0)


def latest_reports_from_dir(root: Path, env: str | None = None) -> dict[str, dict[str, Any]]:
    """The newest ``report.json`` per pipeline found anywhere under ``root`` (of one ``env`` if given)."""
    best: dict[str, tuple[tuple, dict[str, Any]]] = {}
    if not root.exists():
        return {}
    for path in sorted(root.rglob("report.json")):
        if not path.is_file():
            continue
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a half-written or foreign file is not a report
        if not _is_report(report) or (env is not None and report.get("env") != env):
            continue
        report.setdefault("_source", str(path))
        key = _report_key(report, path)
        m = report["pipeline"]
        if m not in best or key > best[m][0]:
            best[m] = (key, report)
    return {m: r for m, (_, r) in best.items()}


def latest_reports_from_mlflow(
    tracking_uri: str, run_filter: str = "", pipelines: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The report of the newest finished parent run per pipeline (``tags.role = 'parent'``) in the store,
    optionally narrowed by an MLflow filter such as ``tags.env = 'base'``."""
    out: dict[str, dict[str, Any]] = {}
    for run in parent_runs(tracking_uri, run_filter, pipelines):  # newest first
        m = run.data.tags.get("pipeline")
        if m in out:
            continue
        report = report_of_run(tracking_uri, run)
        if report is not None:
            out[report["pipeline"]] = report
    return out


def parent_runs(tracking_uri: str, run_filter: str = "", pipelines: Iterable[str] | None = None) -> list:
    """Finished parent runs, newest first, across every experiment of the store."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exps = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    if not exps:
        return []
    filt = "tags.role = 'parent' and attributes.status = 'FINISHED'"
    if run_filter.strip():
        filt += f" and {run_filter.strip()}"
    runs = []
    token = None
    while True:
        page = client.search_runs(
            [e.experiment_id for e in exps],
            filt,
            order_by=["attributes.start_time DESC"],
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    wanted = set(pipelines) if pipelines is not None else None
    return [r for r in runs if wanted is None or r.data.tags.get("pipeline") in wanted]


def report_of_run(tracking_uri: str, run) -> dict[str, Any] | None:
    """The ``report.json`` artifact of a parent run (None if absent), with the run id added."""
    import tempfile

    from mlflow.tracking import MlflowClient

    try:
        with tempfile.TemporaryDirectory(prefix="scoreboard_") as tmp:
            path = MlflowClient(tracking_uri=tracking_uri).download_artifacts(run.info.run_id, "report.json", tmp)
            report = json.loads(Path(path).read_text())
    except Exception:  # noqa: BLE001 - a run without the artifact is skipped, not fatal
        return None
    if not _is_report(report):
        return None
    report["run_id"] = run.info.run_id
    report["experiment_id"] = run.info.experiment_id
    return report


# ----------------------------------------------------------------------------------------- rows
@dataclass
class Row:
    pipeline: str
    status: str = NOT_RUN  # "ok" or "not run"
    paper: str | None = None
    headline: dict[str, Any] | None = None  # metric, method, lower_is_better (+ tolerance, inferred)
    method_value: float | None = None
    method_std: float | None = None
    best_baseline: str | None = None
    best_baseline_value: float | None = None
    relative_gain: float | None = None  # > 0: the method is better than its best baseline
    claims_held: int | None = None
    claims_declared: int | None = None
    claims: list[dict[str, Any]] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)  # holds / fails / inconclusive / untested
    gates_failed: list[str] = field(default_factory=list)
    wall_seconds: float | None = None
    env: str | None = None
    run_id: str | None = None
    save_version: str | None = None
    git_commit: str | None = None
    source: str | None = None


def row_from_report(report: Mapping[str, Any], project: Path | None = None) -> Row:
    m = report["pipeline"]
    head, paper = headline_of(report, project)
    claims = [
        {
            k: c.get(k)
            for k in ("id", "metric", "op", "threshold", "value", "holds", "tolerance", "verdict", "ci", "untested_by")
            if k in c
        }
        for c in report.get("claims") or []
    ]
    from pipelines.core.claims import verdict_counts

    row = Row(
        pipeline=m,
        status="ok",
        paper=paper,
        headline=head,
        claims=claims,
        verdicts=verdict_counts(claims),
        gates_failed=[g["id"] for g in report.get("gates") or [] if not g.get("passed")],
        claims_held=sum(bool(c.get("holds")) for c in claims),
        claims_declared=len(claims),
        wall_seconds=None if report.get("partial_run") else _num(report.get("wall_seconds")),
        env=report.get("env"),
        run_id=report.get("run_id"),
        save_version=report.get("save_version"),
        git_commit=report.get("git_commit"),
        source=report.get("_source"),
    )
    for k, v in headline_values(report, head).items():
        setattr(row, k, v)
    return row


def build_scoreboard(
    reports: Mapping[str, Mapping[str, Any]],
    pipelines: Sequence[str] | None = None,
    project: Path | None = None,
    source: str = "",
) -> dict[str, Any]:
    """Rows for ``pipelines`` (default: those with a report); the ones without a report say "not run"."""
    names = list(pipelines) if pipelines is not None else sorted(reports)
    names += sorted(set(reports) - set(names))  # a report of an unregistered pipeline is still shown
    rows = [row_from_report(reports[m], project) if m in reports else Row(pipeline=m) for m in names]
    return {
        "schema": SCHEMA_VERSION,
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": source,
        "rows": [asdict(r) for r in rows],
    }


# ----------------------------------------------------------------------------------------- regressions
def _worse_by(op: str, old: float, new: float) -> float:
    """How far ``new`` moved against the claim's direction (>= / > want larger values)."""
    return old - new if op in (">=", ">") else new - old


def compare(
    current: Mapping[str, Any],
    reference: Mapping[str, Any],
    headline_tolerance: float = DEFAULT_HEADLINE_TOLERANCE,
    allow_missing: bool = False,
) -> tuple[list[str], list[str]]:
    """(regressions, notes) of ``current`` against ``reference`` (both scoreboards)."""
    regressions: list[str] = []
    notes: list[str] = []
    ref = {r["pipeline"]: r for r in reference.get("rows", [])}
    cur = {r["pipeline"]: r for r in current.get("rows", [])}
    for m, row in cur.items():
        old = ref.get(m)
        if old is None or old.get("status") != "ok":
            if row.get("status") == "ok":
                notes.append(f"{m}: new since the reference (not compared)")
            continue
        if row.get("status") != "ok":
            (notes if allow_missing else regressions).append(f"{m}: had a report in the reference, now {NOT_RUN}")
            continue
        new_claims = {c["id"]: c for c in row.get("claims", [])}
        for c in old.get("claims", []):
            cid, now = c["id"], new_claims.get(c["id"])
            if now is None:
                notes.append(f"{m}: claim {cid} is no longer declared")
                continue
            if c.get("holds") and not now.get("holds"):
                regressions.append(
                    f"{m}: claim {cid} held ({_fmt(c.get('value'))} {c.get('op')} "
                    f"{_fmt(c.get('threshold'))}) and no longer holds ({_fmt(now.get('value'))})"
                )
                continue
            tol = _num(now.get("tolerance", c.get("tolerance")))
            ov, nv = _num(c.get("value")), _num(now.get("value"))
            if tol is not None and ov is not None and nv is not None and _worse_by(c["op"], ov, nv) > tol:
                regressions.append(
                    f"{m}: claim {cid} value {_fmt(nv)} is worse than the reference "
                    f"{_fmt(ov)} by more than its tolerance {tol:g}"
                )
        for cid in sorted(set(new_claims) - {c["id"] for c in old.get("claims", [])}):
            notes.append(f"{m}: claim {cid} is new")
        head, old_head = row.get("headline") or {}, old.get("headline") or {}
        nv, ov = _num(row.get("method_value")), _num(old.get("method_value"))
        same = head.get("metric") == old_head.get("metric") and head.get("method") == old_head.get("method")
        if head and same and nv is not None and ov is not None:
            tol = _num(head.get("tolerance"))
            tol = headline_tolerance if tol is None else tol
            lower = bool(head.get("lower_is_better", True))
            worse = (nv - ov) if lower else (ov - nv)
            if worse > tol * max(abs(ov), 1e-12):
                regressions.append(
                    f"{m}: headline {head['method']} {head['metric']} {_fmt(nv)} is worse than "
                    f"the reference {_fmt(ov)} by more than {tol:.0%}"
                )
        elif head and old_head and not same:
            notes.append(f"{m}: headline changed from {old_head.get('metric')} to {head.get('metric')} (not compared)")
    for m in sorted(set(ref) - set(cur)):
        notes.append(f"{m}: in the reference but no longer registered")
    return regressions, notes


# ----------------------------------------------------------------------------------------- rendering
def _fmt(x: Any, digits: int = 4) -> str:
    v = _num(x)
    return "n/a" if v is None else f"{v:.{digits}g}"


COLUMNS = (
    "pipeline",
    "paper",
    "headline metric",
    "method",
    "best baseline",
    "relative gain",
    "claims held",
    "holds / fails / inconclusive / untested",
    "gates",
    "wall time",
    "run",
    "commit",
)


def _cells(r: Mapping[str, Any]) -> list[str]:
    if r.get("status") != "ok":
        return [r["pipeline"], r.get("paper") or "", NOT_RUN] + [""] * (len(COLUMNS) - 3)
    head = r.get("headline") or {}
    metric = head.get("metric")
    if metric:
        metric = f"{metric} ({'↓' if head.get('lower_is_better', True) else '↑'})" + (
            " *" if head.get("inferred") else ""
        )
    method = ""
    if r.get("method_value") is not None:
        std = r.get("method_std")
        method = f"{head.get('method')}: {_fmt(r['method_value'])}" + (f" ± {_fmt(std, 2)}" if std else "")
    base = f"{r['best_baseline']}: {_fmt(r['best_baseline_value'])}" if r.get("best_baseline") else ""
    rg = r.get("relative_gain")
    held = f"{r.get('claims_held')}/{r.get('claims_declared')}"
    vc = r.get("verdicts") or {}
    verdicts = " / ".join(str(vc.get(k, 0)) for k in ("holds", "fails", "inconclusive", "untested"))
    gates = ("FAILED: " + ", ".join(r["gates_failed"])) if r.get("gates_failed") else "pass"
    wall = "" if r.get("wall_seconds") is None else f"{r['wall_seconds']:.1f} s"
    run = r.get("run_id") or r.get("save_version") or ""
    commit = (r.get("git_commit") or "")[:12] + ("-dirty" if str(r.get("git_commit", "")).endswith("-dirty") else "")
    return [
        r["pipeline"],
        r.get("paper") or "",
        metric or "n/a",
        method,
        base,
        "" if rg is None else f"{rg:+.1%}",
        held,
        verdicts,
        gates,
        wall,
        run,
        commit,
    ]


def to_markdown(
    board: Mapping[str, Any], regressions: Sequence[str] = (), notes: Sequence[str] = (), reference: str | None = None
) -> str:
    lines = [
        "# Scoreboard",
        "",
        f"Generated {board.get('generated_at', '')} from `{board.get('source', '')}`. "
        "Relative gain > 0: the method beats its best baseline on the headline metric "
        "(↓ lower is better, ↑ higher; * inferred from the claims).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in board.get("rows", []):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |")
    rows = board.get("rows", [])
    ungated = [(r["pipeline"], r["gates_failed"]) for r in rows if r.get("gates_failed")]
    if ungated:
        lines += [
            "",
            "**Experiments that test nothing yet** (a gate failed, so their claims are untested): "
            + "; ".join(f"{m} ({', '.join(g)})" for m, g in ungated)
            + ".",
        ]
    failing = [
        (r["pipeline"], c)
        for r in rows
        for c in r.get("claims", [])
        if not c.get("holds") and c.get("verdict") != "untested"
    ]
    if failing:
        lines += [
            "",
            "Claims that do not hold: "
            + ", ".join(
                f"{m}.{c['id']}" + (f" ({c['verdict']})" if c.get("verdict") not in (None, "fails") else "")
                for m, c in failing
            )
            + ".",
        ]
    if reference is not None:
        lines += ["", f"## Compared with `{reference}`", ""]
        lines += [f"- **regression**: {x}" for x in regressions] or ["- no regression"]
        lines += [f"- {x}" for x in notes]
    return "\n".join(lines) + "\n"


def to_html(
    board: Mapping[str, Any], regressions: Sequence[str] = (), notes: Sequence[str] = (), reference: str | None = None
) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = []
    for r in board.get("rows", []):
        cls = (
            "notrun"
            if r.get("status") != "ok"
            else ("fail" if (r.get("claims_held") or 0) < (r.get("claims_declared") or 0) else "ok")
        )
        body.append(f'<tr class="{cls}">' + "".join(f"<td>{esc(c)}</td>" for c in _cells(r)) + "</tr>")
    cmp = ""
    if reference is not None:
        items = [f'<li class="regression">regression: {esc(x)}</li>' for x in regressions] or ["<li>no regression</li>"]
        items += [f"<li>{esc(x)}</li>" for x in notes]
        cmp = f"<h2>Compared with <code>{esc(reference)}</code></h2><ul>{''.join(items)}</ul>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Scoreboard</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }} th, td {{ border: 1px solid #ccc; padding: .3em .6em; text-align: left; }}
th {{ background: #f3f3f3; }} tr.notrun td {{ color: #888; }} tr.fail td:nth-child(7) {{ color: #b00; font-weight: bold; }}
li.regression {{ color: #b00; font-weight: bold; }}
</style></head><body>
<h1>Scoreboard</h1>
<p>Generated {esc(board.get("generated_at", ""))} from <code>{esc(str(board.get("source", "")))}</code>.
Relative gain &gt; 0: the method beats its best baseline on the headline metric (↓ lower is better, ↑ higher;
* inferred from the claims).</p>
<table><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table>
{cmp}
</body></html>
"""


# ----------------------------------------------------------------------------------------- CLI
def load_reference(
    ref: str, tracking_uri: str | None, pipelines: Sequence[str] | None, project: Path | None
) -> dict[str, Any]:
    """``--compare-to``: a scoreboard JSON, a folder of reports, or ``mlflow:<filter>`` on the store."""
    if ref.startswith("mlflow:"):
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise SystemExit("scoreboard: --compare-to mlflow:<filter> needs --tracking-uri or MLFLOW_TRACKING_URI")
        return build_scoreboard(
            latest_reports_from_mlflow(uri, ref[len("mlflow:") :], pipelines), pipelines, project, source=ref
        )
    path = Path(ref)
    if path.is_dir():
        return build_scoreboard(latest_reports_from_dir(path), pipelines, project, source=str(path))
    if not path.is_file():
        raise SystemExit(f"scoreboard: --compare-to {ref!r}: no such file or folder")
    board = json.loads(path.read_text())
    if not isinstance(board, dict) or not isinstance(board.get("rows"), list):
        raise SystemExit(f"scoreboard: --compare-to {ref!r} is not a scoreboard JSON (no 'rows')")
    return board


def registered_pipelines() -> list[str]:
    from pipelines.core.registry import discover_methods

    return discover_methods()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipelines.core.scoreboard",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument(
        "--reports", type=Path, default=None, help="folder searched for report.json files (default: data/08_reporting)"
    )
    src.add_argument("--tracking-uri", default=None, help="read the reports from this MLflow store instead")
    ap.add_argument("--run-filter", default="", help="MLflow filter on parent runs, e.g. \"tags.env = 'base'\"")
    ap.add_argument(
        "--pipelines", default=None, help="comma-separated pipelines to show (default: the registered ones)"
    )
    ap.add_argument("--project", type=Path, default=Path.cwd(), help="project root (for conf/base declarations)")
    ap.add_argument("--out", type=Path, default=None, help="write scoreboard.{md,html,json} into this folder")
    ap.add_argument(
        "--compare-to", default=None, help="reference: a scoreboard JSON, a folder of reports, or mlflow:<run filter>"
    )
    ap.add_argument(
        "--headline-tolerance",
        type=float,
        default=DEFAULT_HEADLINE_TOLERANCE,
        help="relative worsening of the headline metric flagged as a regression (default 0.05)",
    )
    ap.add_argument(
        "--env",
        default="base",
        help="only reports of this Kedro env (default base: the default-scale runs); 'any' for all",
    )
    ap.add_argument(
        "--allow-missing", action="store_true", help="a pipeline without a report now is a note, not a regression"
    )
    ap.add_argument(
        "--sweep",
        default=None,
        metavar="SWEEP_ID",
        help="print each claim's hold rate over a `kedro sweep` (its sweep.json) and exit",
    )
    args = ap.parse_args(argv)
    if args.sweep:
        from pipelines.core.sweep import sweep_hold_rate_markdown

        sys.stdout.write(sweep_hold_rate_markdown(args.sweep, args.project))
        return 0

    pipelines = (
        [p.strip() for p in args.pipelines.split(",") if p.strip()] if args.pipelines else registered_pipelines()
    )
    project = args.project if (args.project / "conf").is_dir() else None
    env = None if args.env == "any" else args.env
    if args.tracking_uri:
        run_filter = args.run_filter
        if env is not None and "tags.env" not in run_filter:
            run_filter = " and ".join(f for f in (run_filter, f"tags.env = '{env}'") if f)
        reports, source = latest_reports_from_mlflow(args.tracking_uri, run_filter, None), args.tracking_uri
    else:
        root = args.reports or (args.project / "data" / "08_reporting")
        reports, source = latest_reports_from_dir(root, env), str(root)
    board = build_scoreboard(reports, pipelines, project, source=source)

    regressions: list[str] = []
    notes: list[str] = []
    if args.compare_to:
        reference = load_reference(args.compare_to, args.tracking_uri, pipelines, project)
        regressions, notes = compare(board, reference, args.headline_tolerance, args.allow_missing)
        board["compared_to"] = {"reference": args.compare_to, "regressions": regressions, "notes": notes}
    md = to_markdown(board, regressions, notes, args.compare_to)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scoreboard.md").write_text(md)
        (args.out / "scoreboard.html").write_text(to_html(board, regressions, notes, args.compare_to))
        (args.out / "scoreboard.json").write_text(json.dumps(board, indent=2))
    sys.stdout.write(md)
    if regressions:
        sys.stderr.write(f"scoreboard: {len(regressions)} regression(s) against {args.compare_to}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
