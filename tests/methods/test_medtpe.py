"""Tests of `medtpe`: the BPE against a brute-force re-count, the layered tokeniser's losslessness and
locality, the dependency-aware replacement, the embedding surgery and bad input (the end-to-end
--env=test run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

from collections import Counter

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.core.params import ParameterError, validate
from pipelines.medtpe.params import Params
from pipelines.medtpe.tpe import BPE, SPECIALS, TPE, build_tpe, pretokenize, train_bpe

RAW = {
    "seeds": [0],
    "data": {"n_train": 80, "n_test": 40, "n_events": [2, 4], "corpus_bytes": 20000},
    "bpe": {"vocab_size": 500},
    "tpe": {"max_m": 40, "mine_records": 60},
    "variants": ["original", "medtpe"],
}


@pytest.fixture(scope="module")
def setup():
    from pipelines.medtpe.data import QUESTIONS, general_corpus, make_ehr
    from pipelines.medtpe.train import answer_tokens

    p = Params.model_validate(RAW)
    bpe = BPE(train_bpe(general_corpus(p)["text"], p.bpe.vocab_size))
    ehr = make_ehr(p)
    texts = [t + QUESTIONS["mortality"] for t in ehr["text"]]
    train, test = texts[: p.data.n_train], texts[p.data.n_train :]
    tok = build_tpe(bpe, train, max_m=40, protect=answer_tokens(bpe))
    return p, bpe, tok, train, test


# ------------------------------------------------------------------------------------------------ BPE
def _brute_force_bpe(texts, n_merges, min_freq=2):
    """Reference: re-count every adjacent pair over the whole corpus at every step."""
    words = [list(w) for t in texts for w in pretokenize(t)]
    merges = []
    for _ in range(n_merges):
        counts = Counter(pr for w in words for pr in zip(w, w[1:]))
        if not counts:
            break
        best = min(counts, key=lambda q: (-counts[q], q))
        if counts[best] < min_freq:
            break
        merges.append(best)
        a, b = best
        new = []
        for w in words:
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            new.append(out)
        words = new
    return merges


def test_bpe_matches_brute_force_recount():
    texts = [
        "the cat sat on the mat; the hat, that cat",
        "Lab Creatinine 1.8 mg/dL (high)\nLab Lactate 2.4 mmol/L",
        "aaaa aaa aa a banana bandana",
        "Med Vancomycin 1 g IV q12h Med Vancomycin",
    ]
    fast = train_bpe(texts, vocab_size=len(SPECIALS) + 256 + 60)
    ref = _brute_force_bpe(texts, 60)
    assert len(ref) > 20
    assert fast == ref


def test_pretokenize_covers_every_character():
    text = "Patient: 67-year-old  male.\n\tA41.9 Sepsis_x é ünïcode ²³ (high)\n\n"
    assert "".join(BPE([]).decode(BPE([]).encode(text))) == text
    assert sum(len(p) for p in pretokenize("abc")) == 3


# ------------------------------------------------------------------------------------------------ TPE
def test_roundtrip_on_every_test_record(setup):
    p, bpe, tok, train, test = setup
    assert len(tok.merges) == 40
    for x in test:
        ids = tok.encode(x)
        assert tok.decode(ids) == x
    # composites make the prompts shorter
    assert sum(map(len, map(tok.encode, test))) < sum(map(len, map(bpe.encode, test)))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_roundtrip_on_arbitrary_text(setup, text):
    _, bpe, tok, _, _ = setup
    assert bpe.decode(bpe.encode(text)) == text
    assert tok.decode(tok.encode(text)) == text


def test_merges_never_change_tokens_outside_merged_pairs(setup):
    """Expanding every composite back into its parts gives the (reduced) BPE's tokens exactly; in extend
    mode (nothing removed) that is the original BPE's tokenisation; in replace mode a pre-token keeps its
    original tokens whenever no removed token lies on its derivation; surviving tokens keep their IDs."""
    p, bpe, tok, train, test = setup
    ext = build_tpe(bpe, train, max_m=40, mode="extend")
    gone = set(tok.removed)
    for x in test:
        base = tok.base.strings(x)
        out = tok.strings(x)
        expanded = [t for s in out for t in (tok.composite[s] if s in tok.composite else (s,))]
        assert expanded == base
        # every output token that is not a composite is the base token at that position
        i = 0
        for s in out:
            n = len(tok.composite.get(s, (s,)))
            if n == 1:
                assert s == base[i]
            i += n
        ext_expanded = [t for s in ext.strings(x) for t in (ext.composite[s] if s in ext.composite else (s,))]
        assert ext_expanded == bpe.strings(x)
        for piece in pretokenize(x):
            orig = bpe.word(piece)
            if not gone.intersection(t for o in orig for t in bpe.decompose(o)):
                assert tok.base.word(piece) == orig
    for i, s in enumerate(bpe.vocab):
        if s not in gone:
            assert tok.stoi[s] == i


def test_dependency_aware_replacement(setup):
    _, bpe, tok, _, _ = setup
    from pipelines.medtpe.train import answer_tokens

    assert len(tok.vocab) == len(bpe.vocab)  # vocabulary size unchanged
    assert len(set(tok.vocab)) == len(tok.vocab)
    gone = set(tok.removed)
    protected = set(SPECIALS) | set(answer_tokens(bpe))
    for g in tok.merges:
        for t in g:
            protected |= bpe.decompose(t)  # merge paths of the sub-tokens
    assert not gone & protected
    assert all(len(t) > 1 for t in gone)  # single bytes are never removed
    for g in tok.merges:  # each composite took a removed token's ID
        assert bpe.vocab[tok.stoi["".join(g)]] in gone


def _resegment(piece, merges, gone):
    """Reference BPE with the tokens ``gone`` removed: drop every merge whose parts or result is gone, then
    apply the surviving merges one by one in rank order across the whole pre-token."""
    s = list(piece)
    for a, b in merges:
        if gone & {a, b, a + b}:
            continue
        out, j = [], 0
        while j < len(s):
            if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                out.append(a + b)
                j += 2
            else:
                out.append(s[j])
                j += 1
        s = out
    return s


def _check_no_word_longer_than_required(bpe, tok, texts):
    """A pre-token whose own BPE tokens all survive replacement keeps exactly its tokens (the reference
    re-segmentation agrees); only a pre-token one of whose tokens was handed to a composite may get longer."""
    gone = set(tok.removed)
    for piece in {p for t in texts for p in pretokenize(t)}:
        after = tok.base.word(piece)
        assert after == _resegment(piece, bpe.merges, gone), piece
        if not gone.intersection(bpe.word(piece)):
            assert after == bpe.word(piece), (piece, bpe.word(piece), after)


def test_replace_mode_keeps_merge_paths_of_kept_words(setup):
    """Replace mode must not hand out the ID of a token that a kept token is built through. On this toy
    corpus "Admission" and "age" are single tokens built from late merges; their merge-path tokens ('Ad',
    'Admi', ..., 'ag') never end a word, and ranking by final-token frequency removed them first (highest
    ID among the zeros), so "Admission" went 1 → 4 tokens and "age" 1 → 3 already at 5 composites while
    ~50 unused general-corpus tokens were still free. At 60 composites the free tokens run out and the two
    words' own tokens are legitimately replaced; the reference re-segmentation still has to agree."""
    general = ["Return the value of the attribute; raise an exception if the object is missing or invalid."] * 6 + [
        "Admission",
        "age",
        "Lab Sodium Creatinine Potassium Glucose Lactate",
    ] * 2
    labs = ["Lab", "Sodium", "Creatinine", "Potassium", "Glucose", "Lactate", "high", "low", "normal", "mg", "dL"]
    task = ["Admission"] * 12 + ["age"] * 8 + [f"{a} {b}" for a in labs for b in labs if a != b] * 2
    bpe = BPE(train_bpe(general, 258 + 300))
    assert bpe.word("Admission") == ["Admission"] and bpe.word("age") == ["age"]
    for max_m in (5, 20, 40, 60):
        tok = build_tpe(bpe, task, max_m=max_m)
        assert len(tok.merges) >= min(max_m, 50)
        if max_m < 60:
            assert tok.base.word("Admission") == ["Admission"] and tok.base.word("age") == ["age"], max_m
        _check_no_word_longer_than_required(bpe, tok, task)
    _, bpe, tok, train, _ = setup  # the same on the synthetic EHR prompts
    _check_no_word_longer_than_required(bpe, tok, train)


def test_trie_picks_highest_priority_not_longest():
    bpe = BPE([])
    vocab = [*bpe.vocab, "abc", "ab"]
    tok = TPE(bpe, [("a", "b"), ("a", "b", "c")], [], vocab, mode="extend")
    assert tok.strings("abcab") == ["ab", "c", "ab"]
    tok2 = TPE(bpe, [("a", "b", "c"), ("a", "b")], [], [*bpe.vocab, "abc", "ab"], mode="extend")
    assert tok2.strings("abcab") == ["abc", "ab"]
    assert tok2.decode(tok2.encode("abcab")) == "abcab"


def test_number_filter_skips_digit_tokens(setup):
    from pipelines.medtpe.tpe import has_digit, unmap_safe

    _, _, tok, _, _ = setup
    assert not any(has_digit(unmap_safe(t)) for g in tok.merges for t in g)


# ------------------------------------------------------------------------------------------------ model
def test_embedding_init_and_rows_only_tuning(setup):
    import torch

    from pipelines.medtpe.model import adapt_model, make_model, only_rows_train

    p, bpe, tok, _, _ = setup
    torch.manual_seed(0)
    base = make_model(len(bpe.vocab), p.model.model_copy(update={"d_model": 16, "n_heads": 2, "n_layers": 1}))
    m = adapt_model(base, bpe.vocab, tok, set(SPECIALS))
    E = base.embed.weight.detach()
    target = 0.5 * E.norm(dim=1).mean()
    new = set(tok.new_ids())
    for g in tok.merges[:5]:
        i = tok.stoi["".join(g)]
        mean = E[[bpe.stoi[t] for t in g]].mean(0)
        torch.testing.assert_close(m.embed.weight[i], mean * target / mean.norm())
        torch.testing.assert_close(m.embed.weight[i].norm(), target)
    keep = [i for i in range(len(bpe.vocab)) if i not in new]
    torch.testing.assert_close(m.embed.weight[keep], E[keep])
    # only the new rows move under an optimiser step
    params = only_rows_train(m, sorted(new))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt = torch.optim.AdamW(params, lr=0.1, weight_decay=0.0)
    ids = torch.tensor([tok.encode("Lab Creatinine 2.0 mg/dL (high)\nAnswer:")])
    m.last_logits(ids, torch.tensor([ids.shape[1]])).logsumexp(-1).sum().backward()
    opt.step()
    after = m.state_dict()
    for k in before:
        if k in ("embed.weight", "head.weight"):
            torch.testing.assert_close(after[k][keep], before[k][keep])
        else:
            torch.testing.assert_close(after[k], before[k])
    assert not torch.equal(after["embed.weight"], before["embed.weight"]) or not torch.equal(
        after["head.weight"], before["head.weight"]
    )


def test_last_logits_equals_full_forward(setup):
    import torch

    from pipelines.medtpe.model import make_model

    p, bpe, _, _, test = setup
    m = make_model(len(bpe.vocab), p.model.model_copy(update={"d_model": 16, "n_heads": 2, "n_layers": 1})).eval()
    from pipelines.medtpe.train import pad

    seqs = [bpe.encode(t)[:50] for t in test[:3]]
    seqs[1] = seqs[1][:20]
    ids, lengths = pad(seqs, bpe.pad_id)
    with torch.no_grad():
        fast = m.last_logits(ids, lengths)
        ref = torch.stack([m(torch.tensor([s]))[0, -1] for s in seqs])  # core's forward, unpadded
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-4)


def test_compression_baselines_keep_question_and_length():
    from pipelines.medtpe.train import drop_tokens, truncate

    ids = [10, 11, 12, 13, 14, 15, 90, 91]
    info = {10: 5.0, 11: 1.0, 12: 3.0, 13: 0.5, 14: 4.0, 15: 2.0, 90: 0.1, 91: 0.1}
    assert drop_tokens(ids, 2, 5, info) == [10, 12, 14, 90, 91]
    assert truncate(ids, 2, 5) == [13, 14, 15, 90, 91]
    assert truncate(ids, 2, 2) == [90, 91]


# ------------------------------------------------------------------------------------------------ pipeline / input
@pytest.mark.parametrize(
    "key, value, where",
    [
        (("tpe", "max_n"), 1, r"medtpe\.tpe\.max_n"),
        (("data", "n_events"), [5, 2], r"medtpe\.data"),
        (("ssft", "lr"), -1.0, r"medtpe\.ssft\.lr"),
        (("tpe", "number_filter"), "digits", r"medtpe\.tpe\.number_filter"),
    ],
)
def test_bad_parameter_names_the_key(key, value, where):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in RAW.items()}
    raw.setdefault(key[0], {})[key[1]] = value
    with pytest.raises(ParameterError, match=where):
        validate(Params, raw, "medtpe")


def test_variants_must_include_original():
    with pytest.raises(ParameterError, match="original"):
        validate(Params, {**RAW, "variants": ["medtpe"]}, "medtpe")


def test_bad_user_file_names_dataset_and_column(tmp_path):
    from pipelines.core.schemas import InputDataError
    from pipelines.medtpe.data import make_ehr

    path = tmp_path / "ehr.parquet"
    pd.DataFrame(
        {"record_id": np.arange(6), "split": ["train"] * 3 + ["test"] * 3, "text": ["x"] * 6, "mortality": [0, 1] * 3}
    ).to_parquet(path)
    p = Params.model_validate({**RAW, "data": {**RAW["data"], "ehr_path": str(path)}})
    with pytest.raises(InputDataError, match=r"medtpe\.ehr.*long_stay"):
        make_ehr(p)


# ------------------------------------------------------------------------------------------------ test resolution
def test_per_seed_test_shards_are_disjoint_and_cover_the_test_set():
    from pipelines.medtpe.data import make_ehr
    from pipelines.medtpe.train import test_stays

    p = Params.model_validate({**RAW, "seeds": [0, 1, 2]})
    ehr = make_ehr(p)
    shards = [set(test_stays(ehr, p, s)["record_id"]) for s in p.seeds]
    assert sum(map(len, shards)) == p.data.n_test
    assert set().union(*shards) == set(ehr[ehr.split == "test"]["record_id"])
    assert not (shards[0] & shards[1]) and not (shards[1] & shards[2])
    shared = Params.model_validate({**RAW, "seeds": [0, 1], "data": {**RAW["data"], "test_split": "shared"}})
    assert len(test_stays(ehr, shared, 1)) == p.data.n_test


def test_hanley_mcneil_se_matches_a_bootstrap():
    from sklearn.metrics import roc_auc_score

    from pipelines.medtpe.evaluate import hanley_mcneil_se

    rng = np.random.default_rng(0)
    y = (rng.random(3000) < 0.13).astype(int)
    s = rng.normal(size=3000) + 0.9 * y
    auc = roc_auc_score(y, s)
    boot = [roc_auc_score(y[i], s[i]) for i in (rng.integers(0, 3000, 3000) for _ in range(300))]
    assert hanley_mcneil_se(auc, int(y.sum()), int(len(y) - y.sum())) == pytest.approx(np.std(boot), rel=0.25)
