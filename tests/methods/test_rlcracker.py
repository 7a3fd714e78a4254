"""Tests of `rlcracker`: the watermark detectors against closed forms and the N(0, 1) null (KS test), the
generation ↔ detection hashing, the semantic similarity against a brute-force edit distance, the RLCracker
objective against hand-computed rewards and gradients, and bad input (the end-to-end --env=test run is
covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.rlcracker.params import Params
from pipelines.rlcracker.watermark import Watermark, expected_z, z_score

BASE = yaml.safe_load(open("conf/base/parameters_rlcracker.yml"))["rlcracker"]
TEST = yaml.safe_load(open("conf/test/parameters_rlcracker.yml"))["rlcracker"]


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return out


RAW = _merge(BASE, TEST)
V, TEXT = 60, np.arange(6, 60)


# ------------------------------------------------------------------------------ detectors
@pytest.mark.parametrize("scheme,h", [("unigram", 0), ("kgw", 1), ("kgw", 4)])
def test_null_z_scores_are_standard_normal(scheme, h):
    from scipy import stats

    wm = Watermark(scheme, V, TEXT, gamma=0.5, delta=2.0, key=7, context=max(h, 1))
    rng = np.random.default_rng(0)
    T = 200
    zs = np.array([wm.z(rng.choice(TEXT, size=T + h)) for _ in range(400)])  # unwatermarked: i.i.d. tokens
    # z lives on a lattice of step 1/√(Tγ(1−γ)); spread each atom uniformly over its cell so that the KS
    # test compares continuous laws (this adds step²/12 ≈ 0.002 to the variance)
    step = 1 / math.sqrt(T * 0.25)
    assert stats.kstest(zs + rng.uniform(-step / 2, step / 2, len(zs)), "norm").pvalue > 0.01
    assert abs(np.mean(zs)) < 0.15 and abs(np.std(zs) - 1) < 0.12


@pytest.mark.parametrize("gamma", [0.25, 0.5])
def test_known_green_list_gives_closed_form_z(gamma):
    wm = Watermark("unigram", V, TEXT, gamma=gamma, delta=2.0, key=3)
    green = np.flatnonzero(wm.green())
    red = np.setdiff1d(TEXT, green)
    assert len(green) == round(gamma * len(TEXT))
    T, k = 100, 70
    ids = np.r_[np.resize(green, k), np.resize(red, T - k)]
    assert wm.count(ids) == (k, T)
    assert wm.z(ids) == pytest.approx((k - gamma * T) / math.sqrt(T * gamma * (1 - gamma)))
    # each token green with probability p: the mean z matches (p − γ)√T / √(γ(1 − γ))
    rng = np.random.default_rng(1)
    p = 0.7
    zs = [wm.z(np.where(rng.random(T) < p, rng.choice(green, T), rng.choice(red, T))) for _ in range(2000)]
    assert np.mean(zs) == pytest.approx(expected_z(p, T, gamma), abs=0.05)


def test_kgw_green_list_follows_the_previous_tokens():
    wm = Watermark("kgw", V, TEXT, gamma=0.5, delta=2.0, key=11, context=2)
    rng = np.random.default_rng(2)
    seq = list(rng.choice(TEXT, 2))
    for _ in range(98):  # always pick a green token of the current context
        seq.append(int(rng.choice(np.flatnonzero(wm.green(seq[-2:])))))
    assert wm.count(seq) == (98, 98)  # the first h tokens are not scored
    assert wm.z(seq) == pytest.approx(z_score(98, 98, 0.5))
    # the product seeding ("time" scheme) is order-free, a shifted context is not
    assert np.array_equal(wm.green([7, 9]), wm.green([9, 7]))
    assert wm.count(seq[::-1])[0] < 75  # other contexts: green only by chance


def test_watermarked_generation_is_detected_and_the_key_matters():
    from pipelines.core.seqmodels import TinyConfig, TinyTransformer
    from pipelines.rlcracker.model import sample

    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_len=80)).eval()
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[6:] = True
    for scheme in ("unigram", "kgw"):
        wm = Watermark(scheme, V, TEXT, gamma=0.5, delta=4.0, key=5, context=2)
        other = Watermark(scheme, V, TEXT, gamma=0.5, delta=4.0, key=6, context=2)
        out = sample(
            model,
            [[3, 7, 8]] * 8,
            64,
            temperature=1.0,
            gen=torch.Generator().manual_seed(0),
            allowed=allowed,
            watermark=wm,
            histories=[[]] * 8,
        )
        z = [wm.z(o) for o in out]
        assert min(z) > 4, (scheme, z)
        assert np.mean([other.z(o) for o in out]) < np.mean(z) / 3  # another key: (mostly) chance


# ------------------------------------------------------------------------------ semantics
def _lev(a, b):
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=14), st.lists(st.integers(0, 4), max_size=14))
def test_edit_distance_matches_brute_force(a, b):
    from pipelines.rlcracker.model import edit_distance, similarity

    assert edit_distance(a, b) == _lev(a, b)
    assert similarity(a, b) == pytest.approx(1 - _lev(a, b) / max(len(a), len(b), 1))


def test_semantic_reward_anchors():
    from pipelines.rlcracker.model import semantic_reward

    assert semantic_reward(0.85, 0.85) == pytest.approx(0.0)
    assert semantic_reward(1.0, 0.85) == pytest.approx(0.95)
    assert semantic_reward(1.0, 0.9) == pytest.approx(0.95)
    assert semantic_reward(0.0, 0.85) < -0.99


def test_paraphrase_keeps_meaning_and_substitution_rate():
    from pipelines.rlcracker.data import synthetic_language
    from pipelines.rlcracker.model import Language

    p = Params.model_validate(RAW)
    lex, corpus = synthetic_language(p)
    lang = Language(lex, corpus)
    rng = np.random.default_rng(0)
    src = lang.ids(" ".join(corpus.answer[:50]))
    para = lang.paraphrase(src, 0.7, rng)
    assert np.array_equal(lang.concepts(para), lang.concepts(src))
    sub = lang.substitute(src, 0.5, rng)
    assert np.array_equal(lang.concepts(sub), lang.concepts(src))
    assert np.mean(np.array(sub) != np.array(src)) == pytest.approx(0.5, abs=0.06)


# ------------------------------------------------------------------------------ RLCracker objective
def test_token_rewards_match_hand_computation():
    from pipelines.rlcracker.train import token_rewards

    lp_pa = torch.tensor([[-1.0, -2.0, 0.0]])
    lp_wm = torch.tensor([[-0.5, -2.5, 0.0]])
    lp_h = torch.tensor([[-1.0, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    R, kl_wm, kl_h = token_rewards(lp_pa, lp_wm, lp_h, torch.tensor([0.3]), 2.0, mask, w_kl=0.9)

    def k3(ref, pa):
        return math.exp(ref - pa) - (ref - pa) - 1

    want = [2 * 0.3 + 0.9 * (k3(-0.5, -1) - k3(-1, -1)), 2 * 0.3 + 0.9 * (k3(-2.5, -2) - k3(-1, -2)), 0.0]
    assert R[0].tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)
    # the policy is pushed away from the watermark-conditioned reference: matching it earns nothing,
    # matching the question-only reference earns the full KL_wm
    R_copy, *_ = token_rewards(lp_wm, lp_wm, lp_h, torch.zeros(1), 1.0, mask, 1.0)
    R_human, *_ = token_rewards(lp_h, lp_wm, lp_h, torch.zeros(1), 1.0, mask, 1.0)
    assert (R_copy[0, :2] < 0).all() and (R_human[0, :2] > 0).all()


def test_objective_gradient_matches_closed_form():
    from pipelines.rlcracker.train import rlcracker_objective, token_rewards

    torch.manual_seed(0)
    lp = (-torch.rand(3, 5) * 3).requires_grad_()
    lp_wm, lp_h = -torch.rand(3, 5) * 3, -torch.rand(3, 5) * 3
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    adv, alpha, beta = torch.tensor([1.0, -0.5, 0.2]), 1.7, 0.04
    with torch.no_grad():
        lp.mul_(mask)
        lp_wm.mul_(mask)
        lp_h.mul_(mask)
    loss, _ = rlcracker_objective(lp, lp_wm, lp_h, adv, alpha, mask, w_kl=0.9, beta=beta)
    loss.backward()
    R, *_ = token_rewards(lp.detach(), lp_wm, lp_h, adv, alpha, mask, 0.9)
    n = mask.sum(1, keepdim=True).float()
    # d/dlp of −(ratio·R − β(e^{d} − d − 1)), d = lp_wm − lp, ratio = 1 with dratio/dlp = 1
    want = (-R + beta * (1 - torch.exp(lp_wm - lp.detach()))) * mask / n / 3
    torch.testing.assert_close(lp.grad, want)
    # value: the ratio is 1, so the loss is the mean of −R + β·k3
    k3 = torch.exp(lp_wm - lp.detach()) - (lp_wm - lp.detach()) - 1
    assert float(loss) == pytest.approx(float((((-R + beta * k3) * mask).sum(1) / n[:, 0]).mean()))


# ------------------------------------------------------------------------------ pipeline and bad input
def test_shared_models_are_train_nodes():
    from pipelines.core.registry import load_pipeline
    from pipelines.rlcracker.params import VARIANTS

    names = {n.name for n in load_pipeline("rlcracker").only_nodes_with_tags("train").nodes}
    assert set(BASE["variants"]) == set(VARIANTS)
    assert {"rlcracker.train.generator", "rlcracker.train.attacker_sft"} <= names


@pytest.mark.parametrize(
    "path,value,key",
    [
        (("rl", "lr"), -1.0, r"rlcracker\.rl\.lr"),
        (("watermark", "gamma"), 1.5, r"rlcracker\.watermark\.gamma"),
        (("variants",), ["rlcracker", "gpt4o"], r"rlcracker\.variants"),
        (("rl", "group_size"), 1, r"rlcracker\.rl\.group_size"),
        (("data", "synonym_pref"), [0.5, 0.5], r"rlcracker\.data"),
    ],
)
def test_bad_parameter_names_the_key(path, value, key):
    raw = yaml.safe_load(yaml.safe_dump(RAW))
    d = raw
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(ParameterError, match=key):
        validate(Params, raw, "rlcracker")


def test_bad_user_corpus_names_dataset_and_column(tmp_path):
    from pipelines.rlcracker.data import load_corpus

    corpus = pd.DataFrame(
        {"split": ["train", "wm_train", "test", "test"], "question": ["a b"] * 4, "text": ["a b c"] * 4}
    )
    lexicon = pd.DataFrame({"token": ["a", "b"], "concept": ["x", "x"]})
    corpus.to_parquet(tmp_path / "c.parquet")
    lexicon.to_parquet(tmp_path / "l.parquet")
    raw = _merge(
        RAW,
        {
            "data": {
                "source": "file",
                "corpus_path": str(tmp_path / "c.parquet"),
                "lexicon_path": str(tmp_path / "l.parquet"),
            }
        },
    )
    p = Params.model_validate(raw)
    with pytest.raises(InputDataError, match=r"rlcracker\.wm_corpus.*answer"):
        load_corpus(p)
    corpus.rename(columns={"text": "answer"}).assign(split=["train", "wm_train", "test", "dev"]).to_parquet(
        tmp_path / "c.parquet"
    )
    with pytest.raises(InputDataError, match=r"rlcracker\.wm_corpus.*split"):
        load_corpus(p)
    lexicon.drop(columns="concept").to_parquet(tmp_path / "l.parquet")
    corpus.rename(columns={"text": "answer"}).to_parquet(tmp_path / "c.parquet")
    with pytest.raises(InputDataError, match=r"rlcracker\.lexicon.*concept"):
        load_corpus(p)
