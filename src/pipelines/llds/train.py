"""Training: the shared SFT warm start (``train.base``: core's loop on gold trajectories, then the fixed
probe set sampled from the SFT policy), and one GRPO run per (variant, seed) (``train.<variant>``): a
rollout batch of questions × G, 4 PPO mini-batch updates per batch, each update one step of core's loop,
with greedy test EM and probe likelihoods every ``eval_every`` iterations."""
from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import torch

from pipelines.core.rl import group_advantages
from pipelines.core.runtime import node_setup, to_cpu
from pipelines.core.training import fit
from pipelines.llds.data import draw_episodes, env_from_dict
from pipelines.llds.env import rollout
from pipelines.llds.model import LossSpec, grpo_loss, make_policy, token_logprobs
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
    fit(model, None, _masked_nll, steps=p.sft.steps, lr=p.sft.lr, optimizer="adamw", weight_decay=0.0,
        scheduler="onecycle", seed=p.sft.seed, desc="llds.base",
        sample_batch=lambda i, g: (sft["ids"][i * bs:(i + 1) * bs], sft["mask"][i * bs:(i + 1) * bs]),
        callback=lambda s: losses.append(s.loss))
    env = env_from_dict(spec)
    g = torch.Generator().manual_seed(p.data.eval_seed + 2)
    probe_b = rollout(model, env, draw_episodes(spec, p.data.n_probe, g), g, temperature=p.rl.temperature)
    probe = {"ids": probe_b.ids, "mask": probe_b.mask, "reward": probe_b.reward, "qtype": probe_b.qtype}
    g = torch.Generator().manual_seed(p.data.eval_seed + 3)
    sampled = rollout(model, env, test, g, temperature=p.rl.temperature)
    info = {"sft_loss": losses, "sft_sampled_reward": float(sampled.reward.mean()),
            "sft_probe_reward": float(probe_b.reward.mean()), **greedy_em(model, spec, test, p),
            **probe_logps(model, probe)}
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


def _clipped_adam(lr: float, eps: float, clip: float, norms: list[float]):
    """Adam that clips the global gradient norm itself and records the norm BEFORE clipping (core's loop
    clips before the optimizer sees the gradients, which would hide an explosion)."""

    class ClippedAdam(torch.optim.Adam):
        def step(self, closure=None):
            params = [q for grp in self.param_groups for q in grp["params"] if q.grad is not None]
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
            return super().step(closure)

    return lambda params: ClippedAdam(params, lr=lr, eps=eps)


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
    """One GRPO run: a row per iteration (rollout and update diagnostics) with the evaluations on the
    iterations that have them (NaN elsewhere)."""
    device = node_setup(p, seed)
    env = env_from_dict(spec)
    model = policy_for(spec, p)
    model.load_state_dict(base_state)
    model.to(device)
    ref = copy.deepcopy(model).eval()
    for q in ref.parameters():
        q.requires_grad_(False)
    r = p.rl
    ls = loss_spec(variant, p)
    lr = r.high_lr if variant.endswith("_hilr") else r.lr
    iterations = r.hilr_iterations if variant.endswith("_hilr") else r.iterations
    n = r.questions * r.group_size
    mb = n // r.minibatches
    rows: list[dict] = []
    norms: list[float] = []
    cur: dict = {}

    def evaluate(it: int) -> dict:
        return {**greedy_em(model, spec, test, p), **probe_logps(model, probe)}

    def sample_batch(step: int, _gen: torch.Generator):
        it, k = divmod(step, r.minibatches)
        if k == 0:
            row = {"iteration": it, **(evaluate(it) if it % r.eval_every == 0 else {})}
            # identical questions, KBs and first draws for every variant of this seed
            g = torch.Generator().manual_seed(1_000_003 * (seed + 1) + it)
            ep = draw_episodes(spec, r.questions, g)
            ep = {key: v.repeat_interleave(r.group_size, 0) for key, v in ep.items()}
            b = rollout(model, env, ep, g, r.temperature)
            adv = group_advantages(b.reward, r.group_size)
            lp_old = b.logp       # π_old: the sampling policy's own log-probs (the cached decode)
            with torch.no_grad():
                lp_ref = token_logprobs(ref, b.ids)[0].cpu()
            m = b.mask[:, 1:].float()
            ok = b.reward > 0
            row.update(train_reward=float(b.reward.mean()),
                       onpolicy_logp_correct=float((lp_old[ok] * m[ok]).sum() / m[ok].sum()) if ok.any() else math.nan,
                       onpolicy_logp=float((lp_old * m).sum() / m.sum()),
                       searches_per_answer=float(b.n_search[b.answered].float().mean()) if b.answered.any() else 0.0,
                       answered_frac=float(b.answered.float().mean()),
                       zero_adv_frac=float((adv == 0).float().mean()))
            rows.append(row)
            ma_scale = max(float(b.n_search[b.answered].float().mean()) - 1, 0.0) \
                if (p.llds.ma_adaptive and b.answered.any()) else 1.0
            cur.update(b=b, adv=adv, lp_old=lp_old, lp_ref=lp_ref, perm=torch.randperm(n, generator=g),
                       ma_scale=ma_scale)
        idx = cur["perm"][k * mb:(k + 1) * mb]
        b = cur["b"]
        return b.ids[idx], b.mask[idx], b.ans_mask[idx], cur["adv"][idx], cur["lp_old"][idx], cur["lp_ref"][idx]

    def loss_fn(model_, *batch):
        return grpo_loss(model_, *(t.to(device) for t in batch), ls, cur["ma_scale"])

    upd: list[dict] = []

    def callback(s):
        upd.append({"iteration": s.step // r.minibatches, "grad_norm": norms[-1], **s.extras})

    fit(model, None, loss_fn, steps=iterations * r.minibatches, sample_batch=sample_batch, lr=lr,
        optimizer=_clipped_adam(lr, r.adam_eps, r.grad_clip, norms), grad_clip=None, weight_decay=0.0,
        seed=seed, desc=f"llds.{variant}[{seed}]", callback=callback)
    rows.append({"iteration": iterations, **evaluate(iterations)})
    it_df = pd.DataFrame(rows)
    u = pd.DataFrame(upd)
    agg = u.groupby("iteration").agg(grad_norm=("grad_norm", "mean"), grad_norm_max=("grad_norm", "max"),
                                     **{c: (c, "mean") for c in u.columns if c not in ("iteration", "grad_norm")})
    out = it_df.merge(agg, left_on="iteration", right_index=True, how="left")
    out.insert(0, "seed", seed)
    out.insert(0, "variant", variant)
    return out


def train_variant(spec: dict, test: dict, base_state: dict, probe: dict, p: Params, variant: str) -> pd.DataFrame:
    """train.<variant>: GRPO (+ the variant's term) from the shared SFT policy, on each of its seeds."""
    return pd.concat([run_grpo(spec, test, base_state, probe, p, variant, s) for s in p.seeds_of(variant)],
                     ignore_index=True)
