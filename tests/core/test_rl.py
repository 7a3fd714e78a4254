"""core.rl against hand-computed GRPO/PPO examples and the exact KL of small categoricals."""

import math

import pytest
import torch

from pipelines.core.rl import group_advantages, k3_kl, ppo_clip_loss, token_entropy


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    a = group_advantages(r, 4)
    s = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    assert a[:4].tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], rel=1e-5)
    assert a[4:].abs().max().item() == 0.0  # all-equal group: zero advantage, no NaN
    assert group_advantages(r, 4, scale=False)[:2].tolist() == [0.5, -0.5]
    with pytest.raises(ValueError, match="multiple of group_size=3"):
        group_advantages(r, 3)


def test_ppo_clip_by_hand():
    # ratios e^{0.5} ≈ 1.65 (clipped to 1.2 for A > 0) and e^{-0.5} ≈ 0.61 (clipped to 0.8 for A < 0)
    logp_old = torch.zeros(2, 2)
    logp = torch.tensor([[0.5, 0.0], [-0.5, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, info = ppo_clip_loss(logp, logp_old, adv, mask, clip=0.2)
    # token terms: min(1.65, 1.2)=1.2 ; min(1,1)=1 ; min(-0.61, -0.8)=-0.8 ; (masked)
    assert loss.item() == pytest.approx(-(1.2 + 1.0 - 0.8) / 3, abs=1e-6)
    assert info["clip_frac"] == pytest.approx(2 / 3)
    # the gradient flows only through unclipped tokens
    lp = logp.clone().requires_grad_(True)
    ppo_clip_loss(lp, logp_old, adv, mask)[0].backward()
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[1, 0].item() == 0.0 and lp.grad[0, 1].item() == pytest.approx(-1 / 3)


def test_k3_is_an_unbiased_kl_estimate_and_entropy_matches_closed_form():
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.5, 0.3, 0.2])
    exact = (p * (p / q).log()).sum().item()
    expected_k3 = (p * k3_kl(p.log(), q.log())).sum().item()  # E_p[k3] over the exact distribution
    assert expected_k3 == pytest.approx(exact, abs=1e-6)
    assert k3_kl(p.log(), p.log()).abs().max().item() == 0.0
    assert token_entropy(torch.log(p)[None]).item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)
    assert token_entropy(torch.zeros(1, 8)).item() == pytest.approx(math.log(8), abs=1e-6)


def test_minus_inf_masked_vocabulary_gives_no_nan():
    """A vocabulary masked with −inf logits (a restricted sampler) and padding whose log-probs are −inf:
    the entropy is the closed form over the allowed tokens, and the masked positions put NaN neither
    into masked_mean / ppo_clip_loss nor into their gradients (they are selected away, not multiplied by 0)."""
    from pipelines.core.rl import GRPOBatch, masked_mean

    logits = torch.tensor([[0.0, 0.0, -math.inf, -math.inf], [1.0, -math.inf, 0.0, -math.inf]], requires_grad=True)
    ent = token_entropy(logits)
    p1 = torch.softmax(torch.tensor([1.0, 0.0]), 0)
    assert ent.tolist() == pytest.approx([math.log(2), -(p1 * p1.log()).sum().item()], abs=1e-6)
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()

    x = torch.tensor([[1.0, 2.0, math.nan], [3.0, -math.inf, math.inf]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    mm = masked_mean(x, mask)
    assert mm.item() == pytest.approx(2.0)
    mm.backward()
    assert x.grad.flatten().tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3, 0.0, 0.0])
    assert masked_mean(x.detach(), mask, dim=1).tolist() == pytest.approx([1.5, 3.0])

    # padding's log-probs are −inf under both policies: −inf − (−inf) would be NaN
    logp = torch.tensor([[-0.5, -math.inf], [-1.0, -math.inf]], requires_grad=True)
    logp_old = torch.tensor([[-0.5, -math.inf], [-1.2, -math.inf]])
    pad_mask = torch.tensor([[True, False], [True, False]])
    adv = torch.tensor([1.0, -1.0])
    loss, info = ppo_clip_loss(logp, logp_old, adv, pad_mask)
    r = math.exp(0.2)  # second row: ratio e^{0.2} > 1.2 → A·clip(ρ)
    assert loss.item() == pytest.approx(-(1.0 + min(-r, -1.2)) / 2, abs=1e-6)
    assert math.isfinite(info["ratio_mean"]) and math.isfinite(info["clip_frac"])
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[:, 1].abs().max().item() == 0.0

    # the default GRPO objective with a KL to the reference: finite value and gradient
    lp = logp.detach().clone().requires_grad_(True)
    b = GRPOBatch(
        model=None,
        ids=None,
        mask=pad_mask,
        logp=lp,
        logits=None,
        logp_old=logp_old,
        logp_ref=logp_old.clone(),
        advantages=adv,
        rewards=adv,
        extras={},
        stats={},
        index=torch.arange(2),
        iteration=0,
    )
    total, logs = ppo_objective(b, kl_coef=0.1)
    total.backward()
    assert math.isfinite(total.item()) and math.isfinite(logs["kl_ref"]) and torch.isfinite(lp.grad).all()


# ---- the GRPO loop -------------------------------------------------------------------------------------------
import torch.nn as nn  # noqa: E402

from pipelines.core.rl import Rollouts, grpo_train, ppo_objective, sample_rollouts  # noqa: E402


class _Bandit(nn.Module):
    """A context-free 'LM': the same logits θ at every position."""

    def __init__(self, v=4):
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(v))

    def forward(self, ids):
        return self.theta.expand(ids.shape[0], ids.shape[1], -1)


def _one_token_rollouts(actions, rewards, **kw):
    ids = torch.stack([torch.zeros_like(actions), actions], 1)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 1] = True
    return Rollouts(ids, mask, rewards, **kw)


def test_grpo_single_update_matches_the_policy_gradient_closed_form():
    # ratio = 1 at the first update, so the PPO-clip gradient is the REINFORCE one:
    # dθ = (lr/N) Σ_i A_i (e_{a_i} − softmax(θ)); with SGD and no clipping θ moves exactly that far.
    pol = _Bandit()
    with torch.no_grad():
        pol.theta.copy_(torch.tensor([0.3, -0.2, 0.1, 0.0]))
    actions = torch.tensor([0, 2, 2, 1, 3, 2, 0, 1])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.2])
    theta0 = pol.theta.detach().clone()
    lr = 0.5
    grpo_train(
        pol,
        lambda p, it, g: _one_token_rollouts(actions, rewards),
        iterations=1,
        group_size=4,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
        grad_clip=None,
    )
    adv = group_advantages(rewards, 4)
    pi = torch.softmax(theta0, 0)
    expected = theta0 + lr / len(actions) * sum(
        a * (torch.nn.functional.one_hot(x, 4).float() - pi) for a, x in zip(adv, actions)
    )
    assert torch.allclose(pol.theta.detach(), expected, atol=1e-6)


def test_grpo_learns_a_bandit_and_reports_its_iterations():
    pol = _Bandit()
    prompts = torch.zeros(4, 1, dtype=torch.long)
    res = grpo_train(
        pol,
        lambda p, it, g: sample_rollouts(
            p, prompts, 8, lambda pr, r: (r[:, 0] == 2).float(), max_new_tokens=1, generator=g
        ),
        iterations=40,
        group_size=8,
        lr=0.1,
        updates_per_iteration=2,
        minibatches=2,
        seed=1,
    )
    assert torch.softmax(pol.theta.detach(), 0)[2] > 0.9
    assert [r["iteration"] for r in res.history] == list(range(40))
    first, last = res.history[0], res.history[-1]
    assert last["reward_mean"] > first["reward_mean"]
    assert {"pg_loss", "clip_frac", "grad_norm", "grad_norm_max", "zero_variance_groups", "loss"} <= set(first)


def test_grpo_objective_sees_aligned_minibatches_extras_and_reference():
    pol, ref = _Bandit(), _Bandit()
    seen = []

    def objective(b):
        seen.append((b.logp.shape, b.mask.shape, b.advantages.shape, b.extras["tag"].tolist(), b.index.tolist()))
        loss, logs = ppo_objective(b, kl_coef=0.1)
        return loss, {**logs, "probe": float(b.stats["s"])}

    actions, rewards = torch.tensor([0, 1, 2, 3]), torch.tensor([0.0, 1.0, 0.0, 1.0])
    res = grpo_train(
        pol,
        lambda p, it, g: _one_token_rollouts(actions, rewards, extras={"tag": actions * 10}, stats={"s": 7.0}),
        iterations=2,
        group_size=2,
        ref_policy=ref,
        minibatches=2,
        objective=objective,
        lr=0.5,
    )
    assert len(seen) == 4
    for lp, m, a, tags, idx in seen:
        assert lp == m == torch.Size([2, 1]) and a == torch.Size([2])
        assert tags == [10 * i for i in idx]  # extras sliced with the same rows
    assert res.history[0]["probe"] == 1.0 * 7.0 and res.history[0]["s"] == 7.0
    assert res.history[0]["kl_ref"] < res.history[1]["kl_ref"]  # the policy moved away from the reference


def test_grpo_single_minibatch_draws_nothing_from_the_generator_and_is_seeded():
    draws = []

    def roll(p, it, g):
        draws.append(torch.rand(1, generator=g).item())
        return _one_token_rollouts(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))

    grpo_train(_Bandit(), roll, iterations=3, group_size=2, seed=5)
    g = torch.Generator().manual_seed(5)
    assert draws == [torch.rand(1, generator=g).item() for _ in range(3)]


def test_sample_rollouts_scores_the_response_through_its_first_eos_only():
    class Fixed(nn.Module):  # always emits token 1 (= EOS) after one token 3
        def forward(self, ids):
            nxt = torch.where(ids[:, -1:] == 3, 1, 3)
            return torch.nn.functional.one_hot(nxt, 4).float().expand(-1, ids.shape[1], -1) * 50

    ro = sample_rollouts(
        Fixed(), torch.zeros(2, 2, dtype=torch.long), 2, lambda p, r: r[:, 0].float(), max_new_tokens=5, eos_id=1
    )
    assert ro.ids.tolist()[0] == [0, 0, 3, 1]
    assert ro.action_mask.tolist()[0] == [False, False, True, True]
    assert ro.rewards.tolist() == [3.0] * 4


def test_grpo_rejects_bad_settings_and_rollouts():
    with pytest.raises(ValueError, match="kl_coef"):
        grpo_train(_Bandit(), lambda p, it, g: None, iterations=1, group_size=2, kl_coef=0.1)
    with pytest.raises(ValueError, match="rewards"):
        _one_token_rollouts(torch.tensor([0, 1]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="extras"):
        _one_token_rollouts(torch.tensor([0, 1]), torch.ones(2), extras={"x": torch.ones(3)})
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo_train(
            _Bandit(),
            lambda p, it, g: _one_token_rollouts(torch.tensor([0, 1, 2]), torch.ones(3)),
            iterations=1,
            group_size=2,
        )
