"""Policy-gradient pieces shared by the RL post-training methods (GRPO and relatives): group-normalised
advantages, the PPO-clip surrogate over masked tokens, the k3 ("low-variance") KL estimate, the entropy
of a categorical policy, and the GRPO loop itself.

The loop (``grpo_train``) owns what every GRPO method repeats — old/reference log-probs, advantages,
PPO-clip + KL, minibatch updates through ``core.training.fit`` with one persistent optimizer, per-iteration
statistics — and leaves the environment to the method: a ``rollout_fn(policy, iteration, generator)``
returns ``Rollouts`` (sequences, which tokens are the policy's actions, rewards), so single-turn sampling
(``sample_rollouts``) and multi-turn tool use (tool output masked out) plug in the same way. An
``extra_loss(batch)`` hook adds a method's regulariser (it sees the minibatch's current and old
log-probs, mask, advantages and rewards)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["GRPOBatch", "GRPOResult", "Rollouts", "group_advantages", "grpo_train", "k3_kl", "masked_mean",
           "ppo_clip_loss", "sample_rollouts", "token_entropy"]


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


@dataclass
class Rollouts:
    """One iteration's samples, ``n_groups · group_size`` rows laid out group after group.

    ``ids`` [N, T] whole sequences (prompt, response, tool output, padding); ``action_mask`` [N, T] True
    where the token was produced by the policy (scored by the loss; prompt, tool output and padding are
    False); ``rewards`` [N]; ``info`` anything per-sample the method wants back (correctness, lengths...)."""
    ids: torch.Tensor
    action_mask: torch.Tensor
    rewards: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        n = self.ids.shape[0]
        if self.action_mask.shape != self.ids.shape:
            raise ValueError(f"Rollouts: action_mask shape {tuple(self.action_mask.shape)} != ids shape "
                             f"{tuple(self.ids.shape)}")
        if self.rewards.shape != (n,):
            raise ValueError(f"Rollouts: rewards must have shape ({n},), got {tuple(self.rewards.shape)}")
        if not torch.isfinite(self.rewards.float()).all():
            raise ValueError("Rollouts: non-finite reward")


@dataclass
class GRPOBatch:
    """What ``extra_loss`` sees for one minibatch (token tensors are [b, T-1], aligned with
    ``sequence_logprobs``: position t scores ids[:, t+1])."""
    logp: torch.Tensor          # current policy, differentiable
    logp_old: torch.Tensor      # policy that sampled the rollouts (no grad)
    mask: torch.Tensor          # float, 1 on action tokens
    advantages: torch.Tensor    # [b]
    rewards: torch.Tensor       # [b]
    index: torch.Tensor         # rows of this minibatch in the iteration's Rollouts
    iteration: int


@dataclass
class GRPOResult:
    history: list[dict[str, float]]       # one row per iteration (see grpo_train)
    last_rollouts: Rollouts | None = None


def sample_rollouts(policy: torch.nn.Module, prompts: torch.Tensor, group_size: int,
                    reward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *, max_new_tokens: int,
                    eos_id: int | None = None, temperature: float = 1.0,
                    generator: torch.Generator | None = None) -> Rollouts:
    """Single-turn rollouts: each prompt row [P, T0] repeated ``group_size`` times, sampled with
    ``core.seqmodels.generate``; the response tokens up to and including the first EOS are actions.
    ``reward_fn(prompts_repeated [N, T0], responses [N, n])`` → rewards [N]."""
    from pipelines.core.seqmodels import generate

    rep = prompts.repeat_interleave(group_size, 0)
    with torch.no_grad():
        out = generate(policy, rep, max_new_tokens, temperature=temperature, eos_id=eos_id, generator=generator)
    t0 = prompts.shape[1]
    resp = out[:, t0:]
    mask = torch.zeros_like(out, dtype=torch.bool)
    if resp.shape[1]:
        act = torch.ones_like(resp, dtype=torch.bool)
        if eos_id is not None:   # tokens after the first EOS are padding
            is_eos = (resp == eos_id).long()
            act = (is_eos.cumsum(1) - is_eos) == 0
        mask[:, t0:] = act
    rewards = torch.as_tensor(reward_fn(rep, resp), dtype=torch.float32).reshape(-1)
    return Rollouts(out, mask, rewards)


def grpo_train(policy: torch.nn.Module, rollout_fn: Callable[[torch.nn.Module, int, torch.Generator], Rollouts],
               *, iterations: int, group_size: int, lr: float = 1e-5, clip: float = 0.2, kl_coef: float = 0.0,
               ref_policy: torch.nn.Module | None = None, updates_per_iteration: int = 1,
               minibatch_size: int | None = None, scale_advantages: bool = True, weight_decay: float = 0.0,
               grad_clip: float | None = 1.0, optimizer: Callable | None = None,
               extra_loss: Callable[[GRPOBatch], torch.Tensor | tuple[torch.Tensor, dict[str, float]]] | None = None,
               callback: Callable[[int, dict[str, float], Rollouts], None] | None = None,
               seed: int = 0, desc: str = "grpo") -> GRPOResult:
    """GRPO: per iteration, ``rollout_fn(policy, it, generator)`` (the policy in eval mode, no grad) →
    log-probs under the sampling policy (and ``ref_policy`` when ``kl_coef`` > 0) → group advantages →
    ``updates_per_iteration`` passes over shuffled minibatches of ``minibatch_size`` rows (None: all rows)
    minimising PPO-clip + kl_coef·k3-KL (+ ``extra_loss``), through ``core.training.fit`` with ONE optimizer
    kept across iterations (AdamW(lr, weight_decay) unless ``optimizer(params)`` is given).

    A history row per iteration: reward mean/std, fraction of groups with zero reward variance (no
    signal), mean action tokens per sample, mean log-prob of the actions under the sampling policy, the
    loss terms, clip fraction, KL, the largest pre-clip gradient norm, and whatever ``extra_loss``
    returns; ``callback(it, row, rollouts)`` may add to the row (e.g. likelihood probes)."""
    from pipelines.core.seqmodels import sequence_logprobs
    from pipelines.core.training import fit

    if iterations < 0 or group_size < 1 or updates_per_iteration < 1:
        raise ValueError("grpo_train: iterations ≥ 0, group_size ≥ 1 and updates_per_iteration ≥ 1 required")
    if kl_coef and ref_policy is None:
        raise ValueError("grpo_train: kl_coef > 0 needs a ref_policy")
    trainable = [q for q in policy.parameters() if q.requires_grad]
    opt = optimizer(trainable) if optimizer is not None else torch.optim.AdamW(trainable, lr=lr,
                                                                             weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    ro = None
    for it in range(iterations):
        policy.eval()
        ro = rollout_fn(policy, it, gen)
        n = ro.ids.shape[0]
        if n % group_size:
            raise ValueError(f"grpo_train: {n} rollouts is not a multiple of group_size={group_size}")
        mask = ro.action_mask[:, 1:].float()
        with torch.no_grad():
            old = sequence_logprobs(policy, ro.ids)
            ref = sequence_logprobs(ref_policy, ro.ids) if kl_coef else None
        adv = group_advantages(ro.rewards, group_size, scale=scale_advantages) if group_size > 1 \
            else ro.rewards.float() - ro.rewards.float().mean()
        mb = n if minibatch_size is None else min(minibatch_size, n)
        per_pass = -(-n // mb)
        order = torch.cat([torch.randperm(n, generator=gen) for _ in range(updates_per_iteration)])

        def batch(step: int, _g: torch.Generator):
            p, k = divmod(step, per_pass)
            idx = order[p * n:(p + 1) * n][k * mb:(k + 1) * mb]
            return (idx,)

        def loss_fn(model, idx):
            lp = sequence_logprobs(model, ro.ids[idx])
            m = mask[idx]
            loss, diag = ppo_clip_loss(lp, old[idx], adv[idx], m, clip)
            logs = {"pg_loss": float(loss.detach()), **diag}
            if kl_coef:
                kl = masked_mean(k3_kl(lp, ref[idx]), m)
                loss = loss + kl_coef * kl
                logs["kl"] = float(kl.detach())
            if extra_loss is not None:
                out = extra_loss(GRPOBatch(lp, old[idx], m, adv[idx], ro.rewards[idx], idx, it))
                extra, more = out if isinstance(out, tuple) else (out, {})
                loss = loss + extra
                logs.update({"extra_loss": float(extra.detach()), **{k: float(v) for k, v in more.items()}})
            return loss, logs

        steps_log: list[dict[str, float]] = []
        fit(policy, None, loss_fn, sample_batch=batch, steps=per_pass * updates_per_iteration,
            optimizer=lambda _params: opt, grad_clip=grad_clip, seed=seed + it, desc=f"{desc} iteration {it}",
            progress=False, callback=lambda s: steps_log.append({"loss": s.loss, "grad_norm": s.grad_norm
                                                                  if s.grad_norm is not None else math.nan,
                                                                  **s.extras}))
        r = ro.rewards.float().view(-1, group_size)
        row = {"iteration": float(it), "reward_mean": float(r.mean()),
               "reward_std": float(r.std()) if r.numel() > 1 else 0.0,
               "zero_variance_groups": float((r.std(1) == 0).float().mean()) if group_size > 1 else 0.0,
               "action_tokens": float(mask.sum(1).mean()),
               "logp_action_mean": float((old * mask).sum() / mask.sum().clamp_min(1.0)),
               "grad_norm_max": max((s["grad_norm"] for s in steps_log), default=math.nan)}
        for key in steps_log[0] if steps_log else ():
            if key not in ("grad_norm",):
                row[key] = sum(s.get(key, 0.0) for s in steps_log) / len(steps_log)
        if callback is not None:
            callback(it, row, ro)
        history.append(row)
    policy.eval()
    return GRPOResult(history, ro)
