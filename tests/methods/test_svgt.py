"""Tests of `svgt`: the splice, the value correction and the bridge's gradient path against independent
references (the backbone's own forward, core's KV-cached decoder, a closed form, finite differences),
then data splits and bad input (the end-to-end --env=test run is covered for every pipeline by
tests/methods/test_all_pipelines.py)."""

import copy

import pandas as pd
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.svgt import model as M
from pipelines.svgt.params import Params

RAW = {
    "seeds": [0],
    "threads": 1,
    "variants": ["svgt", "svgt_dz0", "no_intervention"],
    "data": {"n_topics": 4, "n_verbs": 5, "n_targets": 4, "n_new_verbs": 2, "n_pretrain": 200, "benign_repeats": 1},
    "backbone": {"d_model": 32, "n_layers": 4, "n_heads": 4, "steps": 5},
    "value": {"value_dim": 8, "steps": 5},
    "bridge": {"k": 3, "steps": 5},
}


@pytest.fixture(scope="module")
def world():
    from pipelines.svgt.data import make_corpus
    from pipelines.svgt.train import World, layout

    torch.manual_seed(0)
    p = Params.model_validate(RAW)
    corpus = make_corpus(p)
    vocab = M.vocab_of(pd.concat([corpus["prompt"], corpus["response"]]))
    tok = M.make_tokenizer(vocab)
    m, r = layout(corpus, tok)
    bb = M.make_backbone(len(tok), p.backbone, m + r + p.bridge.k + 8)
    with torch.no_grad():  # make the random backbone less uniform than its 0.02-std init
        for q in bb.parameters():
            q.mul_(20.0 if q.dim() > 1 else 1.0)
    saved = {"state": bb.state_dict(), "vocab": vocab, "m": m, "r": r}
    return p, World(corpus, saved, p)


def _svgt(p, w, use_dz=True, seed=0):
    torch.manual_seed(seed)
    vm = M.ValueModel(p.backbone.d_model, p.value).eval()
    gen = M.BridgeGenerator(p.backbone.d_model, p.value.value_dim, p.bridge.k, p.bridge.n_heads, p.bridge.gate_init)
    return M.SVGTSteer(vm, gen, use_dz=use_dz)


# ------------------------------------------------------------------ the value path off = the backbone
def test_no_bridge_and_zero_vector_leave_the_backbone_unchanged(world):
    """Splitting the backbone at layer l with nothing spliced (K = 0) or a zero steering vector gives the
    backbone's own forward (independent: TinyTransformer.forward with the same mask)."""
    p, w = world
    b = w.batch(w.split("eval_benign"))
    with torch.no_grad():
        ref = w.bb(b.ids, attn_mask=M.attn_mask(b.valid))[:, b.m - 1 : -1]
        for iv in (M.NoIntervention(), M.AddVector(torch.randn(p.backbone.d_model), 0.0)):
            got = M.steered_logits(w.bb, b, w.layer, iv)[0]
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_greedy_without_intervention_matches_cached_generate(world):
    """The no-cache recompute decoder equals core's KV-cached greedy `generate` on unpadded prompts."""
    from pipelines.core.seqmodels import generate

    p, w = world
    df = w.split("eval_harm_id")
    df = df[df["wrapper"] == "roleplay"].head(4)
    b = w.batch(df, with_response=False)
    lens = b.valid[:, : b.m].sum(1)
    assert bool((lens == lens[0]).all())
    n = int(lens[0])
    prompt = b.ids[:, b.m - n : b.m]
    ref = generate(w.bb, prompt, 4, temperature=0, eos_id=w.tok.eos_id)[:, n:]
    got = M.greedy(w.bb, b, w.layer, M.NoIntervention(), 4, w.tok.eos_id)
    assert torch.equal(got[:, : ref.shape[1]], ref)


def test_left_padding_changes_nothing(world):
    """RoPE is relative and pads are masked, so the prompt's left-pad width does not change any output."""
    p, w = world
    df = w.split("eval_benign").head(6)
    iv = _svgt(p, w)
    b1 = w.batch(df)
    b2 = M.encode(w.tok, df["prompt"].tolist(), df["response"].tolist(), df["sys"].to_numpy(), w.m + 3, w.r)
    with torch.no_grad():
        l1 = M.steered_logits(w.bb, b1, w.layer, iv)[0]
        l2 = M.steered_logits(w.bb, b2, w.layer, iv)[0]
    torch.testing.assert_close(l1, l2, rtol=1e-4, atol=1e-4)


def test_response_logits_start_at_m_plus_k_minus_1(world):
    """The first response token is predicted by the last bridge token: equal to the upper blocks run on
    [prompt | bridge] alone (the response truncated away)."""
    p, w = world
    df = w.split("eval_harm_ood").head(5)
    iv = _svgt(p, w)
    b = w.batch(df)
    with torch.no_grad():
        logits, _, _, bridge, k = M.steered_logits(w.bb, b, w.layer, iv)
        x = M.run_lower(w.bb, b.ids[:, : b.m], b.valid[:, : b.m], w.layer)
        x2, v2 = M.splice(x, b.valid[:, : b.m], b.m, bridge)
        ref = M.run_upper(w.bb, x2, v2, w.layer)[0][:, -1]
    assert k == p.bridge.k
    torch.testing.assert_close(logits[:, 0], ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the value correction
def test_correction_reaches_the_boundary_of_a_linear_discriminator(world):
    """For s(z) = w·z + c the correction is dz = −relu(s)·w/‖w‖² (closed form), so s(z + dz) = min(s, 0)."""
    p, w = world
    iv = _svgt(p, w)
    vm = iv.vm
    lin = torch.nn.Linear(p.value.value_dim, 1)
    with torch.no_grad():
        lin.bias.fill_(0.3)
    vm.disc.net = lin
    h = torch.randn(64, p.backbone.d_model) * 3
    z, s, dz = M.value_correction(vm, h)
    wv = lin.weight[0].detach()
    ref = -torch.relu(s)[:, None] * wv / (wv @ wv)
    torch.testing.assert_close(dz, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vm.disc(z + dz), torch.clamp(s, max=0), rtol=1e-4, atol=1e-5)
    assert (s > 0).any() and (s <= 0).any()


def test_dz_is_zero_when_the_prompt_is_scored_safe(world):
    """s(z) ≤ 0 everywhere → dz = 0 → SVGT's bridge equals its dz = 0 ablation's."""
    p, w = world
    a = _svgt(p, w, use_dz=True)
    with torch.no_grad():
        a.vm.disc.net[-1].bias.fill_(-1e3)
    b = copy.deepcopy(a)
    b.use_dz = False
    h = torch.randn(16, p.backbone.d_model)
    with torch.no_grad():
        assert torch.equal(a.bridge(h), b.bridge(h))
    assert float(a.last["dz_norm"].abs().max()) == 0.0


# ------------------------------------------------------------------ gradients stay in the bridge
def test_bridge_gradients_never_reach_frozen_weights(world):
    """A stage-3 loss backpropagates into the bridge generator only; after a training run the backbone and
    the value model are bit-for-bit unchanged."""
    from pipelines.core.training import fit
    from pipelines.svgt.train import _sampler, _stage3_loss

    p, w = world
    iv = _svgt(p, w)
    b = w.batch(w.split("bridge"))
    loss_fn = _stage3_loss(w, b, p, iv.vm, True)
    loss, _ = loss_fn(iv, torch.arange(8))
    loss.backward()
    assert all(q.grad is None for q in w.bb.parameters())
    assert all(q.grad is None for q in iv.vm.parameters())
    gen_grads = [q.grad for q in iv.gen.parameters()]
    assert all(g is not None for g in gen_grads) and sum(float(g.abs().sum()) for g in gen_grads) > 0
    bb0 = copy.deepcopy(w.bb.state_dict())
    vm0 = copy.deepcopy(iv.vm.state_dict())
    gen0 = copy.deepcopy(iv.gen.state_dict())
    fit(iv, None, loss_fn, steps=3, sample_batch=_sampler(len(b), 8), lr=1e-2, seed=0, progress=False)
    assert all(torch.equal(v, w.bb.state_dict()[k]) for k, v in bb0.items())
    assert all(torch.equal(v, iv.vm.state_dict()[k]) for k, v in vm0.items())
    assert any(not torch.equal(v, iv.gen.state_dict()[k]) for k, v in gen0.items())


def test_bridge_gradient_matches_finite_differences(world):
    """The CE gradient with respect to the bridge's gate, through the splice and the frozen upper blocks,
    agrees with central finite differences (float64)."""
    p, w = world
    iv = _svgt(p, w)
    bb = copy.deepcopy(w.bb).double()
    iv = iv.double()
    b = w.batch(w.split("bridge").head(4))

    def ce(gate):
        iv.gen.gate.data = gate
        logits = M.steered_logits(bb, b, w.layer, iv)[0]
        return M.response_nll(logits, b).mean()

    g0 = torch.tensor(-0.5, dtype=torch.float64, requires_grad=True)
    iv.gen.gate = torch.nn.Parameter(g0.detach().clone())
    loss = M.response_nll(M.steered_logits(bb, b, w.layer, iv)[0], b).mean()
    (grad,) = torch.autograd.grad(loss, iv.gen.gate)
    eps = 1e-5
    with torch.no_grad():
        fd = (ce(torch.tensor(-0.5 + eps, dtype=torch.float64)) - ce(torch.tensor(-0.5 - eps, dtype=torch.float64))) / (
            2 * eps
        )
    assert abs(float(grad) - float(fd)) <= 1e-6 + 1e-4 * abs(float(fd))
    assert abs(float(fd)) > 1e-8


# ------------------------------------------------------------------ data, pipeline, bad input
def test_held_out_verbs_and_wrappers_stay_out_of_value_and_bridge_training(world):
    p, w = world
    c = w.corpus
    train = c[c["split"].isin(["value", "bridge"])]
    new_verbs = {r.split("_")[0] for r in c[c["split"] == "eval_harm_newverb"]["request"]}
    assert new_verbs and not ({r.split("_")[0] for r in train["request"]} & new_verbs)
    assert not (set(train["wrapper"]) & set(p.data.ood_wrappers))
    ev = set(c[c["split"] == "eval_harm_id"]["request"])
    assert ev and not (ev & set(train["request"]))
    look = set(c[c["split"] == "eval_lookalike"]["request"])  # benign look-alikes: evaluation only
    assert look and not (look & set(train["request"]))


def test_shared_training_steps_and_one_row_variant_per_steering_coefficient():
    from pipelines.core.registry import load_pipeline
    from pipelines.core.spec import load_spec

    names = {n.name for n in load_pipeline("svgt").only_nodes_with_tags("train").nodes}
    assert {"svgt.train.backbone", "svgt.train.value"} <= names
    p = Params.model_validate({**RAW, "variants": ["svgt", "caa", "iti", "no_intervention"]})
    reported = set(load_spec("svgt").reports(p))
    assert {f"caa_c{c:g}" for c in p.steering.caa_coefs} <= reported
    assert {f"iti_c{c:g}" for c in p.steering.iti_alphas} <= reported
    assert "caa" not in reported and "svgt" in reported


@pytest.mark.parametrize(
    "patch, key",
    [
        ({"bridge": {"k": 0}}, r"svgt\.bridge\.k"),
        ({"value": {"lr_stage1": -1.0}}, r"svgt\.value\.lr_stage1"),
        ({"bridge": {"lambda_ce": True}}, r"svgt\.bridge\.lambda_ce"),
        ({"variants": ["svgt", "caa_typo", "no_intervention"]}, r"svgt\.variants"),
        ({"data": {"ood_wrappers": ["klingon"]}}, r"svgt\.data\.ood_wrappers"),
        ({"value": {"extract_layer": 3}}, r"extract_layer"),
    ],
)
def test_bad_parameter_names_the_key(patch, key):
    raw = copy.deepcopy(RAW)
    for k, v in patch.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) else v
    with pytest.raises(ParameterError, match=key):
        validate(Params, raw, "svgt")


def test_bad_user_corpus_names_dataset_and_column(world):
    from pipelines.svgt.data import check_corpus

    p, w = world
    with pytest.raises(InputDataError, match=r"svgt\.corpus.*'harmful_response'"):
        check_corpus(w.corpus.drop(columns=["harmful_response"]))
    with pytest.raises(InputDataError, match=r"svgt\.corpus.*'sys'"):
        check_corpus(w.corpus.assign(sys="yes"))
    with pytest.raises(InputDataError, match=r"svgt\.corpus.*'split'"):
        check_corpus(w.corpus.assign(split="train"))


def test_user_corpus_is_loaded_and_checked(world, tmp_path):
    from pipelines.svgt.data import make_corpus

    p, w = world
    path = tmp_path / "corpus.parquet"
    w.corpus.to_parquet(path)
    raw = copy.deepcopy(RAW)
    raw["data"] = {**raw["data"], "user_path": str(path)}
    got = make_corpus(Params.model_validate(raw))
    pd.testing.assert_frame_equal(got, w.corpus)
    w.corpus.drop(columns=["request"]).to_parquet(path)
    with pytest.raises(InputDataError, match=r"svgt\.corpus.*'request'"):
        make_corpus(Params.model_validate(raw))
