"""Tests of `kvindexer`: the streaming eviction against independent references (core's plain transformer
with a hand-built attention mask, a brute-force keep rule, numpy pooling), the limit cases of the issue
(budget = sequence length → every policy equals full attention; an empty memory reads out zero) and bad
input (the end-to-end --env=test run is covered by tests/methods/test_all_pipelines.py)."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.core.seqmodels import TinyConfig, TinyTransformer
from pipelines.kvindexer.data import Vocab, make_prompt
from pipelines.kvindexer.model import Indexer, KVTransformer, LatentMemory, Protocol, _pool, stream, teacher
from pipelines.kvindexer.params import Params

N, C_HUNK = 32, 8
PR = Protocol(chunk=C_HUNK, n_sink=2, recent=3, snap_window=4, snap_kernel=3)
V = Vocab(6, 12, 20)

RAW = {
    "seeds": [0],
    "data": {"context_len": 64, "n_keys": 8, "n_values": 16, "n_filler": 16, "n_train": 8, "n_eval": 4},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "steps": 2, "batch_size": 4, "lr": 1e-3},
    "protocol": {"chunk": 16, "n_sink": 2, "recent": 4, "budgets": [12, 16]},
    "indexer": {"heads": 2, "dim": 8, "steps": 2, "batch_size": 2, "lr": 1e-3},
    "memory": {"dim": 8, "steps": 2, "batch_size": 2, "lr": 1e-3, "beta": 1.0},
    "eval": {"tasks": ["niah_single"], "timing_rounds": 3, "timing_budget": 12},
    "variants": ["full_kv", "h2o", "indexer"],
}


def _model(seed=0, L=2):
    torch.manual_seed(seed)
    cfg = TinyConfig(vocab_size=V.size, d_model=32, n_layers=L, n_heads=4, max_len=64)
    m = KVTransformer(cfg)
    with torch.no_grad():  # sharper attention than the 0.02 init, so eviction matters
        for b in m.blocks:
            b.qkv.weight.normal_(0, 0.3)
    m.eval()
    plain = TinyTransformer(cfg)
    plain.load_state_dict(m.state_dict())
    plain.eval()
    return m, plain


def _batch(B=3, seed=0):
    rng = np.random.default_rng(seed)
    prs = [make_prompt("niah_single", rng, N, V) for _ in range(B)]
    ctx = torch.tensor([p["context"] for p in prs])
    tail = torch.tensor([p["question"] + p["answer"][:-1] for p in prs])
    return ctx, tail


def _parts(m):
    cfg = m.config
    ix = Indexer(cfg.n_layers, cfg.d_model, 2, 8)
    mem = LatentMemory(cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads, 8, gate_init=0.0)
    with torch.no_grad():
        mem.u.mul_(5.0)  # a memory that would visibly change the output if it read anything
    return ix, mem


@torch.no_grad()
@pytest.mark.parametrize(
    "policy", ["streamingllm", "h2o", "snapkv", "random", "oracle", "indexer", "indexer+memory", "h2o+memory"]
)
def test_budget_equal_to_sequence_length_is_full_attention(policy):
    m, plain = _model()
    ctx, tail = _batch()
    full_ids = torch.cat([ctx, tail], 1)
    ref = plain(full_ids)[:, N - C_HUNK :]  # core's transformer, no cache, SDPA
    ix, mem = _parts(m)
    fut, _ = teacher(m, full_ids, C_HUNK, N)
    base, _, with_mem = policy.partition("+")
    out = stream(
        m,
        ctx,
        tail,
        base,
        N,
        PR,
        indexer=ix,
        memory=mem if with_mem else None,
        future=fut,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(out.logits, ref, atol=1e-5, rtol=1e-5)
    assert all(p.shape[-1] == full_ids.shape[1] for p in out.positions)


@torch.no_grad()
def test_empty_memory_reads_out_exactly_zero():
    m, _ = _model()
    _, mem = _parts(m)
    st = mem.empty(2)
    q = torch.randn(2, 4, 5, 8)
    for layer in range(2):
        assert torch.equal(mem.readout(layer, q, st), torch.zeros_like(q))
    # nothing evicted (budget = N): the memory variant equals the plain variant bit for bit
    ctx, tail = _batch()
    ix, _ = _parts(m)
    a = stream(m, ctx, tail, "indexer", N, PR, indexer=ix, memory=mem)
    b = stream(m, ctx, tail, "indexer", N, PR, indexer=ix)
    assert torch.equal(a.logits, b.logits)
    assert all(float(x.abs().sum()) == 0.0 for x in a.mem_state.M)
    # ... and once something is evicted the readout is not zero (the memory is wired in)
    c = stream(m, ctx, tail, "indexer", 8, PR, indexer=ix, memory=mem)
    d = stream(m, ctx, tail, "indexer", 8, PR, indexer=ix)
    assert float(c.mem_state.z[0].sum()) > 0 and not torch.allclose(c.logits, d.logits, atol=1e-4)


def _keep_sets_bruteforce(scores: np.ndarray, budget: int, pr: Protocol, n_ctx: int) -> list[set]:
    """The keep rule, independently: after each non-final chunk, sinks and the `recent` newest are kept,
    the rest by descending score until `budget` entries remain. scores [n_chunks, P]. Returns the sets of
    positions cached when each chunk starts."""
    cached, out = [], []
    for ci in range(n_ctx // pr.chunk):
        out.append(set(cached))
        cached = cached + list(range(ci * pr.chunk, (ci + 1) * pr.chunk))
        if ci == n_ctx // pr.chunk - 1 or len(cached) <= budget:
            continue
        nxt = (ci + 1) * pr.chunk
        forced = [s for s in cached if s < pr.n_sink or s >= nxt - pr.recent]
        rest = sorted((s for s in cached if s not in forced), key=lambda s: -scores[ci, s])
        cached = sorted(forced + rest[: budget - len(forced)])
    return out


@torch.no_grad()
@pytest.mark.parametrize("per_head", [False, True])
def test_eviction_by_dropping_equals_eviction_by_masking(per_head):
    """Streaming prefill with physical eviction (cache entries dropped) == one full forward of core's
    plain transformer whose mask hides, from every query, the keys evicted before its chunk."""
    m, plain = _model(seed=1)
    ctx, tail = _batch(B=2, seed=3)
    B, H, budget = ctx.shape[0], 4, 11
    g = torch.Generator().manual_seed(7)
    scores = torch.rand(B, H if per_head else 1, N // C_HUNK, N + tail.shape[1], generator=g)

    def score_fn(layer, pos, ci):
        s = scores[:, :, ci].expand(B, H, -1)
        return s.gather(2, pos)

    out = stream(m, ctx, tail, "fixed", budget, PR, score_fn=score_fn)
    T = N + tail.shape[1]
    mask = torch.zeros(B, H, T, T, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            sets = _keep_sets_bruteforce(scores[b, h if per_head else 0].numpy(), budget, PR, N)
            for ci, kept in enumerate(sets):
                q_lo = ci * C_HUNK
                q_hi = (ci + 1) * C_HUNK if ci < len(sets) - 1 else T
                for qpos in range(q_lo, q_hi):
                    for k in list(kept) + list(range(q_lo, qpos + 1)):
                        mask[b, h, qpos, k] = True
    ref = plain(torch.cat([ctx, tail], 1), attn_mask=mask)[:, N - C_HUNK :]
    torch.testing.assert_close(out.logits, ref, atol=1e-5, rtol=1e-5)
    # the cache really holds `budget` entries per head before the last chunk: bytes = entries x layers x (k, v)
    n_last = C_HUNK + tail.shape[1]
    assert out.cache.nbytes() == (budget + n_last) * B * H * 8 * 2 * 2 * 4


def test_snapkv_pooling_matches_numpy():
    x = torch.rand(2, 3, 11)
    got = _pool(x, 5).numpy()
    xn = x.numpy()
    ref = np.zeros_like(xn)
    for t in range(11):
        lo, hi = max(0, t - 2), min(11, t + 3)
        ref[..., t] = xn[..., lo:hi].mean(-1)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


@torch.no_grad()
def test_teacher_future_mass_counts_future_queries():
    m, _ = _model()
    ctx, tail = _batch()
    fut, outs = teacher(m, torch.cat([ctx, tail], 1), C_HUNK, N)
    T = N + tail.shape[1]
    for ci, bnd in enumerate(range(C_HUNK, N, C_HUNK)):  # every query row sums to 1 per head
        torch.testing.assert_close(fut[:, ci].sum(-1), torch.full((3, 2), 4.0 * (T - bnd)))
    assert outs.shape == (3, 2, 4, T, 8)


def test_prompts_are_well_formed():
    rng = np.random.default_rng(0)
    for task in ("niah_single", "niah_multikey", "niah_multivalue", "vt"):
        for _ in range(20):
            pr = make_prompt(task, rng, N, V)
            ctx = pr["context"]
            assert len(ctx) == N and ctx[0] == 1 and 0 <= pr["depth"] <= 1
            assert len(set(pr["answer"])) == 4
            if task in ("niah_single", "niah_multikey"):
                s = pr["needle_pos"][0]
                assert ctx[s : s + 7] == [3, pr["question"][1], 4, *pr["answer"]]


def test_method_rules_name_the_key():
    with pytest.raises(ParameterError, match=r"kvindexer\.protocol"):
        validate(Params, {**RAW, "protocol": {**RAW["protocol"], "budgets": [4]}}, "kvindexer")
    with pytest.raises(ParameterError, match=r"even size"):
        validate(Params, {**RAW, "model": {**RAW["model"], "d_model": 36, "n_heads": 4}}, "kvindexer")
    with pytest.raises(ParameterError, match=r"chunk must divide"):
        validate(Params, {**RAW, "protocol": {**RAW["protocol"], "chunk": 24}}, "kvindexer")


def test_derived_gaps_are_per_seed_and_paired():
    """The gaps the claims read: best / worst policy chosen by its seed mean, then differences per seed;
    the two-budget minimum is the per-seed minimum; byte ratios are per seed."""
    from pipelines.core.spec import Results, SeedValues
    from pipelines.kvindexer.evaluate import derived

    p = validate(
        Params, {**RAW, "variants": ["full_kv", "streamingllm", "h2o", "snapkv", "oracle", "indexer"]}, "kvindexer"
    )
    em = {
        "full_kv": ([90, 80], [90, 80]),
        "streamingllm": ([10, 30], [20, 20]),
        "h2o": ([20, 10], [30, 40]),
        "snapkv": ([50, 70], [40, 60]),
        "oracle": ([70, 70], [80, 80]),
        "indexer": ([60, 50], [70, 80]),
    }
    tables = {}
    for v, (e12, e16) in em.items():
        r = Results(v)
        for s in (0, 1):
            r.add(
                s,
                em_niah_single_12=e12[s],
                em_niah_single_16=e16[s],
                total_bytes_12=100.0 * (s + 1),
                total_bytes_16=50.0 if v != "full_kv" else 200.0,
            )
        tables[v] = r.table()
    values = SeedValues(tables)
    out = {}
    for d in derived(p):
        out.update(d.compute(values, p, list(em), {}))
    # best of (h2o, streamingllm) at 12 by seed mean: streamingllm (20 vs 15)
    assert out["gap_indexer_vs_best_of_h2o_streamingllm_12"] == {0: 50, 1: 20}
    assert out["gap_oracle_minus_indexer_16"] == {0: 10, 1: 0}
    # best heuristic: snapkv at both budgets; per-seed min over (12, 16) of (indexer - snapkv)
    assert out["gap_indexer_vs_best_heuristic_12"] == {0: 10, 1: -20}
    assert out["gap_indexer_vs_best_heuristic_16"] == {0: 30, 1: 20}
    assert out["gap_indexer_vs_best_heuristic_min_12_16"] == {0: 10, 1: -20}
    # worst non-random at 16: streamingllm (mean 20)
    assert out["gap_full_minus_worst_nonrandom_16"] == {0: 70, 1: 60}
    assert out["kv_bytes_ratio_indexer_16"] == {0: 0.25, 1: 0.25}
    assert out["kv_bytes_ratio_full_kv_12"] == {0: 1.0, 1: 1.0}
    assert "decode_speedup_indexer_memory_12" not in out  # indexer_memory not planned


def test_prompt_table_round_trips_through_tensors():
    from pipelines.kvindexer.train import table_to_tensors, tensors_to_table

    df = pd.DataFrame(
        {
            "variant": ["h2o", "h2o"],
            "budget": [24, 32],
            "task": ["niah_single", "vt"],
            "depth": [0.1, 0.9],
            "correct": [1.0, 0.0],
            "needle_recall": np.float32([0.5, 1.0]),
        }
    )
    pd.testing.assert_frame_equal(tensors_to_table(table_to_tensors(df)), df)


def test_bad_user_file_names_dataset_and_column(tmp_path):
    from pipelines.kvindexer.data import load_user_prompts

    p = validate(Params, RAW, "kvindexer")
    rng = np.random.default_rng(0)
    v = Vocab(8, 16, 16)
    good = pd.DataFrame([{"task": "niah_single", **make_prompt("niah_single", rng, 64, v)} for _ in range(3)])
    path = tmp_path / "prompts.parquet"
    good.to_parquet(path)
    assert len(load_user_prompts(str(path), p)) == 3
    good.drop(columns=["answer"]).to_parquet(path)
    with pytest.raises(InputDataError, match=r"kvindexer\.user_prompts.*'answer'"):
        load_user_prompts(str(path), p)
    bad = copy.deepcopy(good)
    bad.at[0, "context"] = bad.at[0, "context"][:10]
    bad.to_parquet(path)
    with pytest.raises(InputDataError, match=r"kvindexer\.user_prompts.*'context'"):
        load_user_prompts(str(path), p)


def test_truncated_memory_training_reaches_every_memory_parameter():
    m, _ = _model()
    for q in m.parameters():
        q.requires_grad_(False)
    ctx, tail = _batch()
    ix, mem = _parts(m)
    out = stream(m, ctx, tail, "indexer", 8, PR, indexer=ix, memory=mem, keep_out=True)
    out.logits.square().mean().backward()
    for name, q in mem.named_parameters():
        assert q.grad is not None and float(q.grad.abs().sum()) > 0, name
    assert all(q.grad is None for q in ix.parameters())  # the indexer's choice is not differentiated


def test_multikey_needles_share_no_value_when_distinct():
    """``data.multikey_distinct_values``: no value token appears in two needles of one niah_multikey prompt
    or multi-needle training sequence (so each value has one successor in the context); without it the
    generator draws every needle on its own and collisions occur."""
    from pipelines.kvindexer.data import training_sequence

    v = Vocab(8, 16, 16)

    def shared(vals):
        flat = [x for vs in vals for x in vs]
        return len(flat) != len(set(flat))

    def needles(ctx):
        out, i = [], 0
        while i < len(ctx):
            if ctx[i] == 3:  # [KEY] k [VAL] v1..v4
                out.append(ctx[i + 3 : i + 7])
                i += 7
            else:
                i += 1
        return out

    rng = np.random.default_rng(0)
    prs = [make_prompt("niah_multikey", rng, 64, v, distinct=True) for _ in range(200)]
    assert not any(shared(needles(p["context"])) for p in prs)
    assert all(p["answer"] in needles(p["context"]) for p in prs)
    seqs = [training_sequence(rng, 64, v, True, distinct=True) for _ in range(200)]
    assert not any(shared(needles(s[:64])) for s in seqs)
    rng = np.random.default_rng(0)
    assert any(shared(needles(make_prompt("niah_multikey", rng, 64, v)["context"])) for _ in range(200))


def test_distinct_values_need_room_in_the_value_vocabulary():
    raw = copy.deepcopy(RAW)
    raw["data"].update(multikey_distinct_values=True, n_values=15)  # 4 needles x 4 values > 15
    with pytest.raises(ParameterError, match="multikey_distinct_values"):
        validate(Params, raw, "kvindexer")


def test_base_model_is_cached_by_the_params_that_determine_it(tmp_path, monkeypatch):
    """The first run trains and stores the base model under its key; a run with the same key loads it
    (training is not called) and gets the same weights; an eval-only key shares the entry, a training
    key does not."""
    import pipelines.kvindexer.train as T

    raw = copy.deepcopy(RAW)
    raw["model"]["cache_dir"] = str(tmp_path)
    p = validate(Params, raw, "kvindexer")
    first = T.train_base(p)
    files = list(tmp_path.glob("base_*.pt"))
    assert first["source"] == "trained" and [f.name for f in files] == [f"base_{T.base_cache_key(p)}.pt"]

    def no_training(*a, **k):
        raise AssertionError("the cached base model was retrained")

    monkeypatch.setattr(T, "fit", no_training)
    again = T.train_base(p)
    assert again["source"] == "cache" and again["history"] == first["history"]
    assert all(torch.equal(again["state_dict"][k], first["state_dict"][k]) for k in first["state_dict"])
    other_eval = copy.deepcopy(raw)
    other_eval["protocol"]["budgets"] = [12]
    other_eval["eval"]["tasks"] = ["niah_single", "niah_multikey"]
    assert T.base_cache_key(validate(Params, other_eval, "kvindexer")) == T.base_cache_key(p)
    for section, key, value in [
        ("model", "steps", 3),
        ("model", "lr", 2e-3),
        ("data", "n_filler", 17),
        ("data", "multikey_distinct_values", True),
    ]:
        changed = copy.deepcopy(raw)
        changed[section][key] = value
        assert T.base_cache_key(validate(Params, changed, "kvindexer")) != T.base_cache_key(p), key
    with pytest.raises(AssertionError, match="retrained"):
        changed = copy.deepcopy(raw)
        changed["model"]["steps"] = 3
        T.train_base(validate(Params, changed, "kvindexer"))
