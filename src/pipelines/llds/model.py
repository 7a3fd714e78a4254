"""The policy (core's tiny causal transformer), the GRPO objective (PPO-clip + entropy bonus + k3 KL to
the reference) and the LLDS regulariser with its action-level (A-gate) and response-level (R-gate) gates,
the LLDS-MA answer-token down-weighting, and the ungated NLL-on-positives baseline."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelines.core.api import k3_kl, masked_mean, ppo_clip_loss, token_entropy


def make_policy(vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int):
    from pipelines.core.api import TinyConfig, TinyTransformer

    return TinyTransformer(
        TinyConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_len=max(seq_len, 8))
    )


def token_logprobs(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(ids[:, t+1] | ids[:, :t+1]) [B, L−1] and the logits [B, L−1, V] (for the entropy), on the
    model's device."""
    ids = ids.to(next(model.parameters()).device)
    logits = model(ids[:, :-1])
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp, logits


def run_ids(mask: torch.Tensor) -> torch.Tensor:
    """Contiguous runs of True in each row of ``mask`` [B, T], numbered 1, 2, ... per row (0 outside):
    the actions between tool observations."""
    m = mask.long()
    starts = m * (1 - torch.nn.functional.pad(m, (1, 0))[:, :-1])
    return starts.cumsum(1) * m


def llds_penalty(
    logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, gate: str = "action"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token LLDS penalty p_t = gate · max(0, d_t), d_t = log π_old(y_t) − log π_θ(y_t) (π_old
    detached), on the preserving set (responses with A ≥ 0, loss-masked tokens only).

    ``gate="action"`` (A-gate): a contiguous run of preserving tokens (an action) is displaced when the
    sum of d_t over it is > 0; ``gate="response"`` (R-gate): the whole response when the sum over its
    preserving tokens is > 0. Returns (p [B, T], the gate [B, T] as bool)."""
    d = logp_old.detach() - logp
    keep = mask.bool() & (adv >= 0)[:, None]
    dz = torch.where(keep, d.detach(), torch.zeros_like(d))
    if gate == "action":
        runs = run_ids(keep)  # [B, T]
        B, T = runs.shape
        idx = runs + (T + 1) * torch.arange(B, device=runs.device)[:, None]
        sums = torch.zeros(B * (T + 1), dtype=dz.dtype, device=dz.device).index_add_(0, idx.reshape(-1), dz.reshape(-1))
        on = (sums[idx] > 0) & keep
    elif gate == "response":
        on = (dz.sum(1, keepdim=True) > 0) & keep
    else:
        raise ValueError(f"unknown LLDS gate {gate!r} (action or response)")
    return on * torch.clamp(d, min=0), on


@dataclass(frozen=True)
class LossSpec:
    """What one variant adds to GRPO."""

    clip: float = 0.2
    entropy_coef: float = 0.001
    kl_coef: float = 0.001
    llds_lambda: float = 0.0  # 0: no LLDS
    llds_gate: str = "action"
    answer_coef: float | None = None  # LLDS-MA: coefficient on answer tokens (≤ λ)
    nll_coef: float = 0.0  # GRPO + NLL on A > 0 responses (ungated)


def grpo_loss(model, ids, mask, ans_mask, adv, logp_old, logp_ref, spec: LossSpec, ma_scale: float = 1.0):
    """:func:`grpo_objective` on one explicit batch (``mask`` [B, L] marks the action tokens)."""
    from pipelines.core.api import GRPOBatch

    logp, logits = token_logprobs(model, ids)
    return grpo_objective(
        GRPOBatch(
            model=model,
            ids=ids,
            mask=mask[:, 1:].float(),
            logp=logp,
            logits=logits,
            logp_old=logp_old,
            logp_ref=logp_ref,
            advantages=adv,
            rewards=torch.zeros_like(adv),
            extras={"ans_mask": ans_mask},
            stats={"ma_scale": ma_scale},
            index=torch.arange(len(ids)),
            iteration=0,
        ),
        spec,
    )


def grpo_objective(b, spec: LossSpec):
    """The objective of ``core.rl.grpo_train`` for one minibatch ``b`` (a ``GRPOBatch``): PPO-clip − c_H·H +
    LLDS + c_KL·KL_ref (+ NLL on positives), token means over the minibatch's response tokens. Returns
    (loss, diagnostics)."""
    m, logp, logp_old, adv = b.mask, b.logp, b.logp_old, b.advantages
    pg, diag = ppo_clip_loss(logp, logp_old, adv, m, spec.clip)
    ent = token_entropy(b.logits)
    loss = pg - spec.entropy_coef * masked_mean(ent, m)
    kl = masked_mean(k3_kl(logp, b.logp_ref).clamp(-10, 10), m)
    loss = loss + spec.kl_coef * kl
    # how often LLDS would fire (logged for every variant; only LLDS variants add the term)
    with torch.no_grad():
        p_a, on_a = llds_penalty(logp, logp_old, adv, m, "action")
    extras = {
        "pg": pg.item(),
        "entropy": float(masked_mean(ent.detach(), m)),
        "kl": kl.item(),
        "lld_active_frac": float(masked_mean((p_a > 0).float(), m)),
        **diag,
    }
    if spec.llds_lambda > 0:
        p, on = llds_penalty(logp, logp_old, adv, m, spec.llds_gate)
        coef = torch.full_like(p, spec.llds_lambda)
        if spec.answer_coef is not None:
            coef = torch.where(
                b.extras["ans_mask"][:, 1:], min(spec.answer_coef, spec.llds_lambda) * b.stats["ma_scale"], coef
            )
        reg = masked_mean(coef * p, m)
        loss = loss + reg
        extras.update(llds=reg.item(), llds_active_frac=float(masked_mean((p > 0).float(), m)))
    if spec.nll_coef > 0:
        pos = (adv > 0)[:, None] & m.bool()
        nll = masked_mean(-logp * pos, m)
        loss = loss + spec.nll_coef * nll
        extras["nll"] = nll.item()
    return loss, extras
