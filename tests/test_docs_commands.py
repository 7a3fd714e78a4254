"""Every `kedro run` / `kedro sweep` command written in README.md, docs/ and the method READMEs passes
the checks a run makes before it starts (pipeline and env known, options parse, every parameter and
cross-field rule of every method it names valid, every claim and gate computable). Placeholders are
filled with a real method (`<method>`, `<slug>`, `<m>`) and one of its variants (`<variant>`).
The runs themselves are covered by the registry's end-to-end tests; this keeps the docs from drifting."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.conftest import ROOT

DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "src" / "pipelines").glob("*/README.md")),
]
FENCE = re.compile(r"```(?:bash|sh|shell|console)?\n(.*?)```", re.S)


def documented_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                if re.match(r"kedro (run|sweep)\b", line):
                    out.append((str(doc.relative_to(ROOT)), line))
    seen, unique = set(), []  # the same command in several docs is checked once
    for where, line in out:
        key = tuple(_args(line))
        if key not in seen:
            seen.add(key)
            unique.append((where, line))
    return unique


def _fill(cmd: str) -> str:
    cmd = re.sub(r"<(method|slug|m)>", "credal_dro", cmd)
    return cmd.replace("<variant>", "erm")


def _args(line: str) -> list[str]:
    words = shlex.split(_fill(line), comments=True)
    return words[2:]


COMMANDS = documented_commands()
SHOWN_FAILING = {("rankcal.ece.n_bins", "-3")}  # the docs' example of a point that fails


def _raw(names: list[str], env: str | None, params: dict) -> dict[str, dict]:
    """Each method's parameters as the run would read them: its env over base (Kedro's loader, read
    once per env), then the command's ``--params`` merged on top as dotted keys, the loader's rule."""
    from omegaconf import OmegaConf

    from pipelines.core.registry import method_config
    from pipelines.core.runctx import DEFAULT_PIPELINE

    over = OmegaConf.create({})
    for key, value in params.items():
        OmegaConf.update(over, key, value, force_add=True)
    out = {}
    for n in names:
        m = DEFAULT_PIPELINE if n == "__default__" else n
        base = OmegaConf.create({m: method_config(m, env=env, runtime_params={})})
        merged = OmegaConf.to_container(OmegaConf.merge(base, over), resolve=True)
        if merged.get(m):
            out[m] = merged[m]
    return out


def test_the_docs_have_commands():
    assert len(COMMANDS) > 20


@pytest.mark.parametrize(
    "where,line",
    [c for c in COMMANDS if c[1].startswith("kedro run")],
    ids=[f"{c[0]}:{c[1][:60]}" for c in COMMANDS if c[1].startswith("kedro run")],
)
def test_documented_run_command_passes_the_pre_run_checks(where, line, monkeypatch):
    from pipelines import cli

    args = _args(line)
    if any("<" in a for a in args):
        pytest.skip(f"placeholder left in {line!r}")
    monkeypatch.chdir(ROOT)
    ctx = cli.run.make_context("run", list(args))
    kw = ctx.params
    names = [kw["pipeline"]] if kw.get("pipeline") else (sorted(set(kw.get("pipelines") or ())) or ["__default__"])
    cli.check_request(names, kw.get("env"), kw.get("conf_source"))
    cli.validate_params(names, _raw(names, kw.get("env"), kw.get("params") or {}))


@pytest.mark.parametrize(
    "where,line",
    [c for c in COMMANDS if c[1].startswith("kedro sweep") and "--grid" in c[1]],
    ids=[f"{c[0]}:{c[1][:60]}" for c in COMMANDS if c[1].startswith("kedro sweep") and "--grid" in c[1]],
)
def test_documented_sweep_points_pass_the_pre_run_checks(where, line, monkeypatch):
    from pipelines import cli
    from pipelines.core.params import ParameterError
    from pipelines.core.sweep import expand_grid, parse_grid, parse_value

    args = _args(line)
    if any("<" in a for a in args):
        pytest.skip(f"placeholder left in {line!r}")
    monkeypatch.chdir(ROOT)
    pipeline = next(a.split("=", 1)[1] for a in args if a.startswith("--pipeline="))
    env = next((a.split("=", 1)[1] for a in args if a.startswith("--env=")), None)
    grids = [parse_grid(args[i + 1]) for i, a in enumerate(args) if a == "--grid"]
    cli.check_request([pipeline], env, None)
    for point in expand_grid(grids):
        raw = _raw([pipeline], env, {k: parse_value(v) for k, v in point.items()})
        bad = [k for k, v in point.items() if (k, v) in SHOWN_FAILING]
        if bad:  # docs/sweeps.md shows how a bad point fails: it must really fail, naming the key
            with pytest.raises(ParameterError, match=bad[0]):
                cli.validate_params([pipeline], raw)
        else:
            cli.validate_params([pipeline], raw)
