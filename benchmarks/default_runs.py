"""Default runs, one after another, on whatever the machine has (run it on idle cores): wall time, CPU
time and the claims of each pipeline at default scale — the numbers method READMEs quote.

    python benchmarks/default_runs.py                              # every registered pipeline
    python benchmarks/default_runs.py --pipelines trsp hobit --out benchmarks/results/default_runs

Each run is a fresh `python -m pipelines run --pipeline=<m>` process in a throw-away project copy (its own
data/ and MLflow store), `threads: auto`. With --out, each report is kept as <out>/<m>.report.json and a
summary as <out>/summary.md / summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contention import make_project  # noqa: E402

from pipelines.core.registry import discover_methods
from pipelines.core.report import claims_table, gates_table


def run_default(project: Path, pipeline: str, env: str = "base") -> tuple[dict, dict]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PIPELINES_CONCURRENCY", "PIPELINES_THREADS",
                                                                  "OMP_NUM_THREADS")}
    environ.update(KEDRO_DISABLE_TELEMETRY="true", MPLBACKEND="Agg",
                   MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pipelines", "run", "--pipeline", pipeline, "--env", env],
                         cwd=project, env=environ, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{pipeline} failed: {' | '.join(tail)}")
    reports = sorted((project / "data" / "08_reporting" / pipeline / "report.json").glob("*/report.json"))
    rep = json.loads(reports[-1].read_text())
    row = {"pipeline": pipeline, "wall_s": round(wall, 1),
           "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
           "threads": rep.get("threads"), "claims_held": rep["claims_held"],
           "claims_declared": rep["claims_declared"], "load_before": round(os.getloadavg()[0], 2),
           "verdicts": rep.get("verdicts", {}),
           "gates_failed": [g["id"] for g in rep.get("gates", []) if not g.get("passed")]}
    return row, rep


def _row_line(r: dict) -> str:
    v = r.get("verdicts", {})
    return (f"| {r['pipeline']} | {r['wall_s']} | {r['cpu_s']} | {r['threads']} | "
            f"{r['claims_held']}/{r['claims_declared']} | "
            + " / ".join(str(v.get(k, 0)) for k in ("holds", "fails", "inconclusive", "untested"))
            + f" | {', '.join(r.get('gates_failed', [])) or '-'} | {r['load_before']} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipelines", nargs="+", default=None, help="default: every registered pipeline")
    ap.add_argument("--env", default="base")
    ap.add_argument("--out", type=Path, help="keep reports and the summary here")
    args = ap.parse_args(argv)
    names = args.pipelines or discover_methods()
    rows, failures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        project = make_project(Path(tmp) / "project")
        for m in names:
            load = os.getloadavg()[0]
            try:
                row, rep = run_default(project, m, args.env)
            except RuntimeError as exc:
                failures.append(str(exc))
                print(exc, file=sys.stderr, flush=True)
                continue
            row["load_before"] = round(load, 2)
            rows.append(row)
            print(f"{m}: {row['wall_s']} s wall, {row['cpu_s']} s CPU, {row['claims_held']}/"
                  f"{row['claims_declared']} claims (load before {load:.2f})", flush=True)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                # how this report was made, for the README block (benchmarks/readme_tables.py)
                rep["default_run"] = {"wall_s": row["wall_s"], "cpu_s": row["cpu_s"], "load_before": row["load_before"],
                                      "usable_cpus": rep.get("usable_cpus"), "date": time.strftime("%Y-%m-%d")}
                (args.out / f"{m}.report.json").write_text(json.dumps(rep, indent=1))
                gates = gates_table(rep)
                (args.out / f"{m}.claims.md").write_text((gates + "\n\n" if gates else "") + claims_table(rep) + "\n")
    lines = ["| pipeline | wall s | CPU s | threads | claims held | holds / fails / inconclusive / untested "
             "| gates failed | load before |", "|---|---|---|---|---|---|---|---|"]
    lines += [_row_line(r) for r in rows]
    print("\n".join(lines))
    if args.out:   # a partial re-run updates its pipelines' rows and keeps the others'
        summary = args.out / "summary.json"
        kept = json.loads(summary.read_text())["rows"] if summary.is_file() else []
        done = {r["pipeline"] for r in rows}
        rows = [r for r in kept if r["pipeline"] not in done] + rows
        (args.out / "summary.md").write_text("\n".join(lines[:2] + [_row_line(r) for r in rows]) + "\n")
        summary.write_text(json.dumps({"rows": rows, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
