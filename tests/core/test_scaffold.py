"""The scaffold writes a method that passes its own end-to-end run; it never overwrites."""

import shutil

import pytest

from pipelines.core.registry import discover_methods
from pipelines.core.scaffold import ScaffoldError, scaffold
from tests.conftest import ROOT, run_kedro

NAME = "zz_scaffold_probe"


@pytest.fixture
def scaffolded():
    created = scaffold(NAME, title="probe", root=ROOT, contracts=False)
    try:
        yield created
    finally:
        shutil.rmtree(ROOT / "src" / "pipelines" / NAME, ignore_errors=True)
        for p in created:
            p.unlink(missing_ok=True)


@pytest.mark.e2e
def test_scaffolded_method_runs_end_to_end(scaffolded, e2e_project):
    assert NAME in discover_methods()
    shutil.copytree(ROOT / "conf", e2e_project / "conf", dirs_exist_ok=True)  # pick up the new parameters
    result = run_kedro(e2e_project, NAME)
    assert result.exit_code == 0, result.output
    report = result.report
    assert report["env"] == "test" and report["seeds"] == [0]
    assert set(report["variants"]) == {"ridge", "mean_baseline"}
    assert report["claims"][0]["id"] == "beats_mean_baseline" and isinstance(report["claims"][0]["holds"], bool)
    assert report["claims"][0]["holds"] is True  # ridge vs the train mean on its own synthetic data
    # the generated test file passes as written
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/methods/test_{NAME}.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-3000:]


def test_scaffold_refuses_existing_and_bad_names(scaffolded):
    with pytest.raises(ScaffoldError, match="exists already"):
        scaffold(NAME, root=ROOT, contracts=False)
    for bad in ("Bad", "1x", "core", "a-b", "class"):
        with pytest.raises(ScaffoldError, match="method name"):
            scaffold(bad, root=ROOT, contracts=False)
