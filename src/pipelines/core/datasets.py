"""Versioned datasets the catalog factories use beyond kedro-datasets' parquet and JSON ones."""

from __future__ import annotations

import io
import logging
from pathlib import PurePosixPath
from typing import Any

import fsspec
import pandas as pd
from kedro.io import AbstractVersionedDataset, DatasetError, Version
from kedro.io.core import get_filepath_str, get_protocol_and_path
from kedro_datasets.pandas import ParquetDataset

log = logging.getLogger(__name__)


class _FsDataset(AbstractVersionedDataset):
    def __init__(
        self, filepath: str, version: Version | None = None, metadata: dict | None = None, fs_args: dict | None = None
    ) -> None:
        protocol, path = get_protocol_and_path(filepath, version)
        self._protocol = protocol
        self._fs = fsspec.filesystem(protocol, **(fs_args or {}))
        self.metadata = metadata
        super().__init__(
            filepath=PurePosixPath(path), version=version, exists_function=self._fs.exists, glob_function=self._fs.glob
        )

    def _describe(self) -> dict[str, Any]:
        return {"filepath": self._filepath, "protocol": self._protocol, "version": self._version}

    def _exists(self) -> bool:
        try:
            path = self._get_load_path()
        except DatasetError:
            return False
        return self._fs.exists(get_filepath_str(path, self._protocol))


class TableDataset(ParquetDataset):
    """kedro-datasets' versioned ParquetDataset whose load errors name the catalog entry
    (``metadata: {dataset: <m>.<name>}``, set by the catalog factory) and the file."""

    def load(self) -> pd.DataFrame:
        try:
            return super().load()
        except Exception as exc:  # noqa: BLE001 - re-raised with the dataset's name
            name = (self.metadata or {}).get("dataset", "?")
            raise DatasetError(
                f"dataset '{name}' could not be read from {self._get_load_path()}: {type(exc).__name__}: {exc}"
            ) from exc


class TorchDataset(_FsDataset):
    """Tensors, state dicts or nested dicts of them, saved with ``torch.save`` (loaded weights-only)."""

    def _load(self) -> Any:
        import torch

        path = get_filepath_str(self._get_load_path(), self._protocol)
        with self._fs.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)

    def _save(self, data: Any) -> None:
        import torch

        from pipelines.core.runtime import to_cpu

        path = get_filepath_str(self._get_save_path(), self._protocol)
        buf = io.BytesIO()
        torch.save(to_cpu(data), buf)
        self._fs.makedirs(str(PurePosixPath(path).parent), exist_ok=True)
        with self._fs.open(path, "wb") as f:
            f.write(buf.getvalue())


class FiguresDataset(_FsDataset):
    """A dict name → matplotlib Figure, saved as ``<name>.png`` in a versioned folder and logged as
    artifacts (``plots/``) of the active MLflow run. Loading returns name → PNG path.

    Why not kedro-datasets' ``matplotlib.MatplotlibDataset`` wrapped in kedro-mlflow's
    ``MlflowArtifactDataset`` (checked with kedro-datasets 9.6, kedro-mlflow 2.0): that dataset cannot be
    loaded, and evaluate.report loads the plots to list the files it really saved, while a resumed run
    (``--only-missing-outputs``) needs ``exists()`` of the saved version; the artifact wrapper logs one
    file per save (``log_artifact``), not a folder of figures; and figures are closed here after saving,
    so a method with dozens of plots does not hold them all in memory."""

    def _load(self) -> dict[str, str]:
        base = get_filepath_str(self._get_load_path(), self._protocol)
        return {PurePosixPath(p).stem: p for p in sorted(self._fs.glob(f"{base}/*.png"))}

    def _save(self, figures: dict[str, Any]) -> None:
        import matplotlib.pyplot as plt

        base = get_filepath_str(self._get_save_path(), self._protocol)
        self._fs.makedirs(base, exist_ok=True)
        for name, fig in figures.items():
            with self._fs.open(f"{base}/{plot_file_stem(name)}.png", "wb") as f:
                fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
            plt.close(fig)
        _log_artifacts(base, "plots")


def plot_file_stem(name: str) -> str:
    """A figure's file name from its key: a key built from a user's dataset name (``file:mine``) keeps
    letters, digits, ``.``, ``_`` and ``-``; anything else (``:``, ``/``, spaces) becomes ``_``."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._") or "plot"


def _log_artifacts(local_dir: str, artifact_path: str) -> None:
    try:
        import mlflow
    except ImportError:  # pragma: no cover
        return
    if mlflow.active_run() is not None:  # a lost tracking server never fails the node (core.tracking)
        from pipelines.core.tracking import guarded

        guarded(artifact_path, mlflow.log_artifacts, local_dir, artifact_path=artifact_path)
