"""GPUNodeRunner against a real multi-node Ray cluster with token authentication: a head (no GPU) and a
worker node started with `ray start`, the worker declaring one logical GPU (Ray's resources are logical:
on this CPU machine it exercises scheduling, Ray sets CUDA_VISIBLE_DEVICES for the task and torch still
sees no CUDA). gpu nodes must run on that worker; the results (and a `kedro run`'s report) equal an inline
run's; a lost worker ends the run within a bounded time (failing with the node's name, or on CPU when
allowed); SIGTERM while a gpu node runs ends the MLflow run KILLED (exit 143) as inline; a driver without
the token gets one line. Drivers that join the cluster are processes of their own, started with the token
in their environment (Ray reads RAY_AUTH_MODE once, when its core library loads). Each node has 1 CPU; the
cluster is stopped by killing the process groups this module started (never `ray stop`, which would stop
every Ray instance on the machine)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from kedro.io import DataCatalog, MemoryDataset
from kedro.pipeline import node, pipeline

from pipelines.core.runner import GPUNodeRunner, RayConnectError, RayNodeLostError, probe_cluster
from tests.conftest import ROOT, make_project

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

FAST_HEALTH = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "4",
    "RAY_health_check_initial_delay_ms": "0",
}


# ------------------------------------------------------------------------- node functions (importable)
def make_data(n: int) -> torch.Tensor:
    return torch.arange(float(n))


def square(x: torch.Tensor) -> torch.Tensor:
    return x**2


def where_am_i(x: torch.Tensor) -> dict:
    node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None  # None inline
    return {"node_id": node_id, "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "sq": x, "sum": float(x.sum())}


def slow_first_time(marker: str, x: torch.Tensor) -> dict:
    """The first attempt announces itself and then sleeps (its node is killed meanwhile); a later
    attempt (the CPU fallback) returns at once."""
    if not Path(marker).exists():
        Path(marker).write_text(ray.get_runtime_context().get_node_id())
        time.sleep(600)
    return {"node_id": ray.get_runtime_context().get_node_id(), "y": float(x.sum())}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, tmp: Path):
        self.tmp, self.port = tmp, _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.token = secrets.token_hex(24)
        self.procs: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            **FAST_HEALTH,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PIPELINES_THREADS": "1",
        }
        self.env.pop("RAY_ADDRESS", None)

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        ray_bin = Path(sys.executable).with_name("ray")
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [str(ray_bin), "start", "--block", "--num-cpus=1", "--disable-usage-stats", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start_head(self) -> None:
        self._start(
            [
                "--head",
                f"--port={self.port}",
                "--num-gpus=0",
                "--include-dashboard=false",
                "--node-ip-address=127.0.0.1",
            ],
            "head",
        )
        self._wait_nodes(lambda nodes: len(nodes) >= 1, "head")

    def add_gpu_worker(self) -> subprocess.Popen:
        before = len(self.alive())
        proc = self._start(
            [f"--address={self.address}", "--num-gpus=1", "--node-ip-address=127.0.0.1"], f"worker{len(self.procs)}"
        )
        self._wait_nodes(
            lambda nodes: len(nodes) > before and any(n["Resources"].get("GPU") for n in nodes), "gpu worker"
        )
        return proc

    def alive(self) -> list[dict]:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import json, ray; ray.init(address=%r, logging_level='ERROR');"
                    "print(json.dumps([n for n in ray.nodes() if n['Alive']]))"
                )
                % self.address,
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            return []
        return json.loads(out.stdout.strip().splitlines()[-1])

    def gpu_node_ids(self) -> set[str]:
        return {n["NodeID"] for n in self.alive() if n["Resources"].get("GPU")}

    def _wait_nodes(self, ok, what: str, timeout: float = 240) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if ok(self.alive()):
                return
            time.sleep(1)
        raise RuntimeError(f"Ray {what} did not come up within {timeout} s; see {self.tmp}")

    @staticmethod
    def kill(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                self.kill(proc, signal.SIGTERM)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(tmp_path_factory.mktemp("ray_cluster"))
    try:
        c.start_head()
        c.worker = c.add_gpu_worker()
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()


# ------------------------------------------------------------------ drivers, each a process of its own
# Ray reads RAY_AUTH_MODE when its core library loads (once per process, and this test session has loaded
# it already), so a driver that joins the token-auth cluster is a fresh process whose environment holds
# the token from its start, as a `kedro run` against the cluster is. It writes what it saw as JSON.
def _encode(value):
    if isinstance(value, torch.Tensor):
        return {"tensor": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def gpu_pipeline():
    return pipeline(
        [
            node(make_data, "params:n", "x", name="data.make"),
            node(square, "x", "sq", name="train.square", tags=["gpu"]),
            node(where_am_i, "sq", "seen", name="train.probe", tags=["gpu"]),
        ]
    )


def _run_outputs(runner, pipe, catalog) -> dict:
    runner.run(pipe, catalog)
    return {name: _encode(catalog.load(name)) for name in pipe.outputs()}


def driver_main(spec_file: str) -> None:
    """``python -c 'from tests.core.test_ray_cluster import driver_main; driver_main(spec)'``"""

    spec = json.loads(Path(spec_file).read_text())
    runtime_env = {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}}
    result: dict = {"auth_mode": os.environ.get("RAY_AUTH_MODE")}
    runner = GPUNodeRunner(address=spec["address"], runtime_env=runtime_env, **spec.get("runner", {}))
    t0 = time.monotonic()
    try:
        probe_cluster(spec["address"])  # the preflight `kedro run` does: this driver may join
        if spec["scenario"] == "gpu":

            def catalog():
                return DataCatalog({"params:n": MemoryDataset(6)})

            result["inline"] = _run_outputs(GPUNodeRunner(address=None), gpu_pipeline(), catalog())
            result["outputs"] = _run_outputs(runner, gpu_pipeline(), catalog())
        else:  # "lose": one long gpu node, whose node the test kills
            pipe = pipeline(
                [node(slow_first_time, ["params:marker", "params:x"], "out", name="train.long", tags=["gpu"])]
            )
            catalog = DataCatalog(
                {"params:marker": MemoryDataset(spec["marker"]), "params:x": MemoryDataset(torch.ones(3))}
            )
            result["outputs"] = _run_outputs(runner, pipe, catalog)
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        result["error"] = {"types": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    result["seconds"] = time.monotonic() - t0
    result["placements"] = runner.placements
    result["ray_initialized_after"] = ray.is_initialized()
    Path(spec["out"]).write_text(json.dumps(result))


DRIVER_CODE = "import sys; from tests.core.test_ray_cluster import driver_main; driver_main(sys.argv[1])"


class Driver:
    def __init__(self, cluster: Cluster, tmp: Path, scenario: str, **spec):

        tmp.mkdir(parents=True, exist_ok=True)
        self.out, self.marker = tmp / "result.json", tmp / "started"
        spec_file = tmp / "spec.json"
        spec_file.write_text(
            json.dumps(
                {
                    "scenario": scenario,
                    "address": cluster.address,
                    "out": str(self.out),
                    "marker": str(self.marker),
                    **spec,
                }
            )
        )
        self.log = tmp / "driver.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", DRIVER_CODE, str(spec_file)],
                cwd=ROOT,
                env={**cluster.env, "KEDRO_DISABLE_TELEMETRY": "true"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def result(self, timeout: float = 180) -> dict:

        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            Cluster.kill(self.proc)
            raise AssertionError(f"driver still running after {timeout} s:\n{self.log.read_text()[-3000:]}") from None
        assert self.out.exists(), f"driver exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
        return json.loads(self.out.read_text())

    def wait_for_marker(self, timeout: float = 180) -> None:
        t0 = time.monotonic()
        while not self.marker.exists():
            assert self.proc.poll() is None, f"driver ended first:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() - t0 < timeout, f"the gpu node did not start within {timeout} s"
            time.sleep(0.2)


@pytest.fixture
def gpu_worker(cluster):
    """The cluster's GPU worker, started again if a test before killed it."""
    if cluster.worker.poll() is not None or not cluster.gpu_node_ids():
        cluster.worker = cluster.add_gpu_worker()
    return cluster.worker


def test_gpu_nodes_run_on_the_gpu_worker_and_match_inline(cluster, gpu_worker, tmp_path):
    gpu_ids = cluster.gpu_node_ids()
    assert len(gpu_ids) == 1
    got = Driver(cluster, tmp_path, "gpu").result()
    assert "error" not in got, got["error"]
    assert got["auth_mode"] == "token" and not got["ray_initialized_after"]  # it connected, so it disconnected
    placements = got["placements"]
    assert set(placements) == {"train.square", "train.probe"}  # data.make ran in the driver
    assert {p["node_id"] for p in placements.values()} == gpu_ids  # on the GPU worker, not the head
    assert all(p["gpu_ids"] == [0] for p in placements.values())
    seen = got["outputs"]["seen"]
    assert seen["node_id"] in gpu_ids and seen["cuda_visible"] == "0"  # Ray assigned the worker's GPU 0
    assert got["inline"]["seen"]["node_id"] is None  # inline: no Ray task
    # the same values (both at PIPELINES_THREADS=1), to the bit: JSON keeps every float exactly
    assert (
        seen["sq"]
        == got["inline"]["seen"]["sq"]
        == {"tensor": [float(i**2) for i in range(6)], "dtype": "torch.float32"}
    )
    assert seen["sum"] == got["inline"]["seen"]["sum"] == float(sum(i**2 for i in range(6)))


def test_driver_without_token_gets_one_line(cluster, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    t0 = time.monotonic()
    with pytest.raises(RayConnectError) as err:
        probe_cluster(cluster.address)
    assert time.monotonic() - t0 < 15
    msg = str(err.value)
    assert "\n" not in msg and "RAY_AUTH_MODE=token" in msg and "RAY_AUTH_TOKEN" in msg and cluster.address in msg


def test_kedro_run_without_token_one_line_no_mlflow_run(cluster, e2e_project):
    """`kedro run` against the cluster with no token: one line on stderr, no traceback, no MLflow run."""
    env = {k: v for k, v in cluster.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    db = e2e_project / "noauth.db"
    env.update(RAY_ADDRESS=cluster.address, MLFLOW_TRACKING_URI=f"sqlite:///{db}", KEDRO_DISABLE_TELEMETRY="true")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kedro",
            "run",
            "--pipeline=softtorch",
            "--env=test",
            "--runner=pipelines.core.runner.GPUNodeRunner",
        ],
        cwd=e2e_project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode != 0
    err_lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout
    assert any("RAY_AUTH_MODE=token" in ln and "RAY_AUTH_TOKEN" in ln for ln in err_lines), out.stderr[-2000:]
    if db.exists():
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{db}")
        runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
        assert not runs, [r.info.status for r in runs]


# ------------------------------------------------------------------------- `kedro run` on the cluster
PROBE = "zz_cluster_probe"
PROBE_PARAMS_PY = """
from typing import Literal
from pydantic import Field
from pipelines.core.params import MethodParams


class Params(MethodParams):
    variants: list[str] = Field(min_length=1)
    mode: Literal["ok", "wait"] = "ok"
    flag: str = ""
    n: int = Field(default=5, ge=1)
"""
PROBE_PIPELINE_PY = """
import os
import time

import torch
from kedro.pipeline import node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.report import build_report
from pipelines.core.variants import TRAIN_TAGS, variant_node
from pipelines.{m}.params import Params


def make_data(p: Params) -> torch.Tensor:
    return torch.linspace(0.0, 1.0, p.n)


def train_variant(x: torch.Tensor, p: Params, variant: str) -> dict:
    if variant == "b_slow" and p.mode == "wait":   # a gpu node that runs until the test stops the driver
        open(p.flag + ".waiting", "w").close()
        while not os.path.exists(p.flag):
            time.sleep(0.05)
    w = torch.tanh(x * {{"a_fast": 1.0, "b_slow": 2.0}}[variant]).sum()
    return {{"total": float(w), "gpu": str(os.environ.get("CUDA_VISIBLE_DEVICES"))}}


def report(p: Params, **out) -> dict:
    rows = [{{"variant": v, "seed": 0, "total": o["total"]}} for v, o in out.items()]
    return build_report("{m}", p, rows, {{"ratio": rows[1]["total"] / rows[0]["total"]}},
                        extra={{"gpu_seen": [o["gpu"] for o in out.values()]}})


def create_pipeline(**kwargs):
    variants = method_config("{m}")["variants"]
    outs = {{v: f"out_{{v}}_json" for v in variants}}
    return pipeline([
        node(make_data, "params:{m}", "data_tensors", name="data.make", tags=["data"]),
        *[variant_node(train_variant, v, ["data_tensors", "params:{m}"], outs[v], tags=[*TRAIN_TAGS, "gpu"])
          for v in variants],
        node(report, {{"p": "params:{m}", **outs}}, "report", name="evaluate.report", tags=["evaluate"]),
    ], namespace="{m}", parameters={{"params:{m}": "params:{m}"}})
"""
PROBE_PARAMS_YML = f"""{PROBE}:
  seeds: [0]
  variants: [a_fast, b_slow]
  claims:
    - id: slow_is_larger
      text: b_slow's total is larger than a_fast's
      metric: ratio
      op: ">="
      threshold: 1.0
"""


@pytest.fixture(scope="module")
def probe_project(tmp_path_factory):
    """A method whose two train nodes are tagged gpu (written into the package, removed after)."""
    pkg = ROOT / "src" / "pipelines" / PROBE
    pkg.mkdir(exist_ok=True)
    try:
        (pkg / "__init__.py").write_text("")
        (pkg / "params.py").write_text(PROBE_PARAMS_PY)
        (pkg / "pipeline.py").write_text(PROBE_PIPELINE_PY.format(m=PROBE))
        project = make_project(tmp_path_factory.mktemp("cluster_probe"))
        (project / "conf" / "base" / f"parameters_{PROBE}.yml").write_text(PROBE_PARAMS_YML)
        yield project
    finally:
        shutil.rmtree(pkg, ignore_errors=True)


def _kedro_run(cluster, project: Path, *params: str, on_cluster: bool = True) -> subprocess.Popen:
    env = {
        **cluster.env,
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
        "KEDRO_DISABLE_TELEMETRY": "true",
        "COLUMNS": "250",
    }
    if on_cluster:
        env["RAY_ADDRESS"] = cluster.address
    args = ["--params", ",".join(params)] if params else []
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kedro",
            "run",
            f"--pipeline={PROBE}",
            "--env=base",
            "--runner=pipelines.core.runner.GPUNodeRunner",
            *args,
        ],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 180) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        Cluster.kill(proc)
        raise AssertionError(f"`kedro run` still running after {timeout} s:\n{proc.stdout.read()[-3000:]}") from None
    return out


def _probe_reports(project: Path) -> list[dict]:
    files = sorted((project / "data" / "08_reporting" / PROBE / "report.json").glob("*/report.json"))
    return [json.loads(f.read_text()) for f in files]


def _parent_runs(project: Path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name(PROBE)
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]) if exp else []
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def test_kedro_run_on_the_cluster_gives_the_inline_report(cluster, gpu_worker, probe_project):
    """`kedro run` with the token in its environment: the gpu nodes run on the GPU worker (Ray gave each
    GPU 0) and the report equals an inline run's at the same thread count, timings and stamps aside."""
    from tests.core.test_runner import comparable

    inline_out = _finish(_kedro_run(cluster, probe_project, on_cluster=False))
    assert "Pipeline execution completed successfully" in inline_out, inline_out[-3000:]
    out = _finish(_kedro_run(cluster, probe_project))
    assert "Pipeline execution completed successfully" in out, out[-3000:]
    assert f"Completed node: {PROBE}.train.b_slow (Ray task" in out, out[-3000:]
    inline, on_ray = _probe_reports(probe_project)[-2:]
    assert inline["gpu_seen"] == ["None", "None"] and on_ray["gpu_seen"] == ["0", "0"]  # where they ran
    assert on_ray["threads"] == inline["threads"] and on_ray["threads_setting"] == inline["threads_setting"]
    on_ray, inline = ({k: v for k, v in comparable(r).items() if k != "gpu_seen"} for r in (on_ray, inline))
    assert on_ray == inline


def test_sigterm_during_a_ray_gpu_node_ends_the_mlflow_run_killed(cluster, gpu_worker, probe_project, tmp_path):
    """As an inline run (tests/core/test_run_lifecycle.py): SIGTERM while a gpu node runs on the cluster
    ends `kedro run` with 143 and one line, and its MLflow run KILLED; the cluster can run the next job."""
    flag = tmp_path / "flag"
    before = len(_parent_runs(probe_project))
    proc = _kedro_run(cluster, probe_project, f"{PROBE}.mode=wait", f"{PROBE}.flag={flag}")
    try:
        waiting = Path(str(flag) + ".waiting")
        t0 = time.monotonic()
        while not waiting.exists():
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() - t0 < 180, "the gpu node did not start within 180 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out = _finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            Cluster.kill(proc)
    assert proc.returncode == 143, out[-3000:]
    assert "marked KILLED" in out.strip().splitlines()[-1], out[-3000:]
    parents = _parent_runs(probe_project)
    assert len(parents) == before + 1 and parents[-1].info.status == "KILLED"
    # the interrupted task went with its driver: the GPU is free for the next run
    flag.touch()
    again = _finish(_kedro_run(cluster, probe_project, f"{PROBE}.mode=wait", f"{PROBE}.flag={flag}"))
    assert "Pipeline execution completed successfully" in again, again[-3000:]
    assert _parent_runs(probe_project)[-1].info.status == "FINISHED"


def _lose_worker_while_running(cluster, tmp_path, **runner_kw) -> tuple[dict, str]:
    driver = Driver(cluster, tmp_path, "lose", runner={"lost_node_timeout_s": 2, **runner_kw})
    driver.wait_for_marker()
    lost = driver.marker.read_text()  # the Ray node id the first attempt ran on
    cluster.kill(cluster.worker)
    return driver.result(timeout=150), lost


def test_lost_gpu_worker_fails_naming_the_node_then_falls_back(cluster, gpu_worker, tmp_path):
    names = {n["NodeID"]: n["NodeName"] for n in cluster.alive() if n["Resources"].get("GPU")}
    got, lost = _lose_worker_while_running(cluster, tmp_path / "a", max_retries=3)
    assert lost in names
    assert RayNodeLostError.__name__ in got.get("error", {}).get("types", []), got
    msg = got["error"]["message"]  # the gpu node, and the Ray node it lost by name and id
    assert "node 'train.long'" in msg and f"lost {names[lost]} (node id {lost[:12]})" in msg, msg
    assert "allow_cpu_fallback" in msg and "\n" not in msg
    assert got["seconds"] < 120  # bounded: node death noticed (fast health checks here) + lost_node_timeout_s

    cluster.worker = cluster.add_gpu_worker()
    got, lost = _lose_worker_while_running(cluster, tmp_path / "b", allow_cpu_fallback=True)
    assert "error" not in got, got["error"]
    assert got["seconds"] < 120
    out = got["outputs"]["out"]
    assert out["y"] == 3.0 and out["node_id"] != lost  # ran again, elsewhere (the head), on CPU
    assert got["placements"]["train.long"]["gpu_ids"] == []
