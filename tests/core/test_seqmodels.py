"""core.seqmodels against independent references: RoPE's relative-position identity, cached decode vs the
full forward, the SSM scan vs its quadratic (semiseparable-matrix) form, sampling paths that must agree."""

import math

import pytest
import torch

from pipelines.core.seqmodels import (
    KVCache,
    SelectiveSSMLM,
    SSMConfig,
    TinyConfig,
    TinyTransformer,
    Tokenizer,
    generate,
    rope,
    sequence_logprobs,
)


def test_tokenizer_round_trip_batch_and_unknown_symbol():
    tok = Tokenizer.from_texts(["abc cab", "bca"], level="char")
    assert tok.decode(tok.encode("cab ba", bos=True, eos=True)) == "cab ba"
    words = Tokenizer.from_texts(["the cat sat", "a cat"], level="word")
    assert words.decode(words.encode("a cat sat")) == "a cat sat" and len(words) == 3 + 4
    ids, mask = words.batch(["a cat", "the cat sat"])
    assert ids.shape == (2, 5) and mask.sum().item() == 4 + 5 and ids[0, -1].item() == words.pad_id
    with pytest.raises(ValueError, match="'dog' is not in the tokenizer's vocabulary"):
        words.encode("a dog")


def test_rope_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 8, generator=g), torch.randn(1, 8, generator=g)

    def score(m, n):
        return (rope(q, torch.tensor([m])) @ rope(k, torch.tensor([n])).T).item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5) == pytest.approx(score(53, 51), abs=1e-5)
    assert score(0, 0) == pytest.approx((q @ k.T).item(), abs=1e-6)  # position 0: identity
    assert rope(q, torch.tensor([7])).norm().item() == pytest.approx(q.norm().item(), rel=1e-6)  # a rotation


def _tiny(causal=True, seed=0):
    torch.manual_seed(seed)
    return TinyTransformer(
        TinyConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, max_len=32, causal=causal)
    ).eval()


def test_cached_decode_equals_full_forward_and_eviction_keeps_positions():
    m = _tiny()
    ids = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(ids)
        cache = KVCache()
        step = [m(ids[:, :4], cache=cache)]
        step += [m(ids[:, t : t + 1], cache=cache) for t in range(4, 9)]
    assert torch.allclose(torch.cat(step, 1), full, atol=1e-5)
    assert len(cache) == 9 and cache.next_position == 9
    assert cache.nbytes() == 2 * 2 * (2 * 2 * 9 * 8) * 4  # layers·(k,v)·B·H·T·dh·fp32
    # keeping every entry changes nothing; dropping one changes the next token's logits; positions survive
    with torch.no_grad():
        nxt = torch.tensor([[3], [4]])
        ref = m(torch.cat([ids, nxt], 1))[:, -1]
        c2 = KVCache()
        m(ids, cache=c2)
        c2.keep(torch.arange(9))
        assert torch.allclose(m(nxt, cache=c2)[:, -1], ref, atol=1e-5)
        c3 = KVCache()
        m(ids, cache=c3)
        c3.keep(torch.tensor([0, 1, 2, 5, 6, 7, 8]))
        out = m(nxt, cache=c3)[:, -1]
        assert c3.positions.tolist() == [0, 1, 2, 5, 6, 7, 8, 9] and not torch.allclose(out, ref, atol=1e-4)
        # the same as full attention with the evicted keys masked out
        mask = torch.ones(10, 10, dtype=torch.bool).tril()
        mask[9, 3:5] = False
        assert torch.allclose(out, m(torch.cat([ids, nxt], 1), attn_mask=mask)[:, -1], atol=1e-5)


def test_bidirectional_model_sees_the_future_and_max_len_is_enforced():
    m = _tiny(causal=False)
    ids = torch.randint(0, 11, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = m(ids), m(torch.cat([ids[:, :5], (ids[:, 5:] + 1) % 11], 1))
    assert not torch.allclose(a[:, 0], b[:, 0])  # position 0 sees position 5
    with torch.no_grad():
        c = _tiny()(ids), _tiny()(torch.cat([ids[:, :5], (ids[:, 5:] + 1) % 11], 1))
    assert torch.allclose(c[0][:, :5], c[1][:, :5], atol=1e-6)  # causal: it does not
    with pytest.raises(ValueError, match="exceeds max_len=32"):
        _tiny()(torch.zeros(1, 33, dtype=torch.long))


def _ssm(seed=0):
    torch.manual_seed(seed)
    return SelectiveSSMLM(SSMConfig(vocab_size=9, d_model=8, n_layers=2, d_state=4, n_heads=2, expand=2)).eval()


def test_ssm_scan_matches_its_semiseparable_matrix_form():
    layer = _ssm().layers[0]
    u = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y = layer(u)
        x, z, b, c, dt, decay = layer._split(u)
        # y_t = Σ_{s≤t} (Π_{r=s+1..t} a_r) Δ_s (C_t·B_s) x_s  — the quadratic form of the same recurrence
        logcum = torch.log(decay).cumsum(1)  # [B, T, H]
        T = u.shape[1]
        ref = torch.zeros_like(x)
        for t in range(T):
            for s in range(t + 1):
                a = torch.exp(logcum[:, t] - logcum[:, s])  # [B, H]
                cb = (c[:, t] * b[:, s]).sum(-1)  # [B, H]
                ref[:, t] += (a * dt[:, s] * cb)[..., None] * x[:, s]
        expected = layer._finish(ref, x, z)
    assert torch.allclose(y, expected, atol=1e-5)


def test_ssm_step_decode_equals_scan_and_state_mask_prunes_channels():
    m = _ssm()
    ids = torch.randint(0, 9, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = m(ids)
        states, steps = None, []
        for t in range(6):
            lg, states = m.step(ids[:, t], states)
            steps.append(lg)
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5)
    with torch.no_grad():
        for layer in m.layers:
            layer.state_mask[:, 1] = 0  # prune state channel 1
        pruned = m(ids)
        _, states = m.step(ids[:, 0], None)
    assert not torch.allclose(pruned, full) and states[0][..., 1].abs().max().item() == 0.0


@pytest.mark.parametrize("kind", ["transformer", "ssm"])
def test_greedy_generation_with_state_equals_recomputing_the_prefix(kind):
    m = _tiny() if kind == "transformer" else _ssm()

    class Plain(torch.nn.Module):  # no cache, no state
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(ids)

    prompt = torch.tensor([[1, 3, 4], [1, 5, 6]])
    fast = generate(m, prompt, 8, temperature=0)
    slow = generate(Plain(m), prompt, 8, temperature=0)
    assert fast.shape == (2, 11) and torch.equal(fast, slow)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(
        generate(m, prompt, 5, 1.0, top_k=3, generator=g1), generate(m, prompt, 5, 1.0, top_k=3, generator=g2)
    )


def test_generation_stops_at_eos_and_sequence_logprobs_match_a_manual_sum():
    m = _tiny()
    with torch.no_grad():
        first = m(torch.tensor([[1, 3]]))[:, -1].argmax(-1).item()
    out = generate(m, torch.tensor([[1, 3]]), 10, temperature=0, eos_id=first)
    assert out.tolist() == [[1, 3, first]]
    ids = torch.tensor([[1, 4, 2, 7]])
    mask = torch.tensor([[0, 0, 1, 1]])
    with torch.no_grad():
        lp = sequence_logprobs(m, ids, mask)
        probs = m(ids[:, :-1]).softmax(-1)
    manual = math.log(probs[0, 1, 2].item()) + math.log(probs[0, 2, 7].item())
    assert lp.sum().item() == pytest.approx(manual, abs=1e-5) and lp[0, 0].item() == 0.0


# ------------------------------------------------------------------------------------------ chunked SSD
def _mamba2(seed=0, scan="chunked", chunk=5):
    torch.manual_seed(seed)
    return SelectiveSSMLM(
        SSMConfig(
            vocab_size=9,
            d_model=8,
            n_layers=2,
            d_state=4,
            n_heads=4,
            n_groups=2,
            expand=2,
            d_conv=3,
            scan=scan,
            chunk_size=chunk,
        )
    ).eval()


def test_segsum_is_the_sum_between_positions():
    from pipelines.core.seqmodels import segsum

    a = torch.randn(2, 6, generator=torch.Generator().manual_seed(5))
    out = segsum(a)
    for i in range(6):
        for j in range(6):
            ref = a[:, j + 1 : i + 1].sum(-1) if i >= j else torch.full((2,), -math.inf)
            assert torch.allclose(out[:, i, j], ref, atol=1e-6) or (i < j and torch.isinf(out[:, i, j]).all())


@pytest.mark.parametrize("T", [1, 5, 12, 23])
def test_chunked_ssd_equals_the_sequential_scan_with_groups_and_conv(T):
    m = _mamba2()
    ids = torch.randint(0, 9, (3, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        fast, slow = m(ids), m(ids, scan="sequential")
        layer = m.layers[0]
        u = torch.randn(3, T, 8, generator=torch.Generator().manual_seed(1))
        h0 = torch.randn(3, 4, 4, 4, generator=torch.Generator().manual_seed(2))
        y1, s1 = layer(u, state=(h0, None), return_state=True, scan="chunked")
        y2, s2 = layer(u, state=(h0, None), return_state=True, scan="sequential")
    assert torch.allclose(fast, slow, atol=1e-5)
    assert torch.allclose(y1, y2, atol=1e-5) and torch.allclose(s1[0], s2[0], atol=1e-5)


def test_grouped_conv_model_step_decode_equals_forward_and_group_mask_prunes():
    m = _mamba2()
    ids = torch.randint(0, 9, (2, 9), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = m(ids)
        states, steps = None, []
        for t in range(9):
            lg, states = m.step(ids[:, t], states)
            steps.append(lg)
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5)
    layer = m.layers[0]
    assert layer.in_proj.out_features == 2 * 16 + 2 * 2 * 4 + 4 and layer.conv1d.weight.shape == (16 + 16, 1, 3)
    with torch.no_grad():  # causality of the conv: the future never leaks back
        other = m(torch.cat([ids[:, :5], (ids[:, 5:] + 1) % 9], 1))
    assert torch.allclose(other[:, :5], full[:, :5], atol=1e-6)


def test_bad_scan_and_groups_are_rejected():
    with pytest.raises(ValueError, match="n_groups"):
        SelectiveSSMLM(SSMConfig(vocab_size=5, d_model=8, n_heads=4, n_groups=3))
    with pytest.raises(ValueError, match="scan must be"):
        SelectiveSSMLM(SSMConfig(vocab_size=5, d_model=8, n_heads=4, scan="fast"))


def test_block_subclass_hook_and_cache_fork():
    from pipelines.core.seqmodels import Block

    seen = []

    class Recording(Block):
        def attend(self, q, k, v, mask):
            seen.append((self.layer_idx, k.shape[2]))
            return super().attend(q, k, v, mask)

    torch.manual_seed(0)
    c = TinyConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, max_len=32)
    plain, rec = TinyTransformer(c), None
    torch.manual_seed(0)
    rec = TinyTransformer(c, block_cls=Recording)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(plain(ids), rec(ids))  # same init, same function
        assert seen == [(0, 4), (1, 4)]
        prefix = KVCache()
        plain(ids, cache=prefix)
        a = plain(torch.tensor([[5]]), cache=prefix.fork())[:, -1]
        b = plain(torch.tensor([[5]]), cache=prefix.fork())[:, -1]  # the prefix is untouched by the first fork
    assert torch.allclose(a, b) and len(prefix) == 4 and prefix.next_position == 4


def test_init_std_sets_the_weight_scale_and_keeps_gpt2s_default():
    import torch

    from pipelines.core.seqmodels import TinyConfig, TinyTransformer

    torch.manual_seed(0)
    default = TinyTransformer(TinyConfig(vocab_size=50, d_model=64))
    torch.manual_seed(0)
    wide = TinyTransformer(TinyConfig(vocab_size=50, d_model=64, init_std=0.2))
    assert abs(float(default.blocks[0].qkv.weight.std()) - 0.02) < 0.002
    assert abs(float(wide.blocks[0].qkv.weight.std()) - 0.2) < 0.02
    # same seed, same draws: only the scale differs
    assert torch.allclose(default.blocks[0].qkv.weight * 10, wide.blocks[0].qkv.weight, rtol=1e-5)
