"""Tests of `mesa`: the OT expert-capacity reallocation against POT and closed forms, the MoE routing
and the targeted-alignment masks against brute force, the corpus' structure, and bad input (the
end-to-end --env=test run is covered for every pipeline by tests/methods/test_all_pipelines.py)."""

import numpy as np
import pandas as pd
import pytest
import torch

from pipelines.core.params import ParameterError, validate
from pipelines.mesa.params import Params

RAW = {
    "seeds": [0],
    "threads": 1,
    "data": {"n_pretrain": 200, "n_align_harmful": 40, "n_replay": 40, "n_eval": 20},
    "model": {"d_model": 16, "n_heads": 2, "n_experts": 6, "top_k": 2, "d_expert": 8},
    "ot": {"n_sel": 3},
    "variants": ["base", "mesa", "head_sft"],
}


def _problem(seed, m=4, E=8):
    rng = np.random.default_rng(seed)
    a = rng.dirichlet(np.ones(m))
    b = rng.dirichlet(np.ones(E))
    return a, b, rng.random((m, E))


# ------------------------------------------------------------------------------------------ transport
def _reference_sinkhorn(
    a: np.ndarray,
    b: np.ndarray,
    C: np.ndarray,
    eps: float,
    tau: float | None = None,
    max_iter: int = 2000,
    tol: float = 1e-9,
    what: str = "ot",
) -> np.ndarray:
    """Independent reference (hand-written scaling iterations, not POT):
    argmin_P ⟨P, C⟩ + ε·KL(P ‖ a bᵀ) + τ·KL(Pᵀ1 ‖ b)  s.t.  P1 = a   (τ = None: also Pᵀ1 = b).

    Scaling form P = diag(u) K diag(v), K = a bᵀ ⊙ exp(−C/ε): the row update is the exact projection
    u = a / (K v); the column update is the proximal step of the KL marginal penalty,
    v = (b / (Kᵀ u))^(τ/(τ+ε)) (exponent 1 when balanced). Run on log-potentials, so small ε never
    underflows. Stops when the row marginal, after a column step, is within ``tol`` of a (the fixed point)."""
    from scipy.special import logsumexp

    a, b, C = (np.asarray(x, float) for x in (a, b, C))
    fi = 1.0 if tau is None else tau / (tau + eps)
    logK = np.log(a)[:, None] + np.log(b)[None, :] - C / eps
    la, lb = np.log(a), np.log(b)
    lu, lv = np.zeros(len(a)), np.zeros(len(b))
    for _ in range(max_iter):
        lu = la - logsumexp(logK + lv[None, :], axis=1)
        lv = fi * (lb - logsumexp(logK + lu[:, None], axis=0))
        # after the column step the rows drift from a; at the fixed point they do not
        if np.abs(np.exp(logsumexp(lu[:, None] + logK + lv[None, :], axis=1)) - a).max() < tol:
            break
    lu = la - logsumexp(logK + lv[None, :], axis=1)  # end on the exact row projection
    P = np.exp(lu[:, None] + logK + lv[None, :])
    if not np.isfinite(P).all():
        raise AssertionError(what)
    return P


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_plan_marginals_and_reference(seed):
    from pipelines.mesa.transport import sinkhorn_log

    a, b, C = _problem(seed)
    P = sinkhorn_log(a, b, C, eps=0.05, tau=None, max_iter=100000, tol=1e-13)
    np.testing.assert_allclose(P.sum(1), a, atol=1e-6)
    np.testing.assert_allclose(P.sum(0), b, atol=1e-6)
    np.testing.assert_allclose(P, _reference_sinkhorn(a, b, C, eps=0.05, tau=None, max_iter=5000, tol=1e-12), atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relaxed_plan_matches_the_reference_semi_relaxed_solver(seed):
    """Hard row marginal, KL-relaxed expert marginal: POT's generalised Sinkhorn with reg_m = (inf, τ)
    against the hand-written proximal scaling iterations."""
    from pipelines.mesa.transport import sinkhorn_log

    a, b, C = _problem(seed)
    P = sinkhorn_log(a, b, C, eps=0.05, tau=0.1, max_iter=100000, tol=1e-14)
    np.testing.assert_allclose(P.sum(1), a, atol=1e-6)
    np.testing.assert_allclose(P, _reference_sinkhorn(a, b, C, eps=0.05, tau=0.1, max_iter=5000, tol=1e-13), atol=1e-7)
    assert not np.allclose(P.sum(0), b, atol=1e-3)  # the expert marginal moved: it can rank experts


@pytest.mark.parametrize("tau", [None, 0.1, 5.0])
def test_uniform_cost_gives_independent_coupling(tau):
    from pipelines.mesa.transport import sinkhorn_log

    a, b, _ = _problem(3)
    P = sinkhorn_log(a, b, np.full((len(a), len(b)), 0.7), eps=0.05, tau=tau)
    np.testing.assert_allclose(P, np.outer(a, b), atol=1e-10)


def test_a_plan_that_misses_the_duty_marginal_is_refused():
    from pipelines.mesa.transport import TransportError, sinkhorn_log

    a, b, C = _problem(4)
    with pytest.raises(TransportError, match="duty marginal is off"):
        sinkhorn_log(a, b, C, eps=1e-3, tau=0.1, max_iter=3, what="layer 0")


def test_large_tau_tends_to_balanced_and_small_eps_stays_finite():
    from pipelines.mesa.transport import sinkhorn_log

    a, b, C = _problem(4)
    bal = sinkhorn_log(a, b, C, eps=0.05, tau=None, max_iter=5000, tol=1e-12)
    far = sinkhorn_log(a, b, C, eps=0.05, tau=1e5, max_iter=20000, tol=1e-12)
    np.testing.assert_allclose(far, bal, atol=1e-4)
    tiny = sinkhorn_log(a, b, C, eps=1e-3, tau=0.1, max_iter=5000)  # exp(-C/ε) ~ e^-1000: log domain
    assert np.isfinite(tiny).all()
    np.testing.assert_allclose(tiny.sum(1), a, atol=1e-6)
    np.testing.assert_allclose(tiny, _reference_sinkhorn(a, b, C, eps=1e-3, tau=0.1), atol=1e-7)


def _relaxed_objective(P, a, b, C, eps, tau):
    """⟨P, C⟩ + ε·KL(P ‖ a bᵀ) + τ·KL(Pᵀ1 ‖ b), generalised KL (Σ p log(p/q) − p + q)."""

    def kl(p, q):
        return float(np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0) / q), 0.0) - p + q))

    return float((P * C).sum()) + eps * kl(P, np.outer(a, b)) + tau * kl(P.sum(0), b)


def _kkt_spread(P, a, b, C, eps, tau):
    """Optimality certificate independent of any solver: on {P ≥ 0 : P1 = a} the objective is strictly
    convex, and P is its minimiser iff the gradient C + ε·log(P / a bᵀ) + τ·log(Pᵀ1 / b) is constant
    along each row (the row's Lagrange multiplier). Returns the largest within-row spread of that
    gradient, over entries that did not underflow."""
    with np.errstate(divide="ignore"):
        G = C + eps * np.log(P / np.outer(a, b)) + tau * np.log(P.sum(0) / b)[None, :]
    G = np.where(P > 1e-280, G, np.nan)
    return float(np.nanmax(np.nanmax(G, 1) - np.nanmin(G, 1)))


def test_small_eps_relaxed_plan_is_the_converged_minimiser():
    """Review finding: at ε = 1e-3 (τ = 0.1, 5 duties × 6 experts, uniform b) POT's translation-invariant
    iterations stopped on a scale-relative criterion, ~0.02 per entry from the minimiser and the same plan
    for any max_iter, while meeting the hard duty marginal. The plan must be the minimiser: equal to a
    log-domain Sinkhorn iterated to a 1e-13 fixed-point residual, with the minimal objective and a
    vanishing KKT spread."""
    from pipelines.mesa.transport import sinkhorn_log

    rng = np.random.default_rng(0)
    a, b = rng.dirichlet(np.ones(5)), np.full(6, 1 / 6)
    C = rng.random((5, 6))
    C = (C - C.min()) / (C.max() - C.min())  # as cost_matrix: rescaled to [0, 1]
    eps, tau = 1e-3, 0.1
    ref = _reference_sinkhorn(a, b, C, eps=eps, tau=tau, max_iter=200000, tol=1e-13)
    assert _kkt_spread(ref, a, b, C, eps, tau) < 1e-9  # the reference is the minimiser
    P = sinkhorn_log(a, b, C, eps=eps, tau=tau, max_iter=20000, tol=1e-12)
    np.testing.assert_allclose(P.sum(1), a, atol=1e-9)
    np.testing.assert_allclose(P, ref, atol=1e-8)
    assert _relaxed_objective(P, a, b, C, eps, tau) <= _relaxed_objective(ref, a, b, C, eps, tau) + 1e-10
    assert _kkt_spread(P, a, b, C, eps, tau) < 1e-7
    # more iterations than it needs change nothing: it stopped because it converged
    np.testing.assert_allclose(sinkhorn_log(a, b, C, eps=eps, tau=tau, max_iter=100000, tol=1e-12), P, atol=1e-10)


@pytest.mark.parametrize("tau, max_iter", [(0.1, 1500), (None, 200)])
def test_unconverged_plan_warns_naming_eps(tau, max_iter):
    """Stopping on max_iter short of the fixed-point tolerance (too few iterations at ε = 1e-3, yet a duty
    marginal within the 1e-6 hard check: relaxed 1e-8, balanced exact with the expert marginal off by
    3e-2) is not silent: a warning names ε, τ and the instance."""
    from pipelines.mesa.transport import sinkhorn_log

    a, b, C = _problem(4)
    with pytest.warns(RuntimeWarning, match=r"eps=0\.001.*layer 1"):
        P = sinkhorn_log(a, b, C, eps=1e-3, tau=tau, max_iter=max_iter, tol=1e-9, what="layer 1")
    np.testing.assert_allclose(P.sum(1), a, atol=1e-6)


def test_cost_matrix_terms_and_selection_rules():
    from pipelines.mesa.transport import cost_matrix, select

    f_u = np.array([0.5, 0.25, 0.25, 0.0])
    A = np.array([[0.4, 0.4, 0.2, 0.0], [0.0, 0.2, 0.4, 0.4]])
    head = np.array([True, False, False, False])
    C = cost_matrix(f_u, A, head, 1.0, 1.0, 0.5)
    raw = f_u / 0.5 + (1 - A / 0.4) + 0.5 * head
    np.testing.assert_allclose(C, (raw - raw.min()) / (raw.max() - raw.min()))
    plan = np.array([[0.3, 0.1, 0.05, 0.05], [0.0, 0.1, 0.2, 0.2]])  # column mass .3 .2 .25 .25
    assert select("top", plan, C, np.array([0.5, 0.5]), 2, 0.8) == [0, 2]  # stable tie: 2 before 3
    assert select("kappa", plan, C, np.array([0.5, 0.5]), 2, 0.8) == [0, 2, 3]  # .3 + .25 + .25 = .8
    assert select("greedy", plan, C, np.array([0.5, 0.5]), 2, 0.8) == sorted(np.argsort(C.mean(0))[:2].tolist())
    assert len(select("random", plan, C, np.array([0.5, 0.5]), 3, 0.8, np.random.default_rng(0))) == 3


def test_kmeans_recovers_separated_clusters():
    from pipelines.mesa.transport import kmeans

    rng = np.random.default_rng(0)
    centers = np.array([[0, 0], [10, 0], [0, 10]], float)
    x = np.concatenate([c + 0.1 * rng.normal(size=(50, 2)) for c in centers])
    cent, lab = kmeans(x, 3, seed=1)
    for j in range(3):  # each true cluster is one label
        assert len(set(lab[j * 50 : (j + 1) * 50])) == 1
    assert len(set(lab)) == 3


# ------------------------------------------------------------------------------------------ MoE
def test_moe_matches_per_token_brute_force_and_masking():
    import torch.nn.functional as F

    from pipelines.mesa.model import MoE

    torch.manual_seed(0)
    moe = MoE(8, 5, n_experts=6, top_k=2)
    x = torch.randn(2, 3, 8)

    def reference(mask):
        out = torch.zeros_like(x)
        for i in range(2):
            for t in range(3):
                logits = moe.router(x[i, t])
                logits[~mask] = float("-inf")
                top = torch.argsort(logits, descending=True)[:2]
                g = torch.softmax(logits[top], 0)
                for w, e in zip(g, top):
                    h = F.gelu(x[i, t] @ moe.w1[e] + moe.b1[e])
                    out[i, t] += w * (h @ moe.w2[e] + moe.b2[e])
        return out

    with torch.no_grad():
        torch.testing.assert_close(moe(x), reference(torch.ones(6, dtype=torch.bool)), atol=1e-5, rtol=1e-5)
        mask = torch.tensor([False, True, True, False, True, True])
        moe.expert_mask.copy_(mask)
        torch.testing.assert_close(moe(x), reference(mask), atol=1e-5, rtol=1e-5)
        assert not np.isin(moe.last["topi"].numpy(), [0, 3]).any()
        assert float(moe.last["probs"][..., [0, 3]].max()) == 0.0


def test_routing_statistics_brute_force():
    from pipelines.mesa.model import coverage, selection_freq, top_share

    topi = torch.tensor([[[[0, 1], [0, 2]], [[0, 1], [3, 1]]]])  # [L=1, N=2, T=2, k=2]
    mask = torch.tensor([[True, True], [True, False]])
    f = selection_freq(topi, mask, 4)
    np.testing.assert_allclose(f[0], [3 / 6, 2 / 6, 1 / 6, 0])
    assert top_share(f, 2)[0] == pytest.approx(5 / 6)
    assert coverage(f, 0.8)[0] == 2 and coverage(f, 0.9)[0] == 3


def test_targeted_alignment_updates_only_selected_experts_and_router():
    from pipelines.core.training import fit
    from pipelines.mesa.model import expert_grad_masks, make_model, moes, trainable_count

    p = Params.model_validate(RAW)
    torch.manual_seed(0)
    model = make_model(20, p.model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    selected = [[1, 4], [0, 2]]
    params, handles = expert_grad_masks(model, selected)
    ids = torch.randint(3, 20, (8, 6))
    fit(
        model,
        None,
        lambda m, x: m(x).logsumexp(-1).mean(),
        steps=3,
        sample_batch=lambda i, g: (ids,),
        optimizer="adam",
        weight_decay=0.0,
        lr=1e-2,
        params=params,
        progress=False,
    )
    after = model.state_dict()
    for layer, _moe in enumerate(moes(model)):
        for name in ("w1", "b1", "w2", "b2"):
            key = f"blocks.{layer}.ff.{name}"
            changed = {e for e in range(p.model.n_experts) if not torch.equal(before[key][e], after[key][e])}
            assert changed <= set(selected[layer])
            if name.startswith("w"):
                assert changed == set(selected[layer])
        assert not torch.equal(before[f"blocks.{layer}.ff.router.weight"], after[f"blocks.{layer}.ff.router.weight"])
    for key in ("embed.weight", "blocks.0.qkv.weight", "blocks.1.out.weight", "norm.weight"):
        assert torch.equal(before[key], after[key])
    per_expert = 16 * 8 + 8 + 8 * 16 + 16
    assert trainable_count(model, selected, True) == 2 * (2 * per_expert + 16 * 6)
    for h in handles:
        h.remove()


def test_teacher_forced_exact_match_equals_greedy_decoding():
    """benign_acc scores exact match by teacher forcing (every argmax right given the right prefix); it
    must agree with greedy generation (core's cached decoder), row by row, at every stage of training."""
    from pipelines.core.seqmodels import generate
    from pipelines.core.training import fit
    from pipelines.mesa.model import encode, make_model, sft_loss, tokenizer

    p = Params.model_validate(RAW)
    tok = tokenizer(["=>", "a", "b", "c"])
    df = pd.DataFrame(
        {"prompt": ["a b =>", "b =>", "c a =>", "a =>"], "answer": ["c", "a b", "b c a", "c c"], "kind": "benign"}
    )
    enc = encode(df, tok)
    torch.manual_seed(0)
    model = make_model(len(tok), p.model)
    seen = set()
    for _ in range(6):
        with torch.no_grad():
            model.eval()
            ok = ((model(enc.ids)[:, :-1].argmax(-1) == enc.ids[:, 1:]) | ~enc.loss_mask).all(1)
            for i in range(len(df)):
                prompt = enc.ids[i : i + 1, : int(enc.ans_pos[i]) + 1]
                n_ans = int(enc.loss_mask[i].sum())
                gen = generate(model, prompt, n_ans, temperature=0)[0, prompt.shape[1] :]
                target = enc.ids[i, prompt.shape[1] : prompt.shape[1] + n_ans]
                assert bool(torch.equal(gen, target)) == bool(ok[i])
                seen.add(bool(ok[i]))
        fit(
            model,
            None,
            lambda m, x: sft_loss(m(x), enc),
            steps=15,
            sample_batch=lambda i, g: (enc.ids,),
            lr=1e-2,
            progress=False,
        )
    assert seen == {True, False}  # both outcomes were exercised


# ------------------------------------------------------------------------------------------ data
def test_corpus_structure():
    from pipelines.mesa.data import synthetic

    p = Params.model_validate({**RAW, "data": {**RAW["data"], "n_pretrain": 600}})
    pre, align, ev = synthetic(p)
    harm = pre[pre.kind == "harmful"]
    assert (harm[harm.wrapper < 0]["answer"] == "R1 R2 R3").all()  # direct → refusal
    assert harm[harm.wrapper >= 0]["answer"].str.startswith("HOWTO").all()  # wrapped → compliance (jailbreakable)
    assert (pre[pre.kind == "benign"].wrapper >= 0).mean() == pytest.approx(0.5, abs=0.1)
    ds = align[align.kind == "harmful"]
    assert (ds["answer"] == "R1 R2 R3").all() and ds.harm.max() < 15 and ds.wrapper.max() < 3
    assert set(ev.set) == {"direct", "id", "ood", "ood_newharm", "ood_struct", "benign"}
    struct = ev[ev.set == "ood_struct"]
    assert (struct.wrapper < 0).all() and struct.prompt.str.contains("harm").all()
    assert struct.prompt.str.split().map(lambda t: any(x[:-1] in ("add", "copy", "sort", "rev") for x in t)).all()
    assert (ev[ev.set == "ood_newharm"].harm >= 15).all()
    assert (ev[ev.set.isin(["ood", "ood_newharm"])].wrapper >= 3).all()
    add = pre[pre.task == "add"].iloc[0]
    digits = [int(t) for t in add.prompt.split() if t.isdigit()]
    assert int(add.answer) == sum(digits) % 10


# ------------------------------------------------------------------------------------------ contract / bad input
@pytest.mark.parametrize(
    "patch, key",
    [
        ({"ot": {"n_sel": 2}}, r"parameter mesa: .*n_sel"),
        ({"variants": ["base", "mesa", "dpo"]}, r"mesa\.variants"),
        ({"ot": {"eps": 0}}, r"mesa\.ot\.eps"),
        ({"align": {"steps": True}}, r"mesa\.align\.steps"),
        ({"data": {**RAW["data"], "n_harm_heldout": 30}}, r"mesa\.data"),
    ],
)
def test_method_rules_name_the_key(patch, key):
    with pytest.raises(ParameterError, match=key):
        validate(Params, {**RAW, **patch}, "mesa")


def test_bad_user_tables_name_dataset_and_column(tmp_path):
    from pipelines.core.schemas import InputDataError
    from pipelines.mesa.data import make_data, synthetic

    p0 = Params.model_validate(RAW)
    pre, align, ev = synthetic(p0)
    paths = {k: str(tmp_path / f"{k}.parquet") for k in ("pretrain", "align", "eval")}
    pre.to_parquet(paths["pretrain"])
    align.drop(columns="answer").to_parquet(paths["align"])
    ev.to_parquet(paths["eval"])
    p = Params.model_validate({**RAW, "data": {**RAW["data"], **{f"{k}_path": v for k, v in paths.items()}}})
    with pytest.raises(InputDataError, match=r"mesa\.align_safety.*'answer'"):
        make_data(p)
    align.assign(kind="evil").to_parquet(paths["align"])
    with pytest.raises(InputDataError, match=r"mesa\.align_safety.*'kind'"):
        make_data(p)
    align.to_parquet(paths["align"])
    ev.assign(prompt=ev.prompt.str.replace(" =>", "")).to_parquet(paths["eval"])
    with pytest.raises(InputDataError, match=r"mesa\.eval_sets.*'prompt'"):
        make_data(p)
    ev.to_parquet(paths["eval"])
    out = make_data(p)
    assert len(out[0]) == len(pre)


def test_prefix_style_moves_only_the_heldout_wrappers_before_the_request():
    from pipelines.mesa.data import synthetic

    p = Params.model_validate({**RAW, "data": {**RAW["data"], "heldout_wrapper_style": "prefix"}})
    _, align, ev = synthetic(p)
    for prompt in ev[ev.set.isin(["ood", "ood_newharm"])].prompt:
        t = prompt.split()
        assert t[0].startswith("wA") and t[1] == "wB" + t[0][2:] and t[-2].startswith("obj")
    for prompt in ev[ev.set == "id"].prompt:
        t = prompt.split()
        assert t[0].startswith("wA") and t[-2] == "wB" + t[0][2:]
    harm = align[align.kind == "harmful"]
    assert not harm.prompt.str.contains(r"wA[3-5]").any()  # held-out wrappers never carry D_s requests
