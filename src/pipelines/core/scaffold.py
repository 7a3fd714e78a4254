"""``kedro method new <name>``: a new method folder, its parameters and its test, from a template
that already passes its own tests and the end-to-end ``--env=test`` run."""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).parent / "templates" / "method"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{1,30}$")


class ScaffoldError(ValueError):
    pass


def targets(root: Path, name: str) -> dict[str, Path]:
    pkg = root / "src" / "pipelines" / name
    files = {f"{stem}.py.tmpl": pkg / f"{stem}.py" for stem in ("__init__", "params", "spec", "data", "train")}
    files["README.md.tmpl"] = pkg / "README.md"
    for env in ("base", "test", "full"):
        files[f"parameters_{env}.yml.tmpl"] = root / "conf" / env / f"parameters_{name}.yml"
    files["test_method.py.tmpl"] = root / "tests" / "methods" / f"test_{name}.py"
    return files


def add_to_import_contracts(pyproject: Path, name: str) -> bool:
    """Name the new method in the import contracts of ``pyproject.toml`` (``[tool.importlinter]``): every
    list of ``"pipelines.<method>"`` entries gets ``"pipelines.<name>"`` (and the api-ignore list its
    ``"pipelines.<name>.** -> pipelines.core.api"``), in sorted order. False when there is nothing to edit."""
    import re

    if not pyproject.is_file():
        return False
    text = pyproject.read_text()
    entry = re.compile(r'^    "pipelines\.([a-z][a-z0-9_]*)(\.\*\* -> pipelines\.core\.api)?",\n', re.M)
    out, changed, pos = [], False, 0
    for block in re.finditer(r"(?:" + entry.pattern[1:] + r")+", text, re.M):
        lines = block.group(0).splitlines(keepends=True)
        suffix = entry.match(lines[0]).group(2) or ""
        new = f'    "pipelines.{name}{suffix}",\n'
        if new not in lines:
            lines = sorted([*lines, new])
            changed = True
        out += [text[pos : block.start()], "".join(lines)]
        pos = block.end()
    if changed:
        pyproject.write_text("".join(out) + text[pos:])
    return changed


def scaffold(name: str, title: str = "", root: Path | None = None, contracts: bool = True) -> list[Path]:
    """Write the files; refuses a bad name or one that exists (nothing is overwritten). ``contracts``: also
    name the method in pyproject.toml's import contracts (tests that scaffold a throw-away method don't)."""
    from pipelines.core.runctx import project_root

    root = root or project_root()
    if not NAME_RE.match(name) or keyword.iskeyword(name) or name in {"core", "pipelines", "test"}:
        raise ScaffoldError(f"method name '{name}': use 2-31 lowercase letters, digits or '_', starting with a letter")
    files = targets(root, name)
    existing = [str(p.relative_to(root)) for p in files.values() if p.exists()]
    if existing:
        raise ScaffoldError(f"method '{name}' exists already ({', '.join(existing)}); nothing written")
    subst = {"name": name, "title": title or f"{name} (new method)"}
    for tmpl, dest in files.items():
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(Template((TEMPLATES / tmpl).read_text()).substitute(subst))
    if contracts:
        add_to_import_contracts(root / "pyproject.toml", name)
    return list(files.values())
