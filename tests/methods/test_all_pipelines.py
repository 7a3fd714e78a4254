"""One smoke test over the registry: every registered pipeline runs at --env=test and writes a report
with the contract's schema, every claim evaluated, one MLflow parent run with a child per variant, and
its plots. A new method is covered the moment its folder exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.core.registry import discover_methods
from tests.conftest import ROOT

METHODS = discover_methods()
REPORT_KEYS = {
    "pipeline",
    "env",
    "git_commit",
    "seeds",
    "params_hash",
    "save_version",
    "threads",
    "omp_wait_policy",
    "variants",
    "variants_std",
    "metrics",
    "claims",
    "claims_held",
    "claims_declared",
    "artifacts",
    "wall_seconds",
    "gates",
    "verdicts",
    "variants_ci",
    "interval",
}


def _raw(env: str, m: str) -> dict:
    f = ROOT / "conf" / env / f"parameters_{m}.yml"
    return (yaml.safe_load(f.read_text()) or {}).get(m, {}) if f.is_file() else {}


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize("m", METHODS)
@pytest.mark.parametrize("env", ["base", "test", "full"])
def test_parameters_of_every_env_validate(m, env):
    """conf/base, and base with each env's delta, parse with the method's strict schema."""
    from pipelines.core.params import schema_for, validate

    schema = schema_for(m)
    assert schema is not None, f"src/pipelines/{m}/params.py defines no Params"
    raw = _raw("base", m) if env == "base" else _deep_merge(_raw("base", m), _raw(env, m))
    p = validate(schema, raw, m)
    assert p.claims, f"{m} declares no claims"


def _empty_over_full(base: dict, delta: dict, path: str = "") -> list[str]:
    out = []
    for k, v in delta.items():
        b = base.get(k)
        if isinstance(v, dict) and isinstance(b, dict):
            out += [f"{path}{k}"] if not v and b else _empty_over_full(b, v, f"{path}{k}.")
    return out


@pytest.mark.parametrize("m", METHODS)
@pytest.mark.parametrize("env", ["test", "full"])
def test_no_env_empties_a_mapping_it_cannot_empty(m, env):
    """Env files deep-merge over base, so `key: {}` over a non-empty base mapping changes nothing; a file
    that writes it meant a reset that silently does not happen (set each entry instead)."""
    assert _empty_over_full(_raw("base", m), _raw(env, m)) == [], f"conf/{env}/parameters_{m}.yml"


@pytest.mark.parametrize("m", METHODS)
def test_node_names_and_tags_follow_the_contract(m):
    from pipelines.core.registry import load_pipeline

    nodes = load_pipeline(m).nodes
    names = {n.name for n in nodes}
    for n in nodes:
        stage = n.name.split(".")[1]
        assert n.name.startswith(f"{m}.") and stage in {"data", "train", "evaluate"}, n.name
        assert stage in n.tags, f"{n.name} lacks the tag {stage}"
    assert {f"{m}.evaluate.report", f"{m}.evaluate.plots"} <= names
    # one train.<variant> node per trained variant (a method whose variants are decoders or estimators of
    # one trained model may have a single one)
    assert sum(n.startswith(f"{m}.train.") for n in names) >= 1, "no train.<variant> node"


SPEC_METHODS = [m for m in METHODS if (ROOT / "src" / "pipelines" / m / "spec.py").is_file()]


@pytest.mark.parametrize("m", SPEC_METHODS)
def test_one_train_node_per_planned_variant(m):
    """Core builds one train.<variant> node per variant of the validated params; nothing else trains but
    the shared training steps the method declares (``Data(..., stage="train")``, e.g. a base model)."""
    from pipelines.core.registry import load_pipeline, validated_params
    from pipelines.core.spec import load_spec

    spec = load_spec(m)
    trained = spec.trained(validated_params(m, spec))
    shared = {f"{m}.{d.stage}.{d.name}" for d in spec.data if d.stage == "train" or "train" in d.tags}
    names = {n.name for n in load_pipeline(m).only_nodes_with_tags("train").nodes}
    assert names == {f"{m}.train.{v}" for v in trained} | shared


@pytest.mark.parametrize("m", METHODS)
def test_bad_parameter_names_the_key(m):
    """An unknown key, a wrong type and a claim on a metric nothing produces each stop with one line
    naming the key or the claim (the same check the project's `kedro run` makes before any run opens)."""
    import copy

    from pipelines.core.params import ParameterError, schema_for, validate

    schema, raw = schema_for(m), _raw("base", m)
    with pytest.raises(ParameterError, match=rf"parameter {m}\.n_trian: unknown key"):
        validate(schema, {**raw, "n_trian": 3}, m)
    with pytest.raises(ParameterError, match=rf"parameter {m}\.seeds"):
        validate(schema, {**raw, "seeds": "0,1"}, m)
    if m in SPEC_METHODS:
        from pipelines.core.spec import load_spec

        bad = copy.deepcopy(raw)
        bad["claims"] = [
            *bad["claims"],
            {"id": "typo_claim", "text": "t", "metric": "gain.nothing.x_vs_y", "op": ">=", "threshold": 0},
        ]
        with pytest.raises(ParameterError, match="claim 'typo_claim'"):
            load_spec(m).check(validate(schema, bad, m))


@pytest.mark.e2e
@pytest.mark.parametrize("m", METHODS)
def test_pipeline_runs_at_test_env_and_reports(m, test_env_run):
    run = test_env_run(m)
    r = run.report
    assert REPORT_KEYS <= set(r), REPORT_KEYS - set(r)
    assert r["pipeline"] == m and r["env"] == "test" and r["wall_seconds"] > 0
    assert r["variants"] and all(isinstance(row, dict) and row for row in r["variants"].values())
    declared = [c["id"] for c in _deep_merge(_raw("base", m), _raw("test", m))["claims"]]
    assert [c["id"] for c in r["claims"]] == declared
    for c in r["claims"]:
        assert isinstance(c["holds"], bool) and c["verdict"] in {"holds", "fails", "inconclusive", "untested"}, c
        assert c["value"] is not None or c["verdict"] in ("fails", "untested"), c
        assert c["holds"] == (c["verdict"] == "holds")
        # a verdict is decided by the seed interval wherever the metric has two or more seeds
        if c.get("n_seeds", 1) >= 2 and c["value"] is not None:
            assert "ci" in c, c
    failed = {g["id"] for g in r["gates"] if not g["passed"]}
    for c in r["claims"]:
        needs = set(c.get("requires", [g["id"] for g in r["gates"]]))
        assert (c["verdict"] == "untested") == bool(needs & failed), c
    assert r["claims_held"] == sum(c["holds"] for c in r["claims"])
    assert sum(r["verdicts"].values()) == len(r["claims"])
    plots = run.project / "data" / "08_reporting" / m / "plots"
    saved = sorted((plots / r["save_version"]).rglob("*.png"))  # this run's version
    assert r["artifacts"] and saved, "no plots saved"
    assert set(r["artifacts"]) <= {p.name for p in saved}


@pytest.mark.e2e
@pytest.mark.parametrize("m", METHODS)
def test_mlflow_parent_and_variant_children(m, test_env_run):
    import mlflow

    run = test_env_run(m)
    client = mlflow.MlflowClient(tracking_uri=run.tracking_uri)
    exp = client.get_experiment_by_name(m)
    assert exp is not None
    sv = run.report["save_version"]
    [parent] = client.search_runs([exp.experiment_id], f"tags.role = 'parent' and tags.save_version = '{sv}'")
    assert parent.info.status == "FINISHED"
    for tag in ("pipeline", "env", "git_commit", "params_hash", "threads", "omp_wait_policy"):
        assert parent.data.tags.get(tag), tag
    assert {f"claim.{c['id']}" for c in run.report["claims"]} <= set(parent.data.metrics)
    assert any(k.startswith(f"{m}.") for k in parent.data.params), "flattened parameters not logged"
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    variants = {c.data.tags.get("variant") for c in children if c.data.tags.get("role") == "variant"}
    assert len(variants) >= 2 and variants == set(run.report["variants"])
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.json", "plots"} <= arts


def test_every_method_has_a_readme_with_claims_and_no_outside_links():
    for m in METHODS:
        text = (ROOT / "src" / "pipelines" / m / "README.md").read_text()
        assert "claim" in text.lower(), m
        assert "shared/" not in text and "ARCHITECTURE.md" not in text, f"{m}/README.md links outside the repo"


def _project_files() -> list[Path]:
    tracked = [
        *ROOT.glob("*.md"),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "conf").rglob("*.yml"),
        *(ROOT / "src").rglob("*.md"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "notebooks").glob("*.ipynb"),
    ]
    return [p for p in tracked if p.is_file()]


def test_nothing_links_outside_the_repository():
    bad = [
        str(p.relative_to(ROOT))
        for p in _project_files()
        if "../shared" in p.read_text(errors="ignore")
        or "shared/design" in p.read_text(errors="ignore")
        or "shared/methods" in p.read_text(errors="ignore")
    ]
    assert not bad, f"files linking outside the repository: {bad}"
