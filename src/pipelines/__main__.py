"""``python -m pipelines`` runs the Kedro CLI from the project root (same as ``kedro``)."""

import os
import sys
from pathlib import Path

from kedro.framework.cli import main as kedro_main
from kedro.framework.project import configure_project


def main(*args, **kwargs):
    os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")
    configure_project(Path(__file__).parent.name)
    return kedro_main(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
