"""Policy-gradient pieces shared by the RL post-training methods (GRPO and relatives): group-normalised
advantages, the PPO-clip surrogate over masked tokens, the k3 ("low-variance") KL estimate, the entropy
of a categorical policy, and the GRPO loop itself.

The loop (``grpo_train``) owns what every GRPO-style method repeats — one rollout per iteration, the
sampling policy's and the reference's log-probs, group advantages, shuffled minibatch passes, all inside ONE
``core.training.fit`` run (one optimizer, schedule, clipping, NaN guard, progress), and one statistics row
per iteration — and leaves the rest to the method:
  - the environment: ``rollout_fn(policy, iteration, generator)`` returns ``Rollouts`` (sequences, which
    tokens are the policy's actions, rewards, per-row extras, per-iteration stats), so single-turn sampling
    (``sample_rollouts``) and multi-turn tool use (tool output masked out) plug in the same way;
  - the objective: ``objective(batch: GRPOBatch)`` (default ``ppo_objective``: PPO-clip + k3 KL to the
    reference); a regulariser wraps it, a different RL objective replaces it;
  - the log-probs: ``logprob_fn(model, ids)`` → logp [B, T-1] or (logp, logits) (default: the causal
    LM's token log-probs and its logits), e.g. a tempered or vocabulary-restricted sampling distribution."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "GRPOBatch",
    "GRPOResult",
    "Rollouts",
    "group_advantages",
    "grpo_train",
    "k3_kl",
    "masked_mean",
    "ppo_clip_loss",
    "ppo_objective",
    "sample_rollouts",
    "token_entropy",
    "token_logprobs",
]


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None, dim=None) -> torch.Tensor:
    """The mean of ``x`` over the positions where ``mask`` is non-zero (a bool mask, or weights). Masked
    positions are selected away (``torch.where``), not multiplied by 0: a NaN or inf there (the log-prob of
    a −inf-masked token, padding) stays out of the value and of the gradient of ``x``."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    m = mask.to(x.dtype)
    xm = torch.where(m != 0, x * m, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return xm.sum() / m.sum().clamp_min(1.0)
    return xm.sum(dim) / m.sum(dim).clamp_min(1.0)


def _masked_to_zero(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x`` with the masked-out positions replaced by 0 before any arithmetic, so that a −inf there
    gives neither NaN (−inf − (−inf)) nor a NaN gradient (0 · inf) through the ops that follow."""
    if mask is None:
        return x
    return torch.where(mask.expand_as(x) != 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """GRPO's A = (r − mean_group) / (std_group + eps) for rewards [n_groups · group_size] laid out group
    after group (the unbiased std, as GRPO implementations use; ``scale=False`` gives r − mean only)."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, got shape {tuple(rewards.shape)}"
        )
    if group_size < 2 and scale:
        raise ValueError("group_size must be ≥ 2 to scale advantages by the group's std")
    r = rewards.float().view(-1, group_size)
    a = r - r.mean(1, keepdim=True)
    if scale:
        a = a / (r.std(1, keepdim=True) + eps)
    return a.view(-1)


def ppo_clip_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip: float = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """−E[min(ρ·A, clip(ρ, 1−ε, 1+ε)·A)] over the masked tokens (token-mean over the batch), ρ = exp(logp −
    logp_old). ``advantages`` is per sequence [B] (broadcast to tokens) or per token [B, T]. Returns the
    loss and diagnostics (clipped fraction, mean ratio)."""
    if advantages.ndim == 1:
        advantages = advantages[:, None].expand_as(logp)
    logp, logp_old = _masked_to_zero(logp, mask), _masked_to_zero(logp_old, mask)
    advantages = _masked_to_zero(advantages, mask)
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
    """Entropy of the categorical policy at each position, from logits [..., V]. A −inf logit (a masked
    token) has probability 0 and adds 0 (the limit p·log p → 0), not 0 · (−inf) = NaN, to the value or
    the gradient."""
    logp = torch.log_softmax(logits.float(), -1)
    p = logp.exp()
    safe = torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return -(p * safe).sum(-1)


@dataclass
class Rollouts:
    """One iteration's samples, ``n_groups · group_size`` rows laid out group after group.

    ``ids`` [N, T] whole sequences (prompt, response, tool output, padding); ``action_mask`` [N, T] True
    where the token was produced by the policy (scored by the loss; prompt, tool output and padding are
    False); ``rewards`` [N]. Optional: ``advantages`` [N] (default: ``group_advantages(rewards)``),
    ``logp_old`` [N, T-1] (the sampler's own log-probs, e.g. from a cached decode; default: recomputed
    with ``logprob_fn`` before the updates), ``extras`` per-row tensors [N, ...] sliced into each minibatch
    (the objective's own inputs), ``stats`` per-iteration numbers copied into the history row, ``order``
    the rows' minibatch order for each pass ([N] or [passes, N]; default: shuffled by the loop's generator
    — a method that draws its own per-iteration stream, e.g. to give every variant the same minibatches,
    passes it here)."""

    ids: torch.Tensor
    action_mask: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor | None = None
    logp_old: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    order: torch.Tensor | None = None

    def __post_init__(self):
        n = self.ids.shape[0]
        if self.action_mask.shape != self.ids.shape:
            raise ValueError(
                f"Rollouts: action_mask shape {tuple(self.action_mask.shape)} != ids shape {tuple(self.ids.shape)}"
            )
        for name in ("rewards", "advantages"):
            t = getattr(self, name)
            if t is not None and t.shape != (n,):
                raise ValueError(f"Rollouts: {name} must have shape ({n},), got {tuple(t.shape)}")
            if t is not None and not torch.isfinite(t.float()).all():
                raise ValueError(f"Rollouts: non-finite {name[:-1]}")
        bad = [k for k, t in self.extras.items() if t.shape[0] != n]
        if bad:
            raise ValueError(f"Rollouts: extras {bad} do not have {n} rows")
        if self.order is not None:
            rows = self.order.view(-1, n) if self.order.numel() % n == 0 and self.order.numel() else None
            if rows is None or not all(bool((r.sort().values == torch.arange(n, device=r.device)).all()) for r in rows):
                raise ValueError(f"Rollouts: order must be one or more permutations of the {n} rows")


@dataclass
class GRPOBatch:
    """What the objective sees for one minibatch. Token tensors are [b, T-1], aligned with
    ``sequence_logprobs`` (position t scores ids[:, t+1]); ``mask`` is 1.0 on action tokens."""

    model: torch.nn.Module
    ids: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor  # current policy via logprob_fn, differentiable
    logits: torch.Tensor | None  # [b, T-1, V] behind logp (entropy bonuses); None if logprob_fn gives none
    logp_old: torch.Tensor | None  # the sampling policy's (no grad); None with old_logprobs=False
    logp_ref: torch.Tensor | None  # the reference policy's (no grad); None without ref_policy
    advantages: torch.Tensor  # [b]
    rewards: torch.Tensor  # [b]
    extras: dict[str, torch.Tensor]  # the Rollouts' extras, these rows
    stats: dict[str, float]  # the Rollouts' per-iteration stats
    index: torch.Tensor  # rows of this minibatch in the iteration's Rollouts
    iteration: int


@dataclass
class GRPOResult:
    history: list[dict[str, float]]  # one row per iteration (see grpo_train)
    last_rollouts: Rollouts | None = None


def ppo_objective(b: GRPOBatch, clip: float = 0.2, kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's default objective: masked PPO-clip on the sequence advantages + kl_coef · k3-KL to the reference."""
    if b.logp_old is None:
        raise ValueError("ppo_objective needs the sampling policy's log-probs (old_logprobs=True)")
    loss, logs = ppo_clip_loss(b.logp, b.logp_old, b.advantages, b.mask, clip)
    logs = {"pg_loss": float(loss.detach()), **logs}
    if b.logits is not None:
        with torch.no_grad():
            logs["entropy"] = float(masked_mean(token_entropy(b.logits), b.mask))
    if kl_coef:
        if b.logp_ref is None:
            raise ValueError("ppo_objective: kl_coef > 0 needs a ref_policy")
        kl = masked_mean(k3_kl(_masked_to_zero(b.logp, b.mask), _masked_to_zero(b.logp_ref, b.mask)), b.mask)
        loss = loss + kl_coef * kl
        logs["kl_ref"] = float(kl.detach())
    return loss, logs


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal LM's log p(ids[:, t+1] | ids[:, :t+1]) [B, T-1] and the logits behind them [B, T-1, V]
    (``grpo_train``'s default ``logprob_fn``; equals ``core.seqmodels.sequence_logprobs``)."""
    logits = model(ids[:, :-1])
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0], logits


def sample_rollouts(
    policy: torch.nn.Module,
    prompts: torch.Tensor,
    group_size: int,
    reward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    max_new_tokens: int,
    eos_id: int | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Rollouts:
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
        if eos_id is not None:  # tokens after the first EOS are padding
            is_eos = (resp == eos_id).long()
            act = (is_eos.cumsum(1) - is_eos) == 0
        mask[:, t0:] = act
    rewards = torch.as_tensor(reward_fn(rep, resp), dtype=torch.float32).reshape(-1)
    return Rollouts(out, mask, rewards)


def grpo_train(
    policy: torch.nn.Module,
    rollout_fn: Callable[[torch.nn.Module, int, torch.Generator], Rollouts],
    *,
    iterations: int,
    group_size: int,
    objective: Callable[[GRPOBatch], Any] | None = None,
    clip: float = 0.2,
    kl_coef: float = 0.0,
    ref_policy: torch.nn.Module | None = None,
    logprob_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None,
    old_logprobs: bool = True,
    updates_per_iteration: int = 1,
    minibatches: int = 1,
    lr: float = 1e-5,
    optimizer: str | Callable = "adamw",
    weight_decay: float = 0.0,
    scheduler: str | Callable | None = None,
    grad_clip: float | None = 1.0,
    adv_eps: float = 1e-6,
    callback: Callable[[int, dict[str, float], Rollouts], None] | None = None,
    seed: int = 0,
    desc: str = "grpo",
    progress: bool | None = None,
) -> GRPOResult:
    """GRPO-style RL through ONE ``core.training.fit`` run of ``iterations × updates_per_iteration ×
    minibatches`` steps. At each iteration's first step: ``rollout_fn(policy, it, generator)`` with the
    policy in eval mode and no grad (the generator is fit's, seeded by ``seed``); the sampling policy's
    log-probs (unless the rollouts carry them, or ``old_logprobs=False`` for an objective that never reads
    them) and the reference's (with ``ref_policy``); advantages (``group_advantages(rewards, group_size,
    adv_eps)`` unless given). Then ``updates_per_iteration`` passes over ``minibatches`` shuffled
    minibatches (one minibatch, one pass: no shuffle, no draw from the generator), each minimising
    ``objective(GRPOBatch)`` (default ``ppo_objective(b, clip, kl_coef)``), which returns a loss or
    ``(loss, {name: value})``.

    One history row per iteration: ``iteration``, ``reward_mean``/``reward_std``, ``zero_variance_groups``
    (groups without signal), ``action_tokens`` (mean per row), the rollouts' ``stats``, the mean of the
    objective's logs and of ``loss`` over the iteration's steps, and ``grad_norm``/``grad_norm_max`` (before
    clipping; only with ``grad_clip``). ``callback(it, row, rollouts)`` may add to the row before it is
    stored (e.g. evaluations)."""
    from pipelines.core.training import fit

    if iterations < 1 or group_size < 1 or updates_per_iteration < 1 or minibatches < 1:
        raise ValueError("grpo_train: iterations, group_size, updates_per_iteration and minibatches must be ≥ 1")
    if kl_coef and ref_policy is None:
        raise ValueError("grpo_train: kl_coef > 0 needs a ref_policy")
    logprob_fn = logprob_fn or token_logprobs

    def logprobs(model, ids):
        out = logprob_fn(model, ids)
        return out if isinstance(out, tuple) else (out, None)

    objective = objective or (lambda b: ppo_objective(b, clip, kl_coef))
    per_iter = updates_per_iteration * minibatches
    history: list[dict[str, float]] = []
    cur: dict[str, Any] = {}
    steps: list[dict[str, float]] = []

    def close_iteration() -> None:
        if not cur:
            return
        ro, it = cur["ro"], cur["it"]
        r = ro.rewards.float().view(-1, group_size)
        row = {
            "iteration": float(it),
            "reward_mean": float(r.mean()),
            "reward_std": float(r.std()) if r.numel() > 1 else 0.0,
            "zero_variance_groups": float((r.std(1) == 0).float().mean()) if group_size > 1 else 0.0,
            "action_tokens": float(cur["mask"].sum(1).mean()),
            **ro.stats,
        }
        for key in dict.fromkeys(k for s in steps for k in s):
            vals = [s[key] for s in steps if key in s and math.isfinite(s[key])]
            row[key] = sum(vals) / len(vals) if vals else math.nan
        norms = [s["grad_norm"] for s in steps if "grad_norm" in s]
        if norms:
            row["grad_norm_max"] = max(norms)
        if callback is not None:
            callback(it, row, ro)
        history.append(row)
        steps.clear()

    def sample_batch(step: int, gen: torch.Generator):
        it, k = divmod(step, per_iter)
        if k == 0:
            close_iteration()
            policy.eval()
            with torch.no_grad():
                ro = rollout_fn(policy, it, gen)
                n = ro.ids.shape[0]
                if n % group_size:
                    raise ValueError(f"grpo_train: {n} rollouts is not a multiple of group_size={group_size}")
                if n < minibatches:
                    raise ValueError(f"grpo_train: {n} rollouts cannot make {minibatches} minibatches")
                old = (
                    ro.logp_old if ro.logp_old is not None else (logprobs(policy, ro.ids)[0] if old_logprobs else None)
                )
                ref = logprobs(ref_policy, ro.ids)[0] if ref_policy is not None else None
            policy.train()
            adv = (
                ro.advantages
                if ro.advantages is not None
                else (
                    group_advantages(ro.rewards, group_size, eps=adv_eps)
                    if group_size > 1
                    else ro.rewards.float() - ro.rewards.float().mean()
                )
            )
            if ro.order is not None:
                order = ro.order.view(-1, n)
                if order.shape[0] not in (1, updates_per_iteration):
                    raise ValueError(
                        f"grpo_train: Rollouts.order has {order.shape[0]} passes, "
                        f"updates_per_iteration={updates_per_iteration}"
                    )
                order = order.expand(updates_per_iteration, n)
            elif per_iter == 1:
                order = torch.arange(n)[None]
            else:
                order = torch.stack([torch.randperm(n, generator=gen) for _ in range(updates_per_iteration)])
            cur.clear()
            cur.update(
                ro=ro, it=it, old=old, ref=ref, adv=adv, order=order, mask=ro.action_mask[:, 1:].to(torch.float32)
            )
        pas, mb = divmod(k, minibatches)
        return (cur["order"][pas].tensor_split(minibatches)[mb],)

    def loss_fn(model, idx):
        ro = cur["ro"]
        ids = ro.ids[idx]
        lp, logits = logprobs(model, ids)
        b = GRPOBatch(
            model=model,
            ids=ids,
            mask=cur["mask"][idx],
            logp=lp,
            logits=logits,
            logp_old=None if cur["old"] is None else cur["old"][idx],
            logp_ref=None if cur["ref"] is None else cur["ref"][idx],
            advantages=cur["adv"][idx],
            rewards=ro.rewards[idx],
            extras={k: v[idx] for k, v in ro.extras.items()},
            stats=ro.stats,
            index=idx,
            iteration=cur["it"],
        )
        return objective(b)

    def on_step(s) -> None:
        steps.append({"loss": s.loss, **s.extras, **({"grad_norm": s.grad_norm} if s.grad_norm is not None else {})})

    fit(
        policy,
        None,
        loss_fn,
        sample_batch=sample_batch,
        steps=iterations * per_iter,
        lr=lr,
        optimizer=optimizer,
        weight_decay=weight_decay,
        scheduler=scheduler,
        grad_clip=grad_clip,
        seed=seed,
        desc=desc,
        progress=progress,
        callback=on_step,
    )
    close_iteration()
    return GRPOResult(history, cur.get("ro"))
