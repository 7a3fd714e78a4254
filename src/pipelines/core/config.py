"""The config loader's settings, in a light module: ``settings.py`` hands them to Kedro, and
``core.registry.method_config`` reads a run's parameters with them without importing Kedro's project
machinery (which configures logging on import)."""
from kedro.config import OmegaConfigLoader

from pipelines.core.runctx import artifact_location, experiment_name, tracking_uri

CONF_SOURCE = "conf"
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
