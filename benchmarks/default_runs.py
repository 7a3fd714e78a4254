"""Default runs, one after another, on whatever the machine has (run it on idle cores): wall time, CPU
time and the claims of each pipeline at default scale — the numbers method READMEs quote.

    python benchmarks/default_runs.py                              # every registered pipeline
    python benchmarks/default_runs.py --pipelines trsp hobit --out benchmarks/results/default_runs
    python benchmarks/default_runs.py --runners pool sequential --conditions idle loaded --threads auto 1 2 \
        --table docs/threads.md      # the runner x load x threads table of docs/threads.md

Each run is a fresh `python -m pipelines run --pipeline=<m>` process in a throw-away project copy (its own
data/ and MLflow store), `threads: auto` unless --threads says otherwise (a number N runs with
`--params <m>.threads=N`). Runners: `pool` (the default `kedro run`, core.pool.PoolRunner) and `sequential`
(`--runner=SequentialRunner`); conditions: `idle`, and `loaded` (one busy-looping process per usable CPU for the
length of the run, as benchmarks/contention.py). Each row has the wall and CPU time, the peak memory
of the whole process tree (PSS, sampled every 0.2 s: the driver plus its workers) and the load average before
the run. With --out, each report of the first combination is kept as <out>/<m>.report.json and a summary as
<out>/summary.md / summary.json; --table writes the markdown table between markers in that file.
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

RUNNERS = {"pool": [], "sequential": ["--runner", "SequentialRunner"]}


def _tree(root_pid: int) -> list[int]:
    """A process and all its descendants (Linux /proc); forkserver workers are the server's children."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _memory_kb(pid: int) -> int:
    """Proportional set size (shared pages of forked workers counted once overall), else RSS, in kB."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    try:
        pages = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[21])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, IndexError, ValueError):
        return 0


def _cpu_ticks(pid: int) -> int:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_mb(root_pid: int) -> float:
    """Memory of a process and all its descendants (PSS where the kernel gives it), in MB."""
    return sum(_memory_kb(p) for p in _tree(root_pid)) / 1024


def run_default(
    project: Path,
    pipeline: str,
    env: str = "base",
    runner: str = "pool",
    threads: str = "auto",
    condition: str = "idle",
) -> tuple[dict, dict]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PIPELINES_CONCURRENCY", "PIPELINES_THREADS", "OMP_NUM_THREADS")
    }
    environ.update(
        KEDRO_DISABLE_TELEMETRY="true", MPLBACKEND="Agg", MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}"
    )
    cmd = [sys.executable, "-m", "pipelines", "run", "--pipeline", pipeline, "--env", env, *RUNNERS[runner]]
    if threads != "auto":
        cmd += ["--params", f"{pipeline}.threads={threads}"]
    burners = []
    if condition == "loaded":
        from pipelines.core.cpus import usable_cpus

        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cpus())]
        time.sleep(0.5)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    peak = 0.0
    ticks: dict[int, int] = {}  # CPU of every process of the tree (workers are not all our children)
    try:
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(cmd, cwd=project, env=environ, stdout=out, stderr=subprocess.STDOUT, text=True)
            while proc.poll() is None:
                tree = _tree(proc.pid)
                peak = max(peak, sum(_memory_kb(p) for p in tree) / 1024)
                for p in tree[1:]:
                    ticks[p] = max(ticks.get(p, 0), _cpu_ticks(p))
                time.sleep(0.2)
            wall = time.perf_counter() - t0
            out.seek(0)
            log = out.read()
    finally:
        for b in burners:
            b.kill()
            b.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the driver (reaped: its rusage) plus what was seen of its descendants (forkserver workers are the
    # server's children, which nobody here reaps)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu += sum(ticks.values()) / os.sysconf("SC_CLK_TCK")
    if burners:  # the burners are children too: their CPU is not the run's
        cpu = float("nan")
    if proc.returncode != 0:
        tail = log.strip().splitlines()[-3:]
        raise RuntimeError(f"{pipeline} ({runner}, {condition}, threads {threads}) failed: {' | '.join(tail)}")
    reports = sorted((project / "data" / "08_reporting" / pipeline / "report.json").glob("*/report.json"))
    rep = json.loads(reports[-1].read_text())
    row = {
        "pipeline": pipeline,
        "runner": runner,
        "condition": condition,
        "threads_asked": threads,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1) if cpu == cpu else None,
        "peak_rss_mb": round(peak, 1),
        "workers": rep.get("workers"),
        "threads": rep.get("threads"),
        "claims_held": rep["claims_held"],
        "claims_declared": rep["claims_declared"],
        "load_before": round(load, 2),
        "verdicts": rep.get("verdicts", {}),
        "gates_failed": [g["id"] for g in rep.get("gates", []) if not g.get("passed")],
    }
    return row, rep


def _row_line(r: dict) -> str:
    v = r.get("verdicts", {})
    return (
        f"| {r['pipeline']} | {r.get('runner', 'sequential')} | {r.get('condition', 'idle')} | "
        f"{r.get('threads_asked', 'auto')} | {r['wall_s']} | {r['cpu_s']} | {r.get('peak_rss_mb')} | "
        f"{r.get('workers')} | {r['threads']} | "
        f"{r['claims_held']}/{r['claims_declared']} | "
        + " / ".join(str(v.get(k, 0)) for k in ("holds", "fails", "inconclusive", "untested"))
        + f" | {', '.join(r.get('gates_failed', [])) or '-'} | {r['load_before']} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipelines", nargs="+", default=None, help="default: every registered pipeline")
    ap.add_argument("--env", default="base")
    ap.add_argument("--out", type=Path, help="keep reports and the summary here")
    ap.add_argument("--runners", nargs="+", default=["pool"], choices=sorted(RUNNERS))
    ap.add_argument("--conditions", nargs="+", default=["idle"], choices=["idle", "loaded"])
    ap.add_argument("--threads", nargs="+", default=["auto"], help="auto, all, or numbers")
    ap.add_argument(
        "--table",
        type=Path,
        help="write the table into this markdown file, between "
        "<!-- default-runs:begin --> and <!-- default-runs:end -->",
    )
    args = ap.parse_args(argv)
    names = args.pipelines or discover_methods()
    rows, failures = [], []
    combos = [(r, c, t) for t in args.threads for c in args.conditions for r in args.runners]
    with tempfile.TemporaryDirectory() as tmp:
        project = make_project(Path(tmp) / "project")
        for m in names:
            for i, (runner, condition, threads) in enumerate(combos):
                try:
                    row, rep = run_default(project, m, args.env, runner, threads, condition)
                except RuntimeError as exc:
                    failures.append(str(exc))
                    print(exc, file=sys.stderr, flush=True)
                    continue
                rows.append(row)
                print(
                    f"{m} [{runner}, {condition}, threads {threads}]: {row['wall_s']} s wall, {row['cpu_s']} s CPU, "
                    f"peak {row['peak_rss_mb']} MB, {row['workers']} workers, {row['claims_held']}/"
                    f"{row['claims_declared']} claims (load before {row['load_before']:.2f})",
                    flush=True,
                )
                if args.out and i == 0:
                    args.out.mkdir(parents=True, exist_ok=True)
                    # how this report was made, for the README block (benchmarks/readme_tables.py)
                    rep["default_run"] = {
                        "wall_s": row["wall_s"],
                        "cpu_s": row["cpu_s"],
                        "load_before": row["load_before"],
                        "runner": runner,
                        "peak_rss_mb": row["peak_rss_mb"],
                        "usable_cpus": rep.get("usable_cpus"),
                        "date": time.strftime("%Y-%m-%d"),
                    }
                    (args.out / f"{m}.report.json").write_text(json.dumps(rep, indent=1))
                    gates = gates_table(rep)
                    (args.out / f"{m}.claims.md").write_text(
                        (gates + "\n\n" if gates else "") + claims_table(rep) + "\n"
                    )
    lines = [
        "| pipeline | runner | load | threads asked | wall s | CPU s | peak RSS MB | workers | threads used "
        "| claims held | holds / fails / inconclusive / untested | gates failed | load before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row_line(r) for r in rows]
    print("\n".join(lines))
    if args.table:
        write_table(args.table, "\n".join(lines))
    if args.out:  # a partial re-run updates its pipelines' rows and keeps the others'
        summary = args.out / "summary.json"
        kept = json.loads(summary.read_text())["rows"] if summary.is_file() else []
        done = {r["pipeline"] for r in rows}
        rows = [r for r in kept if r["pipeline"] not in done] + rows
        (args.out / "summary.md").write_text("\n".join(lines[:2] + [_row_line(r) for r in rows]) + "\n")
        summary.write_text(json.dumps({"rows": rows, "failures": failures}, indent=1))
    return 1 if failures else 0


def write_table(path: Path, table: str) -> None:
    """Replace the text between the default-runs markers of ``path`` (appended when it has none)."""
    begin, end = "<!-- default-runs:begin -->", "<!-- default-runs:end -->"
    text = path.read_text() if path.is_file() else ""
    block = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
