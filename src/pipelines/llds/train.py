"""Training: the shared SFT warm start (``train.base``: core's loop on gold trajectories, then the fixed
probe set sampled from the SFT policy), and one GRPO run per (variant, seed) (``train.<variant>``): a
rollout batch of questions × G, 4 PPO mini-batch updates per batch on core's GRPO loop (``core.rl.grpo_train``,
one ``fit`` step per update), with greedy test EM and probe likelihoods every ``eval_every`` iterations."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import Rollouts, fit, group_advantages, grpo_train, node_setup, to_cpu
from pipelines.llds.data import draw_episodes, env_from_dict
from pipelines.llds.env import rollout
from pipelines.llds.model import LossSpec, grpo_objective, make_policy, token_logprobs
from pipelines.llds.params import Params


def policy_for(spec: dict, p: Params):
    env = env_from_dict(spec)
    return make_policy(env.vocab_size, env.seq_len, p.model.d_model, p.model.n_layers, p.model.n_heads)


def _masked_nll(model, ids, mask):
    lp, _ = token_logprobs(model, ids)
    m = mask[:, 1:].float().to(lp.device)
    return -(lp * m).sum() / m.sum().clamp_min(1.0)


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def greedy_em(model, spec: dict, test: dict, p: Params) -> dict[str, float]:
    """Greedy exact match per question type on the fixed test episodes (the tool's draws seeded too)."""
    env = env_from_dict(spec)
    b = rollout(model, env, test, torch.Generator().manual_seed(p.data.eval_seed + 1), temperature=0.0)
    out = {}
    for k, name in enumerate(env.qtype_names):
        rows = test["qtype"] == k
        out[f"test_em_{name}"] = float(b.reward[rows].mean()) if rows.any() else math.nan
    out["test_em"] = float(np.nanmean([out[f"test_em_{n}"] for n in env.qtype_names]))
    out["test_searches_per_answer"] = float(b.n_search[b.answered].float().mean()) if b.answered.any() else 0.0
    return out


@torch.no_grad()
def probe_logps(model, probe: dict) -> dict[str, float]:
    """Mean per-token log-likelihood of the fixed probe trajectories' action tokens, split by correctness
    (the LLD signal)."""
    lp = token_logprobs(model, probe["ids"])[0].cpu()
    m = probe["mask"][:, 1:].float()
    out = {}
    for name, rows in (("correct", probe["reward"] > 0), ("incorrect", probe["reward"] <= 0)):
        mm = m[rows]
        out[f"logp_{name}_mean"] = float((lp[rows] * mm).sum() / mm.sum()) if mm.sum() > 0 else math.nan
    return out


# ------------------------------------------------------------------------------------------ SFT
def train_base(spec: dict, sft: dict, test: dict, p: Params) -> tuple[dict, dict, dict]:
    """train.base: SFT on the gold trajectories (one fresh batch per step, AdamW one-cycle), then the
    probe set (``n_probe`` trajectories sampled at T=1 from the SFT policy) and the init's sampled reward,
    which decides the regime (weak init: LLD at high lr)."""
    device = node_setup(p, p.sft.seed)
    model = policy_for(spec, p).to(device)
    bs = p.sft.batch_size
    losses: list[float] = []
    fit(
        model,
        None,
        _masked_nll,
        steps=p.sft.steps,
        lr=p.sft.lr,
        optimizer="adamw",
        weight_decay=0.0,
        scheduler="onecycle",
        seed=p.sft.seed,
        desc="llds.base",
        sample_batch=lambda i, g: (sft["ids"][i * bs : (i + 1) * bs], sft["mask"][i * bs : (i + 1) * bs]),
        callback=lambda s: losses.append(s.loss),
        grad_clip=1.0,
    )
    env = env_from_dict(spec)
    g = torch.Generator().manual_seed(p.data.eval_seed + 2)
    probe_b = rollout(model, env, draw_episodes(spec, p.data.n_probe, g), g, temperature=p.rl.temperature)
    probe = {"ids": probe_b.ids, "mask": probe_b.mask, "reward": probe_b.reward, "qtype": probe_b.qtype}
    g = torch.Generator().manual_seed(p.data.eval_seed + 3)
    sampled = rollout(model, env, test, g, temperature=p.rl.temperature)
    info = {
        "sft_loss": losses,
        "sft_sampled_reward": float(sampled.reward.mean()),
        "sft_probe_reward": float(probe_b.reward.mean()),
        **greedy_em(model, spec, test, p),
        **probe_logps(model, probe),
    }
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return to_cpu(state), to_cpu(probe), info


# ------------------------------------------------------------------------------------------ GRPO
def loss_spec(variant: str, p: Params) -> LossSpec:
    r, lam = p.rl, p.llds.lam
    base = dict(clip=r.clip, entropy_coef=r.entropy_coef, kl_coef=r.kl_coef)
    specs = {
        "grpo": LossSpec(**base),
        "grpo_hilr": LossSpec(**base),
        "grpo_kl": LossSpec(**{**base, "kl_coef": r.strong_kl_coef}),
        "llds": LossSpec(**base, llds_lambda=lam, llds_gate="action"),
        "llds_hilr": LossSpec(**base, llds_lambda=lam, llds_gate="action"),
        "llds_rgate": LossSpec(**base, llds_lambda=lam, llds_gate="response"),
        "llds_ma": LossSpec(**base, llds_lambda=lam, llds_gate="action", answer_coef=p.llds.ma_weight),
        "nll_pos": LossSpec(**base, nll_coef=r.nll_coef),
    }
    if variant not in specs:
        raise ValueError(f"unknown variant {variant!r}")
    return specs[variant]


def collapse_iteration(evals: list[tuple[int, float]], drop: float, min_max: float) -> int | None:
    """First evaluated iteration whose greedy EM is below ``drop`` × its running max, once that max is ≥
    ``min_max``; None if it never happens."""
    best = -math.inf
    for it, em in evals:
        best = max(best, em)
        if best >= min_max and em < drop * best:
            return it
    return None


def run_grpo(spec: dict, test: dict, base_state: dict, probe: dict, p: Params, variant: str, seed: int) -> pd.DataFrame:
    """One GRPO run on core's loop (``core.rl.grpo_train``): a row per iteration (rollout and update
    diagnostics) with the evaluations on the iterations that have them (NaN elsewhere)."""
    node_setup(p, seed)
    env = env_from_dict(spec)
    model = policy_for(spec, p)
    model.load_state_dict(base_state)
    ref = copy.deepcopy(model).eval()
    for q in ref.parameters():
        q.requires_grad_(False)
    r = p.rl
    ls = loss_spec(variant, p)
    lr = r.high_lr if variant.endswith("_hilr") else r.lr
    iterations = r.hilr_iterations if variant.endswith("_hilr") else r.iterations
    n = r.questions * r.group_size

    def rollout_fn(policy, it: int, _gen: torch.Generator) -> Rollouts:
        stats = {**greedy_em(policy, spec, test, p), **probe_logps(policy, probe)} if it % r.eval_every == 0 else {}
        # identical questions, KBs and first draws for every variant of this seed
        g = torch.Generator().manual_seed(1_000_003 * (seed + 1) + it)
        ep = draw_episodes(spec, r.questions, g)
        ep = {key: v.repeat_interleave(r.group_size, 0) for key, v in ep.items()}
        b = rollout(policy, env, ep, g, r.temperature)
        adv = group_advantages(b.reward, r.group_size)
        m = b.mask[:, 1:].float()
        ok = b.reward > 0
        stats.update(
            train_reward=float(b.reward.mean()),
            onpolicy_logp_correct=float((b.logp[ok] * m[ok]).sum() / m[ok].sum()) if ok.any() else math.nan,
            onpolicy_logp=float((b.logp * m).sum() / m.sum()),
            searches_per_answer=float(b.n_search[b.answered].float().mean()) if b.answered.any() else 0.0,
            answered_frac=float(b.answered.float().mean()),
            zero_adv_frac=float((adv == 0).float().mean()),
            ma_scale=max(float(b.n_search[b.answered].float().mean()) - 1, 0.0)
            if (p.llds.ma_adaptive and b.answered.any())
            else 1.0,
        )
        # π_old: the sampling policy's own log-probs (the cached decode)
        return Rollouts(
            b.ids,
            b.mask,
            b.reward,
            advantages=adv,
            logp_old=b.logp,
            extras={"ans_mask": b.ans_mask},
            stats=stats,
            order=torch.randperm(n, generator=g),
        )

    res = grpo_train(
        model,
        rollout_fn,
        iterations=iterations,
        group_size=r.group_size,
        minibatches=r.minibatches,
        objective=lambda bt: grpo_objective(bt, ls),
        ref_policy=ref,
        logprob_fn=token_logprobs,
        optimizer=lambda params: torch.optim.Adam(params, lr=lr, eps=r.adam_eps),
        grad_clip=r.grad_clip,
        seed=seed,
        desc=f"llds.{variant}[{seed}]",
    )
    rows = [{k: v for k, v in row.items() if k not in ("ma_scale",)} for row in res.history]
    rows.append({"iteration": iterations, **greedy_em(model, spec, test, p), **probe_logps(model, probe)})
    out = pd.DataFrame(rows)
    out["iteration"] = out["iteration"].astype(int)
    out.insert(0, "seed", seed)
    out.insert(0, "variant", variant)
    return out


def train_variant(spec: dict, test: dict, base_state: dict, probe: dict, p: Params, variant: str) -> pd.DataFrame:
    """train.<variant>: GRPO (+ the variant's term) from the shared SFT policy, on each of its seeds → the
    variant's long table (per-seed summaries, and the per-iteration curves as histories)."""
    from pipelines.core.api import Results
    from pipelines.llds.evaluate import CURVES, summarise

    res = Results(variant)
    for s in p.seeds_for(variant):
        run = run_grpo(spec, test, base_state, probe, p, variant, s)
        res.add(s, **summarise(run, p))
        for c in CURVES:
            if c in run:
                h = run[["iteration", c]].dropna()
                res.history(s, c, h[c].to_numpy(float), h["iteration"])
    return res.table()
