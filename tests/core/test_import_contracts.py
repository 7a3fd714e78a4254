"""The import contracts in pyproject.toml (checked by `lint-imports` in .ci/run) name every registered method,
and the public API (pipelines.core.api) resolves every name it lists, lazily."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from pipelines.core.registry import discover_methods
from tests.conftest import ROOT


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def test_contracts_name_every_registered_method():
    methods = {f"pipelines.{m}" for m in discover_methods()}
    c = _contracts()
    assert set(c["methods-use-the-api"]["source_modules"]) == methods, "add the new method to pyproject.toml"
    assert set(c["methods-independent"]["modules"]) == methods
    assert set(c["core-imports-no-method"]["forbidden_modules"]) == methods
    ignored = {i.split(" -> ")[0].removesuffix(".**") for i in c["methods-use-the-api"]["ignore_imports"]}
    assert ignored == methods
    assert "core-acyclic" in c


def test_api_names_resolve_and_load_lazily():
    import pipelines.core.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    code = (
        "import sys; from pipelines.core.api import MethodParams, Method, TableSchema; "
        "import pipelines.credal_dro.params; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout


def test_unknown_api_name_lists_the_public_ones():
    import pytest

    import pipelines.core.api as api

    with pytest.raises(AttributeError, match="the public API: .*MethodParams"):
        api.not_a_name  # noqa: B018


def test_a_new_method_is_named_in_every_contract(tmp_path):
    """`kedro method new` adds the method to each list (what the first test checks for the registry)."""
    from pipelines.core.scaffold import add_to_import_contracts

    p = tmp_path / "pyproject.toml"
    p.write_text((ROOT / "pyproject.toml").read_text())
    assert add_to_import_contracts(p, "aaa_new") and not add_to_import_contracts(p, "aaa_new")
    c = {x["id"]: x for x in tomllib.loads(p.read_text())["tool"]["importlinter"]["contracts"]}
    assert "pipelines.aaa_new" in c["methods-use-the-api"]["source_modules"]
    assert "pipelines.aaa_new" in c["methods-independent"]["modules"]
    assert "pipelines.aaa_new" in c["core-imports-no-method"]["forbidden_modules"]
    assert "pipelines.aaa_new.** -> pipelines.core.api" in c["methods-use-the-api"]["ignore_imports"]
    assert c["methods-independent"]["modules"] == sorted(c["methods-independent"]["modules"])
