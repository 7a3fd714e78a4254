"""TESS: the labeller on hand-made series, label ↔ generating parameter, the open-vocabulary text generator
(share 0 is the closed benchmark, train/val texts never hold an unseen paraphrase), the lexicon extractor
(determinism, negation, hedges), the minilm_head extractor (against scikit-learn's logistic regression;
cross-fitted; never reads test labels), the gated prefix (shapes; the prefix never enters the flatten
head), no future leakage, the LLM backend against a stub server, the variants' inputs, the relative
gains (per seed, paired), user data with only level-A texts (window length from the files), bad user tables and bad
parameters. The --env=test run itself is covered by tests/methods/test_all_pipelines.py; its report is
checked here through the shared ``test_env_run`` fixture."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipelines.core.params import validate
from pipelines.core.schemas import InputDataError
from pipelines.tess.params import Params
from tests.conftest import ROOT

BASE = yaml.safe_load((ROOT / "conf/base/parameters_tess.yml").read_text())["tess"]
TEST = yaml.safe_load((ROOT / "conf/test/parameters_tess.yml").read_text())["tess"]


def merged(overrides: dict | None = None) -> dict:
    def deep(a, b):
        out = copy.deepcopy(a)
        for k, v in b.items():
            out[k] = deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return deep(deep(BASE, TEST), overrides or {})


def params(overrides: dict | None = None) -> Params:
    """conf/test's parameters (over conf/base), with ``overrides``, as the typed model nodes receive."""
    return validate(Params, merged(overrides), "tess")


LP = params().labeller


# ------------------------------------------------------------------------------------------ labeller
def test_labeller_on_hand_made_series():
    from pipelines.tess.data import apply_labeller, primitive_stats, shape_label

    rng = np.random.default_rng(0)
    H, L = 24, 96
    x = np.tile(rng.normal(0, 1, L), (4, 1))
    sx = x[0].std()
    y_no = np.full((4, H), x[0].mean())
    path = np.zeros((4, H))
    path[0] = 3 * sx  # big persistent jump from t=0: strong rise
    path[1, 16:] = -0.3 * sx  # small late drop
    path[2] = 0.0  # no event
    path[3] = sx * np.sin(2 * np.pi * np.arange(H) / 6)  # oscillation
    y = y_no + path
    stats = primitive_stats(x, y, y_no)
    th = {"shift_lo": 0.5, "shift_hi": 2.0, "vol_lo": 0.3, "vol_hi": 1.0, "q_diffuse": 0.0, "tail_median": 0.3}
    lab = apply_labeller(stats, th, LP)
    assert list(lab["shift"]) == ["STRONG-RISE", "STABLE", "STABLE", "STABLE"]
    assert lab["lag"][1] == "LATE" and lab["lag"][2] == "DIFFUSE"
    assert lab["lag"][0] == "MID-PERSIST"  # constant from t=0: centroid 0.52, tail 1/3 >= 0.3
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
    lab = apply_labeller(
        primitive_stats(x, y, y_no),
        {"shift_lo": 0.1, "shift_hi": 5, "vol_lo": 9, "vol_hi": 10, "q_diffuse": 0.0, "tail_median": 0.2},
        LP,
    )
    assert lab["lag"][0] == "EARLY-FADE"


def test_labels_depend_on_generating_parameters():
    """Degenerate labellers make text and gate meaningless (card: Pitfalls): lag follows onset, shift sign
    follows the shift parameter, shape follows the template."""
    from pipelines.tess.data import generate_windows, label_primitives

    p = params({"data": {"n_windows": 900}})
    w = generate_windows(p)
    gt, info = label_primitives(w, p)
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

    p = params()
    w = generate_windows(p)
    _, info = label_primitives(w, p)
    w2 = w.copy()
    test = (w2.split == "test").to_numpy()
    w2["y"] = [np.asarray(y) * 50 if t else y for y, t in zip(w2["y"], test)]  # wild test futures
    _, info2 = label_primitives(w2, p)
    assert info["thresholds"] == info2["thresholds"]


# ------------------------------------------------------------------------------------------ open vocabulary
def test_unseen_paraphrases_are_new_many_and_free_of_modifiers():
    from pipelines.tess.lexicon import BANK, HEDGES, NEGATIONS
    from pipelines.tess.paraphrases import open_bank

    ob = open_bank()
    assert set(ob) == set(BANK)
    bank_words = {w for phrases in BANK.values() for ph in phrases for w in ph.split()}
    for group, phrases in ob.items():
        assert len(phrases) >= 6 and len(set(phrases)) == len(phrases), group
        assert not set(phrases) & set(BANK[group]), group
        assert not any(set(ph.split()) & (HEDGES | NEGATIONS) for ph in phrases), group
        # most paraphrases hold a word no seen phrase of any group has: n-grams of the train texts miss them
        novel = np.mean([bool(set(ph.split()) - bank_words) for ph in phrases])
        assert novel >= 0.5, (group, novel)
    assert sum(map(len, ob.values())) > 4 * sum(map(len, BANK.values()))  # 535 vs 114


@pytest.fixture(scope="module")
def synth():
    from pipelines.tess.data import generate_windows, label_primitives

    p = params({"data": {"n_windows": 300}})
    w = generate_windows(p)
    gt, info = label_primitives(w, p)
    return w, gt, info


def test_unseen_share_touches_only_test_texts(synth):
    from pipelines.tess.data import render_texts

    w, gt, _ = synth
    closed, closed_seen = render_texts(w, gt, params({"data": {"n_windows": 300, "unseen_paraphrase_share": 0.0}}))
    opened, seen = render_texts(w, gt, params({"data": {"n_windows": 300, "unseen_paraphrase_share": 0.5}}))
    test = set(w.loc[w.split == "test", "window_id"])
    key = ["window_id", "level"]
    # share 0: one rendering, and the closed-vocabulary rendering is the same text
    pd.testing.assert_frame_equal(closed[closed.window_id.isin(test)].reset_index(drop=True), closed_seen)
    # train and val texts are the same whatever the share; the seen rendering is the share-0 rendering
    nt_a, nt_b = closed[~closed.window_id.isin(test)], opened[~opened.window_id.isin(test)]
    pd.testing.assert_frame_equal(nt_a.reset_index(drop=True), nt_b.reset_index(drop=True))
    assert not nt_b[[c for c in nt_b if c.startswith("unseen_")]].to_numpy().any()
    pd.testing.assert_frame_equal(seen, closed_seen)
    assert set(seen.window_id) == test
    # the open test rendering: about half its (window, primitive) phrases are unseen, and they differ
    ta = opened[(opened.level == "A") & opened.window_id.isin(test)]
    flags = ta[[f"unseen_{k}" for k in ("shift", "vol", "shape", "lag")]].to_numpy()
    assert 0.4 < flags.mean() < 0.7
    changed = ta.set_index(key)["text"] != seen[seen.level == "A"].set_index(key)["text"]
    np.testing.assert_array_equal(changed.to_numpy(), flags.any(1))
    # the narrative span still covers the narrative after the replacement
    row = ta.iloc[int(np.flatnonzero(flags.any(1))[0])]
    assert row["text"][row["narrative_start"] : row["narrative_end"]].startswith("Analysts expect")


# ------------------------------------------------------------------------------------------ extractors
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
    seen = texts.iloc[:1].assign(text=[f"prices {down}"])
    a, b = extract_lexicon(texts, seen, params()), extract_lexicon(texts, seen, params())
    pd.testing.assert_frame_equal(a, b)
    row = a[(a.window_id == 1) & (a.primitive == "shift")].iloc[0]
    assert row["label"] == "STABLE" and row["probs"][:5].sum() == pytest.approx(1.0)
    assert set(a.rendering) == {"open", "seen"}
    assert a[(a.rendering == "seen") & (a.primitive == "shift")]["label"].tolist() == ["STRONG-DROP"]


def test_extractor_knows_only_part_of_the_generator_lexicon():
    from pipelines.tess.lexicon import BANK, known_phrases

    known = known_phrases(0.7)
    total = sum(len(v) for v in BANK.values())
    assert sum(len(known[g]) for g in BANK) < total and all(set(known[g]) <= set(BANK[g]) for g in BANK)


def test_minilm_head_matches_sklearn_logistic_regression():
    """The head is one multinomial logistic regression per primitive: with no early stopping it reaches
    scikit-learn's optimum for C = 1 / (2 n l2) (sklearn: Σ CE + ||W||²/(2C); the head: mean CE + l2 ||W||²)."""
    from sklearn.linear_model import LogisticRegression

    from pipelines.tess.head import fit_head, head_probs
    from pipelines.tess.lexicon import LABELS, PRIMITIVES

    rng = np.random.default_rng(0)
    n, d, l2 = 240, 12, 1e-2
    x = rng.normal(size=(n, d))
    y = np.stack([rng.integers(len(LABELS[prim]), size=n) for prim in PRIMITIVES], 1)
    y[:, 0] = np.argmax(x[:, :5] + rng.normal(scale=0.5, size=(n, 5)), 1)  # learnable signal
    model = fit_head(torch.tensor(x, dtype=torch.float32), torch.tensor(y), None, None, l2, 60, 2, seed=0)
    got = head_probs(model, torch.tensor(x, dtype=torch.float32))
    for k, prim in enumerate(PRIMITIVES):
        ref = LogisticRegression(C=1 / (2 * n * l2), tol=1e-10, max_iter=5000).fit(x, y[:, k])
        full = np.zeros((n, len(LABELS[prim])))
        full[:, ref.classes_] = ref.predict_proba(x)
        np.testing.assert_allclose(got[prim], full, atol=2e-3, err_msg=prim)


def _fake_emb(w: pd.DataFrame, gt: pd.DataFrame, dim: int = 16, seed: int = 0) -> dict:
    """Clause-mean 'embeddings' that carry the shift label plus noise (the head needs no MiniLM to be tested)."""
    from pipelines.tess.lexicon import LABELS

    rng = np.random.default_rng(seed)
    ids = w["window_id"].to_numpy()
    lab = gt.set_index("window_id").loc[ids, "shift"].map({l: i for i, l in enumerate(LABELS["shift"])}).to_numpy()
    x = rng.normal(size=(len(ids), dim))
    x[np.arange(len(ids)), lab] += 3.0
    test = w.loc[w.split == "test", "window_id"].to_numpy()
    xs = torch.tensor(x[np.isin(ids, test)] + 0.1, dtype=torch.float32)
    return {
        "A": {"window_id": torch.tensor(ids), "clauses": torch.tensor(x, dtype=torch.float32)},
        "seen_A": {"window_id": torch.tensor(test), "clauses": xs},
    }


def test_minilm_head_is_cross_fitted_and_never_reads_test_labels(synth):
    from pipelines.tess.head import extract_minilm_head

    w, gt, _ = synth
    emb = _fake_emb(w, gt)
    p = params({"extractor": {"head": {"folds": 3}}})
    out = extract_minilm_head(emb, gt, w, p)
    assert set(out.rendering) == {"open", "seen"} and set(out.backend) == {"minilm_head"}
    test = set(w.loc[w.split == "test", "window_id"])
    assert set(out.loc[out.rendering == "seen", "window_id"]) == test
    shift = out[(out.primitive == "shift") & (out.rendering == "open")].set_index("window_id")
    truth = gt.set_index("window_id").loc[shift.index, "shift"]
    assert (shift["label"] == truth).loc[list(test)].mean() > 0.8  # it learns the signal
    # scrambled test labels: nothing changes
    gt2 = gt.copy()
    is_test = gt2.window_id.isin(test)
    for prim in ("shift", "vol", "shape", "lag"):
        gt2.loc[is_test, prim] = np.random.default_rng(1).permutation(gt2.loc[is_test, prim].to_numpy())
    pd.testing.assert_frame_equal(out, extract_minilm_head(emb, gt2, w, p))
    # cross-fitting: a train window's extraction does not depend on its own label
    tr_id = int(w.loc[w.split == "train", "window_id"].iloc[0])
    gt3 = gt.copy()
    cur = gt3.loc[gt3.window_id == tr_id, "shift"].item()
    gt3.loc[gt3.window_id == tr_id, "shift"] = "STRONG-RISE" if cur != "STRONG-RISE" else "STRONG-DROP"
    out3 = extract_minilm_head(emb, gt3, w, p)
    mine = (out.window_id == tr_id) & (out.primitive == "shift")
    np.testing.assert_array_equal(np.stack(out.loc[mine, "probs"]), np.stack(out3.loc[mine, "probs"]))
    assert not np.array_equal(
        np.stack(out.loc[~mine & (out.primitive == "shift"), "probs"]),
        np.stack(out3.loc[~mine & (out3.primitive == "shift"), "probs"]),
    )


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
    out, g, logit = m(
        torch.randn(B, 96), probs=probs, margin_z=torch.randn(B, 4), entropy=torch.rand(B, 4), return_gate=True
    )
    assert out.shape == (B, 24) and g.shape == (B, 4) and ((g > 0) & (g < 1)).all()
    assert seen["in"] == (B, 11 * 16)
    _, g1, _ = m(
        torch.randn(B, 96),
        probs=probs,
        margin_z=torch.randn(B, 4),
        entropy=torch.rand(B, 4),
        gate_mode="one",
        return_gate=True,
    )
    assert torch.equal(g1, torch.ones(B, 4))


def test_gate_zero_gives_the_null_token():
    from pipelines.tess.model import GatedPrimitivePrefix

    pre = GatedPrimitivePrefix(8, 4)
    with torch.no_grad():
        pre.b2.fill_(-1e4)  # gate closed
    tokens, g, _ = pre(torch.softmax(torch.randn(3, 4, 6), -1), torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(3, 8))
    assert torch.allclose(tokens, (pre.null + pre.type_emb).expand(3, -1, -1), atol=1e-6)


# ------------------------------------------------------------------------------------------ leakage
def test_test_ground_truth_never_reaches_non_oracle_variants(synth):
    """Scrambling the test windows' ground-truth labels changes only the oracle's test predictions."""
    from pipelines.tess.data import render_texts
    from pipelines.tess.extract import extract_lexicon
    from pipelines.tess.train import predict_variant, train_variant

    w, gt, _ = synth
    p = params({"data": {"n_windows": 300}, "extractor": {"backend": "lexicon"}, "train": {"epochs": 1}})
    texts, seen = render_texts(w, gt, p)
    lex = extract_lexicon(texts, seen, p)
    gt2 = gt.copy()
    test = gt2.split == "test"
    rng = np.random.default_rng(0)
    for prim in ("shift", "vol", "shape", "lag"):
        gt2.loc[test, prim] = rng.permutation(gt2.loc[test, prim].to_numpy())
    assert (gt2.loc[test, "shift"] != gt.loc[test, "shift"]).any()
    for v in ("tess", "tess_nogate", "shuffled", "oracle"):
        kw = {} if v == "oracle" else {"extractions": lex}
        a, _ = predict_variant(p, w, gt=gt, variant=v, **kw)
        b, _ = predict_variant(p, w, gt=gt2, variant=v, **kw)
        pa, pb = np.stack(a.pred.to_numpy()), np.stack(b.pred.to_numpy())
        if v == "oracle":
            assert not np.allclose(pa, pb)
        else:
            np.testing.assert_array_equal(pa, pb, err_msg=v)
    # the seen condition: the same fitted model, the closed-vocabulary test extractions
    a, _ = predict_variant(p, w, gt=gt, variant="tess", extractions=lex)
    assert set(a.variant) == {"tess", "tess_seen"}
    assert a.groupby("variant").size().nunique() == 1
    # the node's long table holds both conditions' rows; its artifacts the open rendering's predictions
    table, arts = train_variant(p, w, gt=gt, variant="tess", extractions=lex)
    assert set(table.variant) == {"tess", "tess_seen"}
    assert {"test_mse", "test_mae", "gate_auroc", "gate_mean"} <= set(table.metric)
    assert set(arts) == {f"seed{s}" for s in p.seeds} and arts[f"seed{p.seeds[0]}"]["gate"].shape[1] == 4


# ------------------------------------------------------------------------------------------ pipeline
def test_variant_inputs_and_single_node_selection():
    from pipelines.core.registry import load_pipeline
    from pipelines.tess.train import plan

    pipe = load_pipeline("tess")
    names = {n.name for n in pipe.nodes}
    variants = list(plan(params()))
    expected = {
        "naive",
        "seasonal_naive",
        "dlinear",
        "patchtst",
        "tfidf_ridge",
        "minilm_ridge",
        "fusion_A",
        "xattn_A",
        "tess",
        "tess_nogate",
        "oracle",
        "shuffled",
        "tess_lexicon",
        "tess_prototype",
        "fusion_D",
        "xattn_D",
        "tess_D",
    }
    assert set(variants) == expected
    assert "tess.data.extractor_head" in names  # the shared minilm_head fit
    one = pipe.only_nodes("tess.train.tess_lexicon")
    assert [n.name for n in one.nodes] == ["tess.train.tess_lexicon"]
    assert set(one.inputs()) == {"params:tess", "tess.windows", "tess.primitives_gt", "tess.extractions_lexicon"}
    assert set(one.outputs()) == {"tess.results_tess_lexicon", "tess.tess_lexicon_artifacts_tensors"}
    assert "tess.patchtst_artifacts_tensors" in pipe.only_nodes("tess.train.tfidf_ridge").inputs()
    # the backend list follows the parameters: lexicon as the main backend makes minilm_head a variant
    from pipelines.tess.train import backend_variants

    assert backend_variants(params({"extractor": {"backend": "lexicon"}})) == {
        "tess": "lexicon",
        "tess_minilm_head": "minilm_head",
        "tess_prototype": "prototype",
    }


def test_gains_are_core_relative_gains_per_seed_paired():
    from pipelines.core.metrics import relative_gain
    from pipelines.core.spec import Results, SeedValues
    from pipelines.tess.spec import SPEC

    p = params({"seeds": [0, 1]})
    mse = {
        "naive": [2.0, 2.0],
        "seasonal_naive": [1.5, 1.5],
        "dlinear": [1.0, 1.2],
        "patchtst": [1.1, 1.0],
        "tess": [0.5, 0.7],
        "tess_nogate": [0.6, 0.7],
        "oracle": [0.4],
    }
    tables = {}
    for v in SPEC.variants(p):
        r = Results(v)
        for s, x in enumerate(mse.get(v, [3.0])):
            r.add(s, test_mse=x)
        tables[v] = r.table()
    values = SeedValues(tables)
    point, per_seed = {}, {}
    for d in SPEC.declarations(p):
        if not getattr(d, "inputs", ()):  # those reading the data tables are tested end to end
            for k, x in d.compute(values, p, values.variants, {}).items():
                (per_seed if isinstance(x, dict) else point)[k] = x
    # best unimodal by mean (patchtst 1.05 < dlinear 1.1), then paired seed by seed
    assert per_seed["relative_gain.test_mse.tess_vs_best_unimodal"] == pytest.approx(
        {0: relative_gain(method=0.5, baseline=1.1), 1: relative_gain(method=0.7, baseline=1.0)}
    )
    assert per_seed["relative_gain.test_mse.oracle_vs_tess"] == pytest.approx({0: 0.2})  # single seed: seed 0
    assert per_seed["rel_impr_vs_best_unimodal"] == pytest.approx(
        {s: 100 * x for s, x in per_seed["relative_gain.test_mse.tess_vs_best_unimodal"].items()}
    )
    assert np.isnan(point["relative_gain.test_mse.tess_vs_tfidf_ridge.seen_paraphrases"])  # no seen rendering


# ------------------------------------------------------------------------------------------ LLM backend
def _stub_answer(body: dict, with_logprobs: bool) -> dict:
    from pipelines.core.llm import completion

    answer = "3" if "surge" not in body["messages"][0]["content"] else "5"
    if body.get("logprobs") and with_logprobs:
        return completion(
            [f"Label: {answer}"],
            logprobs=[
                [
                    {"token": "Label", "top_logprobs": []},
                    {"token": ":", "top_logprobs": []},
                    {
                        "token": f" {answer}",
                        "top_logprobs": [
                            {"token": f" {answer}", "logprob": np.log(0.9)},
                            {"token": " 1", "logprob": np.log(0.1)},
                        ],
                    },
                ]
            ],
        )
    if body.get("logprobs"):
        return completion([f"Label: {answer}"])
    return completion([f"<think>maybe 1</think>Label: {answer}"] * body.get("n", 1))


@pytest.mark.parametrize("with_logprobs", [True, False])
def test_llm_backend_against_stub_server(tmp_path, with_logprobs):
    from pipelines.core.llm import LLMError, stub_server

    with stub_server(lambda body: _stub_answer(body, with_logprobs)) as stub:
        _llm_backend_checks(stub, tmp_path, with_logprobs, LLMError)


def _llm_backend_checks(stub, tmp_path, with_logprobs, LLMError):
    from pipelines.tess.llm import extract_llm

    p = params({"extractor": {"backend": "llm", "llm": {"base_url": stub.url, "cache_dir": str(tmp_path)}}})
    texts = pd.DataFrame({"window_id": [0, 1], "level": ["A", "A"], "text": ["prices surge", "calm day"]})
    seen = texts.iloc[:0]
    windows = pd.DataFrame({"window_id": [0, 1], "x": [np.arange(96.0), np.zeros(96)]})
    out = extract_llm(texts, seen, windows, p)
    shift = out[out.primitive == "shift"].set_index("window_id")
    assert shift.loc[0, "label"] == "STRONG-RISE" and shift.loc[1, "label"] == "STABLE"
    if with_logprobs:
        assert shift.loc[0, "probs"][4] == pytest.approx(0.9 / 1.0 * 1 / (1 + 0.01), abs=0.02)
    else:  # 4 votes for "3"/"5", <think> stripped, ε-smoothed
        assert shift.loc[1, "probs"][2] == pytest.approx(4.01 / 4.05, abs=1e-6)
    n_calls = len(stub.requests)
    again = extract_llm(texts, seen, windows, p)  # second run: served from the cache
    assert len(stub.requests) == n_calls
    pd.testing.assert_frame_equal(out, again)
    # no endpoint: the cache still answers; an uncached prompt fails closed with a clear error
    p_off = params({"extractor": {"backend": "llm", "llm": {"base_url": None, "cache_dir": str(tmp_path)}}})
    pd.testing.assert_frame_equal(extract_llm(texts, seen, windows, p_off), out)
    with pytest.raises(LLMError, match=r"tess\.extractor\.llm\.base_url is not set"):
        extract_llm(texts.assign(text=["new text", "other"]), seen, windows, p_off)
    # the llm backend adds its extraction node; the other backends never call it
    assert len(extract_llm(texts, seen, windows, params())) == 0


# ------------------------------------------------------------------------------------------ user data
def _user_files(tmp_path, n: int = 48, L: int = 64, H: int = 16, levels=("A",)):
    rng = np.random.default_rng(3)
    t = np.arange(L + H)
    series = np.sin(2 * np.pi * t / 24)[None] + rng.normal(0, 0.3, (n, L + H)) + rng.normal(0, 1, (n, 1))
    split = np.array(["train"] * (n // 2) + ["val"] * (n // 4) + ["test"] * (n - n // 2 - n // 4))
    windows = pd.DataFrame(
        {"window_id": np.arange(n) + 100, "split": split, "x": list(series[:, :L]), "y": list(series[:, L:])}
    )
    words = ["prices surge on strong demand", "a calm and flat week ahead", "the index may slip a little"]
    texts = pd.DataFrame(
        [
            {"window_id": int(w), "level": lv, "text": f"{words[i % 3]} ({lv})"}
            for i, w in enumerate(windows.window_id)
            for lv in levels
        ]
    )
    wp, tp = tmp_path / "windows.parquet", tmp_path / "texts.parquet"
    windows.to_parquet(wp)
    texts.to_parquet(tp)
    return windows, texts, wp, tp


def _files_params(wp, tp, **data):
    return params(
        {
            "data": {"source": "files", "windows_path": str(wp), "texts_path": str(tp), **data},
            "model": {"patch_len": 16, "stride": 8},
            "train": {"epochs": 1},
        }
    )


def test_user_data_with_level_a_only_runs_every_variant(tmp_path):
    """The README's own-data path with level-A texts only (L = 64, H = 16 from the files, not 96 / 24)."""
    from pipelines.core.spec import make_report
    from pipelines.tess.data import generate_windows, label_primitives, render_texts
    from pipelines.tess.embed import embed_texts
    from pipelines.tess.extract import extract_lexicon
    from pipelines.tess.head import extract_minilm_head
    from pipelines.tess.spec import SPEC
    from pipelines.tess.train import plan, train_variant, variant_inputs

    *_, wp, tp = _user_files(tmp_path)
    p = _files_params(wp, tp)
    assert (p.data.history, p.data.horizon) == (96, 24)
    w = generate_windows(p)
    gt, info = label_primitives(w, p)
    assert (info["history_used"], info["horizon_used"]) == (64, 16)
    texts, seen = render_texts(w, gt, p)
    assert set(texts.level) == {"A"} and len(seen) == 0
    data = {
        "windows": w,
        "primitives_gt": gt,
        "texts": texts,
        "texts_seen": seen,
        "extractions_lexicon": extract_lexicon(texts, seen, p),
    }
    emb, data["extractions_prototype"] = embed_texts(texts, seen, w, p)
    assert set(emb) == {"A"}
    data["text_emb_tensors"] = emb
    data["extractions_minilm_head"] = extract_minilm_head(emb, gt, w, p)
    data["extractions_llm"] = pd.DataFrame()
    data["labeller_json"] = info
    outputs = {}
    for v in plan(p):
        kw = {
            arg: (data[ds] if ds in data else outputs[ds])
            for arg, ds in variant_inputs(p, v).items()
            if arg != "windows"
        }
        outputs[f"results_{v}"], outputs[f"{v}_artifacts_tensors"] = train_variant(p, w, variant=v, **kw)
    for v in ("tess_D", "fusion_D", "xattn_D"):  # no level-D texts: skipped, not failed
        assert len(outputs[f"results_{v}"]) == 0
    assert len(outputs["results_tess"]) and "tess_seen" not in set(outputs["results_tess"].variant)
    rep = make_report(
        "tess",
        p=p,
        **{f"r__{v}": outputs[f"results_{v}"] for v in plan(p)},
        **{f"i__{k}": data[ds] for k, ds in SPEC.inputs_map().items()},
    )
    assert (rep["history_used"], rep["horizon_used"]) == (64, 16)
    assert (rep["metrics"]["history_used"], rep["metrics"]["horizon_used"]) == (64, 16)
    assert "tess_D" not in rep["variants"] and "tess" in rep["variants"]
    claims = {c["id"]: c for c in rep["claims"]}
    assert claims["tess_beats_tfidf_seen_paraphrases"]["verdict"] == "fails"  # no seen rendering: NaN
    assert claims["tess_beats_tfidf_seen_paraphrases"]["value"] is None


@pytest.mark.parametrize(
    "table,breaks,match",
    [
        ("windows", lambda d: d.drop(columns="x"), r"dataset 'tess\.user_windows': column 'x' is missing"),
        (
            "windows",
            lambda d: d.assign(window_id=d.window_id.astype(str)),
            r"'tess\.user_windows': column 'window_id' should be int",
        ),
        ("windows", lambda d: d.iloc[:0], r"'tess\.user_windows': 0 rows"),
        (
            "windows",
            lambda d: d.assign(split="training"),
            r"'tess\.user_windows': column 'split' has unknown value\(s\) \['training'\]",
        ),
        (
            "windows",
            lambda d: d.assign(y=[v[:-1] if i == 0 else v for i, v in enumerate(d.y)]),
            r"'tess\.user_windows': column 'y' holds arrays of different lengths",
        ),
        ("texts", lambda d: d.drop(columns="text"), r"dataset 'tess\.user_texts': column 'text' is missing"),
        ("texts", lambda d: d.assign(text=1.0), r"'tess\.user_texts': column 'text' should be str"),
        ("texts", lambda d: d.iloc[1:], r"'tess\.user_texts': column 'window_id' lacks a level-A text"),
        ("texts", lambda d: d.assign(level="Z"), r"'tess\.user_texts': column 'level' has unknown value\(s\) \['Z'\]"),
    ],
)
def test_bad_user_tables_name_the_dataset_and_column(tmp_path, table, breaks, match):
    from pipelines.tess.data import generate_windows, label_primitives, render_texts

    windows, texts, wp, tp = _user_files(tmp_path)
    if table == "windows":
        breaks(windows).to_parquet(wp)
    else:
        breaks(texts).to_parquet(tp)
    p = _files_params(wp, tp)
    with pytest.raises(InputDataError, match=match) as err:
        w = generate_windows(p)
        render_texts(w, label_primitives(w, p)[0], p)
    assert "\n" not in str(err.value)


def test_missing_user_file_names_the_dataset(tmp_path):
    from pipelines.tess.data import generate_windows

    with pytest.raises(InputDataError, match=r"dataset 'tess\.data\.windows_path \(.*nope\.parquet\)': file not found"):
        generate_windows(_files_params(tmp_path / "nope.parquet", tmp_path / "texts.parquet"))


# ------------------------------------------------------------------------------------------ the test-env report
@pytest.mark.e2e
def test_report_has_both_vocabulary_conditions(test_env_run):
    r = test_env_run("tess").report
    for v in ("tess", "tfidf_ridge", "minilm_ridge", "tess_lexicon"):
        assert v in r["variants"] and f"{v}_seen" in r["variants"], v
    m = r["metrics"]
    for k in (
        "relative_gain.test_mse.tess_vs_tfidf_ridge.seen_paraphrases",
        "relative_gain.test_mse.tess_vs_tfidf_ridge.unseen_paraphrases",
        "extract_acc.minilm_head.mean.unseen_slots",
        "unseen_paraphrase_share_measured",
        "gate_auroc",
    ):
        assert k in m, k
    assert (r["history_used"], r["horizon_used"]) == (96, 24) == (m["history_used"], m["horizon_used"])
    assert "paraphrase_conditions.png" in r["artifacts"]
