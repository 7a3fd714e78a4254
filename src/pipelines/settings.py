"""Kedro project settings: hooks, config loader, the MLflow resolvers."""

from kedro.framework.session import KedroSession

from pipelines.core import config as _config
from pipelines.core.hooks import PlatformHooks
from pipelines.core.pool import ThreadRecordHooks
from pipelines.core.progress import ProgressHooks
from pipelines.core.runner import RunnerConfigHooks
from pipelines.core.tracking import GuardedMlflowHook, bound_http_requests

# Ours stamps and logs the report, logs the typed parameters, names the node in errors and ends MLflow runs
# FAILED on errors; RunnerConfigHooks hands the GPU-node runner this run's conf/<env>/runner.yml;
# ThreadRecordHooks starts each run's record of the threads its nodes used (the report's threads_by_node)
# empty; ProgressHooks prints the run's progress and summary; kedro-mlflow's hook runs behind
# core.tracking's guard (a lost tracking server never fails a run), in place of its entry point.
# Last here = called first, as its entry point was: its run exists for ours.
HOOKS = (ThreadRecordHooks(), PlatformHooks(), RunnerConfigHooks(), ProgressHooks(), GuardedMlflowHook())

# kedro-viz's dataset-stats / run-event hooks would write .viz/ on every run; `kedro viz` works without them.
DISABLE_HOOKS_FOR_PLUGINS = ("kedro-viz", "kedro_mlflow", "kedro-mlflow")

# MLflow's HTTP retries bounded (where the user has not set them): a lost server is noticed in under a minute
bound_http_requests()

CONFIG_LOADER_CLASS, CONFIG_LOADER_ARGS = _config.CONFIG_LOADER_CLASS, _config.CONFIG_LOADER_ARGS

# no two processes of this project get the same session id (= save version): core.versions
from pipelines.core.versions import unique_session_class  # noqa: E402

SESSION_CLASS = unique_session_class(KedroSession)
