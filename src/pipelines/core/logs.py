"""Console logging: the stream ``conf/logging.yml`` writes to, and ``kedro run -v``.

Default output is a progress report (``core.progress``); ``-v`` turns Kedro's and the plugins' INFO lines
(every dataset load and save, each node's signature, MLflow's own messages) back on."""

from __future__ import annotations

import logging
import sys
import warnings

# Loggers conf/logging.yml keeps at WARNING; -v sets them to INFO.
VERBOSE_LOGGERS = ("kedro", "kedro_mlflow", "mlflow")
DEBUG_WHEN_VERBOSE = ("pipelines.core.pool",)  # each worker's node: pid, seconds, threads


class _Stderr:
    """A stream that writes to the current ``sys.stderr``: a handler built once still follows pytest's
    capture, a notebook's redirect or a test's ``redirect_stderr``."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return bool(getattr(sys.stderr, "isatty", lambda: False)())


STDERR = _Stderr()

# Warnings go to the log as one line each (the handler's format), not as source excerpts.
logging.captureWarnings(True)


def set_verbose(on: bool = True) -> None:
    for name in VERBOSE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if on else logging.WARNING)
    for name in DEBUG_WHEN_VERBOSE:
        logging.getLogger(name).setLevel(logging.DEBUG if on else logging.NOTSET)


class _DropNoise(logging.Filter):
    """Third-party warnings users cannot act on. MLflow forces its own ``once`` filter around the import
    that warns about ``predict`` type hints, so a ``warnings`` filter cannot silence it: the log drops it."""

    NOISE = ("Add type hints to the `predict` method",)

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(n in msg for n in self.NOISE)


logging.getLogger("py.warnings").addFilter(_DropNoise())


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ARG001
    """A warning in the log is one line: where, what (no source excerpt, no colour codes)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(message))
    return f"{category.__name__}: {text} ({filename}:{lineno})"


warnings.formatwarning = _one_line_warning
