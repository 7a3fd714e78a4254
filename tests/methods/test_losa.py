"""Tests of `losa`: the mechanism against independent references (SDPA over the concatenated keys, a
brute-force set union of the selected pages, a brute-force Quest bound, limit cases where LoSA must equal
dense attention), the gather kernels against the mask-based policies, the data generator, and bad input.
The end-to-end --env=test run is covered by tests/methods/test_all_pipelines.py."""

import copy
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.losa.params import Params, Variant

with open("conf/base/parameters_losa.yml") as fh:
    BASE = yaml.safe_load(fh)["losa"]
with open("conf/test/parameters_losa.yml") as fh:
    TEST = yaml.safe_load(fh)["losa"]


def _merge(a, b):
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


RAW = _merge(BASE, TEST)


def params(**over) -> Params:
    return Params.model_validate(_merge(RAW, over))


def qkv(b=3, h=2, B=6, N=37, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, B, d, generator=g)
    k = torch.randn(b, h, N + B, d, generator=g)
    v = torch.randn(b, h, N + B, d, generator=g)
    return q, k, v


# ----------------------------------------------------------------------------- attention primitives
def test_online_softmax_merge_equals_softmax_over_concatenation():
    from pipelines.losa.model import attn_lse, merge_lse

    q, k, v = qkv()
    o1, l1 = attn_lse(q, k[:, :, :20], v[:, :, :20])
    o2, l2 = attn_lse(q, k[:, :, 20:], v[:, :, 20:])
    o, lse = merge_lse(o1, l1, o2, l2)
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)


def test_quest_score_bounds_every_key_of_its_page():
    from pipelines.losa.model import page_minmax, quest_scores

    q, k, _ = qkv(N=40)
    kp = k[:, :, :40]
    kmin, kmax = page_minmax(kp, 8)
    s = quest_scores(q, kmin, kmax)  # [b, h, B, 5]
    dots = (q @ kp.transpose(-1, -2)).reshape(*q.shape[:3], 5, 8)  # brute force q·k per page
    assert (s >= dots.amax(-1) - 1e-5).all()
    # one-key pages: the bound is exact
    kmin1, kmax1 = page_minmax(kp, 1)
    torch.testing.assert_close(quest_scores(q, kmin1, kmax1), q @ kp.transpose(-1, -2), atol=1e-5, rtol=1e-5)


def test_page_union_count_matches_brute_force_set_union():
    from pipelines.losa.model import PrefixPolicy, page_minmax, quest_scores, union_page_count

    g = torch.Generator().manual_seed(3)
    sel = torch.rand(4, 3, 8, 11, generator=g) < 0.2
    cnt = union_page_count(sel)
    for i in range(4):
        for j in range(3):
            pages = set()
            for t in range(8):
                pages |= {int(x) for x in torch.nonzero(sel[i, j, t]).flatten()}
            assert cnt[i, j] == len(pages)

    # the policy's loaded KV (Quest, and LoSA over its active tokens) vs a brute-force union in Python
    q, k, v = qkv(b=2, h=2, B=6, N=45, d=8, seed=5)
    N, P, budget = 45, 8, 16
    kmin, kmax = page_minmax(k[:, :, :N], P)
    scores = quest_scores(q, kmin, kmax)
    for kind in ("quest", "losa"):
        pol = PrefixPolicy(Variant(name="x", kind=kind), budget, N, P, n_steps=4)
        pol(0, q, k, v, torch.zeros(2, 6, 16))
        loaded = pol.stats[0]["density"] * N  # tokens per (batch, head)
        for i in range(2):
            for j in range(2):
                pages = set()
                for t in range(6):
                    order = sorted(range(scores.shape[-1]), key=lambda gi: -float(scores[i, j, t, gi]))
                    pages |= set(order[: budget // P])
                assert float(loaded[i, j]) == pytest.approx(len(pages) * P + N % P)


# ----------------------------------------------------------------------------- limit cases
def test_losa_all_active_full_budget_equals_dense_attention():
    from pipelines.losa.model import PrefixPolicy

    q, k, v = qkv(N=40)
    ref = F.scaled_dot_product_attention(q, k, v)
    x = torch.randn(3, 6, 16)
    spec = Variant(name="l", kind="losa", rho=1.0)
    pol = PrefixPolicy(spec, 40, 40, 8, n_steps=3)
    for t in range(3):  # later steps: rho = 1 → every token active
        pol.step = t
        q_t = q + 0.1 * t
        out = pol(0, q_t, k, v, x + t)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q_t, k, v), atol=1e-5, rtol=1e-5)
    assert pol.stats[-1]["active"].all() and torch.allclose(pol.stats[-1]["density"], torch.ones(3, 2))
    # quest at the full budget too
    pq = PrefixPolicy(Variant(name="q", kind="quest"), 48, 40, 8, n_steps=1)
    torch.testing.assert_close(pq(0, q, k, v, x), ref, atol=1e-5, rtol=1e-5)


def _tiny_model(seed=0):
    from pipelines.losa.model import build_model

    torch.manual_seed(seed)
    p = params()
    return build_model(p, 40, 20), p


def test_losa_decode_equals_dense_decode_at_full_budget():
    from pipelines.losa.model import PrefixPolicy, decode_block

    model, p = _tiny_model()
    prefix = torch.randint(5, 40, (5, 20), generator=torch.Generator().manual_seed(1))
    ref = decode_block(model, prefix, 4, 4, 3, policy=None)
    for spec in (
        Variant(name="d", kind="dense"),
        Variant(name="l", kind="losa", rho=1.0),
        Variant(name="t", kind="losa", active_rule="threshold", threshold=0.0),
        Variant(
            name="h",
            kind="losa",
            rho=1.0,
            activity_signal="hidden",
            activity_reference="last_refresh",
            first_step_mode="dense",
        ),
    ):
        pol = PrefixPolicy(spec, 24 if spec.kind != "dense" else None, 20, 4, 4)
        out = decode_block(model, prefix, 4, 4, 3, policy=pol)
        assert torch.equal(out, ref), spec.name
        assert max(float(r["rel_err"].max()) for r in pol.stats) < 1e-5


def test_stable_tokens_reuse_their_cached_prefix_output():
    from pipelines.losa.model import PrefixPolicy, attn_lse

    q, k, v = qkv(N=40)
    spec = Variant(name="l", kind="losa", rho=0.5)
    pol = PrefixPolicy(spec, 16, 40, 8, n_steps=2)
    x = torch.zeros(3, 6, 16)
    pol(0, q, k, v, x)
    o0, l0 = (t.clone() for t in pol.cache[0])
    q1 = q.clone()
    q1[:, :, :3] += 1.0  # only tokens 0-2 change → they are the active half
    pol.step = 1
    pol(0, q1, k, v, x)
    o1, l1 = pol.cache[0]
    act = pol.stats[-1]["active"].bool()
    assert act[:, :, :3].all() and not act[:, :, 3:].any()
    torch.testing.assert_close(o1[:, :, 3:], o0[:, :, 3:])
    torch.testing.assert_close(l1[:, :, 3:], l0[:, :, 3:])
    assert not torch.allclose(o1[:, :, :3], o0[:, :, :3])
    # the active ones attend to the union of their pages (recomputed here by hand)
    from pipelines.losa.model import page_minmax, pages_to_tokens, quest_scores, top_pages

    kmin, kmax = page_minmax(k[:, :, :40], 8)
    sel = top_pages(quest_scores(q1, kmin, kmax), 2) & act[..., None]
    tok = pages_to_tokens(sel.any(-2), 8, 40)[:, :, None, :]
    o_ref, _ = attn_lse(q1, k[:, :, :40], v[:, :, :40], tok)
    torch.testing.assert_close(o1[:, :, :3], o_ref[:, :, :3])


def test_layer0_queries_change_only_at_the_committed_token():
    """Structural locality: at layer 0 only the token committed at step t-1 gets a new input."""
    from pipelines.losa.model import PrefixPolicy, decode_block

    model, p = _tiny_model()
    prefix = torch.randint(5, 40, (4, 20), generator=torch.Generator().manual_seed(2))
    pol = PrefixPolicy(Variant(name="d", kind="dense"), None, 20, 4, 4)
    decode_block(model, prefix, 4, 4, 3, policy=pol)
    for r in pol.stats:
        if r["layer"] == 0 and "dq" in r:
            changed = (r["dq"] > 0).any(1).sum(-1)  # tokens with any change per prompt
            assert (changed == 1).all()


def test_prefix_is_causal_and_blind_to_the_block():
    from pipelines.losa.model import bdlm_mask

    model, _ = _tiny_model()
    ids = torch.randint(5, 40, (2, 24), generator=torch.Generator().manual_seed(4))
    other = ids.clone()
    other[:, 20:] = 3
    m = bdlm_mask(20, 4)
    a, b = model(ids, attn_mask=m), model(other, attn_mask=m)
    torch.testing.assert_close(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


# ----------------------------------------------------------------------------- gather kernels
def test_gather_kernels_equal_mask_based_policies():
    from pipelines.losa.bench import losa_decode_attention, quest_gather
    from pipelines.losa.model import PrefixPolicy, attn_lse, page_minmax, pages_to_tokens, quest_scores, top_pages

    N, P = 43, 8
    steps = [qkv(N=N, seed=s) for s in range(3)]
    k, v = steps[0][1], steps[0][2]
    kp, vp = k[:, :, :N], v[:, :, :N]
    meta = page_minmax(kp, P)
    q = steps[0][0]
    o, lse = quest_gather(q, kp, vp, meta, 2, P)
    sel = top_pages(quest_scores(q, *meta), 2)
    o_ref, l_ref = attn_lse(q, kp, vp, pages_to_tokens(sel, P, N))
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, l_ref, atol=1e-5, rtol=1e-5)

    qs = [[s[0]] for s in steps]
    o_g, l_g, _ = losa_decode_attention(qs, [kp], [vp], [meta], 2, P, rho=0.5)
    pol = PrefixPolicy(Variant(name="l", kind="losa", rho=0.5), 16, N, P, n_steps=3)
    for t, (q_t, _, _) in enumerate(steps):
        pol.step = t
        pol(0, q_t, k, v, torch.zeros(3, 6, 16))
    o_m, l_m = pol.cache[0]
    torch.testing.assert_close(o_g, o_m, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l_g, l_m, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- data
def test_answers_are_the_values_of_the_query_keys():
    from pipelines.losa.data import PAD, make_tasks, prefix_len_of, vocab_of

    p = params()
    t = make_tasks(p)
    d, v, n_prefix = p.data, vocab_of(p), prefix_len_of(p)
    ev = t[f"eval_seed{p.seeds[0]}"].long().numpy()
    assert ev.shape == (d.n_eval, n_prefix + d.block_size)
    for row in ev:
        ctx = row[1 : 1 + d.context_len]
        keys = [i for i, x in enumerate(ctx) if v.key0 <= x < v.value0]
        assert len(keys) == d.n_records and len({ctx[i] for i in keys}) == d.n_records
        lookup = {int(ctx[i]): int(ctx[i + 1]) for i in keys}
        asked = row[2 + d.context_len : n_prefix]
        want = [lookup[int(a)] for a in asked]
        assert list(row[n_prefix : n_prefix + len(want)]) == want
        assert (row[n_prefix + len(want) :] == PAD).all()
    again = make_tasks(p)
    assert torch.equal(again["train"], t["train"])


def test_user_table_is_loaded_and_checked(tmp_path):
    from pipelines.losa.data import make_tasks

    df = pd.DataFrame(
        {
            "prompt": ["a b c k1", "d e k2 f", "k1 x y z"],
            "answer": ["v1", "v2 v3", "v1"],
            "split": ["train", "train", "eval"],
        }
    )
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    p = params(data={"source": "file", "path": str(path)})
    t = make_tasks(p)
    assert t["train"].shape[0] == 2 and t[f"eval_seed{p.seeds[0]}"].shape[0] == 1
    df.drop(columns=["answer"]).to_csv(path, index=False)
    with pytest.raises(InputDataError, match=r"losa\.user_table.*'answer'"):
        make_tasks(p)


# ----------------------------------------------------------------------------- pipeline and params
@pytest.mark.parametrize(
    "over, key",
    [
        ({"decode": {"budgets": [10]}}, r"losa\.decode: .*budgets"),
        ({"timing": {"budgets": [6]}}, r"timing\.budgets"),
        ({"train": {"lr": -1.0}}, r"losa\.train\.lr"),
        ({"train": {"stepz": 3}}, r"losa\.train\.stepz"),
        (
            {"variants": [{"name": "dense", "kind": "dense"}, {"name": "l", "kind": "losa", "rho": 1.5}]},
            r"losa\.variants\.1\.rho",
        ),
    ],
)
def test_bad_parameter_names_the_key(over, key):
    with pytest.raises(ParameterError, match=key):
        validate(Params, _merge(RAW, over), "losa")


def test_claim_on_an_unplanned_budget_is_rejected():
    from pipelines.losa.spec import SPEC

    raw = _merge(RAW, {})
    raw["claims"] = [{"id": "x", "text": "x", "metric": "variants.quest.kv_density_b64", "op": "<", "threshold": 1}]
    with pytest.raises(ParameterError, match="claim 'x': variant 'quest' produces no metric 'kv_density_b64'"):
        SPEC.check(validate(Params, raw, "losa"))
    raw["claims"] = [{"id": "y", "text": "y", "metric": "density_ratio.losa_vs_quest.b64", "op": ">", "threshold": 1}]
    with pytest.raises(ParameterError, match="claim 'y'"):
        SPEC.check(validate(Params, raw, "losa"))
    SPEC.check(params())


def test_density_and_matched_density_ratios():
    from pipelines.losa.evaluate import derived_metrics

    p = params()  # test env: dense, quest, sparsed, losa, losa_thr at budgets 8, 16

    def table(rows):
        return pd.DataFrame(
            [
                {"seed": 0, "budget": b, "answer_em": 0.0, "kv_density": d, "attn_out_rel_err": e, "blocks": [0]}
                for b, d, e in rows
            ]
        )

    res = {
        "dense": table([(52, 100.0, 0.0)]),
        "quest": table([(8, 30.0, 0.6), (16, 50.0, 0.4)]),
        "sparsed": table([(8, 60.0, 0.5), (16, 70.0, 0.3)]),
        "losa": table([(8, 20.0, 0.5), (16, 40.0, 0.25)]),
        "losa_thr": table([(8, 10.0, 0.7), (16, 25.0, 0.3)]),
    }
    m = derived_metrics(p, res)
    assert m["density_ratio.losa_vs_quest.b8"] == pytest.approx(1.5)
    assert m["density_ratio.losa_vs_quest.min"] == pytest.approx(1.25)
    assert m["err_ratio.quest_vs_losa.min"] == pytest.approx(1.2)
    # inside Quest's range: linear interpolation (40 % → 0.5); below it: Quest's sparsest error; above: NaN
    assert m["matched_density_err_ratio.quest_vs_losa.b16"] == pytest.approx(0.5 / 0.25)
    assert m["matched_density_err_ratio.quest_vs_losa_thr.b16"] == pytest.approx(0.6 / 0.3)
    assert math.isnan(m["matched_density_err_ratio.quest_vs_sparsed.b16"])
    # EM gaps are plain differences: the claims on them require the gate dense_retrieves (conf)
    assert m["gated.answer_em_gap.losa_minus_dense.b16"] == 0.0 and "em_gate_passed" not in m
    # every produced name is declared for core's check of the claims
    from pipelines.losa.spec import comparison_names

    assert set(m) <= set(comparison_names(p, list(res)))


def test_full_mask_share_masks_whole_blocks_and_leaves_the_rest_as_before():
    """``train.full_mask_share``: that share of the samples has every block slot masked with γ = 1 (dense
    supervision on every answer token); share 0 draws exactly the card's γ-noising."""
    from pipelines.losa.model import noise_block

    ids = torch.arange(40 * 12).view(40, 12) % 50 + 10
    a = noise_block(ids, 4, 0.125, 3, torch.Generator().manual_seed(0))
    b = noise_block(ids, 4, 0.125, 3, torch.Generator().manual_seed(0), full_share=0.0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not a[1].all(1).all()  # γ-noising leaves some slots visible
    noised, masked, gamma = noise_block(ids, 4, 0.125, 3, torch.Generator().manual_seed(0), full_share=1.0)
    assert masked.all() and (gamma == 1).all() and (noised[:, 4:] == 3).all() and torch.equal(noised[:, :4], ids[:, :4])
    _, masked, gamma = noise_block(ids, 4, 0.125, 3, torch.Generator().manual_seed(1), full_share=0.5)
    full = masked.all(1) & (gamma == 1)
    assert 0 < full.sum() < len(ids)


def test_model_init_scale_defaults_to_inverse_sqrt_width():
    from pipelines.losa.model import build_model

    p = params(model={"d_model": 64, "n_heads": 2})
    m = build_model(p, 200, 20)
    assert m.config.init_std == pytest.approx(64**-0.5)
    w = torch.cat([m.embed.weight.flatten(), m.blocks[0].qkv.weight.flatten()])
    assert w.std().item() == pytest.approx(64**-0.5, rel=0.05)
    assert build_model(params(model={"init_std": 0.02}), 200, 20).config.init_std == 0.02
