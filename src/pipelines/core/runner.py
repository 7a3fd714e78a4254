"""The shared GPU-node runner (docs/architecture.md, "The GPU-node runner"), built on Ray.

``kedro run --pipeline=<m> --runner=pipelines.core.runner.GPUNodeRunner`` runs any pipeline. Loads,
saves, hooks and kedro-mlflow logging all stay in the ``kedro run`` process (the driver); only the
function of a node tagged ``gpu`` travels, as a Ray task asking for ``num_gpus`` (1, or n with a tag
``gpus-<n>``). Everything else runs in the driver, so versioned datasets and MLflow runs behave as with
Kedro's SequentialRunner, and nothing unpicklable (catalog, hooks, MLflow datasets) is shipped.

Backend (first that is set wins): ``--runner-params address=...``, ``$RAY_ADDRESS``, ``address`` in
``conf/<env>/runner.yml``. No address → ``inline`` (exactly SequentialRunner, zero overhead, no Ray
import); ``local`` → a local Ray instance with this machine's CPUs/GPUs; anything else (``auto``,
``ray://head:10001``, ``head:6379``) → join that cluster.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import socket
import sys
import time
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from kedro.framework.hooks import hook_impl
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.core.runctx import current_node, merge_node_threads, set_run_workers, take_node_threads
from pipelines.core.scheduling import OffloadingRunner, load_inputs

if TYPE_CHECKING:
    from kedro.pipeline import Pipeline
    from kedro.pipeline.node import Node

log = logging.getLogger(__name__)

GPU_TAG = "gpu"
_GPUS_TAG = re.compile(r"^gpus-(\d+(?:\.\d+)?)$")
INLINE_ADDRESSES = {"", "none", "null", "inline"}


# --------------------------------------------------------------------------------------------- config
class RunnerConfig(BaseModel):
    """``conf/<env>/runner.yml`` (soft-merged over conf/base) and ``--runner-params``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None  # None → inline; "local"; "auto"; "ray://head:10001"; "head:6379"
    num_gpus: float = Field(default=1, ge=0)  # per gpu node without a gpus-<n> tag
    cpus_per_node: float = Field(default=1, ge=0)  # CPUs each gpu-node task reserves
    allow_cpu_fallback: bool = False
    max_retries: int = Field(default=3, ge=0)  # Ray re-runs a task whose worker process died
    # a gpu node's task waiting this long with no alive Ray node able to run it (its GPU node lost):
    # the run fails naming the node, or (allow_cpu_fallback) the task is sent again with num_gpus=0
    lost_node_timeout_s: float = Field(default=60, gt=0)
    cuda_outputs: Literal["convert", "reject"] = "convert"
    local_cpus: int | None = Field(default=None, ge=1)  # size of a local instance; None = all
    runtime_env: dict[str, Any] | None = None  # passed to ray.init (e.g. env_vars, working_dir)

    @property
    def backend(self) -> str:
        if self.address is None or self.address.strip().lower() in INLINE_ADDRESSES:
            return "inline"
        return "ray"

    def describe(self) -> str:
        return "inline" if self.backend == "inline" else f"ray@{self.address}"


class RunnerConfigError(ValueError):
    """A runner setting is wrong; the message names the key."""


def parse_config(raw: dict[str, Any], source: str) -> RunnerConfig:
    try:
        return RunnerConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        why = "unknown key (typo?)" if err["type"] == "extra_forbidden" else err["msg"]
        raise RunnerConfigError(f"runner setting '{key}' ({source}): {why}") from None


def resolve_config(
    overrides: dict[str, Any], conf: dict[str, Any] | None = None, environ: dict[str, str] | None = None
) -> RunnerConfig:
    """Runner kwargs (``--runner-params``) > ``$RAY_ADDRESS`` > runner.yml > defaults."""
    environ = os.environ if environ is None else environ
    merged = dict(parse_config(dict(conf or {}), "runner.yml").model_dump(exclude_unset=True))
    if environ.get("RAY_ADDRESS"):
        merged["address"] = environ["RAY_ADDRESS"]
    merged.update(overrides)
    return parse_config(merged, "--runner-params / RAY_ADDRESS")


def node_gpus(node: Node, default: float) -> float | None:
    """GPUs the node asks for: None if it is not tagged ``gpu`` (it runs in the driver)."""
    if GPU_TAG not in node.tags:
        return None
    asked = [float(m.group(1)) for t in node.tags if (m := _GPUS_TAG.match(t))]
    return max(asked) if asked else default


# Where the runner finds conf/<env>/runner.yml: RunnerConfigHooks (registered in settings.HOOKS)
# captures the session's config loader; without it the runner reads the project's conf itself.
_session: dict[str, Any] = {}


class RunnerConfigHooks:
    """Captures the run's ``runner`` config (honouring ``--env`` and ``--conf-source``)."""

    @hook_impl
    def after_context_created(self, context) -> None:
        from kedro.config import MissingConfigException

        _session.clear()
        _session["env"] = context.env
        try:
            _session["conf"] = dict(context.config_loader["runner"] or {})
        except (MissingConfigException, KeyError):
            _session["conf"] = {}

    # the captured config belongs to one session: forget it when the run ends, so a runner used
    # later in the same process (a notebook, a test) never sees a stale env's settings
    @hook_impl
    def after_pipeline_run(self) -> None:
        _session.clear()

    @hook_impl
    def on_pipeline_error(self) -> None:
        _session.clear()


def forget_session() -> None:
    """Drop the captured session config (called when a `kedro run` ends, however it ends)."""
    _session.clear()


def _run_env(hook_manager) -> str | None:
    """The ``--env`` of this run when RunnerConfigHooks is not registered: the platform hook has it."""
    get_plugins = getattr(hook_manager, "get_plugins", None)
    for plugin in (get_plugins() if callable(get_plugins) else None) or ():
        ctx = getattr(plugin, "_ctx", None)
        if isinstance(ctx, dict) and ctx.get("env"):
            return ctx["env"]
    return os.environ.get("KEDRO_ENV")


def load_runner_conf(env: str | None) -> dict[str, Any]:
    """``runner`` config of ``env`` merged over base, read with the project's config loader."""
    from kedro.config import MissingConfigException
    from kedro.framework.project import settings

    from pipelines.core.runctx import project_root

    conf_source = Path(project_root()) / settings.CONF_SOURCE
    if not conf_source.is_dir():
        return {}
    loader = settings.CONFIG_LOADER_CLASS(conf_source=str(conf_source), env=env, **settings.CONFIG_LOADER_ARGS)
    if "runner" not in loader.config_patterns:
        loader.config_patterns["runner"] = ["runner*", "runner*/**"]
    try:
        return dict(loader["runner"] or {})
    except (MissingConfigException, KeyError):
        return {}


# ------------------------------------------------------------------------------------------- errors
class GPUUnavailableError(RuntimeError):
    """A ``gpu`` node was asked of a cluster that cannot give it the GPUs."""


class RayNodeLostError(GPUUnavailableError):
    """A gpu node's task can no longer be scheduled: the cluster lost the node(s) with its GPUs."""


class RayConnectError(RunnerConfigError):
    """The driver cannot join the Ray cluster (unreachable, or token authentication refused it)."""


AUTH_HINT = (
    "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the cluster's token> (or RAY_AUTH_TOKEN_PATH) "
    "in the driver's environment"
)


def _connect_error(address: str, exc: BaseException, captured: str = "") -> RayConnectError:
    text = f"{exc} {captured}"
    if "AuthenticationError" in type(exc).__name__ or "InvalidAuthToken" in text or "Unauthenticated" in text:
        return RayConnectError(f"the Ray cluster at {address} refused this driver (token authentication): {AUTH_HINT}")
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RayConnectError(f"cannot connect to the Ray cluster at {address}: {first}")


class _CaptureStderr:
    """Ray's C++ client writes its retries to file descriptor 2: hold them, give them back on success."""

    def __enter__(self):
        import tempfile

        sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> None:
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()


def probe_cluster(address: str, timeout_ms: int = 3000) -> None:
    """Check, before any MLflow run opens, that this driver may join the cluster at ``address``
    (``host:port`` of its GCS): a RayConnectError in one line if token auth refuses it or none answers.
    ``local``/``ray://`` addresses are not probed (the connection itself reports them)."""
    addr = address.strip()
    if addr.lower() in ("local", "auto") or addr.startswith("ray://") or ":" not in addr:
        return
    from ray._raylet import InnerGcsClient

    with _CaptureStderr() as cap:
        try:
            InnerGcsClient.standalone(addr, None, timeout_ms)
            err = None
        except Exception as exc:  # noqa: BLE001 - Ray's RpcError / AuthenticationError
            err = exc
    if err is not None:
        raise _connect_error(addr, err, cap.text)
    # success: nothing worth repeating on stderr


class CudaOutputError(TypeError):
    """A remote node returned CUDA tensors while ``cuda_outputs: reject``."""


class RemoteNodeError(RuntimeError):
    """A node failed in its Ray task; the message names the node and carries the remote traceback.

    Raised as a subclass of the original exception's type too (when possible), so code that catches,
    e.g., ``NonFiniteLossError`` behaves as with the SequentialRunner."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _remote_error(node: Node, exc: BaseException, attempts: int) -> RemoteNodeError:
    import ray.exceptions as rex

    cause = getattr(exc, "cause", None) if isinstance(exc, rex.RayTaskError) else None
    if isinstance(exc, rex.RayTaskError):
        remote_tb = getattr(exc, "traceback_str", "") or str(exc)
        what = f"{type(cause).__name__}: {cause}" if cause is not None else exc.__class__.__name__
        msg = (
            f"node '{node.name}' failed in its Ray task ({what}) on {getattr(exc, 'ip', '?')} "
            f"pid {getattr(exc, 'pid', '?')}\n--- remote traceback ---\n{remote_tb.rstrip()}"
        )
    else:  # the worker died more often than max_retries allows, the node was lost, OOM-killed, ...
        msg = f"node '{node.name}' failed in its Ray task after {attempts} attempt(s): {type(exc).__name__}: {exc}"
    if isinstance(cause, Exception) and not isinstance(cause, RemoteNodeError):
        try:
            cls = type(f"RemoteNodeError[{type(cause).__name__}]", (RemoteNodeError, type(cause)), {})
            return cls(msg)
        except TypeError:  # incompatible layouts (e.g. OSError): the plain error still names the node
            pass
    return RemoteNodeError(msg)


# ------------------------------------------------------------------------------------ remote side
def _cpu_outputs(node_name: str, obj: Any, policy: str, path: str = "outputs") -> Any:
    """Tensors (and modules) moved to the CPU, or a CudaOutputError naming where a CUDA one is.

    Done on the worker: a pickled CUDA tensor needs CUDA to unpickle, which the driver may lack."""
    torch = sys.modules.get("torch")
    if torch is None:
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu":
            return obj
        if policy == "reject":
            raise CudaOutputError(
                f"node '{node_name}' returned a {obj.device} tensor at {path}; nodes "
                "return CPU tensors (pipelines.core.runtime.to_cpu) or set "
                "cuda_outputs: convert in runner.yml"
            )
        return obj.detach().cpu()
    if isinstance(obj, torch.nn.Module):
        devices = {t.device.type for t in chain(obj.parameters(), obj.buffers())}
        if devices <= {"cpu"}:
            return obj
        if policy == "reject":
            raise CudaOutputError(
                f"node '{node_name}' returned a module on {sorted(devices)} at {path}; "
                "move it to the CPU or set cuda_outputs: convert in runner.yml"
            )
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _cpu_outputs(node_name, v, policy, f"{path}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
        return type(obj)(_cpu_outputs(node_name, v, policy, f"{path}[{i}]") for i, v in enumerate(obj))
    return obj


def assigned_device() -> str:
    """``cuda`` when this process may use a GPU (inside a Ray task: Ray assigned one), else ``cpu``.

    Inside a Ray task with ``num_gpus=0`` (the CPU fallback) torch may still see the machine's GPUs
    (recent Ray, 2.60 here, no longer blanks CUDA_VISIBLE_DEVICES then), so the assignment decides.
    ``pipelines.core.runtime.get_device`` applies the same rule."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return "cpu"
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ctx = ray.get_runtime_context()
        if ctx.get_task_id() is not None and not ray.get_gpu_ids():
            return "cpu"
    return "cuda"


def _execute_remote(node: Node, inputs: dict[str, Any], cuda_outputs: str) -> tuple[dict[str, Any], dict]:
    """Body of the Ray task: run the node's function, hand back CPU outputs and where it ran."""
    import ray

    # `threads: auto` in a task means the CPUs Ray reserved for it, not the whole worker machine
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    os.environ["PIPELINES_THREADS"] = str(max(1, int(cpus)))
    # the NaN guard names the node from current_node, as PlatformHooks.before_node_run does in the driver
    token = current_node.set(node.name)
    take_node_threads()  # a reused worker: only this task's record goes back
    t0 = time.perf_counter()
    try:
        outputs = node.run(inputs)
        outputs = _cpu_outputs(node.name, outputs, cuda_outputs)
    finally:
        current_node.reset(token)
    ctx = ray.get_runtime_context()
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "gpu_ids": list(ray.get_gpu_ids()),
        "node_id": ctx.get_node_id(),
        "seconds": round(time.perf_counter() - t0, 3),
        # what the node's preamble chose in this task, for the driver's report (threads_by_node)
        "threads_by_node": take_node_threads(),
    }
    return outputs, info


def worker_runtime_env(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """The user's runtime_env with OpenMP's passive wait policy for every worker (unless it sets one):
    a worker imports torch before it imports this package, so the package import is too late there."""
    env = dict(runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    env_vars.setdefault("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    env["env_vars"] = env_vars
    return env


class SignalRelay:
    """Gives back what the caller's SIGTERM handler raised while Ray blocked.

    Ray's blocking calls (``ray.wait``, ``ray.get``) check for signals themselves and turn any
    ``KeyboardInterrupt`` a handler raises (``kedro run``'s ``RunInterrupted`` on SIGTERM) into a bare
    ``KeyboardInterrupt``: the run would end as a Ctrl-C (exit 130, "interrupted (Ctrl-C)") instead of
    "terminated (SIGTERM)" (143) as an inline run does. Inside this block the handler's own exception is
    recorded and re-raised in place of Ray's."""

    def __init__(self, signum: int | None = None) -> None:
        import signal

        self.signum = signal.SIGTERM if signum is None else signum
        self.previous: Any = None
        self.raised: BaseException | None = None

    def __enter__(self) -> Self:
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(self.signum)
        if not callable(previous):  # SIG_DFL / SIG_IGN: nothing is raised, nothing to relay
            return self
        self.previous = previous

        def relay(signum, frame):
            try:
                previous(signum, frame)
            except BaseException as exc:
                self.raised = exc
                raise

        signal.signal(self.signum, relay)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        import signal

        if self.previous is not None:
            signal.signal(self.signum, self.previous)
        if isinstance(exc, KeyboardInterrupt) and self.raised is not None and exc is not self.raised:
            raise self.raised.with_traceback(None) from None
        return False


# ------------------------------------------------------------------------------------------ runner
class GPUNodeRunner(OffloadingRunner):
    """Runs ``gpu``-tagged nodes as Ray tasks, everything else (loads, saves, hooks) in the driver.

    Keyword arguments (``--runner-params key=value,...``) override ``runner.yml`` key by key."""

    def __init__(self, is_async: bool = False, **overrides: Any) -> None:
        super().__init__(is_async=is_async)
        parse_config(overrides, "--runner-params")  # reject typos before the session starts
        self._overrides = overrides
        self.config: RunnerConfig | None = None
        self.placements: dict[str, dict] = {}  # node name → where its Ray task ran
        self._warned_fallback = False
        self._gpu_nodes: dict[str, str] = {}  # Ray node id → name, of the nodes with GPUs at the start

    def __str__(self) -> str:  # recorded by Kedro as run_params["runner"]
        return f"GPUNodeRunner({self.config.describe()})" if self.config else "GPUNodeRunner"

    def _get_executor(self, max_workers: int) -> None:
        return None

    @classmethod
    def preflight(cls, env: str | None = None, **overrides: Any) -> None:
        """Called by ``kedro run`` before the session (and its MLflow run) starts: a Ray cluster that
        refuses this driver (token auth without a token) or does not answer fails in one line."""
        overrides.pop("is_async", None)
        cfg = resolve_config(overrides, load_runner_conf(env))
        if cfg.backend == "ray":
            probe_cluster(cfg.address)

    # -- configuration ---------------------------------------------------------------------------
    def _configure(self, hook_manager) -> RunnerConfig:
        if _session:
            conf = _session.get("conf", {})
        else:
            conf = load_runner_conf(_run_env(hook_manager))
        self.config = resolve_config(self._overrides, conf)
        return self.config

    def _run(self, pipeline: Pipeline, catalog, hook_manager=None, run_id: str | None = None) -> None:
        cfg = self._configure(hook_manager)
        if cfg.backend == "inline":
            self._logger.info(
                "GPUNodeRunner: inline backend (no RAY_ADDRESS / runner address); gpu nodes run in this process"
            )
            super()._run(pipeline, catalog, hook_manager, run_id)
            return
        remote = {n: g for n in pipeline.nodes if (g := node_gpus(n, cfg.num_gpus)) is not None}
        for n in [n for n in remote if inspect.isgeneratorfunction(n.func)]:
            # a generator's chunks are saved as they come: that needs the catalog, so it stays here
            self._logger.warning("GPUNodeRunner: node '%s' is a generator; it runs in this process", n.name)
            del remote[n]
        if not remote:
            self._logger.info("GPUNodeRunner: no gpu-tagged node; running in this process")
            super()._run(pipeline, catalog, hook_manager, run_id)
            return
        with SignalRelay():  # SIGTERM ends a Ray run as it ends an inline one
            started = self._connect(cfg)
            try:
                remote = self._check_resources(remote, cfg)
                self._run_with_ray(pipeline, catalog, hook_manager, run_id, remote, cfg)
            finally:
                if started:
                    import ray

                    ray.shutdown()

    def _connect(self, cfg: RunnerConfig) -> bool:
        """Join or start Ray; True if this runner started (and so must stop) it."""
        import ray
        import ray.exceptions as rex

        if ray.is_initialized():  # a caller (a notebook, a test) already connected: reuse, leave running
            return False
        kwargs: dict[str, Any] = {"runtime_env": worker_runtime_env(cfg.runtime_env), "logging_level": logging.WARNING}
        if cfg.address.strip().lower() == "local":
            kwargs.update(address="local", num_cpus=cfg.local_cpus, include_dashboard=False)
        else:
            kwargs["address"] = cfg.address
        self._logger.info("GPUNodeRunner: connecting to Ray (%s)", cfg.address)
        import signal
        import threading

        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if main else None
        try:
            with _CaptureStderr() as cap:
                try:
                    ray.init(**{k: v for k, v in kwargs.items() if v is not None})
                    err = None
                except (ConnectionError, rex.RayError) as exc:
                    err = exc
        finally:
            # ray.init installs its own SIGTERM handler (sys.exit): keep the caller's, so `kedro run`
            # ends a terminated Ray run KILLED as it does an inline one
            if main and previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if err is not None:
            raise _connect_error(cfg.address, err, cap.text) from None
        if cap.text.strip():
            sys.stderr.write(cap.text)
        return True

    def _check_resources(self, remote: dict[Node, float], cfg: RunnerConfig) -> dict[Node, float]:
        """Fail fast (before any node runs) when a gpu node cannot get its GPUs, or fall back."""
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        per_node = [n.get("Resources", {}).get("GPU", 0.0) for n in nodes]
        self._gpu_nodes = {
            n["NodeID"]: n.get("NodeName") or n.get("NodeManagerAddress", "?")
            for n in nodes
            if n.get("Resources", {}).get("GPU", 0.0) > 0
        }
        total = ray.cluster_resources()
        summary = ", ".join(
            f"{k}: {v:g}" for k, v in sorted(total.items()) if not k.startswith(("node:", "memory", "object_store"))
        )
        largest = max(per_node, default=0.0)
        out = {}
        for node, gpus in remote.items():
            if gpus <= largest:
                out[node] = gpus
                continue
            if largest == 0 and cfg.allow_cpu_fallback:
                if not self._warned_fallback:
                    self._logger.warning(
                        "GPUNodeRunner: the Ray cluster (%s) has no GPU; gpu nodes run on CPU "
                        "(allow_cpu_fallback: true): %s",
                        summary,
                        ", ".join(sorted(n.name for n in remote)),
                    )
                    self._warned_fallback = True
                out[node] = 0.0
                continue
            where = "has no GPU" if largest == 0 else f"has at most {largest:g} GPU(s) on one node"
            hint = (
                " Set allow_cpu_fallback: true in conf/<env>/runner.yml (or --runner-params "
                "allow_cpu_fallback=true) to run gpu nodes on CPU."
                if largest == 0
                else ""
            )
            raise GPUUnavailableError(
                f"node '{node.name}' is tagged gpu and asks for {gpus:g} GPU(s), but the Ray cluster "
                f"({cfg.address}) {where}; its resources: {summary or 'none'} over {len(nodes)} "
                f"node(s).{hint}"
            )
        return out

    # -- how a node travels (the loop is core.scheduling's) -----------------------------------------
    def _run_with_ray(
        self, pipeline: Pipeline, catalog, hook_manager, run_id, remote: dict[Node, float], cfg: RunnerConfig
    ) -> None:
        import ray

        self._task_fn, self._remote, self._cfg = ray.remote(_execute_remote), remote, cfg
        self._unschedulable: dict[Node, float] = {}  # gpu node → since when no alive Ray node can run it
        self._logger.info(
            "GPUNodeRunner: %d of %d nodes go to Ray (%s): %s",
            len(remote),
            len(pipeline.nodes),
            cfg.address,
            ", ".join(f"{n.name}[gpus={g:g}]" for n, g in remote.items()),
        )
        # every ready gpu node is submitted at once: independent ones run concurrently
        self._drive(pipeline, catalog, hook_manager, run_id, set(remote))

    def _offload(self, node: Node, catalog, hook_manager, run_id) -> tuple[Any, dict[str, Any]]:
        inputs = load_inputs(node, catalog, hook_manager, run_id)
        try:
            ref = self._submit(self._task_fn, node, inputs, self._remote[node], self._cfg)
        except Exception as exc:  # noqa: BLE001 - pickling errors come in many types
            raise RemoteNodeError(
                f"node '{node.name}': its function or inputs cannot be shipped to Ray "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "define node functions in an importable module"
            ) from exc
        self._unschedulable.pop(node, None)
        return ref, inputs

    def _wait(self, inflight: dict) -> list:
        import ray

        # bounded waits: signals (SIGTERM, Ctrl-C) are handled, and a lost GPU node is noticed
        finished, _ = ray.wait(list(inflight), num_returns=1, timeout=min(2.0, self._cfg.lost_node_timeout_s))
        if not finished:
            self._watch_lost_nodes(inflight, self._remote, self._unschedulable, self._task_fn, self._cfg)
        return finished

    def _outputs(self, handle, node: Node, inputs, catalog, hook_manager, run_id) -> dict[str, Any]:
        return self._collect(handle, node, inputs, catalog, hook_manager, run_id, self._cfg)

    def _cancel(self, handles: list) -> None:
        import ray

        for ref in handles:  # not force: killing workers would make the next run start new ones
            ray.cancel(ref)

    def _completed(self, node: Node, seconds: float) -> None:
        self._logger.info("Completed node: %s (Ray task, %.2fs, %s)", node.name, seconds, self._where(node.name))

    @staticmethod
    def _submit(task_fn, node: Node, inputs: dict[str, Any], gpus: float, cfg: RunnerConfig):
        return task_fn.options(
            num_gpus=gpus,
            num_cpus=cfg.cpus_per_node,
            max_retries=cfg.max_retries,
            retry_exceptions=False,
            name=node.name,
        ).remote(node, inputs, cfg.cuda_outputs)

    def _watch_lost_nodes(
        self, inflight: dict, remote: dict[Node, float], unschedulable: dict[Node, float], task_fn, cfg: RunnerConfig
    ) -> None:
        """A task waiting for GPUs that no alive node has any more (its node was lost; Ray would retry it
        forever): after ``lost_node_timeout_s``, fail naming the node, or send it again on CPU."""
        import ray

        alive = [n for n in ray.nodes() if n.get("Alive")]
        now = time.monotonic()
        for ref, (node, inputs, _t0) in list(inflight.items()):
            gpus = remote[node]
            if gpus <= 0 or any(
                n.get("Resources", {}).get("GPU", 0.0) >= gpus
                and n.get("Resources", {}).get("CPU", 0.0) >= cfg.cpus_per_node
                for n in alive
            ):
                unschedulable.pop(node, None)
                continue
            since = unschedulable.setdefault(node, now)
            if now - since < cfg.lost_node_timeout_s:
                continue
            alive_ids = {n["NodeID"] for n in alive}
            lost = [f"{name} (node id {nid[:12]})" for nid, name in self._gpu_nodes.items() if nid not in alive_ids]
            what = f"lost {', '.join(lost)}" if lost else "has no node with that many GPUs"
            ray.cancel(ref, force=True)
            del inflight[ref]
            if cfg.allow_cpu_fallback:
                self._logger.warning(
                    "GPUNodeRunner: node '%s' asks for %g GPU(s) but the Ray cluster (%s) %s for %.0f s; "
                    "it runs again on CPU (allow_cpu_fallback: true)",
                    node.name,
                    gpus,
                    cfg.address,
                    what,
                    now - since,
                )
                remote[node] = 0.0
                inflight[self._submit(task_fn, node, inputs, 0.0, cfg)] = (node, inputs, time.perf_counter())
                unschedulable.pop(node, None)
                continue
            raise RayNodeLostError(
                f"node '{node.name}' asks for {gpus:g} GPU(s) but the Ray cluster ({cfg.address}) {what}: "
                f"no alive node can run it (waited {now - since:.0f} s, lost_node_timeout_s="
                f"{cfg.lost_node_timeout_s:g}). Set allow_cpu_fallback: true to run it on CPU instead."
            )

    def _where(self, name: str) -> str:
        p = self.placements.get(name, {})
        return f"{p.get('host')} pid {p.get('pid')} gpus {p.get('gpu_ids')} ray node {str(p.get('node_id'))[:12]}"

    def _collect(self, ref, node: Node, inputs, catalog, hook_manager, run_id, cfg: RunnerConfig):
        import ray
        import ray.exceptions as rex

        try:
            outputs, info = ray.get(ref)
        except rex.RayError as exc:
            error = _remote_error(node, exc, cfg.max_retries + 1)
            hook_manager.hook.on_node_error(
                error=error, node=node, catalog=catalog, inputs=inputs, is_async=False, run_id=run_id
            )
            raise error from None
        self.placements[node.name] = info
        merge_node_threads(info.get("threads_by_node") or {})
        set_run_workers(len({(p.get("host"), p.get("pid")) for p in self.placements.values()}))
        hook_manager.hook.after_node_run(
            node=node, catalog=catalog, inputs=inputs, outputs=outputs, is_async=False, run_id=run_id
        )
        return outputs
