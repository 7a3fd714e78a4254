"""What the MLflow UI shows of a run (issue #23 §1): experiments tagged as classic ML training (the UI opens
them on their runs, not on GenAI traces), parent runs named ``<pipeline> · <env> · <save version>``, child
runs named after their variant and carrying its own parameters and seeds, the headline and the claim /
gate counts as parent metrics. Unit checks on a sqlite store, a re-logged report, and one ``kedro run
--env=test`` of a fast method (recm: a ``variants: {name: spec}`` mapping, a top-level ``recm:`` block,
a headline and gates)."""

from __future__ import annotations

import json

import pytest

from pipelines.core.mlflow_logging import (
    CLASSIC_ML_KIND,
    EXPERIMENT_KIND_TAG,
    mark_experiment_kind,
    parent_run_name,
    unflatten_params,
    variant_params,
    variant_seeds,
)
from pipelines.core.report import build_report
from tests.conftest import run_kedro

FAST = "recm"

PARAMS = {
    "seeds": [0, 1, 2],
    "headline": {"metric": "mse", "method": "ours", "lower_is_better": True},
    "ours": {"alpha": 0.01},  # a top-level block named after a variant
    "variants": {"ours": {"kind": "recm", "rule": "two_ema"}, "base": {"kind": "strict"}},
    "variant_seeds": {"base": 1},
    "gates": [
        {"id": "base_learns", "text": "t", "metric": "variants.base.mse", "op": "<=", "threshold": 5.0},
        {"id": "never", "text": "t", "metric": "variants.ours.mse", "op": "<", "threshold": 0.0},
    ],
    "claims": [
        {"id": "ours_better", "text": "t", "metric": "variants.ours.mse", "op": "<=", "threshold": 1.5, "requires": []},
        {"id": "ours_worse", "text": "t", "metric": "variants.ours.mse", "op": ">=", "threshold": 3.0, "requires": []},
        {
            "id": "gated",
            "text": "t",
            "metric": "variants.ours.mse",
            "op": "<=",
            "threshold": 9.0,
            "requires": ["never"],
        },
    ],
}
ROWS = [{"variant": "ours", "seed": s, "mse": 1.0 + 0.1 * s} for s in (0, 1, 2)] + [
    {"variant": "base", "seed": 0, "mse": 2.0}
]


def _report() -> dict:
    return build_report("alpha", PARAMS, [dict(r) for r in ROWS])


def test_variant_params_are_the_entries_keyed_by_the_variant():
    assert variant_params(PARAMS, "ours") == {
        "config.alpha": "0.01",
        "variants.kind": "recm",
        "variants.rule": "two_ema",
    }
    assert variant_params(PARAMS, "base") == {"variants.kind": "strict", "variant_seeds": "1"}
    # a list of {name: ...} items (losa's variants), a list of names (nothing of their own)
    listed = {"variants": [{"name": "dense", "kind": "dense"}, {"name": "sparse", "kind": "s", "frac": 0.2}]}
    assert variant_params(listed, "sparse") == {"variants.kind": "s", "variants.frac": "0.2"}
    assert variant_params({"variants": ["a", "b"], "seeds": [0]}, "a") == {}
    assert variant_params(None, "a") == {}


def test_variant_seeds_are_the_prefix_it_ran_on():
    rep = _report()
    assert variant_seeds(rep, "ours") == [0, 1, 2]
    assert variant_seeds(rep, "base") == [0]
    assert variant_seeds(rep, "missing") == [0, 1, 2]


def test_parent_run_name_and_flattened_params_read_back():
    assert parent_run_name("tess", "test", "2026-12-03T06.00.00.000Z") == "tess · test · 2026-12-03T06.00.00.000Z"
    assert parent_run_name("tess", None, None) == "tess · base"
    flat = {"alpha.seeds": "[0, 1]", "alpha.variants.a.kind": "dense", "alpha.n": "3", "alpha.on": "True"}
    assert unflatten_params(flat) == {
        "alpha": {"seeds": [0, 1], "variants": {"a": {"kind": "dense"}}, "n": 3, "on": True}
    }


@pytest.fixture
def store(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield uri
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)


def _children(client, parent):
    return {
        r.info.run_name: r
        for r in client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    }


def test_parent_metrics_and_child_params(store, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipelines.core.mlflow_logging import log_report

    rep = _report()
    assert rep["verdicts"] == {"holds": 1, "fails": 1, "inconclusive": 0, "untested": 1}
    exp_id = mlflow.create_experiment("alpha", (tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=exp_id) as run:
        log_report(rep, PARAMS)
    client = MlflowClient(store)
    parent = client.get_run(run.info.run_id)
    m = parent.data.metrics
    assert m["headline.mse"] == pytest.approx(1.1) and m["headline.mse_std"] == pytest.approx(
        rep["variants_std"]["ours"]["mse"]
    )
    assert m["headline.best_baseline.mse"] == 2.0 and m["headline.relative_gain"] == pytest.approx(0.45)
    assert parent.data.tags["headline"] == "mse of ours (lower is better)"
    assert parent.data.tags["headline.best_baseline"] == "base"
    assert {k: m[f"claims_{k}"] for k in ("holds", "fails", "inconclusive", "untested")} == rep["verdicts"]
    assert (m["claims_held"], m["claims_declared"], m["gates_passed"], m["gates_declared"]) == (1, 3, 1, 2)
    children = _children(client, parent)
    assert set(children) == {"ours", "base"}
    assert children["ours"].data.params == {
        "variant": "ours",
        "seeds": "[0, 1, 2]",
        "n_seeds": "3",
        "config.alpha": "0.01",
        "variants.kind": "recm",
        "variants.rule": "two_ema",
    }
    assert children["base"].data.params == {
        "variant": "base",
        "seeds": "[0]",
        "n_seeds": "1",
        "variants.kind": "strict",
        "variant_seeds": "1",
    }
    assert children["base"].data.metrics["mse"] == 2.0


def test_no_headline_logs_no_headline_metric(store, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipelines.core.mlflow_logging import log_report

    rep = build_report("beta", {"seeds": [0], "claims": []}, [{"variant": "a", "seed": 0, "x": 1.0}])
    exp_id = mlflow.create_experiment("beta", (tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=exp_id) as run:
        log_report(rep)
    parent = MlflowClient(store).get_run(run.info.run_id)
    assert not [k for k in parent.data.metrics if k.startswith("headline")]
    assert parent.data.metrics["gates_declared"] == 0 and "headline" not in parent.data.tags


def test_experiment_kind_is_set_once_and_a_chosen_kind_is_kept(store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.create_experiment("gamma")
    assert mark_experiment_kind(exp, client) is True
    assert client.get_experiment(exp).tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML_KIND
    chosen = client.create_experiment("delta", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    assert mark_experiment_kind(chosen, client) is False
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_relogged_report_is_named_tagged_and_has_variant_params(store, tmp_path):
    from mlflow.tracking import MlflowClient

    from pipelines.core.mlflow_logging import relog_report

    rep = {**_report(), "env": "test", "save_version": "2026-12-03T06.00.00.000Z"}
    folder = tmp_path / "data" / "08_reporting" / "alpha" / "report.json" / rep["save_version"]
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(rep))
    flat = {
        "alpha.seeds": "[0, 1, 2]",
        "alpha.ours.alpha": "0.01",
        "alpha.variants.ours.kind": "recm",
        "alpha.variants.ours.rule": "two_ema",
        "alpha.variants.base.kind": "strict",
        "alpha.variant_seeds.base": "1",
    }
    (folder / "params.json").write_text(json.dumps(flat))
    done = relog_report(folder / "report.json", store, "alpha")
    client = MlflowClient(store)
    parent = client.get_run(done["run_id"])
    assert client.get_experiment(parent.info.experiment_id).tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML_KIND
    assert parent.info.run_name == f"alpha · test · {rep['save_version']}"
    assert parent.data.metrics["headline.mse"] == pytest.approx(1.1)
    children = _children(client, parent)
    assert children["ours"].data.params["variants.rule"] == "two_ema"
    assert children["ours"].data.params["config.alpha"] == "0.01"
    assert children["base"].data.params["seeds"] == "[0]"


@pytest.mark.e2e
def test_kedro_run_is_what_the_ui_shows(tmp_path):
    from mlflow.tracking import MlflowClient

    from pipelines.core.scoreboard import row_from_report
    from tests.conftest import make_project

    project = make_project(tmp_path / "project")
    res = run_kedro(project, FAST, "test")
    assert res.exit_code == 0, res.output
    report = res.report
    client = MlflowClient(res.tracking_uri)
    exp = client.get_experiment_by_name(FAST)
    assert exp.tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML_KIND
    parents = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.run_name == f"{FAST} · test · {report['save_version']}"
    m = parent.data.metrics
    head = report["headline"]["metric"]
    row = row_from_report(report)
    assert m[f"headline.{head}"] == pytest.approx(report["variants"][report["headline"]["method"]][head])
    assert m[f"headline.{head}"] == pytest.approx(row.method_value)
    if row.relative_gain is not None:
        assert m["headline.relative_gain"] == pytest.approx(row.relative_gain)
    assert {k: int(m[f"claims_{k}"]) for k in report["verdicts"]} == report["verdicts"]
    assert m["claims_held"] == report["claims_held"] and m["claims_declared"] == report["claims_declared"]
    assert m["gates_passed"] == sum(g["passed"] for g in report["gates"]) and m["gates_declared"] == len(
        report["gates"]
    )
    children = _children(client, parent)
    assert set(children) == set(report["variants"])
    declared = json.loads((res.report_path.parent / "params.json").read_text())
    for name, child in children.items():
        p = child.data.params
        assert p["variant"] == name and p["seeds"] == str(report["seeds"]), name
        assert p["variants.kind"] == declared[f"{FAST}.variants.{name}.kind"], name
        assert {k for k in p if k.startswith("variants.")} == {
            f"variants.{k.split('.', 3)[3]}" for k in declared if k.startswith(f"{FAST}.variants.{name}.")
        }
    assert children[FAST].data.params["config.alpha"] == declared[f"{FAST}.{FAST}.alpha"]


def test_a_sweep_creates_its_experiment_as_classic_ml(tmp_path):
    from mlflow.tracking import MlflowClient

    from pipelines.core.sweep.store import Store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = Store(uri, "sweep_exp", tmp_path)
    assert store.client.get_experiment(store.experiment_id).tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML_KIND
    old = MlflowClient(uri).create_experiment("older")  # made before the platform tagged kinds
    assert EXPERIMENT_KIND_TAG not in MlflowClient(uri).get_experiment(old).tags
    Store(uri, "older", tmp_path)  # tagged before any point starts
    assert MlflowClient(uri).get_experiment(old).tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML_KIND


def test_a_lost_tagging_race_is_no_failure(store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.create_experiment("raced")

    class Raced:  # another run sets the tag between our read and our write, and our write fails
        def get_experiment(self, eid):
            return client.get_experiment(eid)

        def set_experiment_tag(self, eid, key, value):
            client.set_experiment_tag(eid, key, value)
            raise RuntimeError("UNIQUE constraint failed: experiment_tags.key, experiment_tags.experiment_id")

    assert mark_experiment_kind(exp, Raced()) is False
