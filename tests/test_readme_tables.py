"""Every method README's gates and claims tables equal its committed default-run report
(`benchmarks/results/default_runs/<m>.report.json`), and the generator is a real round trip."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)

from pipelines.core.registry import discover_methods  # noqa: E402


def test_every_method_has_a_committed_default_run_report():
    assert set(rt.methods()) == set(discover_methods())


@pytest.mark.parametrize("m", rt.methods())
def test_readme_tables_equal_the_default_run_report(m):
    readme, text, new = rt.updated(m)
    assert rt.BEGIN in text, f"{readme}: no generated block (run python benchmarks/readme_tables.py --write)"
    assert new == text, f"{readme}: tables differ from {m}.report.json (python benchmarks/readme_tables.py --write)"


def test_the_block_carries_every_claim_verdict_and_gate_of_the_report():
    m = rt.methods()[0]
    rep = json.loads((rt.REPORTS / f"{m}.report.json").read_text())
    block = rt.render(m, rep)
    for c in rep["claims"]:
        assert f"| {c['id']} |" in block
    for g in rep.get("gates") or []:
        assert f"| {g['id']} |" in block
    # a changed value changes the block: the check would catch a README left behind
    rep["claims"][0]["value"] = 7.625
    assert "7.625" in rt.render(m, rep) and rt.render(m, rep) != block


def test_first_write_replaces_hand_written_tables_in_place():
    text = "intro\n\n| claim | metric | op | threshold | value | holds |\n|---|---|---|---|---|---|\n| a | `m` | >= | 1 | 2 | yes |\n\nafter\n"
    out = rt._replace_tables(text, "BLOCK")
    assert out == "intro\n\nBLOCK\n\nafter\n"
