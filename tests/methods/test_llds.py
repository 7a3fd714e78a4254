"""Tests of `llds`: GRPO's advantages and clipped objective against a hand-computed example, the LLDS
regulariser against a brute-force per-action loop (zero when no likelihood decreases, only on the
preserving set, one-sided), the environment against its closed-form Bayes accuracy, the cached rollout's
log-probs against a full forward, and bad input (the end-to-end --env=test run is covered for every
pipeline by tests/methods/test_all_pipelines.py)."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.core.params import ParameterError, validate
from pipelines.llds.params import Params

RAW = {
    "seeds": [0],
    "variants": ["grpo", "llds"],
    "data": {"n_persons": 20, "n_cities": 8, "n_countries": 5, "n_orgs": 6, "n_test_per_type": 10, "n_probe": 20},
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
    "sft": {"steps": 5, "batch_size": 8},
    "rl": {"iterations": 2, "questions": 4, "group_size": 2, "minibatches": 2, "eval_every": 1},
}


class FixedLogits(torch.nn.Module):
    """A "policy" whose logits are a free parameter [B, T, V] (ignores the ids): log-probs are known."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone())

    def forward(self, ids):
        return self.logits


# ------------------------------------------------------------------------------------------ GRPO
def test_grpo_objective_matches_hand_computed_example():
    from pipelines.core.rl import group_advantages
    from pipelines.llds.model import LossSpec, grpo_loss

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # two groups of G = 3
    adv = group_advantages(rewards, 3)
    s = 1 / math.sqrt(3)  # unbiased std of (1, 0, 0)
    a_pos, a_neg = (2 / 3) / s, (-1 / 3) / s  # 1.1547, -0.57735
    np.testing.assert_allclose(adv.numpy(), [a_pos, a_neg, a_neg, 0, 0, 0], atol=1e-5)

    # one scored token per response (ids[:, 1] under 2-way logits); chosen ratios exp(logp - logp_old)
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.9, 1.3, 0.7])
    p_tok = torch.full((6,), 0.4)
    logits = torch.zeros(6, 1, 2)
    logits[:, 0, 1] = torch.log(p_tok / (1 - p_tok))  # softmax gives p(token 1) = 0.4
    ids = torch.tensor([[0, 1]] * 6)
    mask = torch.tensor([[False, True]] * 6)
    logp_old = (torch.log(p_tok) - torch.log(ratios))[:, None]
    model = FixedLogits(logits)
    spec = LossSpec(clip=0.2, entropy_coef=0.0, kl_coef=0.0)
    loss, extras = grpo_loss(model, ids, mask, torch.zeros_like(mask), adv, logp_old, logp_old, spec)
    # by hand: min(ρA, clip(ρ)A) per token, then the negative mean
    terms = [
        1.2 * a_pos,  # ρ 1.5, A > 0: clipped to 1.2
        0.8 * a_neg,  # ρ 0.5, A < 0: clipped to 0.8 (the smaller of 0.5A, 0.8A)
        1.1 * a_neg,  # ρ 1.1, A < 0: unclipped (1.1A < 1.2A... both, min is 1.1A)
        0.0,
        0.0,
        0.0,
    ]  # A = 0
    assert loss.item() == pytest.approx(-sum(terms) / 6, rel=1e-5)
    assert extras["clip_frac"] == pytest.approx(2 / 6)


# ------------------------------------------------------------------------------------------ LLDS
def _brute_force_penalty(logp, logp_old, adv, mask, gate):
    """Per-token loops: the preserving set, its runs (actions) or whole responses, Σ d > 0, max(0, d)."""
    B, T = logp.shape
    out = np.zeros((B, T))
    for b in range(B):
        if adv[b] < 0:
            continue
        keep = [bool(mask[b, t]) for t in range(T)]
        d = [float(logp_old[b, t] - logp[b, t]) for t in range(T)]
        groups, cur = [], []
        for t in range(T):
            if keep[t]:
                cur.append(t)
            elif cur:
                groups.append(cur)
                cur = []
        if cur:
            groups.append(cur)
        if gate == "response":
            groups = [[t for g in groups for t in g]]
        for g in groups:
            if g and sum(d[t] for t in g) > 0:
                for t in g:
                    out[b, t] = max(0.0, d[t])
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), gate=st.sampled_from(["action", "response"]))
def test_llds_gates_match_brute_force(seed, gate):
    from pipelines.llds.model import llds_penalty

    g = torch.Generator().manual_seed(seed)
    B, T = 6, 14
    logp_old = -torch.rand(B, T, generator=g) * 3
    logp = logp_old + torch.randn(B, T, generator=g) * 0.3
    mask = torch.rand(B, T, generator=g) < 0.6  # action tokens with info gaps between them
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0, -1.0, 0.0])
    p, on = llds_penalty(logp, logp_old, adv, mask, gate)
    ref = _brute_force_penalty(logp.numpy(), logp_old.numpy(), adv.numpy(), mask.numpy(), gate)
    np.testing.assert_allclose(p.numpy(), ref, atol=1e-6)
    assert not on[adv < 0].any() and not on[~mask].any()  # never on A < 0 responses or masked tokens


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), gate=st.sampled_from(["action", "response"]))
def test_llds_is_zero_when_no_likelihood_decreases(seed, gate):
    from pipelines.llds.model import llds_penalty

    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(5, 12, generator=g) * 3
    logp = (logp_old + torch.rand(5, 12, generator=g) * 0.5).requires_grad_(True)  # every token rose (or held)
    mask = torch.rand(5, 12, generator=g) < 0.7
    adv = torch.randn(5, generator=g)
    p, _ = llds_penalty(logp, logp_old, adv, mask, gate)
    assert float(p.detach().abs().sum()) == 0.0
    p.sum().backward()
    assert float(logp.grad.abs().sum()) == 0.0


def test_llds_penalises_only_decreases_inside_a_displaced_action():
    from pipelines.llds.model import llds_penalty

    # one response, two actions separated by an info token; action 1 net decreased, action 2 net increased
    logp_old = torch.zeros(1, 7)
    logp = torch.tensor([[-0.5, 0.2, -0.1, 0.0, 0.3, -0.2, 0.0]])
    mask = torch.tensor([[True, True, True, False, True, True, True]])
    p, on = llds_penalty(logp, logp_old, torch.tensor([0.0]), mask, "action")
    np.testing.assert_allclose(p[0].numpy(), [0.5, 0.0, 0.1, 0, 0, 0, 0], atol=1e-7)  # one-sided, gated
    p_r, _ = llds_penalty(logp, logp_old, torch.tensor([0.0]), mask, "response")  # Σd = 0.3 > 0 overall
    np.testing.assert_allclose(p_r[0].numpy(), [0.5, 0.0, 0.1, 0, 0, 0.2, 0], atol=1e-7)


def test_llds_loss_is_lambda_times_token_mean_over_all_response_tokens():
    from pipelines.llds.model import LossSpec, grpo_loss, token_logprobs

    torch.manual_seed(0)
    logits = torch.randn(4, 5, 3)
    ids = torch.randint(0, 3, (4, 6))
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 0] = False
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5])
    model = FixedLogits(logits)
    lp = token_logprobs(model, ids)[0].detach()
    logp_old = lp + torch.randn_like(lp) * 0.2
    base = LossSpec(entropy_coef=0.0, kl_coef=0.0)
    with_llds = LossSpec(entropy_coef=0.0, kl_coef=0.0, llds_lambda=0.2)
    l0, _ = grpo_loss(model, ids, mask, torch.zeros_like(mask), adv, logp_old, logp_old, base)
    l1, ex = grpo_loss(model, ids, mask, torch.zeros_like(mask), adv, logp_old, logp_old, with_llds)
    ref = _brute_force_penalty(lp.numpy(), logp_old.numpy(), adv.numpy(), mask[:, 1:].numpy(), "action")
    assert (l1 - l0).item() == pytest.approx(0.2 * ref.sum() / mask[:, 1:].sum().item(), rel=1e-5)
    assert ex["llds_active_frac"] == pytest.approx((ref > 0).mean(), abs=1e-6)


def test_llds_ma_down_weights_answer_tokens_and_nll_pos_hits_only_positives():
    from pipelines.llds.model import LossSpec, grpo_loss, llds_penalty, token_logprobs

    torch.manual_seed(1)
    logits = torch.randn(3, 6, 4)
    ids = torch.randint(0, 4, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[:, :1] = False
    ans = torch.zeros(3, 7, dtype=torch.bool)
    ans[:, 4:] = True  # the last action is the answer
    adv = torch.tensor([0.7, 0.0, -0.7])
    model = FixedLogits(logits)
    lp = token_logprobs(model, ids)[0].detach()
    logp_old = lp + 0.3  # every token fell: every gate fires
    kw = dict(entropy_coef=0.0, kl_coef=0.0)
    l0, _ = grpo_loss(model, ids, mask, ans, adv, logp_old, logp_old, LossSpec(**kw))
    l_ma, _ = grpo_loss(
        model, ids, mask, ans, adv, logp_old, logp_old, LossSpec(**kw, llds_lambda=0.2, answer_coef=0.05)
    )
    p, _ = llds_penalty(lp, logp_old, adv, mask[:, 1:], "action")
    coef = torch.where(ans[:, 1:], 0.05, 0.2)
    assert (l_ma - l0).item() == pytest.approx(float((coef * p).sum() / mask[:, 1:].sum()), rel=1e-5)
    l_big, _ = grpo_loss(
        model, ids, mask, ans, adv, logp_old, logp_old, LossSpec(**kw, llds_lambda=0.2, answer_coef=0.9)
    )  # capped at λ: plain LLDS
    l_plain, _ = grpo_loss(model, ids, mask, ans, adv, logp_old, logp_old, LossSpec(**kw, llds_lambda=0.2))
    assert l_big.item() == pytest.approx(l_plain.item(), rel=1e-6)
    l_nll, _ = grpo_loss(model, ids, mask, ans, adv, logp_old, logp_old, LossSpec(**kw, nll_coef=0.2))
    assert (l_nll - l0).item() == pytest.approx(0.2 * float(-lp[0].sum() / mask[:, 1:].sum()), rel=1e-5)


# ------------------------------------------------------------------------------------------ environment
def test_bayes_copy_policy_reaches_closed_form_accuracy():
    """Gold (copy slot 1) trajectories without corruption are right with probability q + (1 − q)/|range|,
    q = p_true^hops (a wrong path lands on a uniformly random entity of the answer's type)."""
    from pipelines.llds.env import builtin_env, gold_trajectories

    env = builtin_env(150, 40, 10, 30, 0.9, 3, False)
    g = torch.Generator().manual_seed(0)
    for k, (hops, n_range) in enumerate([(1, 40), (2, 10), (2, 40)]):
        b = gold_trajectories(env, env.episodes(4000, g, qtype=k), g, corrupt=0.0)
        q = 0.9**hops
        assert b.reward.mean().item() == pytest.approx(q + (1 - q) / n_range, abs=0.025)


def test_trajectory_layout_and_loss_mask():
    from pipelines.llds.env import ANSWER, INFO, SEARCH, builtin_env, gold_trajectories

    env = builtin_env(30, 8, 5, 6, 1.0, 3, True)
    g = torch.Generator().manual_seed(1)
    b = gold_trajectories(env, env.episodes(64, g), g, corrupt=0.0)
    assert b.reward.mean().item() == 1.0  # p_true = 1: copying slot 1 is always right
    P = env.prompt_len
    assert (b.ids[:, P] == SEARCH).all()
    assert (b.ids[:, P + 4] == INFO).all() and not b.mask[:, P + 4 : P + 4 + env.info_len].any()
    info = b.ids[:, P + 5 : P + 4 + env.info_len - 1]
    ents = info.reshape(64, -1, 3)[:, :, [0, 2]]
    assert (ents >= env.obs_base).all()  # ood_obs: info entities the policy never emits
    assert (b.ans_mask.sum(1) == 4).all() and (b.ids[b.ans_mask].view(64, 4)[:, 0] == ANSWER).all()


def test_cached_rollout_logprobs_equal_a_full_forward():
    """π_old is taken from the sampling pass (KV cache); it must be the policy's own log-probs."""
    from pipelines.llds.env import builtin_env, rollout
    from pipelines.llds.model import make_policy, token_logprobs

    env = builtin_env(20, 8, 5, 6, 0.9, 3, False)
    torch.manual_seed(0)
    model = make_policy(env.vocab_size, env.seq_len, 16, 2, 2)
    g = torch.Generator().manual_seed(0)
    b = rollout(model, env, env.episodes(32, g), g, 1.0)
    with torch.no_grad():
        lp = token_logprobs(model, b.ids)[0]
    m = b.mask[:, 1:]
    assert m.any()
    np.testing.assert_allclose(b.logp[m].numpy(), lp[m].numpy(), atol=1e-5)
    assert (b.logp[~m] == 0).all()


def test_collapse_rule():
    from pipelines.llds.train import collapse_iteration

    assert collapse_iteration([(0, 0.6), (10, 0.4), (20, 0.29)], 0.5, 0.2) == 20
    assert collapse_iteration([(0, 0.15), (10, 0.05)], 0.5, 0.2) is None  # the max never reached 0.2
    assert collapse_iteration([(0, 0.3), (10, 0.2), (20, 0.3)], 0.5, 0.2) is None


def test_reward_rise_counts_only_the_iterations_before_the_collapse():
    """The gate's metric by hand: best 10-iteration mean before the collapsed evaluation minus the first
    10-iteration mean; a rise after the collapse does not count; too few iterations before it give 0."""
    from pipelines.llds.evaluate import reward_rise

    r = np.r_[np.full(10, 0.1), np.full(10, 0.3), np.zeros(10), np.full(10, 0.9)]
    it = pd.DataFrame({"iteration": np.arange(40), "train_reward": r})
    assert reward_rise(it, None) == pytest.approx(0.8)  # nothing collapsed: the whole run
    assert reward_rise(it, 30) == pytest.approx(0.2)  # iterations 0..29 only
    assert reward_rise(it, 15) == pytest.approx(np.mean(r[5:15]) - 0.1)  # windows ending before iteration 15
    assert reward_rise(it, 9) == 0.0  # fewer than 10 iterations before it
    assert reward_rise(it.iloc[::-1], 30) == pytest.approx(0.2)  # the frame's row order does not matter


def test_grpo_run_is_paired_and_llds_inert_on_first_minibatch():
    """Two variants see the same questions on their first iteration (paired rollouts); d_t = 0 on the first
    mini-batch, so LLDS's first update equals vanilla's; the run's table has every iteration."""
    from pipelines.llds.data import make_env, qa_test, sft_trajectories
    from pipelines.llds.train import run_grpo, train_base

    p = Params.model_validate(RAW)
    spec = make_env(p)
    test = qa_test(spec, p)
    state, probe, info = train_base(spec, sft_trajectories(spec, p), test, p)
    a = run_grpo(spec, test, state, probe, p, "grpo", 0)
    b = run_grpo(spec, test, state, probe, p, "llds", 0)
    assert list(a["iteration"]) == [0, 1, 2]
    assert a.loc[0, "train_reward"] == b.loc[0, "train_reward"]
    assert a.loc[0, "test_em"] == b.loc[0, "test_em"]
    assert np.isfinite(a["grad_norm_max"].iloc[:2]).all()


# ------------------------------------------------------------------------------------------ user data
def _user_tables(n_people=12):
    facts, questions = [], []
    for i in range(n_people):
        facts.append((f"p{i}", "born_in", f"c{i % 5}"))
        questions.append((f"p{i}", "born_in|city_in", f"n{i % 5 % 3}"))
        questions.append((f"p{i}", "born_in", f"c{i % 5}"))
    for c in range(5):
        facts.append((f"c{c}", "city_in", f"n{c % 3}"))
    return (
        pd.DataFrame(facts, columns=["subject", "relation", "object"]),
        pd.DataFrame(questions, columns=["subject", "relations", "answer"]),
    )


def test_user_kb_env_runs_the_gold_policy_exactly(tmp_path):
    from pipelines.llds.data import draw_episodes, env_from_dict, make_env
    from pipelines.llds.env import gold_trajectories

    facts, questions = _user_tables()
    facts.to_parquet(tmp_path / "f.parquet")
    questions.to_parquet(tmp_path / "q.parquet")
    p = Params.model_validate(
        {
            **RAW,
            "data": {
                "source": "file",
                "facts_path": str(tmp_path / "f.parquet"),
                "questions_path": str(tmp_path / "q.parquet"),
                "p_true": 1.0,
            },
        }
    )
    spec = make_env(p)
    env = env_from_dict(spec)
    assert env.qtype_names == ["born_in", "born_in|city_in"]
    g = torch.Generator().manual_seed(0)
    b = gold_trajectories(env, draw_episodes(spec, 50, g), g, corrupt=0.0)
    assert b.reward.mean().item() == 1.0


def test_bad_user_file_names_dataset_and_column(tmp_path):
    from pipelines.core.schemas import InputDataError
    from pipelines.llds.data import make_env

    facts, questions = _user_tables()
    facts.drop(columns="object").to_parquet(tmp_path / "f.parquet")
    questions.to_parquet(tmp_path / "q.parquet")
    p = Params.model_validate(
        {
            **RAW,
            "data": {
                "source": "file",
                "facts_path": str(tmp_path / "f.parquet"),
                "questions_path": str(tmp_path / "q.parquet"),
            },
        }
    )
    with pytest.raises(InputDataError, match=r"llds\.facts.*'object'"):
        make_env(p)
    facts.to_parquet(tmp_path / "f.parquet")
    questions.assign(relations="born_in|lives_in").to_parquet(tmp_path / "q.parquet")
    with pytest.raises(ValueError, match=r"llds\.questions.*'relations'"):
        make_env(p)


# ------------------------------------------------------------------------------------------ params / pipeline
def test_shared_base_is_a_train_step():
    from pipelines.core.registry import load_pipeline

    names = {n.name for n in load_pipeline("llds").only_nodes_with_tags("train").nodes}
    assert "llds.train.base" in names  # the SFT policy every variant starts from


def test_fewer_seed_variants_take_the_first_seeds_and_unshared_pairs_give_no_pairs():
    from pipelines.core.spec import Results, SeedValues, compute_derived
    from pipelines.llds.spec import SPEC

    p = Params.model_validate({**RAW, "seeds": [3, 4], "variant_seeds": {"llds": 1}})
    assert p.seeds_for("llds") == [3] and p.seeds_for("grpo") == [3, 4]
    from pipelines.llds.evaluate import DELTA_METRICS

    rest = dict.fromkeys(DELTA_METRICS, 0.0)
    g, ll = Results("grpo"), Results("llds")
    g.add(4, **{**rest, "test_em": 0.2, "grad_norm_max": 1.0})
    ll.add(3, **{**rest, "test_em": 0.3, "grad_norm_max": 1.0})
    values = SeedValues({"grpo": g.table(), "llds": ll.table()})
    g2 = Results("grpo")
    g2.add(3, **{**rest, "test_em": 0.1, "grad_norm_max": 2.0})
    shared = SeedValues({"grpo": g2.table(), "llds": ll.table()})
    base = {"sft_sampled_reward": 0.1, "test_em": 0.5, "sft_probe_reward": 0.1}
    _, per_seed = compute_derived(SPEC, p, values, ["grpo", "llds"], {"base": base})
    assert not per_seed.get("delta.test_em.llds_minus_grpo")  # no shared seed: no pair, no value
    _, per_seed = compute_derived(SPEC, p, shared, ["grpo", "llds"], {"base": base})
    assert per_seed["delta.test_em.llds_minus_grpo"] == {3: pytest.approx(0.2)}
    assert per_seed["ratio.grad_norm_max.grpo_over_llds"] == {3: pytest.approx(2.0)}


@pytest.mark.parametrize(
    "patch, key",
    [
        ({"rl": {**RAW["rl"], "lr": -1.0}}, r"llds\.rl\.lr"),
        ({"rl": {**RAW["rl"], "minibatches": 3}}, r"llds\.rl"),
        ({"variants": ["grpo", "ppo"]}, r"llds\.variants"),
        ({"llds": {"lam": 0}}, r"llds\.llds\.lam"),
        ({"sft": {"corrupt": 1.0}}, r"llds\.sft\.corrupt"),
        ({"data": {"source": "file"}}, r"llds\.data"),
    ],
)
def test_bad_parameter_names_the_key(patch, key):
    with pytest.raises(ParameterError, match=key):
        validate(Params, {**RAW, **patch}, "llds")
