"""Bad input, over the registry: typos inside mapping-typed parameters, unreadable user files, a broken
YAML file in an env, `--env=full` data stages under a memory limit and sweeps over seeds. Each stops with
one line naming the key, dataset or file (or, for seeds, just works)."""

from __future__ import annotations

import copy
import types
import typing
from typing import Annotated, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from pipelines.core.params import VariantName
from pipelines.core.registry import discover_methods
from tests.methods.test_all_pipelines import _deep_merge, _raw

METHODS = discover_methods()


# ---------------------------------------------------------------------------------------- mapping keys
def _strip(tp):
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _mapping_fields(model: type[BaseModel], path: tuple = (), seen=None):
    """(path, key type) of every mapping-typed field in a Params class tree (``*`` for a list item or a
    mapping value)."""
    seen = set() if seen is None else seen
    if model in seen:
        return
    seen.add(model)
    for name, f in model.model_fields.items():
        yield from _mapping_types(f.annotation, (*path, name), seen)


def _mapping_types(tp, path, seen):
    tp = _strip(tp)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for a in get_args(tp):
            yield from _mapping_types(a, path, seen)
    elif origin in (dict, typing.Mapping):
        key, value = get_args(tp)
        yield path, key
        yield from _mapping_types(value, (*path, "*"), seen)
    elif origin in (list, tuple):
        for a in get_args(tp):
            yield from _mapping_types(a, (*path, "*"), seen)
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        yield from _mapping_fields(tp, path, seen)


def _closed(key) -> bool:
    return get_origin(_strip(key)) is Literal


def _at(raw, path):
    """The raw mappings at a schema path (``*`` expands over list items)."""
    if not path:
        yield (), raw
        return
    head, rest = path[0], path[1:]
    if head == "*":
        items = enumerate(raw) if isinstance(raw, list) else (raw.items() if isinstance(raw, dict) else ())
        for k, v in items:
            for p, x in _at(v, rest):
                yield (k, *p), x
    elif isinstance(raw, dict) and head in raw:
        for p, x in _at(raw[head], rest):
            yield (head, *p), x


@pytest.mark.parametrize("m", METHODS)
def test_every_mapping_parameter_says_whose_keys_it_takes(m):
    """A mapping parameter either takes keys from a fixed set (``keys_of``: a typo is refused) or names
    chosen by the user (``dict[VariantName, ...]``: each a configuration / variant); a bare ``dict[str, ...]``
    would accept any typo in silence."""
    from pipelines.core.params import schema_for

    bare = [".".join(p) for p, key in _mapping_fields(schema_for(m)) if not _closed(key) and key is not VariantName]
    assert bare == [], f"{m}: mapping parameter(s) {bare} accept any key; use keys_of(...) or dict[VariantName, ...]"


@pytest.mark.parametrize("m", METHODS)
@pytest.mark.parametrize("env", ["base", "test", "full"])
def test_a_typo_inside_a_mapping_names_the_key(m, env):
    """Every fixed-key mapping an env sets (``softtorch.modes``, ``wedlm.data.answer_len``...) refuses a
    misspelt key with one line naming it, like every other key."""
    from pipelines.core.params import ParameterError, schema_for, validate

    schema = schema_for(m)
    raw = _raw("base", m) if env == "base" else _deep_merge(_raw("base", m), _raw(env, m))
    tried = 0
    for path, key in _mapping_fields(schema):
        if not _closed(key):
            continue
        for where, mapping in list(_at(raw, path)):
            if not isinstance(mapping, dict) or not mapping:
                continue
            first = next(iter(mapping))
            typo = f"{first}x"
            bad = copy.deepcopy(raw)
            target = bad
            for p in where:
                target = target[p]
            target[typo] = copy.deepcopy(mapping[first])
            dotted = ".".join(map(str, (m, *where, typo)))
            with pytest.raises(ParameterError, match=rf"^parameter {dotted}: unknown key \(typo\?\)") as e:
                validate(schema, bad, m)
            assert "\n" not in str(e.value)
            tried += 1
    if m in ("softtorch", "wedlm") and env == "base":
        assert tried, f"{m}: expected a fixed-key mapping to try"


def test_typo_in_a_mapping_on_the_command_line_stops_the_run(tmp_path):
    """`--params wedlm.data.answer_len.cuont=12` and `softtorch.modes.neuralsortx=smooth` stop before any run
    opens, with one line naming the key."""
    from tests.conftest import make_project, run_kedro

    project = make_project(tmp_path / "p")
    for m, item in [("wedlm", "wedlm.data.answer_len.cuont=12"), ("softtorch", "softtorch.modes.neuralsortx=smooth")]:
        res = run_kedro(project, m, "test", ["--params", item])
        key = item.split("=")[0]
        assert res.exit_code != 0
        errors = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
        assert len(errors) == 1 and errors[0].startswith(f"Error: parameter {key}: unknown key (typo?): use "), (
            res.output
        )
        assert "Traceback" not in res.output and "Running node" not in res.output
