"""TESS: the labeller on hand-made series, label ↔ generating parameter, the lexicon extractor
(determinism, negation, hedges), the gated prefix (shapes; the prefix never enters the flatten head), no
future leakage, the LLM backend against a stub server, bad parameters, and the end-to-end --env=test run
(report, MLflow parent + child runs, a corrupt input naming its dataset, same seed → same report)."""
from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipelines.core.params import ParameterError, parse
from tests.conftest import ROOT, run_kedro

BASE = yaml.safe_load((ROOT / "conf/base/parameters_tess.yml").read_text())["tess"]
TEST = yaml.safe_load((ROOT / "conf/test/parameters_tess.yml").read_text())["tess"]


def merged(overrides: dict | None = None) -> dict:
    def deep(a, b):
        out = copy.deepcopy(a)
        for k, v in b.items():
            out[k] = deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return deep(deep(BASE, TEST), overrides or {})


LP = parse("tess", merged()).labeller


# ------------------------------------------------------------------------------------------ labeller
def test_labeller_on_hand_made_series():
    from pipelines.tess.data import apply_labeller, primitive_stats, shape_label

    rng = np.random.default_rng(0)
    H, L = 24, 96
    x = np.tile(rng.normal(0, 1, L), (4, 1))
    sx = x[0].std()
    y_no = np.full((4, H), x[0].mean())
    path = np.zeros((4, H))
    path[0] = 3 * sx                                        # big persistent jump from t=0: strong rise
    path[1, 16:] = -0.3 * sx                                # small late drop
    path[2] = 0.0                                           # no event
    path[3] = sx * np.sin(2 * np.pi * np.arange(H) / 6)     # oscillation
    y = y_no + path
    stats = primitive_stats(x, y, y_no)
    th = {"shift_lo": 0.5, "shift_hi": 2.0, "vol_lo": 0.3, "vol_hi": 1.0, "q_diffuse": 0.0, "tail_median": 0.3}
    lab = apply_labeller(stats, th, LP)
    assert list(lab["shift"]) == ["STRONG-RISE", "STABLE", "STABLE", "STABLE"]
    assert lab["lag"][1] == "LATE" and lab["lag"][2] == "DIFFUSE"
    assert lab["lag"][0] == "MID-PERSIST"                   # constant from t=0: centroid 0.52, tail 1/3 >= 0.3
    # volatility: y with no step-to-step movement is much calmer than a noisy history
    assert lab["vol"][0] == "MUCH-CALMER"
    # shape rules on clean templates
    t = np.arange(H, dtype=float)
    assert shape_label(t, 5, 0.15, 0.42) == "ASCEND"
    assert shape_label(-t, 5, 0.15, 0.42) == "DESCEND"
    assert shape_label(np.sin(np.pi * t / (H - 1)), 5, 0.15, 0.42) == "PEAK"
    assert shape_label(-np.sin(np.pi * t / (H - 1)), 5, 0.15, 0.42) == "TROUGH"
    assert shape_label(np.sin(2 * np.pi * t / 6), 5, 0.15, 0.42) == "OSCILLATE"
    assert shape_label(np.zeros(H), 5, 0.15, 0.42) == "OSCILLATE"


def test_early_fading_event_is_early_fade():
    from pipelines.tess.data import apply_labeller, primitive_stats

    H = 24
    x = np.random.default_rng(1).normal(0, 1, (1, 96))
    y_no = np.zeros((1, H))
    y = y_no + 2 * 0.5 ** (np.arange(H) / 4)[None]
    lab = apply_labeller(primitive_stats(x, y, y_no),
                         {"shift_lo": 0.1, "shift_hi": 5, "vol_lo": 9, "vol_hi": 10, "q_diffuse": 0.0,
                          "tail_median": 0.2}, LP)
    assert lab["lag"][0] == "EARLY-FADE"


def test_labels_depend_on_generating_parameters():
    """Degenerate labellers make text and gate meaningless (card: Pitfalls): lag follows onset, shift sign
    follows the shift parameter, shape follows the template."""
    from pipelines.tess.data import generate_windows, label_primitives

    raw = merged({"data": {"n_windows": 900}})
    w = generate_windows(raw)
    gt, info = label_primitives(w, raw)
    ev = w.has_event.to_numpy()
    late = (gt.lag == "LATE").to_numpy()
    assert late[ev & (w.gen_onset == 16)].mean() > 0.8 and late[ev & (w.gen_onset == 0)].mean() < 0.1
    rise = gt["shift"].str.contains("RISE").to_numpy()
    assert rise[ev & (w.gen_shift == 1.5)].mean() > 0.7 and rise[ev & (w.gen_shift == -1.5)].mean() < 0.05
    asc = (gt["shape"] == "ASCEND").to_numpy()
    assert asc[ev & (w.gen_template == "ramp_up")].mean() > asc[ev & (w.gen_template == "ramp_down")].mean() + 0.3
    assert set(info["thresholds"]) >= {"shift_lo", "shift_hi", "q_diffuse", "tail_median"}


def test_thresholds_use_train_only():
    from pipelines.tess.data import generate_windows, label_primitives

    raw = merged()
    w = generate_windows(raw)
    _, info = label_primitives(w, raw)
    w2 = w.copy()
    test = (w2.split == "test").to_numpy()
    w2["y"] = [np.asarray(y) * 50 if t else y for y, t in zip(w2["y"], test)]   # wild test futures
    _, info2 = label_primitives(w2, raw)
    assert info["thresholds"] == info2["thresholds"]


# ------------------------------------------------------------------------------------------ extractor
def test_lexicon_is_deterministic_and_handles_negation_and_hedges():
    from pipelines.tess.extract import extract_lexicon, lexicon_scores
    from pipelines.tess.lexicon import LABELS, known_phrases

    known = known_phrases(0.7)
    up, down = known["STRONG-RISE"][0], known["STRONG-DROP"][0]
    shift = LABELS["shift"]
    s = lexicon_scores(f"prices {up} tomorrow", 0.7)["shift"]
    assert shift[int(np.argmax(s))] == "STRONG-RISE"
    neg = lexicon_scores(f"prices will not {up} tomorrow", 0.7)["shift"]
    assert shift[int(np.argmax(neg))] == "STABLE"
    hedged = lexicon_scores(f"prices may {down}", 0.7)["shift"]
    plain = lexicon_scores(f"prices {down}", 0.7)["shift"]
    assert hedged[shift.index("STRONG-DROP")] == pytest.approx(plain[shift.index("STRONG-DROP")] / 2)
    lag = LABELS["lag"]
    persist = lexicon_scores(f"{known['EARLY'][0]} and {known['PERSIST'][0]}", 0.7)["lag"]
    assert lag[int(np.argmax(persist))] == "EARLY-PERSIST"
    flipped = lexicon_scores(f"{known['EARLY'][0]} and not {known['PERSIST'][0]}", 0.7)["lag"]
    assert lag[int(np.argmax(flipped))] == "EARLY-FADE"
    texts = pd.DataFrame({"window_id": [0, 1], "level": ["A", "A"], "text": [f"prices {up}", "nothing to see"]})
    a, b = extract_lexicon(texts, merged()), extract_lexicon(texts, merged())
    pd.testing.assert_frame_equal(a, b)
    row = a[(a.window_id == 1) & (a.primitive == "shift")].iloc[0]
    assert row["label"] == "STABLE" and row["probs"][:5].sum() == pytest.approx(1.0)


def test_extractor_knows_only_part_of_the_generator_lexicon():
    from pipelines.tess.lexicon import BANK, known_phrases

    known = known_phrases(0.7)
    total = sum(len(v) for v in BANK.values())
    assert sum(len(known[g]) for g in BANK) < total and all(set(known[g]) <= set(BANK[g]) for g in BANK)


# ------------------------------------------------------------------------------------------ model
def test_gate_shapes_and_prefix_never_enters_the_head():
    from pipelines.tess.model import PatchTST

    m = PatchTST(96, 24, 16, 2, 1, 32, 16, 8, 0.0, text="tess", gate_hidden=8).eval()
    assert m.head.in_features == m.n_patches * 16 == 11 * 16
    seen = {}

    def record(mod, inp, out):
        seen.setdefault("in", inp[0].shape)

    m.head.register_forward_hook(record)
    B = 5
    probs = torch.softmax(torch.randn(B, 4, 6), -1)
    out, g, logit = m(torch.randn(B, 96), probs=probs, margin_z=torch.randn(B, 4), entropy=torch.rand(B, 4),
                      return_gate=True)
    assert out.shape == (B, 24) and g.shape == (B, 4) and ((g > 0) & (g < 1)).all()
    assert seen["in"] == (B, 11 * 16)
    _, g1, _ = m(torch.randn(B, 96), probs=probs, margin_z=torch.randn(B, 4), entropy=torch.rand(B, 4),
                 gate_mode="one", return_gate=True)
    assert torch.equal(g1, torch.ones(B, 4))


def test_gate_zero_gives_the_null_token():
    from pipelines.tess.model import GatedPrimitivePrefix

    pre = GatedPrimitivePrefix(8, 4)
    with torch.no_grad():
        pre.b2.fill_(-1e4)                                   # gate closed
    tokens, g, _ = pre(torch.softmax(torch.randn(3, 4, 6), -1), torch.zeros(3, 4), torch.zeros(3, 4),
                       torch.zeros(3, 8))
    assert torch.allclose(tokens, (pre.null + pre.type_emb).expand(3, -1, -1), atol=1e-6)


# ------------------------------------------------------------------------------------------ leakage
def test_test_ground_truth_never_reaches_non_oracle_variants():
    """Scrambling the test windows' ground-truth labels changes only the oracle's test predictions."""
    from pipelines.tess.data import generate_windows, label_primitives, render_texts
    from pipelines.tess.extract import extract_lexicon
    from pipelines.tess.train import train_tess

    raw = merged({"data": {"n_windows": 90}, "train": {"epochs": 1}})
    w = generate_windows(raw)
    gt, _ = label_primitives(w, raw)
    texts = render_texts(w, gt, raw)
    lex = extract_lexicon(texts, raw)
    gt2 = gt.copy()
    test = gt2.split == "test"
    rng = np.random.default_rng(0)
    for prim in ("shift", "vol", "shape", "lag"):
        gt2.loc[test, prim] = rng.permutation(gt2.loc[test, prim].to_numpy())
    assert (gt2.loc[test, "shift"] != gt.loc[test, "shift"]).any()
    p1, _, _ = train_tess(w, gt, lex, lex.assign(backend="prototype"), None, raw)
    p2, _, _ = train_tess(w, gt2, lex, lex.assign(backend="prototype"), None, raw)
    for v in p1.variant.unique():
        a = np.stack(p1[p1.variant == v].pred.to_numpy())
        b = np.stack(p2[p2.variant == v].pred.to_numpy())
        if v == "oracle":
            assert not np.allclose(a, b)
        else:
            np.testing.assert_array_equal(a, b, err_msg=v)


# ------------------------------------------------------------------------------------------ LLM backend
class _Stub(BaseHTTPRequestHandler):
    calls: list = []
    with_logprobs = True

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(body)
        prompt = body["messages"][0]["content"]
        answer = "3" if "surge" not in prompt else "5"
        if body.get("logprobs") and type(self).with_logprobs:
            choice = {"message": {"content": f"Label: {answer}"}, "logprobs": {"content": [
                {"token": "Label", "top_logprobs": []}, {"token": ":", "top_logprobs": []},
                {"token": f" {answer}", "top_logprobs": [{"token": f" {answer}", "logprob": np.log(0.9)},
                                                          {"token": " 1", "logprob": np.log(0.1)}]}]}}
            out = {"choices": [choice]}
        elif body.get("logprobs"):
            out = {"choices": [{"message": {"content": f"Label: {answer}"}}]}
        else:
            out = {"choices": [{"message": {"content": f"<think>maybe 1</think>Label: {answer}"}}
                               for _ in range(body.get("n", 1))]}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def stub_server():
    _Stub.calls = []
    srv = HTTPServer(("127.0.0.1", 0), _Stub)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


@pytest.mark.parametrize("with_logprobs", [True, False])
def test_llm_backend_against_stub_server(stub_server, tmp_path, with_logprobs):
    from pipelines.tess.llm import extract_llm

    _Stub.with_logprobs = with_logprobs
    raw = merged({"extractor": {"backend": "llm", "llm": {"base_url": stub_server, "cache_dir": str(tmp_path)}}})
    texts = pd.DataFrame({"window_id": [0, 1], "level": ["A", "A"], "text": ["prices surge", "calm day"]})
    windows = pd.DataFrame({"window_id": [0, 1], "x": [np.arange(96.0), np.zeros(96)]})
    out = extract_llm(texts, windows, raw)
    shift = out[out.primitive == "shift"].set_index("window_id")
    assert shift.loc[0, "label"] == "STRONG-RISE" and shift.loc[1, "label"] == "STABLE"
    if with_logprobs:
        assert shift.loc[0, "probs"][4] == pytest.approx(0.9 / 1.0 * 1 / (1 + 0.01), abs=0.02)
    else:                                                   # 4 votes for "3"/"5", <think> stripped, ε-smoothed
        assert shift.loc[1, "probs"][2] == pytest.approx(4.01 / 4.05, abs=1e-6)
    n_calls = len(_Stub.calls)
    again = extract_llm(texts, windows, raw)                 # second run: served from the cache
    assert len(_Stub.calls) == n_calls
    pd.testing.assert_frame_equal(out, again)
    # no endpoint: the cache still answers; an uncached prompt fails closed with a clear error
    raw_off = merged({"extractor": {"backend": "llm", "llm": {"base_url": None, "cache_dir": str(tmp_path)}}})
    pd.testing.assert_frame_equal(extract_llm(texts, windows, raw_off), out)
    with pytest.raises(ValueError, match="base_url is not set"):
        extract_llm(texts.assign(text=["new text", "other"]), windows, raw_off)


# ------------------------------------------------------------------------------------------ parameters
@pytest.mark.parametrize("override,key", [
    ({"model": {"d_model": "big"}}, "tess.model.d_model"),
    ({"train": {"lr": -0.1}}, "tess.train.lr"),
    ({"data": {"reliability": 1.5}}, "tess.data.reliability"),
    ({"extractor": {"backend": "gpt"}}, "tess.extractor.backend"),
    ({"model": {"dmodel": 3}}, "tess.model.dmodel"),
])
def test_bad_parameters_name_the_key(override, key):
    with pytest.raises(ParameterError, match=rf"^parameter {key.replace('.', '[.]')}:"):
        parse("tess", merged(override))


def test_missing_key_names_the_key():
    raw = merged()
    del raw["train"]["epochs"]
    with pytest.raises(ParameterError, match=r"parameter tess\.train\.epochs: missing key"):
        parse("tess", raw)


# ------------------------------------------------------------------------------------------ end to end
def _strip_run_context(report: dict) -> dict:
    drop = {"wall_seconds", "save_version", "train_seconds"}

    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in drop}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return clean(report)


@pytest.fixture(scope="module")
def tess_run(tmp_path_factory):
    from tests.conftest import make_project

    project = make_project(tmp_path_factory.mktemp("tess"))
    res = run_kedro(project, "tess")
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.e2e
def test_end_to_end_report(tess_run):
    r = tess_run.report
    assert r["pipeline"] == "tess" and r["env"] == "test" and r["seeds"] == [0]
    expected = {"naive", "seasonal_naive", "dlinear", "patchtst", "tfidf_ridge", "fusion_A", "xattn_A", "tess",
                "tess_nogate", "oracle", "shuffled", "tess_prototype", "fusion_D", "xattn_D", "tess_D"}
    assert set(r["variants"]) == expected
    assert all("test_mse" in row and "test_mae" in row for row in r["variants"].values())
    ids = [c["id"] for c in r["claims"]]
    assert ids == [c["id"] for c in BASE["claims"]]
    assert all(isinstance(c["holds"], bool) for c in r["claims"])
    for k in ("extract_acc_shift", "gate_auroc", "gap_a_minus_gap_d", "mse_by_text_level.tess.D"):
        assert k in r["metrics"]
    assert {"forecasts.png", "gate_reliability.png", "mse_vs_text_level.png", "confusion_lag.png"} <= set(r["artifacts"])
    assert r["git_commit"] and r["params_hash"] and r["wall_seconds"] > 0


@pytest.mark.e2e
def test_end_to_end_mlflow_parent_and_child_runs(tess_run):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tess_run.tracking_uri)
    exp = client.get_experiment_by_name("tess")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("role") == "parent"]
    children = [r for r in runs if r.data.tags.get("role") == "variant"]
    assert len(parents) == 1
    parent = parents[0]
    for tag in ("pipeline", "env", "git_commit", "params_hash", "save_version"):
        assert parent.data.tags.get(tag), tag
    assert parent.data.tags["env"] == "test"
    assert {f"claim.{c['id']}" for c in tess_run.report["claims"]} <= set(parent.data.metrics)
    assert {c.data.tags["variant"] for c in children} == set(tess_run.report["variants"])
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert all({"test_mse", "test_mae"} <= set(c.data.metrics) for c in children)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.json", "plots"} <= arts
    plots = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert "gate_reliability.png" in plots


@pytest.mark.e2e
def test_corrupt_input_names_the_dataset(tess_run):
    windows = sorted((tess_run.project / "data/02_intermediate/tess/windows.parquet").glob("*/windows.parquet"))[-1]
    good = windows.read_bytes()
    try:
        windows.write_bytes(b"garbage")
        res = run_kedro(tess_run.project, "tess", extra=["--from-nodes", "tess.data.label_primitives",
                                                         "--to-nodes", "tess.data.label_primitives"])
        assert res.exit_code != 0
        assert "dataset 'tess.windows'" in res.output
    finally:
        windows.write_bytes(good)


@pytest.mark.e2e
def test_same_seed_gives_identical_reports(tess_run):
    again = run_kedro(tess_run.project, "tess")
    assert again.exit_code == 0, again.output
    assert again.report_path != tess_run.report_path            # a new version, the old one kept
    first = json.loads(tess_run.report_path.read_text())
    assert _strip_run_context(again.report) == _strip_run_context(first)
