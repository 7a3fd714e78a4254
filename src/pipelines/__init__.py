"""ICML 2026 methods as Kedro pipelines: one sub-package per method, a shared ``core``."""

__version__ = "0.1.0"

import os as _os
import warnings as _warnings

# OpenMP threads that spin while waiting for work (the default policy) collapse on a busy machine:
# a tiny MLP step measured 173-245 ms with 2 spinning threads on 2 loaded cores, 1-8 ms passive.
# The runtime reads this once, when torch is first imported, so it is set here, on the package import
# that the CLI, `python -m pipelines`, notebooks and Ray workers all go through. A user's own setting wins.
OMP_WAIT_POLICY_SET_BY_USER = "OMP_WAIT_POLICY" in _os.environ
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Third-party noise on every `kedro run` that users cannot act on (kept out of the logs).
_warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning)
_warnings.filterwarnings("ignore", message=r".*Add type hints to the `predict` method", category=UserWarning)
