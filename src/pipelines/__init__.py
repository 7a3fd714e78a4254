"""ICML 2026 methods as Kedro pipelines: one sub-package per method, a shared ``core``."""

__version__ = "0.1.0"

import warnings as _warnings

# Third-party noise on every `kedro run` that users cannot act on (kept out of the logs).
_warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning)
_warnings.filterwarnings("ignore", message=r".*Add type hints to the `predict` method", category=UserWarning)
