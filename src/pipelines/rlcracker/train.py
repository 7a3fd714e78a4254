"""Training and attacking: the watermarked generator and the attacker's SFT start (trained once, shared), the
watermarked texts, and one function for every variant (the RLCracker GRPO loop of the paper's §4 / the
repo's ``GRPOTrainer_reph``: sigmoid semantic reward in the group advantage, the token-level distributional
reward r_kl = KL_wm − KL_h from the frozen reference in two contexts, α up-weighting, k3 penalty to the
reference under the watermarked context, and the PPL term; its ablations; and the non-adaptive baselines)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import (
    Rollouts,
    fit,
    group_advantages,
    grpo_train,
    k3_kl,
    masked_mean,
    node_setup,
    sequence_logprobs,
    stream_seed,
)
from pipelines.rlcracker.model import (
    Language,
    completion_logprobs,
    make_model,
    pack,
    pad_batch,
    sample,
    semantic_reward,
    similarity,
    unpack,
)
from pipelines.rlcracker.params import RL_VARIANTS, Params
from pipelines.rlcracker.watermark import Watermark

GEN_TEMPERATURE = 1.0  # the watermarked generator samples its (biased) distribution as it is


def make_watermark(lang: Language, p: Params, scheme: str) -> Watermark:
    w = p.watermark
    return Watermark(scheme, lang.V, lang.text_ids, w.gamma, w.delta, w.key, w.kgw_context)


# ------------------------------------------------------------------------------------ LM training
def _lm_loss(model, ids: torch.Tensor, mask: torch.Tensor):
    logits = model(ids[:, :-1])
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    return masked_mean(ce.view(ids.shape[0], -1), mask[:, 1:])


def _batch(seqs: list[list[int]], starts: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and the mask of the target tokens (from ``starts[i]`` on, pad excluded)."""
    ids = pad_batch(seqs, pad_id)
    pos = torch.arange(ids.shape[1])[None, :]
    mask = (pos >= torch.tensor(starts)[:, None]) & (pos < torch.tensor([len(s) for s in seqs])[:, None])
    return ids, mask


def _fit_lm(model, make_rows, cfg, seed: int, desc: str) -> list[float]:
    losses: list[float] = []

    def sample_batch(step: int, gen: torch.Generator):
        rng = np.random.default_rng([seed, step])
        seqs, starts = make_rows(rng, cfg.batch_size)
        return _batch(seqs, starts, 0)

    fit(
        model,
        None,
        _lm_loss,
        steps=cfg.steps,
        sample_batch=sample_batch,
        lr=cfg.lr,
        optimizer="adamw",
        weight_decay=0.0,
        batch_size=None,
        seed=seed,
        desc=desc,
        scheduler=_cosine,
        callback=lambda s: losses.append(s.loss),
        grad_clip=1.0,
    )
    return losses


def _cosine(opt, total: int, warmup: float = 0.05, min_ratio: float = 0.1):
    """Linear warm-up over ``warmup``·total steps, then cosine decay to ``min_ratio``·lr."""
    warm = max(1, round(warmup * total))
    return torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda i: (
            min(1.0, (i + 1) / warm)
            * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(i, total) / total)))
        ),
    )


def train_generator(lexicon: pd.DataFrame, corpus: pd.DataFrame, p: Params) -> tuple[dict, dict]:
    """train.generator: the LM that answers questions (question → answer), watermarked at sampling time."""
    device = node_setup(p, p.data.seed)
    lang = Language(lexicon, corpus)
    tr = corpus[corpus.split == "train"]
    pairs = [(lang.qa_prompt(q), lang.ids(a) + [lang.eos_id]) for q, a in zip(tr.question, tr.answer)]

    def rows(rng, n):
        pick = rng.integers(len(pairs), size=n)
        return [pairs[i][0] + pairs[i][1] for i in pick], [len(pairs[i][0]) for i in pick]

    model = make_model(lang.V, p.model).to(device)
    losses = _fit_lm(model, rows, p.generator, p.data.seed, "rlcracker.generator")
    return pack(model), {"loss": losses}


def train_attacker_sft(lexicon: pd.DataFrame, corpus: pd.DataFrame, p: Params) -> tuple[dict, dict]:
    """train.attacker_sft: the attacker's starting point (the paper's instruct LLM), trained from scratch on
    human data only: ``[Q] question → answer`` and ``[P] text → paraphrase`` (same concepts; the source
    synonym kept with prob copy_prob, else the human choice)."""
    device = node_setup(p, p.data.seed + 1)
    lang = Language(lexicon, corpus)
    tr = corpus[corpus.split == "train"]
    qs = [lang.qa_prompt(q) for q in tr.question]
    ans = [lang.ids(a) for a in tr.answer]
    a = p.attacker

    def rows(rng, n):
        seqs, starts = [], []
        for i in rng.integers(len(ans), size=n):
            if rng.random() < a.paraphrase_fraction:
                prompt = lang.para_prompt(ans[i])
                tgt = lang.paraphrase(ans[i], a.copy_prob, rng)
            else:
                prompt, tgt = qs[i], ans[i]
            seqs.append(prompt + tgt + [lang.eos_id])
            starts.append(len(prompt))
        return seqs, starts

    model = make_model(lang.V, p.model).to(device)
    losses = _fit_lm(model, rows, a, p.data.seed + 1, "rlcracker.attacker_sft")
    return pack(model), {"loss": losses}


# ------------------------------------------------------------------------------------ watermarked texts
def _sliding_question(question: str, prev_chunk: list[str]) -> str:
    """The next chunk's question: the original one with its last two words replaced by the previous chunk's
    last two (the generator continues the text from there)."""
    q = question.split()
    keep = max(0, len(q) - 2)
    return " ".join(q[:keep] + prev_chunk[-2:])


def _generate_texts(
    model,
    lang: Language,
    questions: list[str],
    n_chunks: int,
    n_new: int,
    wm: Watermark | None,
    gen: torch.Generator,
    batch: int,
) -> tuple[list[list[str]], list[list[str]]]:
    chunks: list[list[list[int]]] = [[] for _ in questions]
    qs: list[list[str]] = [[q] for q in questions]
    for k in range(n_chunks):
        if k:
            for i in range(len(questions)):
                qs[i].append(_sliding_question(questions[i], [lang.tok.itos[t] for t in chunks[i][-1]]))
        prompts = [lang.qa_prompt(q[k]) for q in qs]
        hist = [[t for c in ch for t in c] for ch in chunks]
        out = sample(
            model,
            prompts,
            n_new,
            temperature=GEN_TEMPERATURE,
            gen=gen,
            allowed=lang.allowed_text,
            watermark=wm,
            histories=hist,
            batch_size=batch,
        )
        for i, o in enumerate(out):
            chunks[i].append(o)
    return qs, [[lang.text(c) for c in ch] for ch in chunks]


def watermark_texts(lexicon: pd.DataFrame, corpus: pd.DataFrame, generator: dict, p: Params) -> pd.DataFrame:
    """data.watermark: the generator's watermarked answers (train and test, short = one chunk, long =
    ``long_chunks`` chunks with a sliding context) for each scheme, and unwatermarked ones (null texts for
    the calibrated threshold and the FPR)."""
    device = node_setup(p, p.data.seed + 2)
    lang = Language(lexicon, corpus)
    model = unpack(generator, device)
    d = p.data
    gen = torch.Generator().manual_seed(p.data.seed + 2)
    train_q = corpus[corpus.split == "wm_train"].question.tolist()
    test_q = corpus[corpus.split == "test"].question.tolist()[: d.n_test]
    null_q = [test_q[i % len(test_q)] for i in range(d.n_null)]
    schemes = list(dict.fromkeys([p.watermark.train_scheme, *p.watermark.eval_schemes]))
    rows = []

    def add(scheme, split, qs, texts, n_chunks, watermarked):
        for i, (q, t) in enumerate(zip(qs, texts)):
            rows.append(
                {
                    "scheme": scheme,
                    "split": split,
                    "n_chunks": n_chunks,
                    "text_id": i,
                    "watermarked": watermarked,
                    "questions": list(q),
                    "chunks": list(t),
                }
            )

    n_new = d.answer_len
    for length in (1, d.long_chunks):
        qs, texts = _generate_texts(model, lang, null_q, length, n_new, None, gen, p.eval.batch_size)
        for scheme in schemes:
            add(scheme, "null", qs, texts, length, False)
    for scheme in schemes:
        wm = make_watermark(lang, p, scheme)
        if scheme == p.watermark.train_scheme:
            qs, texts = _generate_texts(model, lang, train_q, 1, n_new, wm, gen, p.eval.batch_size)
            add(scheme, "wm_train", qs, texts, 1, True)
        for length in dict.fromkeys((1, d.long_chunks)):
            qs, texts = _generate_texts(model, lang, test_q, length, n_new, wm, gen, p.eval.batch_size)
            add(scheme, "test", qs, texts, length, True)
    df = pd.DataFrame(rows)
    df["n_tokens"] = [sum(len(c.split()) for c in ch) for ch in df["chunks"]]
    zs = []
    for scheme, g in df.groupby("scheme", sort=False):
        wm = make_watermark(lang, p, scheme)
        zs.append(pd.Series([wm.z(lang.ids(" ".join(ch))) for ch in g["chunks"]], index=g.index))
    df["z"] = pd.concat(zs)
    return df


# ------------------------------------------------------------------------------------ RL (RLCracker)
def _aligned(lp: torch.Tensor, starts: list[int], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row completion positions of a [B, T−1] log-prob tensor → gather index [B, L] and mask [B, L]."""
    L = max(max(lengths), 1)
    ar = torch.arange(L)[None, :]
    mask = ar < torch.tensor(lengths)[:, None]
    idx = (torch.tensor(starts)[:, None] - 1 + ar).clamp(max=lp.shape[1] - 1)
    return idx, mask


def token_rewards(
    lp_pa: torch.Tensor,
    lp_wm: torch.Tensor,
    lp_h: torch.Tensor,
    adv: torch.Tensor,
    alpha: float | torch.Tensor,
    mask: torch.Tensor,
    w_kl: float,
) -> tuple[torch.Tensor, ...]:
    """R_t = α·A + w_kl·r_kl(t), r_kl = KL_wm − KL_h with the k3 estimates exp(lp_ref − lp_pa) − (lp_ref −
    lp_pa) − 1 of KL(π ‖ ref(·|c_wm)) and KL(π ‖ ref(·|c_h)) on the policy's own tokens (no gradient):
    move away from the watermark-conditioned distribution, stay close to the question-only one."""
    kl_wm = k3_kl(lp_pa, lp_wm) * mask
    kl_h = k3_kl(lp_pa, lp_h) * mask
    return (alpha * adv[:, None] + w_kl * (kl_wm - kl_h)) * mask, kl_wm, kl_h


def rlcracker_objective(
    lp: torch.Tensor,
    lp_wm: torch.Tensor,
    lp_h: torch.Tensor,
    adv: torch.Tensor,
    alpha: float | torch.Tensor,
    mask: torch.Tensor,
    w_kl: float,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """mean_seq mean_t −(exp(lp − sg(lp))·R_t − β·k3(ref(·|c_wm) ‖ π)) over the masked completion tokens
    (lp [B, L] with gradient; the rest fixed)."""
    lp_pa = lp.detach()
    R, kl_wm, kl_h = token_rewards(lp_pa, lp_wm, lp_h, adv, alpha, mask, w_kl)
    kl_ref = k3_kl(lp, lp_wm)
    per_tok = -(torch.exp(lp - lp_pa) * R - beta * kl_ref)
    loss = masked_mean(per_tok, mask, dim=1).mean()
    return loss, {
        "kl_wm": float(masked_mean(kl_wm, mask)),
        "kl_h": float(masked_mean(kl_h, mask)),
        "kl_ref": float(masked_mean(kl_ref.detach(), mask)),
    }


def rl_attack(
    policy,
    ref,
    lang: Language,
    texts: list[tuple[list[int], str]],
    p: Params,
    variant: str,
    seed: int,
    wm_train: Watermark,
) -> dict[str, list[float]]:
    """GRPO with RLCracker's rewards (``rlcracker``), the semantic reward only (``grpo_sem_only``: w_kl = 0),
    or the semantic reward minus the detector's z (``oracle_rl``: violates the threat model, an upper
    bound), on core's GRPO loop (one rollout group per update). Trains ``policy`` in place; returns the
    per-update curves."""
    rl = p.rl
    w_kl = rl.w_kl if variant == "rlcracker" else 0.0
    G, T, allowed = rl.group_size, rl.temperature, lang.allowed_rewrite
    dev = next(policy.parameters()).device

    def rollout(policy_, it: int, gen: torch.Generator) -> Rollouts:
        pick = torch.randint(len(texts), (rl.prompts_per_update,), generator=gen).tolist()
        srcs = [texts[i][0] for i in pick for _ in range(G)]
        c_wm = [lang.para_prompt(s) for s in srcs]
        c_h = [lang.qa_prompt(texts[i][1]) for i in pick for _ in range(G)]
        ys = sample(
            policy_,
            c_wm,
            math.ceil(len(srcs[0]) * rl.max_new_factor),
            temperature=T,
            gen=gen,
            allowed=allowed,
            eos_id=lang.eos_id,
        )
        sims = np.array([similarity(lang.concepts(y), lang.concepts(s)) for y, s in zip(ys, srcs)])
        r_sem = semantic_reward(sims, rl.sem_threshold)
        zs = np.array([wm_train.z(y) for y in ys])  # monitoring; only oracle_rl's reward reads it
        reward = torch.tensor(r_sem - rl.oracle_z_weight * zs if variant == "oracle_rl" else r_sem, dtype=torch.float32)
        alpha = max(1.0, rl.w_sem * (1.0 - float(r_sem.mean())))
        ids_wm = pad_batch([c + y for c, y in zip(c_wm, ys)], lang.pad_id).to(dev)
        ids_h = pad_batch([c + y for c, y in zip(c_h, ys)], lang.pad_id).to(dev)
        lens = [len(y) for y in ys]
        lp_wm_all = completion_logprobs(ref, ids_wm, T, allowed)
        lp_h_all = completion_logprobs(ref, ids_h, T, allowed)
        idx_wm, ymask = _aligned(lp_wm_all, [len(c) for c in c_wm], lens)
        idx_h, _ = _aligned(lp_h_all, [len(c) for c in c_h], lens)
        ymask = ymask.to(dev)
        actions = torch.zeros_like(ids_wm, dtype=torch.bool)  # the rewrite tokens (EOS included)
        actions[:, 1:].scatter_(1, idx_wm.to(dev), ymask)
        return Rollouts(
            ids_wm,
            actions,
            reward,
            advantages=group_advantages(reward, G, eps=rl.adv_eps).to(dev),
            extras={
                "idx_wm": idx_wm.to(dev),
                "ymask": ymask,
                "ids_h": ids_h,
                "lp_wm": lp_wm_all.gather(1, idx_wm.to(dev)) * ymask,
                "lp_h": lp_h_all.gather(1, idx_h.to(dev)) * ymask,
            },
            stats={
                "reward_sem": float(r_sem.mean()),
                "similarity": float(sims.mean()),
                "alpha": alpha,
                "rollout_z": float(zs.mean()),
                "rollout_len": float(np.mean(lens)),
            },
        )

    def objective(b):
        e = b.extras
        lp = b.logp.gather(1, e["idx_wm"]) * e["ymask"]
        pg, info = rlcracker_objective(
            lp,
            e["lp_wm"],
            e["lp_h"],
            b.advantages,
            torch.tensor(b.stats["alpha"], device=dev),
            e["ymask"],
            w_kl,
            rl.beta,
        )
        tok_mask = e["ids_h"] != lang.pad_id
        nll = -masked_mean(sequence_logprobs(b.model, e["ids_h"]), tok_mask[:, 1:])  # PPL term on [question; rewrite]
        return pg + rl.w_ppl * nll, info

    res = grpo_train(
        policy,
        rollout,
        iterations=rl.updates,
        group_size=G,
        objective=objective,
        logprob_fn=lambda m, ids: completion_logprobs(m, ids, T, allowed),
        old_logprobs=False,
        lr=rl.lr,
        optimizer="adam",
        weight_decay=0.0,
        grad_clip=rl.grad_clip,
        seed=seed,
        scheduler=(lambda o, n: _cosine(o, n, warmup=0.1)) if rl.schedule == "cosine" else None,
        desc=f"rlcracker.{variant}",
    )
    keys = (
        "reward_sem",
        "similarity",
        "kl_wm",
        "kl_h",
        "kl_ref",
        "alpha",
        "grad_norm",
        "rollout_z",
        "rollout_len",
        "loss",
    )
    return {k: [row[k] for row in res.history] for k in keys}


# ------------------------------------------------------------------------------------ attacks + scoring
def rewrite_chunks(
    variant: str, lang: Language, chunks: list[list[int]], questions: list[str], p: Params, seed: int, attacker=None
) -> list[list[int]]:
    """Apply one attack to a list of chunks (each rewritten on its own)."""
    rng = np.random.default_rng([seed, 7])
    if variant == "no_attack":
        return [list(c) for c in chunks]
    if variant in ("random_sub30", "random_sub50"):
        rate = 0.3 if variant == "random_sub30" else 0.5
        return [lang.substitute(c, rate, rng) for c in chunks]
    gen = torch.Generator().manual_seed(stream_seed(seed, "attack_sampling"))
    n_new = math.ceil(max(len(c) for c in chunks) * p.rl.max_new_factor)
    if variant == "regenerate":
        prompts = [lang.qa_prompt(q) for q in questions]
    else:
        prompts = [lang.para_prompt(c) for c in chunks]
    out = sample(
        attacker,
        prompts,
        n_new,
        temperature=p.eval.temperature,
        gen=gen,
        allowed=lang.allowed_rewrite,
        eos_id=lang.eos_id,
        batch_size=p.eval.batch_size,
    )
    return [lang.surface(o) for o in out]


def score_attack(
    variant: str, seed: int, lang: Language, texts: pd.DataFrame, p: Params, attacker=None
) -> pd.DataFrame:
    """Rewrite every watermarked test text and score it: z and green fraction (the scheme's detector),
    semantic similarity, copy rate and length ratio against the source."""
    test = texts[(texts.split == "test") & texts.watermarked & texts.scheme.isin(p.watermark.eval_schemes)]
    flat, owner, qs = [], [], []
    for r, (ch, q) in enumerate(zip(test["chunks"], test["questions"])):
        for c, qq in zip(ch, q):
            flat.append(lang.ids(c))
            qs.append(qq)
            owner.append(r)
    new = rewrite_chunks(variant, lang, flat, qs, p, seed, attacker)
    per_text: list[list[int]] = [[] for _ in range(len(test))]
    per_chunk: list[list[str]] = [[] for _ in range(len(test))]
    for o, y in zip(owner, new):
        per_text[o].extend(y)
        per_chunk[o].append(lang.text(y))
    wms = {s: make_watermark(lang, p, s) for s in p.watermark.eval_schemes}
    rows = []
    for r, (row, y) in enumerate(zip(test.itertuples(), per_text)):
        src = lang.ids(" ".join(row.chunks))
        g, n = wms[row.scheme].count(y)
        overlap = sum((pd.Series(y).value_counts().clip(upper=pd.Series(src).value_counts())).fillna(0)) if y else 0
        rows.append(
            {
                "variant": variant,
                "seed": seed,
                "scheme": row.scheme,
                "n_chunks": int(row.n_chunks),
                "n_tokens": int(row.n_tokens),
                "text_id": int(row.text_id),
                "z": wms[row.scheme].z(y),
                "green_fraction": g / n if n else 0.0,
                "semantic_sim": similarity(lang.concepts(y), lang.concepts(src)),
                "copy_rate": float(overlap) / max(1, len(y)),
                "len_ratio": len(y) / max(1, len(src)),
                "z_source": float(row.z),
                "rewrite_chunks": per_chunk[r],
            }
        )
    return pd.DataFrame(rows)


def train_variant(
    lexicon: pd.DataFrame, corpus: pd.DataFrame, texts: pd.DataFrame, attacker_sft: dict, p: Params, variant: str
) -> tuple[pd.DataFrame, dict]:
    """train.<variant>: the attack on every seed (RL ablations on the first ``rl.ablation_seeds`` seeds) →
    (its long table: the scores per seed and the RL training curves, artifacts: the scored rewrites, the
    curves by seed and the RL policies' weights by seed)."""
    from pipelines.core.api import Results
    from pipelines.rlcracker.evaluate import attack_rows

    lang = Language(lexicon, corpus)
    seeds = list(p.seeds)
    if variant in ("grpo_sem_only", "oracle_rl"):
        seeds = seeds[: p.rl.ablation_seeds]
    frames, curves, states = [], {}, {}
    for seed in seeds:
        device = node_setup(p, seed)
        attacker = (
            unpack(attacker_sft, device) if variant not in ("no_attack", "random_sub30", "random_sub50") else None
        )
        if variant in RL_VARIANTS:
            ref = unpack(attacker_sft, device)
            for q in ref.parameters():
                q.requires_grad_(False)
            tr = texts[(texts.split == "wm_train") & (texts.scheme == p.watermark.train_scheme)]
            pairs = [(lang.ids(ch[0]), q[0]) for ch, q in zip(tr["chunks"], tr["questions"])]
            curves[str(seed)] = rl_attack(
                attacker, ref, lang, pairs, p, variant, seed, make_watermark(lang, p, p.watermark.train_scheme)
            )
            states[str(seed)] = pack(attacker)
        frames.append(score_attack(variant, seed, lang, texts, p, attacker))
    attack = pd.concat(frames, ignore_index=True)
    res = Results(variant).add_rows(attack_rows(p, texts, attack))
    for seed, series in curves.items():
        for name, vals in series.items():
            res.history(int(seed), name, vals)
    cols = {c: [x.tolist() if hasattr(x, "tolist") else x for x in attack[c]] for c in attack.columns}
    return res.table(), {"attack": cols, "curves": curves, "states": states}
