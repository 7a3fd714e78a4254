"""Start-up overhead of the platform: ``kedro run --pipeline=<m> --env=test`` for a trivial pipeline vs
bare Kedro running the same nodes, and ``kedro registry list``. Goal: overhead <= 1.5 s.

    python benchmarks/startup.py [--repeats 3] [--json out.json]

The trivial pipeline is the scaffold's template (ridge vs a mean baseline on 50+50 rows, one seed),
written into a throw-away copy of the package (never into src/), so the platform run pays for what every
method pays: parameter validation, versioned parquet/JSON/PNG saves, report stamping and MLflow logging
(parent + child runs into a fresh sqlite store). The bare run is a minimal Kedro project whose registry
returns the *same* namespaced pipeline, everything in memory (MemoryDatasets), kedro-mlflow's hook off.
Each command is a fresh process (what a user waits for); the median of ``--repeats`` runs is reported.
Not a test: timings on a shared machine are noisy, so nothing here asserts.
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

ROOT = Path(__file__).resolve().parents[1]
METHOD = "zz_bench_trivial"
KEDRO = str(Path(sys.executable).with_name("kedro"))


def platform_project(dest: Path, method: str = METHOD) -> Path:
    """A project folder (conf, data, pyproject) plus a copy of the package holding core and ``method`` only."""
    from pipelines.core.registry import discover_methods
    from pipelines.core.scaffold import scaffold

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "conf", dest / "conf", ignore=shutil.ignore_patterns("local"), dirs_exist_ok=True)
    for f in (dest / "conf").rglob("parameters_*.yml"):
        f.unlink()  # only the benchmark's method is registered in the copy
    (dest / "conf" / "local").mkdir(exist_ok=True)
    (dest / "data").mkdir(exist_ok=True)
    src = ROOT / "src" / "pipelines"
    others = set(discover_methods())
    shutil.copytree(
        src,
        dest / "src" / "pipelines",
        ignore=lambda d, names: [n for n in names if n == "__pycache__" or (Path(d) == src and n in others)],
    )
    scaffold(method, title="start-up benchmark", root=dest)
    return dest


def bare_project(dest: Path, method: str = METHOD) -> Path:
    """Bare Kedro: the same namespaced pipeline, parameters from the same files, no hooks, in memory."""
    pkg = dest / "src" / "bare_bench"
    pkg.mkdir(parents=True, exist_ok=True)
    (dest / "conf" / "base").mkdir(parents=True, exist_ok=True)
    (dest / "conf" / "local").mkdir(parents=True, exist_ok=True)
    (dest / "pyproject.toml").write_text(
        '[tool.kedro]\npackage_name = "bare_bench"\nproject_name = "bare-bench"\n'
        'kedro_init_version = "1.7.0"\nsource_dir = "src"\n'
    )
    (pkg / "__init__.py").write_text("")
    (dest / "conf" / "base" / "catalog.yml").write_text("{}\n")  # everything in memory
    # no plugin hooks: bare Kedro as the floor (kedro-mlflow, kedro-viz's run events, telemetry off)
    (pkg / "settings.py").write_text(
        'DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow", "kedro-mlflow", "kedro-viz", "kedro-telemetry")\n'
    )
    (pkg / "pipeline_registry.py").write_text(
        f"from pipelines.{method}.pipeline import create_pipeline\n\n\n"
        "def register_pipelines():\n    p = create_pipeline()\n"
        f"    return {{'{method}': p, '__default__': p}}\n"
    )
    return dest


def copy_params(platform: Path, bare: Path, method: str = METHOD) -> None:
    """The bare project gets the test-env parameters merged by hand (it has no soft merge)."""
    import yaml

    base = yaml.safe_load((platform / "conf" / "base" / f"parameters_{method}.yml").read_text())[method]
    test = yaml.safe_load((platform / "conf" / "test" / f"parameters_{method}.yml").read_text())[method]

    def merge(a: dict, b: dict) -> dict:
        return {
            **a,
            **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v for k, v in b.items()},
        }

    (bare / "conf" / "base" / "parameters.yml").write_text(yaml.safe_dump({method: merge(base, test)}))


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"benchmark: {' '.join(cmd)} failed in {cwd}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        plat = platform_project(Path(tmp) / "platform")
        bare = bare_project(Path(tmp) / "bare")
        copy_params(plat, bare)
        env = {
            **os.environ,
            "KEDRO_DISABLE_TELEMETRY": "true",
            "MPLBACKEND": "Agg",
            "PYTHONPATH": str(plat / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        env.pop("MLFLOW_TRACKING_URI", None)  # the platform run uses <copy>/mlflow.db
        cmds = {
            "platform: kedro run --pipeline=m --env=test": ([KEDRO, "run", f"--pipeline={METHOD}", "--env=test"], plat),
            "bare kedro: kedro run (same nodes, in memory)": ([KEDRO, "run", f"--pipeline={METHOD}"], bare),
            "kedro registry list": ([KEDRO, "registry", "list"], ROOT),
            "python -c 'import kedro' (floor)": ([sys.executable, "-c", "import kedro"], ROOT),
        }
        # one untimed warm-up each: the first run creates the sqlite store and fills the OS file cache
        for cmd, cwd in cmds.values():
            timed(cmd, cwd, env)
        times = {name: [timed(cmd, cwd, env) for _ in range(args.repeats)] for name, (cmd, cwd) in cmds.items()}

    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = med["platform: kedro run --pipeline=m --env=test"] - med["bare kedro: kedro run (same nodes, in memory)"]
    print(f"{'command':50s} {'median s':>9s}  runs")
    for k, v in times.items():
        print(f"{k:50s} {med[k]:9.2f}  {', '.join(f'{x:.2f}' for x in v)}")
    print(
        f"{'platform overhead (platform - bare)':50s} {overhead:9.2f}  goal <= 1.50 -> "
        f"{'met' if overhead <= 1.5 else 'NOT met'}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "runs_s": times,
                    "median_s": med,
                    "overhead_s": overhead,
                    "cpus": os.cpu_count(),
                    "load_avg": os.getloadavg(),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
