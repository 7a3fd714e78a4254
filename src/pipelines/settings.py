"""Kedro project settings: hooks, config loader, the MLflow resolvers."""
from kedro.config import OmegaConfigLoader

from pipelines.core.hooks import PlatformHooks
from pipelines.core.runner import RunnerConfigHooks
from pipelines.core.runctx import artifact_location, experiment_name, tracking_uri

# kedro-mlflow registers its own hook through its entry point; ours stamps and logs the report,
# validates parameters before any node runs and names the node in errors; RunnerConfigHooks hands
# the GPU-node runner this run's conf/<env>/runner.yml.
HOOKS = (PlatformHooks(), RunnerConfigHooks())

# kedro-viz's dataset-stats / run-event hooks would write .viz/ on every run; `kedro viz` works without them.
DISABLE_HOOKS_FOR_PLUGINS = ("kedro-viz",)

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # conf/test and conf/full hold only what differs from conf/base: deep-merge parameters and mlflow.yml
    "merge_strategy": {"parameters": "soft", "mlflow": "soft", "runner": "soft"},
    "config_patterns": {
        "mlflow": ["mlflow*", "mlflow*/**"],
        "runner": ["runner*", "runner*/**"],
    },
    # mlflow.yml reads these, so the store is <project root>/mlflow.db whatever the cwd, and the
    # experiment is named after the pipeline that `kedro run` was asked for.
    "custom_resolvers": {
        "platform.tracking_uri": tracking_uri,
        "platform.experiment": experiment_name,
        "platform.artifact_location": artifact_location,
    },
}
