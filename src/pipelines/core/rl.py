"""Policy-gradient pieces shared by the RL post-training methods (GRPO and relatives): group-normalised
advantages, the PPO-clip surrogate over masked tokens, the k3 ("low-variance") KL estimate, and the
entropy of a categorical policy. Pure tensor functions; a method's loop composes them with
``core.training.fit`` (steps mode) and ``core.seqmodels.sequence_logprobs``."""
from __future__ import annotations

import torch

__all__ = ["group_advantages", "ppo_clip_loss", "k3_kl", "masked_mean", "token_entropy"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None, dim=None) -> torch.Tensor:
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6,
                     scale: bool = True) -> torch.Tensor:
    """GRPO's A = (r − mean_group) / (std_group + eps) for rewards [n_groups · group_size] laid out group
    after group (the unbiased std, as GRPO implementations use; ``scale=False`` gives r − mean only)."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    if group_size < 2 and scale:
        raise ValueError("group_size must be ≥ 2 to scale advantages by the group's std")
    r = rewards.float().view(-1, group_size)
    a = r - r.mean(1, keepdim=True)
    if scale:
        a = a / (r.std(1, keepdim=True) + eps)
    return a.view(-1)


def ppo_clip_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor | None = None, clip: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """−E[min(ρ·A, clip(ρ, 1−ε, 1+ε)·A)] over the masked tokens (token-mean over the batch), ρ = exp(logp −
    logp_old). ``advantages`` is per sequence [B] (broadcast to tokens) or per token [B, T]. Returns the
    loss and diagnostics (clipped fraction, mean ratio)."""
    if advantages.ndim == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp(logp - logp_old)
    unclipped, clipped = ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages
    loss = -masked_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        frac = masked_mean((clipped < unclipped).float(), mask).item()
        mean_ratio = masked_mean(ratio, mask).item()
    return loss, {"clip_frac": frac, "ratio_mean": mean_ratio}


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref) from samples of π: exp(Δ) − Δ − 1 with Δ = logp_ref − logp
    (≥ 0, unbiased; veRL's ``low_var_kl`` also clamps it to [−10, 10], which we leave to the caller)."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical policy at each position, from logits [..., V]."""
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)
