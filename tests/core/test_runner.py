"""GPUNodeRunner: configuration, the inline backend (= SequentialRunner), the local Ray backend with CPU
fallback (same results and report as inline), fail-fast without GPUs, retry of a killed worker, remote
errors naming the node, and CUDA outputs converted or rejected. CPU only; Ray tests share one local
2-CPU instance started and stopped by a module fixture."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from kedro.io import DataCatalog, MemoryDataset
from kedro.pipeline import node, pipeline
from kedro.runner import SequentialRunner

from pipelines.core.registry import discover_methods
from pipelines.core.runner import (
    CudaOutputError,
    GPUNodeRunner,
    GPUUnavailableError,
    RemoteNodeError,
    RunnerConfigError,
    RunnerConfigHooks,
    SignalRelay,
    _cpu_outputs,
    load_runner_conf,
    node_gpus,
    resolve_config,
)
from pipelines.core.scaffold import scaffold
from tests.conftest import ROOT, run_kedro

RUNNER = "pipelines.core.runner.GPUNodeRunner"


# ----------------------------------------------------------------------- node functions (importable)
def make_data(n: int) -> torch.Tensor:
    return torch.arange(float(n))


def square(x: torch.Tensor) -> torch.Tensor:
    return x**2


def cube(x: torch.Tensor) -> torch.Tensor:
    return x**3


def combine(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"total": float((a + b).sum())}


def node_and_device() -> dict:
    """What a node sees in its process: the node name (NaN errors use it) and the device helper."""
    from pipelines.core.runctx import current_node
    from pipelines.core.runner import assigned_device
    from pipelines.core.runtime import get_device

    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # pretend the worker sees a GPU Ray did not assign to us
    try:
        device = assigned_device(), str(get_device())
    finally:
        torch.cuda.is_available = real
    return {"node": current_node.get(), "device": device, "pid": os.getpid()}


def die_once(marker: str, x: torch.Tensor) -> torch.Tensor:
    """Kill the worker process the first time (as an OOM kill or a lost node would)."""
    if not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)
    return x + 1


def fail(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom in the remote node")


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that reports a CUDA device (this machine has no GPU)."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    def detach(self):
        return self

    def cpu(self):
        return self.as_subclass(torch.Tensor).clone()


def cuda_out(x: torch.Tensor) -> dict:
    return {"w": x.clone().as_subclass(FakeCudaTensor), "n": 3}


def toy_pipeline(gpu_tags=("gpu",)):
    return pipeline(
        [
            node(make_data, "params:n", "x", name="data.make", tags=["data"]),
            node(square, "x", "sq", name="train.square", tags=["train", *gpu_tags]),
            node(cube, "x", "cu", name="train.cube", tags=["train", *gpu_tags]),
            node(combine, ["sq", "cu"], "summary", name="evaluate.combine", tags=["evaluate"]),
        ]
    )


def toy_catalog(**extra) -> DataCatalog:
    return DataCatalog({"params:n": MemoryDataset(5), **{k: MemoryDataset(v) for k, v in extra.items()}})


def run_toy(runner, pipe=None, catalog=None) -> dict:
    catalog = catalog or toy_catalog()
    pipe = pipe or toy_pipeline()
    runner.run(pipe, catalog)
    return {name: catalog.load(name) for name in pipe.outputs()}  # intermediates are released


# --------------------------------------------------------------------------------- configuration
def test_config_precedence_and_validation():
    conf = {"address": None, "num_gpus": 2, "max_retries": 1}
    assert resolve_config({}, conf, environ={}).backend == "inline"
    cfg = resolve_config({}, conf, environ={"RAY_ADDRESS": "ray://head:10001"})
    assert (cfg.backend, cfg.address, cfg.num_gpus, cfg.max_retries) == ("ray", "ray://head:10001", 2, 1)
    cfg = resolve_config({"address": "local", "max_retries": 0}, conf, environ={"RAY_ADDRESS": "auto"})
    assert (cfg.address, cfg.max_retries) == ("local", 0)
    assert resolve_config({"address": None}, {}, environ={"RAY_ADDRESS": "auto"}).backend == "inline"
    for none in ("none", "inline", ""):
        assert resolve_config({"address": none}, {}, environ={}).backend == "inline"
    with pytest.raises(RunnerConfigError, match="'allow_cpu_fallbak'.*unknown key"):
        GPUNodeRunner(allow_cpu_fallbak=True)
    with pytest.raises(RunnerConfigError, match="'cuda_outputs' \\(runner.yml\\)"):
        resolve_config({}, {"cuda_outputs": "ignore"}, environ={})
    with pytest.raises(RunnerConfigError, match="'num_gpus'"):
        resolve_config({"num_gpus": -1}, {}, environ={})


def test_runner_yml_is_merged_per_env(e2e_project, monkeypatch):
    monkeypatch.chdir(e2e_project)
    base, test = load_runner_conf("local"), load_runner_conf("test")
    assert base["address"] is None and base["allow_cpu_fallback"] is False and base["num_gpus"] == 1
    assert test["allow_cpu_fallback"] is True and test["local_cpus"] == 2 and test["num_gpus"] == 1


def test_config_hook_captures_the_sessions_runner_conf(monkeypatch):
    """Registered in settings.HOOKS, the hook hands the runner the session's env-merged runner.yml."""
    import pipelines.core.runner as runner_mod

    class Context:
        env = "test"
        config_loader = {"runner": {"address": "none", "max_retries": 7}}

    monkeypatch.setattr(runner_mod, "_session", {})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    RunnerConfigHooks().after_context_created(Context())
    runner = GPUNodeRunner(cpus_per_node=2)
    run_toy(runner)
    assert (runner.config.max_retries, runner.config.cpus_per_node, runner.config.backend) == (7, 2, "inline")


def test_gpu_tags():
    tagged = toy_pipeline(("gpu", "gpus-2")).nodes
    by_name = {n.name: node_gpus(n, 1) for n in tagged}
    assert by_name == {"data.make": None, "train.square": 2.0, "train.cube": 2.0, "evaluate.combine": None}
    assert node_gpus(node(square, "x", "y", name="a", tags=["gpu"]), 1) == 1
    assert node_gpus(node(square, "x", "y", name="b", tags=["gpu", "gpus-0.5"]), 1) == 0.5
    assert node_gpus(node(square, "x", "y", name="c", tags=["gpus-4"]), 1) is None  # no gpu tag: driver


def test_cuda_outputs_converted_or_rejected():
    fake = torch.arange(3.0).as_subclass(FakeCudaTensor)
    out = _cpu_outputs("train.fit", {"m.w": [fake, 1], "m.df": "kept"}, "convert")
    assert type(out["m.w"][0]) is torch.Tensor and out["m.w"][0].device.type == "cpu"
    assert torch.equal(out["m.w"][0], torch.arange(3.0)) and out["m.df"] == "kept"
    with pytest.raises(CudaOutputError, match=r"node 'train.fit' returned a cuda:0 tensor at outputs\['m.w'\]\[1\]"):
        _cpu_outputs("train.fit", {"m.w": (torch.zeros(1), fake)}, "reject")


def test_inline_backend_is_sequential(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    reference = run_toy(SequentialRunner())
    runner = GPUNodeRunner()
    got = run_toy(runner)
    assert runner.config.backend == "inline" and not runner.placements
    assert got["summary"] == reference["summary"] == {"total": float(sum(i**2 + i**3 for i in range(5)))}
    assert "ray" not in str(runner)


def test_signal_relay_gives_back_the_sigterm_handlers_exception():
    """Ray's blocking calls turn what a signal handler raises into a bare KeyboardInterrupt; inside the
    relay the run still ends with kedro run's RunInterrupted (exit 143 "terminated (SIGTERM)", as inline)."""
    import signal

    from pipelines.cli import RunInterrupted, _on_sigterm

    def ray_like_wait():  # what ray.wait does when a signal arrives while it blocks
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with pytest.raises(KeyboardInterrupt) as bare:
            ray_like_wait()
        assert type(bare.value) is KeyboardInterrupt  # without the relay: a Ctrl-C
        with pytest.raises(RunInterrupted, match=r"terminated \(SIGTERM\)"), SignalRelay():
            ray_like_wait()
        assert signal.getsignal(signal.SIGTERM) is _on_sigterm  # the caller's handler is back
        with pytest.raises(KeyboardInterrupt) as ctrl_c, SignalRelay():
            raise KeyboardInterrupt()  # a real Ctrl-C stays one
        assert type(ctrl_c.value) is KeyboardInterrupt
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------------- local Ray
@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    # Workers import the node functions of this test module by name: give them the repo root, and this
    # checkout's package (not whichever one is pip-installed), as the test process has.
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}},
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_ray_fallback_matches_inline_and_names_the_node(ray_local, caplog):
    reference = run_toy(GPUNodeRunner(address=None))
    runner = GPUNodeRunner(address="local", allow_cpu_fallback=True)
    pipe = toy_pipeline() + pipeline([node(node_and_device, None, "seen", name="train.probe", tags=["gpu"])])
    with caplog.at_level(logging.WARNING, logger="pipelines.core.runner"):
        got = run_toy(runner, pipe)
    assert got["summary"] == reference["summary"]
    assert set(runner.placements) == {"train.square", "train.cube", "train.probe"}  # gpu nodes went to Ray
    assert got["seen"]["node"] == "train.probe" and got["seen"]["pid"] != os.getpid()
    assert got["seen"]["device"] == ("cpu", "cpu")  # a GPU is visible but Ray assigned none: cpu
    fallbacks = [r for r in caplog.records if "allow_cpu_fallback" in r.getMessage()]
    assert len(fallbacks) == 1 and "CPU: 2" in fallbacks[0].getMessage()


@pytest.mark.ray
def test_no_gpu_fails_fast_with_resources(ray_local):
    catalog = toy_catalog()
    with pytest.raises(GPUUnavailableError) as err:
        GPUNodeRunner(address="local").run(toy_pipeline(), catalog)
    msg = str(err.value)
    assert "node 'train." in msg and "asks for 1 GPU" in msg and "has no GPU" in msg
    assert "CPU: 2" in msg and "allow_cpu_fallback: true" in msg
    assert not catalog.exists("x")  # failed before any node ran
    with pytest.raises(GPUUnavailableError, match="asks for 2 GPU"):
        GPUNodeRunner(address="local").run(toy_pipeline(("gpu", "gpus-2")), toy_catalog())


@pytest.mark.ray
def test_killed_worker_is_retried(ray_local, tmp_path):
    marker = str(tmp_path / "died")
    pipe = pipeline([node(die_once, ["params:marker", "params:x"], "y", name="train.flaky", tags=["gpu"])])
    catalog = DataCatalog({"params:marker": MemoryDataset(marker), "params:x": MemoryDataset(torch.ones(2))})
    runner = GPUNodeRunner(address="local", allow_cpu_fallback=True, max_retries=2)
    runner.run(pipe, catalog)
    assert Path(marker).read_text() == "died"  # the first attempt did die
    assert torch.equal(catalog.load("y"), torch.full((2,), 2.0))

    marker2 = str(tmp_path / "died_again")
    catalog = DataCatalog({"params:marker": MemoryDataset(marker2), "params:x": MemoryDataset(torch.ones(2))})
    with pytest.raises(RemoteNodeError, match="node 'train.flaky' failed in its Ray task after 1 attempt"):
        GPUNodeRunner(address="local", allow_cpu_fallback=True, max_retries=0).run(pipe, catalog)


@pytest.mark.ray
def test_remote_exception_names_node_with_traceback(ray_local):
    pipe = pipeline([node(fail, "params:x", "never", name="train.broken", tags=["gpu"])])
    catalog = DataCatalog({"params:x": MemoryDataset(torch.ones(2))})
    with pytest.raises(ValueError) as err:  # still the node's own exception type
        GPUNodeRunner(address="local", allow_cpu_fallback=True).run(pipe, catalog)
    msg = str(err.value)
    assert isinstance(err.value, RemoteNodeError)
    assert "node 'train.broken' failed in its Ray task (ValueError: boom in the remote node)" in msg
    assert "remote traceback" in msg and "in fail" in msg

    cuda = pipeline([node(cuda_out, "params:x", "out", name="train.cuda", tags=["gpu"])])
    catalog = DataCatalog({"params:x": MemoryDataset(torch.ones(2))})
    GPUNodeRunner(address="local", allow_cpu_fallback=True).run(cuda, catalog)
    assert type(catalog.load("out")["w"]) is torch.Tensor  # converted on the worker
    with pytest.raises(CudaOutputError, match="node 'train.cuda' returned a cuda:0 tensor"):
        GPUNodeRunner(address="local", allow_cpu_fallback=True, cuda_outputs="reject").run(
            cuda, DataCatalog({"params:x": MemoryDataset(torch.ones(2))})
        )


# ------------------------------------------------------------------------- end to end (kedro run)
PROBE = "zz_runner_probe"
STAMPS = ("wall_seconds", "save_version", "git_commit", "runner", "workers", "partial_run")


@pytest.fixture
def gpu_probe(e2e_project):
    """A scaffolded method whose train node is tagged gpu (removed afterwards)."""
    created = scaffold(PROBE, title="runner probe", root=ROOT, contracts=False)
    try:
        pipe_py = ROOT / "src" / "pipelines" / PROBE / "pipeline.py"
        pipe_py.write_text(pipe_py.read_text().replace('tags=["train"]', 'tags=["train", "gpu"]'))
        shutil.copytree(ROOT / "conf", e2e_project / "conf", dirs_exist_ok=True)
        yield PROBE
    finally:
        shutil.rmtree(ROOT / "src" / "pipelines" / PROBE, ignore_errors=True)
        for p in created:
            p.unlink(missing_ok=True)
        for p in (e2e_project / "conf").rglob(f"parameters_{PROBE}.yml"):
            p.unlink()


def comparable(report: dict) -> dict:
    """The report without its run stamps and timings (``*_seconds`` differ between any two runs)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not k.endswith("_seconds")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip({k: v for k, v in report.items() if k not in STAMPS})


def assert_close(a, b, rel: float, abs: float, path: str = "report") -> None:
    """Equal structure; floats equal to rel/abs; everything else exactly equal."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys differ"
        for k in a:
            assert_close(a[k], b[k], rel, abs, f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, rel, abs, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(a, bool):
        assert b == pytest.approx(a, rel=rel, abs=abs), f"{path}: {a} vs {b}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def _end_mlflow_runs() -> None:
    """An in-process `kedro run` leaves its MLflow run active (reported to the lead); end it so the
    next run gets its own parent run, as two `kedro run` commands would."""
    import mlflow

    while mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.skipif("tess" in discover_methods(), reason="covered on the flagship by the tess test below")
def test_kedro_run_on_local_ray_gives_the_inline_report(ray_local, gpu_probe, e2e_project, monkeypatch, caplog):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    inline = run_kedro(e2e_project, gpu_probe, extra=["--runner", RUNNER])
    assert inline.exit_code == 0, inline.output
    inline_report = inline.report  # read now: .report is the latest version in the folder
    _end_mlflow_runs()
    caplog.clear()
    # conf/test/runner.yml allows the CPU fallback; only the address comes from the command line
    with caplog.at_level(logging.INFO, logger="pipelines.core.runner"):
        on_ray = run_kedro(e2e_project, gpu_probe, extra=["--runner", RUNNER, "--runner-params", "address=local"])
    assert on_ray.exit_code == 0, on_ray.output
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "pipelines.core.runner")
    assert "has no GPU; gpu nodes run on CPU" in logged
    assert f"Completed node: {gpu_probe}.train.variants (Ray task" in logged
    assert comparable(on_ray.report) == comparable(inline_report)
    assert on_ray.report["save_version"] != inline_report["save_version"]  # two versioned reports
    _end_mlflow_runs()
    import mlflow

    client = mlflow.MlflowClient(on_ray.tracking_uri)
    exp = client.get_experiment_by_name(gpu_probe)
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    parents = [r for r in runs if r.data.tags.get("role") == "parent"]
    assert len(parents) >= 2
    latest, previous = parents[0], parents[1]
    assert latest.data.metrics == pytest.approx(
        {**previous.data.metrics, "wall_seconds": latest.data.metrics["wall_seconds"]}
    )


def tess_train_nodes() -> tuple[set[str], set[str], set[str]]:
    """The train nodes of tess at --env=test (one per variant), those tagged gpu, and the datasets they read."""
    from pipelines.core import runctx
    from pipelines.core.registry import load_pipeline

    runctx.set_run_config("test", None, {})
    try:
        nodes = [n for n in load_pipeline("tess").nodes if n.name.startswith("tess.train.")]
    finally:
        runctx.set_run_config(None, None, {})
    reads = {i for n in nodes for i in n.inputs if not i.startswith("params:") and i != "parameters"}
    return {n.name for n in nodes}, {n.name for n in nodes if "gpu" in n.tags}, reads


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.skipif("tess" not in discover_methods(), reason="the tess pipeline has not landed yet")
def test_tess_inline_and_local_ray_equal_sequential_runner(ray_local, e2e_project, test_env_run, monkeypatch, caplog):
    """The flagship: the session's default-runner (pool) run of tess, then its train + evaluate stages again from
    the same (versioned) data with the inline backend and with the gpu nodes on local Ray: the same report,
    and the Ray run logged to MLflow as a run of its own with the same claims."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sequential = test_env_run("tess")  # shared with the registry smoke test: one run per session
    reference = json.loads(sequential.report_path.read_text())
    reports = {}
    train, gpu, reads = tess_train_nodes()
    # the reference run's own data: a later tess run of the session (another test) may have saved newer
    # versions, computed at another thread count
    pinned = ",".join(f"{d}:{reference['save_version']}" for d in sorted(reads))
    assert len(train) >= 5 and gpu
    for backend, params in (("inline", "address=null"), ("ray", "address=local")):
        _end_mlflow_runs()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pipelines.core.runner"):
            run = run_kedro(
                e2e_project,
                "tess",
                extra=[
                    "--runner",
                    RUNNER,
                    "--runner-params",
                    params,
                    "--from-nodes",
                    ",".join(sorted(train)),
                    "--load-versions",
                    pinned,
                ],
            )
        assert run.exit_code == 0, run.output
        reports[backend] = run.report
        shipped = {
            r.getMessage().split()[2]
            for r in caplog.records
            if r.getMessage().startswith("Completed node:") and "(Ray task" in r.getMessage()
        }
        assert shipped == (gpu if backend == "ray" else set())
    _end_mlflow_runs()
    assert reports["inline"]["variants"] and reports["inline"]["claims"]
    # the reference is the default runner's (the pool: each train node in a worker at its CPU share, 1 thread
    # on 2 CPUs), as a Ray task's `threads: auto` is the CPUs Ray reserved for it (1): the same report, and
    # the report says so; inline, tess (which declares that it scales) trains at 2 threads: float32 sums in
    # another order, so values agree to float32 rounding and every claim verdict is the same
    ray_threads = {k: v for k, v in reports["ray"]["threads_by_node"].items() if ".train." in k}
    assert ray_threads and set(ray_threads.values()) == {1} and reports["ray"]["threads"] == 1
    if all(reference["threads_by_node"].get(k) == 1 for k in ray_threads):
        # the --from-nodes runs record the nodes they ran (train + evaluate), not the reference's data nodes
        ref = comparable(reference)
        ref["threads_by_node"] = {
            k: v for k, v in ref["threads_by_node"].items() if k in reports["ray"]["threads_by_node"]
        }
        assert comparable(reports["ray"]) == ref
    threadless = ("threads", "threads_by_node", "workers")
    assert_close(
        {k: v for k, v in comparable(reports["inline"]).items() if k not in threadless},
        {k: v for k, v in comparable(reference).items() if k not in threadless},
        rel=1e-4,
        abs=1e-6,
    )
    assert [c["holds"] for c in reports["inline"]["claims"]] == [c["holds"] for c in reference["claims"]]
    assert len({reference["save_version"], *(r["save_version"] for r in reports.values())}) == 3

    import mlflow

    client = mlflow.MlflowClient(sequential.tracking_uri)
    exp = client.get_experiment_by_name("tess")
    parents = [
        r
        for r in client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
        if r.data.tags.get("role") == "parent"
    ]
    assert len(parents) >= 3  # one per kedro run
    claims = [{k: v for k, v in p.data.metrics.items() if k.startswith("claim.")} for p in parents[:3]]
    assert claims[0] and claims[0] == claims[1] == claims[2]
