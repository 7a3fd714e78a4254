"""Versioned datasets: round trips, never overwriting a version, errors naming the dataset."""

import pandas as pd
import pytest
import torch
from kedro.io import DatasetError, Version

from pipelines.core.datasets import TableDataset, TorchDataset


def test_torch_dataset_round_trip_and_no_overwrite(tmp_path):
    ds = TorchDataset(filepath=str(tmp_path / "x.pt"), version=Version(None, "2026-01-01T00.00.00.000Z"))
    ds.save({"a": torch.arange(3), "nested": {"b": torch.ones(2)}})
    back = TorchDataset(filepath=str(tmp_path / "x.pt"), version=Version(None, None)).load()
    assert torch.equal(back["a"], torch.arange(3)) and torch.equal(back["nested"]["b"], torch.ones(2))
    with pytest.raises(DatasetError, match="must not exist if versioning is enabled"):
        ds.save({"a": torch.zeros(1)})


def test_corrupt_parquet_error_names_the_dataset(tmp_path):
    path = tmp_path / "windows.parquet"
    good = TableDataset(
        filepath=str(path), version=Version(None, "2026-01-01T00.00.00.000Z"), metadata={"dataset": "m.windows"}
    )
    good.save(pd.DataFrame({"a": [1, 2]}))
    saved = next(path.glob("*/windows.parquet"))  # <filepath>/<version>/windows.parquet
    saved.write_bytes(b"not a parquet file")
    ds = TableDataset(filepath=str(path), version=Version(None, None), metadata={"dataset": "m.windows"})
    with pytest.raises(DatasetError, match=r"dataset 'm\.windows'"):
        ds.load()
