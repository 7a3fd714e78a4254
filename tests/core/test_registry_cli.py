"""Registry discovery (file system only, lazy imports), the project CLI's listing and one-line errors."""

import json
import subprocess
import sys

from click.testing import CliRunner

from pipelines.core.registry import LazyPipelines, discover_methods
from tests.conftest import ROOT


def test_discovery_finds_method_folders_only():
    names = discover_methods()
    assert "tess" in names and "core" not in names
    expected = sorted(
        {
            p.parent.name
            for p in (ROOT / "src" / "pipelines").glob("*/*.py")
            if p.name in ("pipeline.py", "spec.py") and p.parent.name != "core"
        }
    )
    assert names == expected


def test_default_is_tess_and_imports_only_what_is_asked():
    code = (
        "import sys; from pipelines.core.registry import LazyPipelines; p = LazyPipelines(); "
        "d = p['__default__']; print(sorted({m.split('.')[1] for m in sys.modules "
        "if m.startswith('pipelines.') and m.split('.')[1] not in ('core', 'settings')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == ["tess"]


def test_unknown_pipeline_is_a_key_error():
    import pytest

    with pytest.raises(KeyError):
        LazyPipelines()["no_such_method"]


def test_registry_list_json_matches_discovery():
    from pipelines.cli import registry_list

    res = CliRunner().invoke(registry_list, ["--json"])
    assert res.exit_code == 0 and json.loads(res.output) == discover_methods()


def test_bad_runtime_parameter_stops_with_one_line(e2e_project):
    from tests.conftest import run_kedro

    res = run_kedro(e2e_project, "tess", extra=["--params", "tess.train.lr=-1"])
    assert res.exit_code != 0
    assert "Error: parameter tess.train.lr: Input should be greater than 0" in res.output
