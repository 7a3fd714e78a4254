"""Tests of `wedlm`: the mechanism against independent references (naive recompute decoder, uncached
forwards, explicit logical-order masks, a brute-force training mask, a hand-written training loop),
structural p_cache bounds, the interleaved timing, one train node per trained model, bad parameters and
bad input files (the end-to-end --env=test run is tests/methods/test_all_pipelines.py's)."""

import copy
import json

import numpy as np
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.wedlm.params import Params

V, MASK, EOS = 20, 18, 17


def _model(seed=0, layers=2, sharp=True):
    from pipelines.wedlm.model import TinyLM

    torch.manual_seed(seed)
    m = TinyLM(V, 32, 4, layers, 64).eval()
    if sharp:  # a random init is nearly uniform; sharpen it so argmax and entropy decisions are not ties
        with torch.no_grad():
            m.head.weight.mul_(40)
    return m


def _prompts(n=6, P=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (n, P), generator=g)


def naive_mask_decoder(model, prompt, max_new):
    """Reference for a window of one slot: recompute [prompt, generated, MASK] from scratch every step
    (no cache, plain causal mask, logical order) and take the argmax at the MASK."""
    seq = prompt.tolist()
    out = []
    while len(out) < max_new:
        x = torch.tensor([seq + out + [MASK]])
        logits, _ = model(x, torch.arange(x.shape[1])[None])
        t = int(logits[0, -1].argmax())
        out.append(t)
        if t == EOS:
            break
    return out


def test_streaming_window_one_equals_naive_recompute():
    from pipelines.wedlm.decode import decode_parallel

    model, prompts = _model(), _prompts()
    res = decode_parallel(model, prompts, EOS, MASK, max_new=9, window=1, tau=0.4, lam=0.1)
    for i, p in enumerate(prompts):
        assert res.tokens[i] == naive_mask_decoder(model, p, 9)
    assert all(f == len(t) for f, t in zip(res.forwards, res.tokens))  # one token per forward


def test_ar_cached_logits_equal_uncached():
    from pipelines.wedlm.decode import KVCache, forward_on_cache

    model = _model(sharp=False)
    x = torch.cat([_prompts(3, 9), torch.randint(0, 16, (3, 6))], 1)
    full, _ = model(x, torch.arange(x.shape[1]).expand(3, -1))
    cache = KVCache(model, 3, 32, "cpu")
    lg, kv = forward_on_cache(model, cache, x[:, :9], torch.arange(9).expand(3, -1))
    cache.write(kv, torch.full((3,), 9))
    steps = [lg]
    for t in range(9, x.shape[1]):
        lg, kv = forward_on_cache(model, cache, x[:, t : t + 1], torch.full((3, 1), t))
        cache.write(kv, torch.ones(3, dtype=torch.long))
        steps.append(lg)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_streaming_cached_logits_equal_uncached():
    """A mid-decoding streaming forward (rows with different committed lengths, filled and masked slots,
    reordered) on the ragged cache equals one uncached causal forward over [prefix, reordered window]."""
    from pipelines.wedlm.decode import KVCache, forward_on_cache

    model = _model(3, sharp=False)
    g = torch.Generator().manual_seed(5)
    prefix_lens, W = [8, 11], 6
    cache = KVCache(model, 2, 40, "cpu")
    prefixes = [torch.randint(0, 16, (n,), generator=g) for n in prefix_lens]
    # fill the cache in uneven chunks per row, as streaming commits do
    for i, pre in enumerate(prefixes):
        row = KVCache(model, 1, 40, "cpu")
        for s in range(0, len(pre), 3):
            chunk = pre[s : s + 3][None]
            _, kv = forward_on_cache(model, row, chunk, torch.arange(s, s + chunk.shape[1])[None])
            row.write(kv, torch.tensor([chunk.shape[1]]))
        for L in range(len(model.layers)):
            cache.k[L][i], cache.v[L][i] = row.k[L][0], row.v[L][0]
        cache.len[i] = row.len[0]
    filled = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0]], dtype=torch.bool)
    win = torch.where(filled, torch.randint(0, 16, (2, W), generator=g), torch.full((2, W), MASK))
    off = torch.arange(W).expand(2, W)
    perm = torch.where(filled, off, W + off).argsort(1)
    tok = win.gather(1, perm)
    pos = torch.tensor(prefix_lens)[:, None] + perm
    cached, _ = forward_on_cache(model, cache, tok, pos)
    for i, pre in enumerate(prefixes):
        x = torch.cat([pre, tok[i]])[None]
        p = torch.cat([torch.arange(len(pre)), pos[i]])[None]
        ref, _ = model(x, p)
        torch.testing.assert_close(cached[i], ref[0, len(pre) :], atol=1e-5, rtol=0)


def test_reordering_equals_logical_order_with_explicit_mask():
    model = _model(4, sharp=False)
    g = torch.Generator().manual_seed(2)
    L = 14
    x = torch.randint(0, 16, (3, L), generator=g)
    observed = torch.rand(3, L, generator=g) < 0.5
    observed[:, 0] = True
    tok = torch.where(observed, x, torch.full_like(x, MASK))
    pos = torch.arange(L)
    # (a) logical order; observed causal among themselves, a mask sees every observed token and the
    # masks before it (itself included)
    i, j = pos[:, None], pos[None, :]
    ref = []
    for b in range(3):
        ob = observed[b]
        m = (
            (ob[:, None] & ob[None, :] & (j <= i))
            | (~ob[:, None] & ob[None, :])
            | (~ob[:, None] & ~ob[None, :] & (j <= i))
        )
        lg, _ = model(tok[b : b + 1], pos[None], m[None])
        ref.append(lg[0])
    ref = torch.stack(ref)
    # (b) observed moved to the physical prefix, logical positions kept for RoPE, plain causal mask
    perm = torch.where(observed, pos, L + pos).argsort(1)
    lg, _ = model(tok.gather(1, perm), perm)
    back = torch.empty_like(lg).scatter_(1, perm[:, :, None].expand_as(lg), lg)
    torch.testing.assert_close(back, ref, atol=1e-5, rtol=0)


def test_dual_stream_mask_matches_brute_force_rules():
    from pipelines.wedlm.model import block_ids, dual_stream_mask

    L, B, off = 11, 4, 3
    blk = block_ids(L, B, off)
    m = dual_stream_mask(blk)
    for r in range(2 * L):
        for c in range(2 * L):
            if r < L:
                want = c < L and c <= r
            elif c < L:
                want = blk[c] < blk[r - L]
            else:
                want = blk[c - L] == blk[r - L] and c <= r
            assert bool(m[r, c]) == want, (r, c)


def test_dual_stream_batch_reorders_within_blocks_and_weights():
    from pipelines.wedlm.model import IGNORE, block_ids, dual_stream_batch

    g = torch.Generator().manual_seed(0)
    N, L, P, B = 16, 20, 6, 5
    x = torch.randint(0, 16, (N, L), generator=g)
    b = dual_stream_batch(x, P, B, 2, 0.05, MASK, g)
    blk = block_ids(L, B, 2)
    xt_tok, xt_pos = b["tokens"][:, L:], b["pos"][:, L:]
    assert torch.equal(b["tokens"][:, :L], x) and torch.equal(b["pos"][:, :L], torch.arange(L).expand(N, L))
    for n in range(N):
        assert sorted(xt_pos[n].tolist()) == list(range(L))
        assert torch.equal(blk[xt_pos[n]], blk)  # positions stay inside their block
        is_m = xt_tok[n] == MASK
        assert (xt_pos[n][is_m] >= P).all()  # the prompt is never masked
        for k in blk.unique():
            sel = blk == k
            mk, ps = is_m[sel], xt_pos[n][sel]
            # observed first, then masks, each ascending by logical position
            assert mk.tolist() == sorted(mk.tolist())
            assert ps[~mk].tolist() == sorted(ps[~mk].tolist()) and ps[mk].tolist() == sorted(ps[mk].tolist())
        tgt = b["mlm_target"][n]
        assert torch.equal(tgt[is_m], x[n][xt_pos[n][is_m]]) and (tgt[~is_m] == IGNORE).all()
        assert torch.equal(xt_tok[n][~is_m], x[n][xt_pos[n][~is_m]])
    torch.testing.assert_close(b["mlm_weight"].sum(), torch.tensor(1.0))
    assert (b["mlm_weight"][b["mlm_target"] == IGNORE] == 0).all()


@pytest.mark.parametrize("mode", ["stream", "block"])
def test_p_cache_at_most_half_and_ar_is_one(mode):
    from pipelines.wedlm.decode import decode_ar, decode_parallel

    model, prompts = _model(1), _prompts(8)
    for W, tau in [(4, 0.4), (8, 3.0), (3, 50.0)]:
        r = decode_parallel(model, prompts, EOS, MASK, 12, W, tau, 0.02, mode=mode)
        assert sum(r.cached) / sum(r.processed) <= 0.5
        assert all(len(t) <= 12 for t in r.tokens)
    a = decode_ar(model, prompts, EOS, 12)
    assert sum(a.cached) == sum(a.processed) > 0
    assert all(f == len(t) for f, t in zip(a.forwards, a.tokens))


def test_refill_after_predict_caps_tokens_per_forward_at_half_window():
    from pipelines.wedlm.decode import decode_parallel

    model, prompts = _model(2), _prompts(5)
    W = 4
    # tau huge: every mask is filled at once, so only the refill order limits throughput
    before = decode_parallel(model, prompts, -1, MASK, 48, W, 1e9, 0.0, refill="before_forward")
    after = decode_parallel(model, prompts, -1, MASK, 48, W, 1e9, 0.0, refill="after_predict")
    tpf = [sum(map(len, r.tokens)) / sum(r.forwards) for r in (before, after)]
    assert tpf[0] == pytest.approx(W)
    # W/2 up to the last fill, which needs no commit forward: 48 tokens in 23 forwards
    assert 0.45 * W <= tpf[1] <= 0.55 * W


def test_batched_decoding_equals_one_by_one():
    from pipelines.wedlm.decode import decode_parallel

    model, prompts = _model(5), _prompts(5)
    batched = decode_parallel(model, prompts, EOS, MASK, 10, 4, 0.8, 0.05)
    for i in range(5):
        single = decode_parallel(model, prompts[i : i + 1], EOS, MASK, 10, 4, 0.8, 0.05)
        assert single.tokens[0] == batched.tokens[i] and single.forwards[0] == batched.forwards[i]


def _base_params():
    import yaml

    from tests.conftest import ROOT

    return yaml.safe_load((ROOT / "conf/base/parameters_wedlm.yml").read_text())["wedlm"]


def _params(raw) -> Params:
    return validate(Params, raw, "wedlm")


def _tiny_raw(**train):
    raw = copy.deepcopy(_base_params())
    raw["seeds"] = [0]
    raw["data"]["n_test"] = 6
    raw["model"].update(d_model=16, n_heads=2, n_layers=1, d_ff=32)
    raw["train"].update(steps=6, batch_size=4, **train)
    raw["decode"]["max_new_tokens"] = 14
    raw["eval"].update(taus=[0.4], n_timing=4, timing_rounds=2)
    return raw


@pytest.mark.parametrize(
    "path,value,key",
    [
        (("decode", "window"), 0, "wedlm.decode.window"),
        (("train", "gamma_min"), 0.0, "wedlm.train.gamma_min"),
        (("decode", "refill"), "sometimes", "wedlm.decode.refill"),
        (("model", "n_heads"), "four", "wedlm.model.n_heads"),
        (("eval", "tau_grid"), [0.1], "wedlm.eval.tau_grid"),
        (("train", "steps"), True, "wedlm.train.steps"),
        (("eval", "timing_rounds"), 0, "wedlm.eval.timing_rounds"),
    ],
)
def test_bad_parameter_names_the_key(path, value, key):
    raw = copy.deepcopy(_base_params())
    raw[path[0]][path[1]] = value
    with pytest.raises(ParameterError, match=key.replace(".", r"\.")):
        _params(raw)


def test_inconsistent_lengths_rejected():
    raw = copy.deepcopy(_base_params())
    raw["data"]["seq_len"] = 10
    with pytest.raises(ParameterError, match=r"wedlm\.data.*seq_len"):
        _params(raw)


def test_tasks_follow_their_rules_and_file_input(tmp_path):
    from pipelines.wedlm.data import layout_sequence, make_tasks, vocab_of

    raw = copy.deepcopy(_base_params())
    raw["data"].update(n_test=20, count_strides=[1, 2, 3])
    test, tasks = make_tasks(_params(raw))
    strides = set()
    for _, r in test.iterrows():
        if r.regime == "count":
            # one stride per item, drawn from data.count_strides and readable from the prompt's last two terms
            seq = [*r.prompt, *r.answer]
            diffs = {(b - a) % 32 for a, b in zip(seq, seq[1:])}
            assert len(diffs) == 1 and len(r.prompt) >= 2
            strides |= diffs
        elif r.regime == "reverse":
            assert list(r.answer) == list(r.prompt)[::-1]
        assert len(r.answer) == raw["data"]["answer_len"][r.regime]
    chain = tasks["chain"].numpy()
    ent = -(chain * np.log(chain)).sum(1).mean()
    assert 0.9 < ent < 1.8  # the card's high-entropy regime (≈ 1.2-1.5 nats at T = 1)
    assert strides == set(raw["data"]["count_strides"])
    raw1 = copy.deepcopy(raw)
    raw1["data"]["count_strides"] = None  # the default single stride: +1 mod 32 on every item
    test1, _ = make_tasks(_params(raw1))
    for _, r in test1[test1.regime == "count"].iterrows():
        seq = [*r.prompt, *r.answer]
        assert all((b - a) % 32 == 1 for a, b in zip(seq, seq[1:]))
    # file input: JSONL rows are laid out with tags, SEP, EOS and PAD by the pipeline
    rows = [
        {"regime": "count", "prompt": [1, 2, 3], "answer": list(range(4, 16))},
        {"regime": "reverse", "prompt": list(range(10)), "answer": list(range(9, -1, -1))},
    ]
    for name in ("train", "test"):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    raw["data"].update(source="file", train_path=str(tmp_path / "train.jsonl"), test_path=str(tmp_path / "test.jsonl"))
    p = _params(raw)
    test, tasks = make_tasks(p)
    assert list(test.regime) == ["count", "reverse"] and list(test["item"]) == [0, 0]
    v = vocab_of(p)
    seq = tasks["train_sequences"][0].tolist()
    assert seq == layout_sequence("count", [1, 2, 3], list(range(4, 16)), v, 12, 28)
    assert seq[:12] == [v.pad] * 7 + [v.tags["count"], 1, 2, 3, v.sep] and seq[24] == v.eos


GOOD = {"regime": "count", "prompt": [1, 2, 3], "answer": list(range(4, 16))}


@pytest.mark.parametrize(
    "lines,msg",
    [
        ([{"prompt": [1], "answer": list(range(12))}], r"column 'regime' is missing"),
        (
            [{**GOOD, "prompt": 5}],
            r"column 'prompt' should be array\[int\], got a value of type int \(first at line 1\)",
        ),
        ([{**GOOD, "regime": 3}], r"column 'regime' should be str"),
        ([{**GOOD, "answer": None}], r"column 'answer'"),
        ([], r"0 rows, at least 1 needed"),
        (
            [GOOD, {**GOOD, "prompt": [99]}],
            r"column 'prompt' must be in \[0, \d+\]; 1 value\(s\) are not \(first 99 at line 2\)",
        ),
        (
            [{**GOOD, "prompt": [1.5]}],
            r"column 'prompt' should be array\[int\], got elements of dtype float64 \(first at line 1\)",
        ),
        ([{**GOOD, "answer": [1]}], r"line 1: column 'answer' has 1 tokens"),
        (
            [{**GOOD, "regime": "add"}],
            r"column 'regime' has unknown value\(s\) \['add'\] \(allowed: .*; first at line 1\)",
        ),
        (
            [{**GOOD, "prompt": list(range(11))}],
            r"column 'prompt' must hold arrays of a length <= \d+; 1 row\(s\) do not \(first of length 11 at line 1\)",
        ),
        (["{not json"], r"line 1 is not JSON"),
    ],
)
def test_bad_input_file_stops_with_one_line_naming_dataset_and_column(tmp_path, lines, msg):
    from pipelines.wedlm.data import make_tasks

    (tmp_path / "train.jsonl").write_text(json.dumps(GOOD))
    (tmp_path / "test.jsonl").write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    raw = copy.deepcopy(_base_params())
    raw["data"].update(source="file", train_path=str(tmp_path / "train.jsonl"), test_path=str(tmp_path / "test.jsonl"))
    with pytest.raises(InputDataError, match=msg) as err:
        make_tasks(_params(raw))
    assert "\n" not in str(err.value) and "wedlm.test (" in str(err.value) and "test.jsonl" in str(err.value)


def test_missing_input_file_is_one_line(tmp_path):
    from pipelines.wedlm.data import make_tasks

    raw = copy.deepcopy(_base_params())
    raw["data"].update(source="file", train_path=str(tmp_path / "no.jsonl"), test_path=str(tmp_path / "no.jsonl"))
    with pytest.raises(InputDataError, match=r"wedlm\.data\.test_path .*no\.jsonl.*file not found"):
        make_tasks(_params(raw))


def _reference_training(p, chain, seed, objective, train_rows=None):
    """The training loop written out by hand (as it was before core.training.fit): AdamW, one-cycle
    with 10 % warm-up, clipping; synthetic batches and block offsets from default_rng([seed, 2]), the
    dual-stream masks (and file rows) from a torch generator seeded with the model seed."""
    from pipelines.core.runtime import seed_everything
    from pipelines.wedlm.data import training_batch, vocab_of
    from pipelines.wedlm.model import ar_loss_from_logits, build_model, dual_stream_batch, wedlm_loss

    t, v = p.train, vocab_of(p)
    gen = seed_everything(seed)
    rng = np.random.default_rng([seed, 2])
    model = build_model(p, v.size)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=t.lr, total_steps=t.steps, pct_start=0.1)
    losses = []
    model.train()
    for _ in range(t.steps):
        if train_rows is None:
            x = training_batch(list(p.data.regimes), t.batch_size, rng, p, chain, v)
        else:
            x = train_rows[torch.randint(0, len(train_rows), (t.batch_size,), generator=gen)]
        left = torch.arange(x.shape[1])[None, :] < p.data.prompt_len
        ar_mask = ~(left & (x == v.pad))
        if objective == "wedlm":
            off = int(rng.integers(0, t.block_size))
            b = dual_stream_batch(x, p.data.prompt_len, t.block_size, off, t.gamma_min, v.mask, gen)
            loss, _ = wedlm_loss(model, b, x, ar_mask, t.ar_weight)
        else:
            logits, _ = model(x, torch.arange(x.shape[1]).expand_as(x))
            loss = ar_loss_from_logits(logits, x, ar_mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return model.state_dict(), losses


@pytest.mark.parametrize("objective", ["wedlm", "ar"])
@pytest.mark.parametrize("source", ["synthetic", "rows"])
def test_training_through_core_fit_equals_the_hand_written_loop(objective, source):
    """Same seeds, same RNG streams, same optimiser and schedule: the weights after training agree."""
    from pipelines.wedlm.data import make_tasks
    from pipelines.wedlm.train import train_one

    p = _params(_tiny_raw())
    _, tasks = make_tasks(p)
    chain = tasks["chain"].numpy()
    rows = None
    if source == "rows":
        g = torch.Generator().manual_seed(9)
        rows = torch.randint(0, 32, (10, p.data.seq_len), generator=g)
    ref, ref_losses = _reference_training(p, chain, 3, objective, rows)
    from pipelines.core.runtime import seed_everything

    seed_everything(3)
    sd, hist = train_one(p, chain, 3, objective, torch.device("cpu"), rows, desc="t")
    assert [h["step"] for h in hist] == [0, p.train.steps - 1]
    np.testing.assert_allclose([h["loss"] for h in hist], [ref_losses[0], ref_losses[-1]], rtol=1e-6)
    for k in ref:
        # the same operations in the same order; float64 comparison with a float32 rounding margin
        np.testing.assert_allclose(sd[k].double().numpy(), ref[k].double().numpy(), rtol=1e-5, atol=1e-6)


def test_one_train_node_trains_every_model_and_times_the_decoders_side_by_side():
    from pipelines.core.registry import load_pipeline, method_config
    from pipelines.wedlm.params import trained_variants

    pipe = load_pipeline("wedlm")
    p = _params(method_config("wedlm"))
    assert trained_variants(p) == ["wedlm", "ar_only"]  # conf/base trains the AR-only baseline too
    assert {n.name for n in pipe.only_nodes_with_tags("train").nodes} == {"wedlm.train.wedlm"}
    assert {n.name for n in pipe.nodes} == {
        "wedlm.data.tasks",
        "wedlm.train.wedlm",
        "wedlm.evaluate.plots",
        "wedlm.evaluate.report",
    }
    assert trained_variants(
        _params({**method_config("wedlm"), "train": {**method_config("wedlm")["train"], "ar_only_seeds": []}})
    ) == ["wedlm"]


def test_variant_node_trains_decodes_and_timing_is_interleaved():
    """train.<variant> returns per-seed weights, the fit log and the decodes; evaluate.timing times every
    main decoder on the same prompt groups, round by round; the ratios carry an interval around them."""
    from pipelines.wedlm.data import make_tasks
    from pipelines.wedlm.evaluate import _speed_ratios, measure_speed
    from pipelines.wedlm.train import train_model as train_variant

    p = _params(_tiny_raw(ar_only_seeds=[0]))
    test, tasks = make_tasks(p)
    models, log, dec, traces = train_variant(tasks, test, p, variant="wedlm")
    assert set(models) == {"seed0"} and set(log.model) == {"wedlm"} and log.step.max() == p.train.steps - 1
    assert {"ar", "wedlm", "wedlm_fast", "blockwise"} <= set(dec.variant)
    assert set(traces) == set(p.data.regimes)
    ar_models, _, ar_dec, _ = train_variant(tasks, test, p, variant="ar_only")
    assert set(ar_dec.variant) == {"ar_only"} and (ar_dec.forwards == ar_dec.n_gen).all()
    # deterministic given the seeds: a second run gives the same weights and decodes
    again, _, dec2, _ = train_variant(tasks, test, p, variant="wedlm")
    assert all(torch.equal(again["seed0"][k], models["seed0"][k]) for k in models["seed0"])
    assert dec2.tokens.map(list).tolist() == dec.tokens.map(list).tolist()

    timing = measure_speed(p, test, wedlm=models, ar_only=ar_models)
    assert set(timing.variant) == {"ar", "wedlm", "wedlm_fast", "blockwise", "ar_only"}
    assert len(timing) == 5 * len(p.data.regimes) * p.eval.timing_rounds
    assert (timing.seconds > 0).all()
    # every decoder decoded the same group in a round; the batch-1 token counts equal the batched decodes
    assert timing.groupby(["regime", "round"]).group.nunique().eq(1).all()
    for (variant, regime), t in timing.groupby(["variant", "regime"]):
        d = dec if variant != "ar_only" else ar_dec
        ref = d[(d.variant == variant) & (d.regime == regime) & (d.kind == "main")].sort_values("item")
        assert t.tokens.sum() == ref.n_gen.iloc[: p.eval.n_timing].sum()
    m = _speed_ratios(timing, list(p.data.regimes))
    for r in p.data.regimes:
        for pair in ("wedlm_vs_ar", "wedlm_fast_vs_ar", "blockwise_vs_ar", "wedlm_fast_vs_blockwise"):
            key = f"ratio.tokens_per_sec_{r}.{pair}"
            assert m[f"{key}.ci_low"] <= m[key] <= m[f"{key}.ci_high"]
    # the interval is ratio_ci's over the paired (seed, round) ratios
    from pipelines.core.metrics import ratio_ci

    t = timing[timing.regime == "count"].assign(tps=lambda d: d.tokens / d.seconds)
    a = t[t.variant == "wedlm"].sort_values(["seed", "round"]).tps.to_numpy()
    b = t[t.variant == "ar"].sort_values(["seed", "round"]).tps.to_numpy()
    est = ratio_ci(a, b)
    assert m["ratio.tokens_per_sec_count.wedlm_vs_ar"] == pytest.approx(est.ratio)
    assert m["ratio.tokens_per_sec_count.wedlm_vs_ar.ci_high"] == pytest.approx(est.ci_high)


def test_own_data_builds_no_synthetic_chain(tmp_path, monkeypatch):
    """`source: file` (the --env=full default) reads the user's rows and builds no Markov chain: at
    n_symbols = 32,000 that chain alone is 8 GB, and the run was killed at 23.8 GB before reading the
    files. Training and decoding run without it (markov rows have no true NLL)."""
    import tracemalloc

    import pipelines.wedlm.data as data
    from pipelines.wedlm.train import train_model

    def no_chain(*a, **k):
        raise AssertionError("own-data run built the synthetic Markov chain")

    monkeypatch.setattr(data, "markov_chain", no_chain)
    raw = _tiny_raw()
    rows = [
        {"regime": "count", "prompt": [1, 2, 3], "answer": list(range(4, 16))},
        {"regime": "markov", "prompt": [5, 6], "answer": list(range(12))},
        {"regime": "reverse", "prompt": list(range(10)), "answer": list(range(9, -1, -1))},
    ]
    for name in ("train", "test"):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    raw["data"].update(source="file", train_path=str(tmp_path / "train.jsonl"), test_path=str(tmp_path / "test.jsonl"))
    big = copy.deepcopy(raw)
    big["data"]["n_symbols"] = 32000
    tracemalloc.start()
    try:
        test, tasks = data.make_tasks(_params(big))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "chain" not in tasks and len(test) == 3
    assert peak < 50e6, f"own-data make_tasks allocated {peak / 1e6:.0f} MB"
    p = _params(raw)
    test, tasks = data.make_tasks(p)
    _, log, dec, _ = train_model(tasks, test, p, "wedlm")
    assert len(log) and dec[dec.regime == "markov"]["nll"].isna().all()
    assert dec[dec.regime != "markov"]["nll"].isna().all()
