"""benchmarks/gpu_smoke.py: the command that runs every ``gpu`` node on one device. On a machine without a
GPU its ``--device cpu`` path runs here, end to end, on one method at ``--env=test`` sizes: the same
runner, hook and table as the CUDA run, with the device check reversed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
smoke = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(smoke)


def test_judge_says_where_a_node_ran():
    boom = RuntimeError("CUDA out of memory")
    assert smoke.judge("cuda", ["cuda"], 1024, None) == (True, "")
    assert smoke.judge("cuda", ["cuda"], 0, None)[0] is False  # handed cuda, nothing allocated there
    assert smoke.judge("cuda", ["cpu"], 0, None) == (False, "handed cpu, not cuda")
    assert smoke.judge("cpu", ["cpu"], 0, None) == (True, "")
    assert smoke.judge("cpu", ["cpu", "cuda"], 10, None)[0] is False
    assert smoke.judge("cpu", [], 0, None)[0] is False  # never asked core.runtime for a device
    assert smoke.judge("cuda", ["cuda"], 10, boom) == (False, "RuntimeError: CUDA out of memory")


def test_markdown_table_has_one_row_per_node():
    rows = [
        {
            "method": "m",
            "node": "m.train.a",
            "device": "cuda",
            "cuda_mib": 12.5,
            "seconds": 1.25,
            "ok": True,
            "note": "",
        },
        {
            "method": "m",
            "node": "m.train.b",
            "device": "cpu",
            "cuda_mib": 0.0,
            "seconds": 0.5,
            "ok": False,
            "note": "handed cpu, not cuda",
        },
    ]
    text = smoke.markdown(rows, "cuda", "test")
    assert "1 of 2 ok" in text
    assert "| m | `m.train.a` | cuda | 12.5 | 1.25 | yes |  |" in text
    assert "| m | `m.train.b` | cpu | 0 | 0.5 | **no** | handed cpu, not cuda |" in text


@pytest.mark.e2e
def test_cpu_smoke_runs_every_gpu_node_of_a_method(tmp_path, capsys):
    out = tmp_path / "smoke.md"
    assert smoke.main(["--device", "cpu", "--methods", "adamspike", "--out", str(out)]) == 0, capsys.readouterr().out
    table = out.read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| adamspike |")]
    gpu = smoke.gpu_nodes("adamspike", "test", {})
    assert gpu and len(rows) == len(gpu), table
    for name in gpu:
        row = next(r for r in rows if f"`{name}`" in r)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "cpu" and cells[3] == "0" and cells[5] == "yes", row
        assert float(cells[4]) >= 0


def test_cuda_without_a_gpu_says_so_in_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the CUDA run is benchmarks/gpu_smoke.py itself")
    assert smoke.main(["--device", "cuda", "--methods", "adamspike"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu_smoke: --device cuda, but torch sees no CUDA device (use --device cpu)"]
