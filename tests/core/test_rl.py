"""core.rl against hand-computed GRPO/PPO examples and the exact KL of small categoricals."""
import math

import pytest
import torch

from pipelines.core.rl import group_advantages, k3_kl, ppo_clip_loss, token_entropy


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    a = group_advantages(r, 4)
    s = math.sqrt(1 / 3)                           # unbiased std of [1, 0, 0, 1]
    assert a[:4].tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], rel=1e-5)
    assert a[4:].abs().max().item() == 0.0          # all-equal group: zero advantage, no NaN
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
    expected_k3 = (p * k3_kl(p.log(), q.log())).sum().item()      # E_p[k3] over the exact distribution
    assert expected_k3 == pytest.approx(exact, abs=1e-6)
    assert k3_kl(p.log(), p.log()).abs().max().item() == 0.0
    assert token_entropy(torch.log(p)[None]).item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)
    assert token_entropy(torch.zeros(1, 8)).item() == pytest.approx(math.log(8), abs=1e-6)
