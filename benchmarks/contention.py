"""Thread policy under load: wall time of default runs idle vs with one busy process per core, and idle
with the platform's OpenMP policy vs OpenMP's default, interleaved in one session.

    python benchmarks/contention.py                               # tess, wedlm, rankcal at default scale
    python benchmarks/contention.py --pipelines rankcal --env test --rounds 3
    python benchmarks/contention.py --out benchmarks/results/contention.json

Conditions, each a fresh `python -m pipelines run --pipeline=<m> --env=<env>` process in a throw-away
project copy (its own data/ and MLflow store), `threads: auto`:
  idle      nothing else running; OMP_WAIT_POLICY unset (the package makes it PASSIVE)
  loaded    one busy-looping process per usable CPU, started before the run and stopped after it
  idle_off  idle, OMP_WAIT_POLICY set to the empty string: OpenMP's own default (the platform leaves a
            user's setting alone, and libgomp treats an empty value as unset)
  loaded_off  loaded, with OpenMP's own default
Rounds interleave the conditions (idle, loaded, idle_off, then rotated), so drift hits them alike. Goals:
loaded ≤ 2.5× idle for each pipeline; idle no more than 5% slower than idle_off.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipelines.core.cpus import usable_cpus

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ("idle", "loaded", "idle_off", "loaded_off")


def make_project(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "conf", dest / "conf", ignore=shutil.ignore_patterns("local"), dirs_exist_ok=True)
    (dest / "conf" / "local").mkdir(exist_ok=True)
    (dest / "src").mkdir(exist_ok=True)
    (dest / "data").mkdir(exist_ok=True)
    return dest


def run_once(project: Path, pipeline: str, env: str, condition: str) -> dict:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "PIPELINES_CONCURRENCY", "PIPELINES_THREADS", "OMP_NUM_THREADS")
    }
    environ.update(
        KEDRO_DISABLE_TELEMETRY="true", MPLBACKEND="Agg", MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}"
    )
    if condition.endswith("_off"):
        environ["OMP_WAIT_POLICY"] = ""
    burners = []
    if condition.startswith("loaded"):
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cpus())]
        time.sleep(0.5)
    try:
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "pipelines", "run", "--pipeline", pipeline, "--env", env],
            cwd=project,
            env=environ,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
    finally:
        for b in burners:
            b.kill()
            b.wait()
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"{pipeline} ({condition}) failed: {' | '.join(tail)}")
    reports = sorted((project / "data" / "08_reporting" / pipeline / "report.json").glob("*/report.json"))
    rep = json.loads(reports[-1].read_text())
    return {
        "pipeline": pipeline,
        "condition": condition,
        "wall_s": wall,
        "threads": rep.get("threads"),
        "omp_wait_policy": rep.get("omp_wait_policy"),
    }


def summarise(rows: list[dict], pipelines: list[str], conditions=CONDITIONS) -> tuple[str, list[dict]]:
    """Median wall seconds per condition, and the two ratios the goals are about where measured."""
    out = []
    head = [*(f"{c} s" for c in conditions), "loaded / idle", "idle / idle_off", "loaded_off / idle_off"]
    lines = ["| pipeline | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for m in pipelines:
        med = {
            c: statistics.median(r["wall_s"] for r in rows if r["pipeline"] == m and r["condition"] == c)
            for c in conditions
        }

        def ratio(a: str, b: str) -> float | None:
            return med[a] / med[b] if a in med and b in med else None

        row = {
            "pipeline": m,
            **{f"{c}_s": med[c] for c in conditions},
            "loaded_over_idle": ratio("loaded", "idle"),
            "idle_over_default": ratio("idle", "idle_off"),
            "loaded_off_over_idle_off": ratio("loaded_off", "idle_off"),
        }
        out.append(row)
        cells = [f"{med[c]:.1f}" for c in conditions]
        cells += [
            f"{v:.2f}×" if v is not None else ""
            for v in (row["loaded_over_idle"], row["idle_over_default"], row["loaded_off_over_idle_off"])
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipelines", nargs="+", default=["tess", "wedlm", "rankcal"])
    ap.add_argument("--env", default="base")
    ap.add_argument("--rounds", type=int, default=1, help="each condition this many times per pipeline")
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=CONDITIONS)
    ap.add_argument("--out", type=Path, help="write the rows and the summary as JSON here")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="contention-") as tmp:
        project = make_project(Path(tmp) / "project")
        for r in range(args.rounds):
            for m in args.pipelines:
                conds = tuple(args.conditions)
                order = conds[r % len(conds) :] + conds[: r % len(conds)]
                for c in order:
                    row = run_once(project, m, args.env, c)
                    rows.append({**row, "round": r})
                    print(
                        f"round {r} {m:8s} {c:9s} {row['wall_s']:7.1f} s  threads={row['threads']} "
                        f"omp={row['omp_wait_policy']!r}",
                        flush=True,
                    )
    table, summary = summarise(rows, args.pipelines, args.conditions)
    print(f"\n{usable_cpus()} usable CPUs, env {args.env}, {args.rounds} round(s), medians:\n")
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"rows": rows, "summary": summary, "env": args.env, "cpus": usable_cpus()}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
