"""Compare two reports of one pipeline (e.g. before and after a refactor): every variant metric and
derived metric present in both (values equal to a relative tolerance), what only one has, and the claims
table side by side (value and verdict).

    python benchmarks/compare_reports.py OLD.report.json NEW.report.json [--rtol 1e-9]
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def _close(a, b, rtol: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=rtol * 1e-3)


def compare(old: dict, new: dict, rtol: float = 1e-9) -> dict:
    changed, only_old, only_new = [], [], []
    flat = {}
    for tag, r in (("old", old), ("new", new)):
        d = {f"variants.{v}.{k}": x for v, row in r.get("variants", {}).items() for k, x in row.items()}
        d.update(r.get("metrics", {}))
        flat[tag] = d
    for k in sorted(set(flat["old"]) | set(flat["new"])):
        if k not in flat["new"]:
            only_old.append(k)
        elif k not in flat["old"]:
            only_new.append(k)
        elif not _close(flat["old"][k], flat["new"][k], rtol):
            changed.append((k, flat["old"][k], flat["new"][k]))
    claims = []
    newc = {c["id"]: c for c in new.get("claims", [])}
    for c in old.get("claims", []):
        n = newc.get(c["id"], {})
        claims.append(
            (
                c["id"],
                c.get("value"),
                c.get("verdict", "holds" if c.get("holds") else "fails"),
                n.get("value"),
                n.get("verdict"),
                n.get("ci"),
                n.get("untested_by"),
            )
        )
    return {
        "changed": changed,
        "only_old": only_old,
        "only_new": only_new,
        "claims": claims,
        "n_common": len(set(flat["old"]) & set(flat["new"])),
    }


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def markdown(res: dict) -> str:
    out = [
        f"{res['n_common']} values in both; {len(res['changed'])} differ; "
        f"{len(res['only_old'])} only before; {len(res['only_new'])} only after"
    ]
    for k, a, b in res["changed"][:40]:
        out.append(f"- changed `{k}`: {a!r} → {b!r}")
    if res["only_old"]:
        out.append("- only before: " + ", ".join(f"`{k}`" for k in res["only_old"][:40]))
    if res["only_new"]:
        out.append("- only after: " + ", ".join(f"`{k}`" for k in res["only_new"][:40]))
    out += ["", "| claim | before | verdict before | after [95% CI] | verdict after |", "|---|---|---|---|---|"]
    for cid, v0, d0, v1, d1, ci, unt in res["claims"]:
        cell = _f(v1) + (f" [{_f(ci[0])}, {_f(ci[1])}]" if ci else "")
        d1 = f"untested ({', '.join(unt)})" if d1 == "untested" else d1
        out.append(f"| {cid} | {_f(v0)} | {d0} | {cell} | {d1} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rtol", type=float, default=1e-9)
    a = ap.parse_args(argv)
    res = compare(json.load(open(a.old)), json.load(open(a.new)), a.rtol)
    print(markdown(res))
    return 1 if res["changed"] else 0


if __name__ == "__main__":
    sys.exit(main())
