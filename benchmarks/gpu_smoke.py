"""GPU smoke: every ``gpu``-tagged node of every method, on one device, at small sizes, in one command.

    python benchmarks/gpu_smoke.py                      # CUDA, --env=test sizes, every method
    python benchmarks/gpu_smoke.py --device cpu --methods adamspike,credal_dro --out /tmp/smoke.md

Each method runs in its own process (a fresh CUDA context) in a throw-away copy of the project:
``kedro run --pipeline=<m> --env=<env> --runner=pipelines.core.runner.GPUNodeRunner --to-nodes=<its gpu
nodes>`` (inline backend: the nodes run in that process, as SequentialRunner runs them), with
``<m>.device=<device>`` where the method has a ``device`` parameter. ``--device cpu`` also hides every GPU
(``CUDA_VISIBLE_DEVICES=""``): the same path, on the CPU. A hook records, for each ``gpu`` node, the
devices the node preamble handed out (``core.runtime.get_device``, which ``node_setup`` calls), the CUDA
memory it allocated (``torch.cuda.max_memory_allocated`` over the node) and its wall time. A node is
``ok`` when it finished and ran where it was asked: on ``cuda`` it was handed ``cuda`` and allocated CUDA
memory; on ``cpu`` it was handed only ``cpu`` and allocated none.

Writes a markdown table (method, node, device, CUDA MiB, seconds, ok, note) to ``--out`` and prints it;
exits 1 when a node is not ok. Seconds are wall time on whatever machine ran it: a record, not a claim.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = "pipelines.core.runner.GPUNodeRunner"


# ============================================================================ in the method's process
class _Recorder:
    """Kedro hooks (registered with the project's own): one row per ``gpu`` node."""

    def __init__(self, method: str, device: str) -> None:
        self.method, self.device = method, device
        self.rows: list[dict] = []
        self.handed: list[str] = []  # devices core.runtime.get_device returned during the node
        self._t0 = 0.0

    def wrap_get_device(self) -> None:
        from pipelines.core import runtime

        original = runtime.get_device

        def get_device(prefer: str = "auto"):
            dev = original(prefer)
            self.handed.append(dev.type)
            return dev

        runtime.get_device = get_device

    @staticmethod
    def _cuda():
        import torch

        return torch.cuda if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def before_node_run(self, node) -> None:
        if "gpu" not in node.tags:
            return
        self.handed.clear()
        cuda = self._cuda()
        if cuda is not None:
            cuda.synchronize()
            cuda.reset_peak_memory_stats()
        self._t0 = time.perf_counter()

    def _finish(self, node, error: BaseException | None) -> None:
        if "gpu" not in node.tags:
            return
        cuda = self._cuda()
        if cuda is not None:
            cuda.synchronize()
        seconds = time.perf_counter() - self._t0
        peak = cuda.max_memory_allocated() if cuda is not None else 0
        handed = sorted(set(self.handed))
        row = {
            "method": self.method,
            "node": node.name,
            "device": ",".join(handed) or "-",
            "cuda_mib": round(peak / 2**20, 1),
            "seconds": round(seconds, 2),
        }
        row["ok"], row["note"] = judge(self.device, handed, peak, error)
        self.rows.append(row)


def judge(device: str, handed: list[str], peak_bytes: int, error: BaseException | None) -> tuple[bool, str]:
    """Whether a gpu node ran where it was asked, and why not (one line)."""
    if error is not None:
        return False, " ".join(f"{type(error).__name__}: {error}".split())[:200]
    if not handed:
        return False, "the node never asked core.runtime for a device (node_setup / get_device)"
    if device == "cuda":
        if "cuda" not in handed:
            return False, f"handed {','.join(handed)}, not cuda"
        if peak_bytes <= 0:
            return False, "handed cuda but allocated no CUDA memory"
        return True, ""
    if handed != ["cpu"] or peak_bytes > 0:
        return False, f"asked for cpu, handed {','.join(handed)}, {peak_bytes} CUDA bytes"
    return True, ""


def gpu_nodes(method: str, env: str, params: dict) -> list[str]:
    """The method's ``gpu`` nodes as a run with ``env`` and ``params`` builds them (variants can differ)."""
    from pipelines.core import runctx
    from pipelines.core.registry import load_pipeline

    runctx.set_run_config(env, None, params)
    try:
        return [n.name for n in load_pipeline(method).nodes if "gpu" in n.tags]
    finally:
        runctx.set_run_config(None, None, {})


def run_one(method: str, device: str, env: str, project: Path) -> list[dict]:
    """Run ``method``'s gpu nodes (and what they need) in this process; one row per gpu node."""
    from kedro.framework.hooks import hook_impl

    os.chdir(project)
    rec = _Recorder(method, device)
    rec.wrap_get_device()

    class Hooks:
        @hook_impl
        def before_node_run(self, node):
            rec.before_node_run(node)

        @hook_impl
        def after_node_run(self, node):
            rec._finish(node, None)

        @hook_impl
        def on_node_error(self, error, node):
            rec._finish(node, error)

    import pipelines.settings as project_settings

    project_settings.HOOKS = (*project_settings.HOOKS, Hooks())
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(project)
    from pipelines.core.registry import method_config

    params = {}
    if "device" in method_config(method, env=env):
        params = {method: {"device": device}}
    nodes = gpu_nodes(method, env, params)
    if not nodes:
        return []
    from pipelines.cli import run

    args = ["--pipeline", method, "--env", env, "--runner", RUNNER, "--to-nodes", ",".join(nodes)]
    if params:
        args += ["--params", f"{method}.device={device}"]
    try:
        run.main(args, standalone_mode=False)
        failure = None
    except SystemExit as exc:
        failure = None if exc.code in (0, None) else f"exit {exc.code}"
    except Exception as exc:  # noqa: BLE001 - reported in the table, one line
        failure = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    seen = {r["node"] for r in rec.rows}
    for name in nodes:  # a gpu node that never ran (an upstream node or the run failed first)
        if name not in seen:
            rec.rows.append(
                {
                    "method": method,
                    "node": name,
                    "device": "-",
                    "cuda_mib": 0.0,
                    "seconds": 0.0,
                    "ok": False,
                    "note": f"did not run ({failure or 'not reached'})",
                }
            )
    return rec.rows


# ============================================================================================ driver
def methods_with_gpu_nodes() -> list[str]:
    from pipelines.core.registry import discover_methods

    return list(discover_methods())


def make_project(dest: Path) -> Path:
    """A throw-away project: conf (no local), pyproject, empty data/ and its own MLflow store."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "conf", dest / "conf", ignore=shutil.ignore_patterns("local"), dirs_exist_ok=True)
    for sub in ("conf/local", "src", "data"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    return dest


def markdown(rows: list[dict], device: str, env: str) -> str:
    head = (
        f"GPU smoke: every `gpu` node at `--env={env}`, asked for `{device}` "
        f"({sum(r['ok'] for r in rows)} of {len(rows)} ok)\n\n"
        "| method | node | device | CUDA MiB | seconds | ok | note |\n|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r['method']} | `{r['node']}` | {r['device']} | {r['cuda_mib']:g} | {r['seconds']:g} | "
        f"{'yes' if r['ok'] else '**no**'} | {r['note'].replace('|', '/')} |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--env", default="test", help="sizes (default: test)")
    ap.add_argument("--methods", default=None, help="comma-separated subset (default: every method)")
    ap.add_argument(
        "--out", type=Path, default=None, help="markdown table (default: benchmarks/results/gpu_smoke_<device>.md)"
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per method")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one method here
    ap.add_argument("--project", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        rows = run_one(a.one, a.device, a.env, a.project)
        a.json.write_text(json.dumps(rows))
        return 0

    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_smoke: --device cuda, but torch sees no CUDA device (use --device cpu)", file=sys.stderr)
            return 2
    methods = a.methods.split(",") if a.methods else methods_with_gpu_nodes()
    out = a.out or ROOT / "benchmarks" / "results" / f"gpu_smoke_{a.device}.md"
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "true", "MPLBACKEND": "Agg"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("RAY_ADDRESS", None)  # inline backend: the nodes run in the method's process
    if a.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        project = make_project(Path(tmp) / "project")
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{project / 'mlflow.db'}"
        for m in methods:
            js = Path(tmp) / f"{m}.json"
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--one",
                m,
                "--device",
                a.device,
                "--env",
                a.env,
                "--project",
                str(project),
                "--json",
                str(js),
            ]
            try:
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout, check=False)
                got = json.loads(js.read_text()) if js.exists() else None
                if got is None:
                    tail = [ln for ln in (res.stderr or "").splitlines() if ln.strip()][-1:] or [
                        f"exit {res.returncode}"
                    ]
                    got = [
                        {
                            "method": m,
                            "node": "-",
                            "device": "-",
                            "cuda_mib": 0.0,
                            "seconds": 0.0,
                            "ok": False,
                            "note": tail[0][:200],
                        }
                    ]
            except subprocess.TimeoutExpired:
                got = [
                    {
                        "method": m,
                        "node": "-",
                        "device": "-",
                        "cuda_mib": 0.0,
                        "seconds": a.timeout,
                        "ok": False,
                        "note": f"ran past --timeout {a.timeout:g} s",
                    }
                ]
            rows += got
            for r in got:
                print(
                    f"{r['method']:12s} {r['node']:40s} {r['device']:5s} {r['seconds']:8.2f}s "
                    f"{'ok' if r['ok'] else 'NOT OK ' + r['note']}",
                    flush=True,
                )
    table = markdown(rows, a.device, a.env)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"\n{table}\nwritten to {out}")
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
