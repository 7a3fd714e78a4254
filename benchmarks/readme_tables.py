"""Each method README's gates and claims tables, generated from the committed default-run report
(`benchmarks/results/default_runs/<m>.report.json`, written by `default_runs.py --out`), between markers:

    python benchmarks/readme_tables.py            # check: exit 1 naming every README whose tables differ
    python benchmarks/readme_tables.py --write    # rewrite the blocks (first time: replaces the tables)

A README's prose reads from its table; the table never drifts from the report (a test runs the check).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pipelines.core.report import claims_table, gates_table  # noqa: E402

REPORTS = ROOT / "benchmarks" / "results" / "default_runs"
BEGIN = "<!-- default-run:begin"
END = "<!-- default-run:end -->"
_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
_TABLE_HEAD = re.compile(r"^\| (gate|claim) \|")


def _counts(rep: dict) -> str:
    v = rep.get("verdicts") or {}
    return " / ".join(f"{v.get(k, 0)} {k}" for k in ("holds", "fails", "inconclusive", "untested"))


def timing_line(rep: dict) -> str:
    """One sentence: how the report was made (wall and CPU time, threads, load) and its verdict counts."""
    d = rep.get("default_run") or {}
    gates = rep.get("gates") or []
    failed = [g["id"] for g in gates if not g.get("passed")]
    gate_txt = (
        "no gates declared"
        if not gates
        else f"gate(s) failed: {', '.join(failed)}"
        if failed
        else f"all {len(gates)} gate(s) pass"
    )
    threads = f"`threads: {rep.get('threads_setting', 'auto')}` → {rep.get('threads')}"
    if d:
        how = (
            f"{d['wall_s']:.1f} s wall, {d['cpu_s']:.1f} s CPU ({threads}) on {d.get('usable_cpus', '?')} cores, "
            f"load {d['load_before']:.2f} before it, {d['date']}"
        )
    else:
        how = f"pipeline wall {rep.get('wall_seconds', float('nan')):.1f} s ({threads})"
    n = len(rep.get("seeds") or [])
    return (
        f"Default run (`python benchmarks/default_runs.py`): {how}; {n} seed(s), 95% t-intervals over seeds; "
        f"claims: {_counts(rep)}; {gate_txt}."
    )


def render(method: str, rep: dict) -> str:
    gates = gates_table(rep)
    body = "\n\n".join(x for x in (gates, claims_table(rep), timing_line(rep)) if x)
    return (
        f"{BEGIN} generated from benchmarks/results/default_runs/{method}.report.json by "
        f"`python benchmarks/readme_tables.py --write`; edit the report's run, not this block -->\n"
        f"{body}\n{END}"
    )


def _replace_tables(text: str, block: str) -> str | None:
    """First time: put the block where the README's gate/claim tables stand (they and the blank lines
    between them go); None when the README has no such table."""
    lines = text.split("\n")
    start = next((i for i, x in enumerate(lines) if _TABLE_HEAD.match(x)), None)
    if start is None:
        return None
    end = start
    i = start
    while i < len(lines):
        if lines[i].startswith("|"):
            end = i
            i += 1
        elif not lines[i].strip() and i + 1 < len(lines) and _TABLE_HEAD.match(lines[i + 1]):
            i += 1
        else:
            break
    return "\n".join(lines[:start] + [block] + lines[end + 1 :])


def updated(method: str) -> tuple[Path, str, str]:
    """(README path, current text, text with the generated block)."""
    readme = ROOT / "src" / "pipelines" / method / "README.md"
    rep = json.loads((REPORTS / f"{method}.report.json").read_text())
    text = readme.read_text()
    block = render(method, rep)
    if _BLOCK.search(text):
        new = _BLOCK.sub(lambda _: block, text, count=1)
    else:
        new = _replace_tables(text, block)
        if new is None:
            new = text.rstrip("\n") + "\n\n## Claims (default run)\n" + block + "\n"
    return readme, text, new


def methods() -> list[str]:
    return sorted(p.name.split(".")[0] for p in REPORTS.glob("*.report.json"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the blocks instead of checking them")
    ap.add_argument("methods", nargs="*", help="default: every method with a committed report")
    args = ap.parse_args(argv)
    stale = []
    for m in args.methods or methods():
        readme, text, new = updated(m)
        if new != text:
            if args.write:
                readme.write_text(new)
                print(f"{readme.relative_to(ROOT)}: tables written")
            else:
                stale.append(str(readme.relative_to(ROOT)))
    if stale:
        print(
            "out of date with their default-run report (run `python benchmarks/readme_tables.py --write`): "
            + ", ".join(stale),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
