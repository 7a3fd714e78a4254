"""Every ``--env=full`` data stage fits a small machine or stops at once in one line (issue #24).

For each method with a conf/full env, its ``data``-tagged nodes (not those tagged ``gpu``) run at ``--env=full`` in a subprocess whose
data segment is capped (RLIMIT_DATA; RLIMIT_AS would count torch's reserved address space), with tiny user
files written where the full env expects them (valid files: the run gets past the checks at the door).
The run either completes, or fails with its last line ``Error: ...`` and no traceback: a method that
builds an 8 GB synthetic object it does not use (wedlm's Markov chain over 32,000 symbols, built before
its own-data files were read) hits the cap and fails here with a MemoryError traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT, make_project

pytestmark = [pytest.mark.e2e, pytest.mark.full_env]

LIMIT_BYTES = 6 << 30  # a quarter of the 24 GB machine of the issue: a data stage is far below it
TIMEOUT_S = 240  # a data stage still running then (a full-size synthetic corpus) is skipped, said
FULL_METHODS = sorted(p.stem.removeprefix("parameters_") for p in (ROOT / "conf" / "full").glob("parameters_*.yml"))


def _params(method: str, env: str):
    from pipelines.core.params import schema_for, validate
    from pipelines.core.registry import method_config

    return validate(schema_for(method), method_config(method, env=env), method)


def _data(method: str) -> dict:
    from pipelines.core.registry import method_config

    return dict(method_config(method, env="full").get("data") or {})


def _put(project: Path, rel: str) -> Path:
    path = project / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _wedlm(project: Path) -> None:
    d = _data("wedlm")
    rng = np.random.default_rng(0)
    rows = [
        {
            "regime": r,
            "prompt": rng.integers(0, d["n_symbols"], 5).tolist(),
            "answer": rng.integers(0, d["n_symbols"], d["answer_len"][r]).tolist(),
        }
        for r in d["answer_len"]
    ]
    for key in ("train_path", "test_path"):
        _put(project, d[key]).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _bimu(project: Path) -> None:
    rng = np.random.default_rng(0)
    n = 20
    pd.DataFrame(
        {
            "label": np.arange(n) % 10,
            "split": ["train", "test"] * (n // 2),
            **{f"x{i}": rng.random(n) for i in range(784)},
        }
    ).to_csv(_put(project, _data("bimu")["user_path"]), index=False)


def _featjnd(project: Path) -> None:
    import torch

    from pipelines.featjnd.data import digits_canvas

    data = digits_canvas(0, 20, 10, 10, test_renders=1)
    torch.save({k: v for k, v in data.items() if k != "mask_test"}, _put(project, _data("featjnd")["path"]))


def _ghost(project: Path) -> None:
    d = _data("ghost")
    rng = np.random.default_rng(0)
    pd.DataFrame(
        {
            "split": ["train", "val", "calib", "test"] * 2,
            "tokens": [rng.integers(0, d["vocab_size"], d["seq_len"]).tolist() for _ in range(8)],
        }
    ).to_parquet(_put(project, d["user_file"]))


def _hobit(project: Path) -> None:
    rng = np.random.default_rng(0)
    pd.DataFrame(
        {
            "split": ["train"] * 6 + ["test"] * 2,
            "fact": [0, 0, 1, 2, 3, 4, 5, 6],
            "q": list(rng.normal(size=(8, 4))),
            "d": list(rng.normal(size=(8, 4))),
        }
    ).to_parquet(_put(project, _data("hobit")["user_path"]))


def _llds(project: Path) -> None:
    facts, questions = [], []
    for i in range(12):
        facts.append((f"p{i}", "born_in", f"c{i % 5}"))
        questions += [(f"p{i}", "born_in|city_in", f"n{i % 5 % 3}"), (f"p{i}", "born_in", f"c{i % 5}")]
    facts += [(f"c{c}", "city_in", f"n{c % 3}") for c in range(5)]
    d = _data("llds")
    pd.DataFrame(facts, columns=["subject", "relation", "object"]).to_parquet(_put(project, d["facts_path"]))
    pd.DataFrame(questions, columns=["subject", "relations", "answer"]).to_parquet(_put(project, d["questions_path"]))


def _mesa(project: Path) -> None:
    from pipelines.mesa.data import synthetic

    d = _data("mesa")
    for df, key in zip(synthetic(_params("mesa", "test")), ("pretrain_path", "align_path", "eval_path")):
        df.to_parquet(_put(project, d[key]))


def _mts(project: Path) -> None:
    rng = np.random.default_rng(0)
    n = 30
    pd.DataFrame(
        {
            **{f"x{i}": rng.normal(size=n) for i in range(4)},
            "y": np.arange(n) % 2,
            "is_syn": [False, True] * (n // 2),
            "split": ["train", "meta", "test"] * (n // 3),
            "quality": ["good", "bad"] * (n // 2),
        }
    ).to_parquet(_put(project, _data("mts")["path"]))


def _rankcal(project: Path) -> None:
    d = _data("rankcal")
    rng = np.random.default_rng(9)
    for name in (x.removeprefix("file:") for x in d["datasets"] if str(x).startswith("file:")):
        n = 40
        pd.DataFrame(
            {
                "x_0": rng.normal(size=n),
                "x_1": rng.normal(size=n),
                "ranking": [",".join(map(str, rng.permutation(4))) for _ in range(n)],
            }
        ).to_csv(_put(project, f"{d['user_dir']}/{name}.csv"), index=False)


def _rlcracker(project: Path) -> None:
    from pipelines.rlcracker.data import synthetic_language

    d = _data("rlcracker")
    lexicon, corpus = synthetic_language(_params("rlcracker", "test"))
    corpus.to_parquet(_put(project, d["corpus_path"]))
    lexicon.to_parquet(_put(project, d["lexicon_path"]))


def _svgt(project: Path) -> None:
    from pipelines.svgt.data import make_corpus

    make_corpus(_params("svgt", "test")).to_parquet(_put(project, _data("svgt")["user_path"]))


# the methods whose full env reads user files at paths it names, and a tiny valid file for each
TINY_FILES = {
    "wedlm": _wedlm,
    "bimu": _bimu,
    "featjnd": _featjnd,
    "ghost": _ghost,
    "hobit": _hobit,
    "llds": _llds,
    "mesa": _mesa,
    "mts": _mts,
    "rankcal": _rankcal,
    "rlcracker": _rlcracker,
    "svgt": _svgt,
}


# data stages known to pass the cap at full today (left for their methods; the test says so, it does not pass them)
OVER_CAP = {
    "tess": "data stage allocates an n x max_tokens x hidden float tensor for the texts' token embeddings "
    "(torch.zeros in its data nodes) past 6 GiB at --env=full: not fixed yet (#24)",
    "softtorch": "data.speed (the soft-sort timing benchmark, softops._ot) allocates past 6 GiB at --env=full "
    "sizes: not fixed yet (#24)",
}


@pytest.fixture(scope="module")
def full_project(tmp_path_factory) -> Path:
    project = make_project(tmp_path_factory.mktemp("full_env"))
    for write in TINY_FILES.values():
        write(project)
    return project


def data_nodes(method: str) -> list[str]:
    """The method's data stage: its ``data`` nodes, less those tagged ``gpu`` (a base model trained on
    the GPU node, e.g. kvindexer's ``data.base_model``: training, not data, and not a CPU test's to run)."""
    from pipelines.core.registry import LazyPipelines

    return [n.name for n in LazyPipelines()[method].nodes if "data" in n.tags and "gpu" not in n.tags]


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (LIMIT_BYTES, LIMIT_BYTES))


def test_every_full_env_that_names_a_user_file_gets_one():
    """A new full env that points at a user file needs a tiny one here, or this test would not run it."""
    missing = []
    for m in FULL_METHODS:
        d = _data(m)
        named = {k: v for k, v in d.items() if isinstance(v, str) and ("/" in v) and k != "source"}
        if named and m not in TINY_FILES:
            missing.append(f"{m}: {named}")
    assert not missing, missing


@pytest.mark.parametrize(
    "method",
    [
        pytest.param(m, marks=pytest.mark.xfail(reason=OVER_CAP[m], strict=False)) if m in OVER_CAP else m
        for m in FULL_METHODS
    ],
)
def test_full_env_data_stage_fits_or_stops_in_one_line(full_project, method):
    nodes = data_nodes(method)
    assert nodes, f"{method} has no data node"
    env = {
        **os.environ,
        "KEDRO_DISABLE_TELEMETRY": "true",
        "MLFLOW_TRACKING_URI": f"sqlite:///{full_project / 'mlflow.db'}",
    }
    try:
        res = subprocess.run(
            [sys.executable, "-m", "kedro", "run", f"--pipeline={method}", "--env=full", "--nodes=" + ",".join(nodes)],
            cwd=full_project,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            preexec_fn=_cap,
            check=False,
        )
    except subprocess.TimeoutExpired:  # under the cap all along, but not finished: said, not passed
        pytest.skip(
            f"{method}: the --env=full data stage stayed under {LIMIT_BYTES >> 30} GiB for {TIMEOUT_S} s "
            f"and had not finished"
        )
    out = res.stderr + res.stdout
    assert res.returncode >= 0, f"{method}: killed by signal {-res.returncode}\n{out[-3000:]}"
    assert "MemoryError" not in out and "can't allocate memory" not in out, (
        f"{method}: the --env=full data stage needs more than {LIMIT_BYTES >> 30} GiB\n{out[-3000:]}"
    )
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert "Traceback" not in out and lines and lines[-1].startswith("Error: "), (
            f"{method}: the --env=full data stage failed without a one-line error\n{out[-3000:]}"
        )
