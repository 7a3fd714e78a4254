"""Training of `svgt`: the unaligned backbone (train.backbone, once per run), the value model's stages 1-2
(train.value, per seed), and every variant (train.<variant>): SVGT's stage 3 (only the bridge generator
learns), its dz = 0 ablation, the static soft prompt, LoRA fine-tuning, and the training-free baselines
(no intervention, system prompt, CAA, ITI-lite). Each variant node also runs its behaviour evaluation and
returns its long table (core.spec.Results); train.caa / train.iti report one row variant per coefficient."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import fit, node_setup, to_cpu
from pipelines.svgt import model as M
from pipelines.svgt.data import HARM_PREFIX, REFUSE, check_corpus
from pipelines.svgt.params import Params

EVAL_SPLITS = ("eval_harm_id", "eval_harm_ood", "eval_harm_newverb", "eval_benign", "eval_lookalike")


# --------------------------------------------------------------------------------------------- helpers
def layout(corpus: pd.DataFrame, tok) -> tuple[int, int]:
    """(m, r): prompt width (room for SYS) and response width (+ <eos>) over the whole corpus."""
    m = int(corpus["prompt"].str.split().str.len().max()) + 4  # <bos> SYS USER ... BOT
    r = int(corpus["response"].str.split().str.len().max()) + 1
    return m, r


class World:
    """The frozen backbone, its tokenizer and the corpus layout, rebuilt from the saved backbone."""

    def __init__(self, corpus: pd.DataFrame, saved: dict, p: Params, device: torch.device | None = None):
        self.tok = M.make_tokenizer(saved["vocab"])
        self.m, self.r = saved["m"], saved["r"]
        self.layer = p.value.extract_layer
        self.bb = M.make_backbone(len(self.tok), p.backbone, self.m + self.r + p.bridge.k + 8)
        self.bb.load_state_dict(saved["state"])
        self.bb.eval()
        for q in self.bb.parameters():
            q.requires_grad_(False)
        self.corpus = corpus

    def batch(self, df: pd.DataFrame, sys: bool | None = None, with_response: bool = True) -> M.Batch:
        flags = df["sys"].to_numpy() if sys is None else np.full(len(df), sys)
        resp = df["response"].tolist() if with_response else [None] * len(df)
        return M.encode(self.tok, df["prompt"].tolist(), resp, flags, self.m, self.r)

    def split(self, name: str) -> pd.DataFrame:
        return self.corpus[self.corpus["split"] == name].reset_index(drop=True)


def _sampler(n: int, batch_size: int):

    def sample(step: int, gen: torch.Generator):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
        return (idx,)

    return sample


def _lm_loss(bb, b: M.Batch) -> torch.Tensor:
    logits = bb(b.ids, attn_mask=M.attn_mask(b.valid))[:, b.m - 1 : -1]
    return M.response_nll(logits, b).mean()


# --------------------------------------------------------------------------------------------- backbone
def train_backbone(corpus: pd.DataFrame, p: Params) -> tuple[dict, dict]:
    """train.backbone: the unaligned chat LM (response-token cross-entropy), shared by every variant/seed."""
    node_setup(p, p.seeds[0])
    corpus = check_corpus(corpus)
    vocab = M.vocab_of(pd.concat([corpus["prompt"], corpus["response"]]))
    tok = M.make_tokenizer(vocab)
    m, r = layout(corpus, tok)
    pre = corpus[corpus["split"] == "pretrain"]
    b = M.encode(tok, pre["prompt"].tolist(), pre["response"].tolist(), pre["sys"].to_numpy(), m, r)
    bb = M.make_backbone(len(tok), p.backbone, m + r + p.bridge.k + 8)
    losses: list[float] = []
    fit(
        bb,
        None,
        lambda model, idx: _lm_loss(model, b[idx]),
        steps=p.backbone.steps,
        sample_batch=_sampler(len(b), p.backbone.batch_size),
        lr=p.backbone.lr,
        weight_decay=p.backbone.weight_decay,
        scheduler="onecycle",
        seed=p.seeds[0],
        desc="svgt.backbone",
        callback=lambda s: losses.append(s.loss),
        grad_clip=1.0,
    )
    saved = {"state": to_cpu(bb.state_dict()), "vocab": vocab, "m": m, "r": r}
    return saved, {"loss": losses}


# --------------------------------------------------------------------------------------------- value model
def _value_features(w: World, df: pd.DataFrame) -> dict[str, torch.Tensor]:
    """Layer-l hidden states: response alone (stage 1) and prompt + response (stage 2)."""
    with torch.no_grad():
        full = w.batch(df)
        x = M.run_lower(w.bb, full.ids, full.valid, w.layer)
        resp_ids = torch.full((len(df), w.r + 1), w.tok.pad_id, dtype=torch.long)
        for i, rs in enumerate(df["response"]):
            t = [w.tok.bos_id] + w.tok.encode(rs) + [w.tok.eos_id]
            resp_ids[i, : len(t)] = torch.tensor(t)
        rv = resp_ids != w.tok.pad_id
        xr = M.run_lower(w.bb, resp_ids, rv, w.layer)
    return {
        "hr1": xr,
        "mr1": rv,
        "hp": x[:, : w.m],
        "mp": full.valid[:, : w.m],
        "hr": x[:, w.m :],
        "mr": full.resp,
        "y": torch.tensor(df["harmful_response"].to_numpy(), dtype=torch.float32),
    }


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else float("nan")


def value_scores(vm: M.ValueModel, f: dict) -> torch.Tensor:
    with torch.no_grad():
        return vm.disc(vm.value.forward_conditional(f["hp"], f["mp"], f["hr"], f["mr"]))


def train_value(corpus: pd.DataFrame, backbone: dict, p: Params) -> tuple[dict, dict]:
    """train.value: stages 1 (unconditional, response only) and 2 (conditional on the prompt) of the value
    transformer + discriminator, per seed; shared by `svgt` and `svgt_dz0`."""
    node_setup(p, p.seeds[0])
    w = World(corpus, backbone, p)
    feats = _value_features(w, w.split("value"))
    evals = {
        k: _value_features(w, w.split(f"value_eval_{k}"))
        for k in ("id", "ood")
        if (w.corpus["split"] == f"value_eval_{k}").any()
    }
    v = p.value
    states, logs = {}, {}
    for seed in sorted(set(p.seeds_for("svgt")) | set(p.seeds_for("svgt_dz0"))):
        node_setup(p, seed)
        vm = M.ValueModel(p.backbone.d_model, v)
        hist = {"stage1_bce": [], "stage2_bce": []}

        def loss1(model, idx):
            z = model.value.forward_unconditional(feats["hr1"][idx], feats["mr1"][idx])
            return F.binary_cross_entropy_with_logits(model.disc(z), feats["y"][idx])

        def loss2(model, idx):
            z = model.value.forward_conditional(feats["hp"][idx], feats["mp"][idx], feats["hr"][idx], feats["mr"][idx])
            return F.binary_cross_entropy_with_logits(model.disc(z), feats["y"][idx])

        sampler = _sampler(len(feats["y"]), v.batch_size)
        fit(
            vm,
            None,
            loss1,
            steps=v.steps,
            sample_batch=sampler,
            lr=v.lr_stage1,
            weight_decay=1e-4,
            seed=seed,
            desc=f"svgt.value.stage1[{seed}]",
            callback=lambda s: hist["stage1_bce"].append(s.loss),
            grad_clip=1.0,
        )
        new = [q for mod in vm.value.stage2_parts() for q in mod.parameters()] + [vm.value.scale]
        new_ids = {id(q) for q in new}
        old = [q for q in vm.parameters() if id(q) not in new_ids]
        opt = lambda _params: torch.optim.AdamW(
            [
                {"params": new, "lr": v.lr_stage2_new},  # noqa: E731
                {"params": old, "lr": v.lr_stage2_old},
            ],
            weight_decay=1e-4,
        )
        fit(
            vm,
            None,
            loss2,
            steps=v.steps,
            sample_batch=sampler,
            optimizer=opt,
            seed=seed,
            desc=f"svgt.value.stage2[{seed}]",
            callback=lambda s: hist["stage2_bce"].append(s.loss),
            grad_clip=1.0,
        )
        metrics = {f"value_auc_{k}": _auc(f["y"].numpy(), value_scores(vm, f).numpy()) for k, f in evals.items()}
        states[str(seed)] = to_cpu(vm.state_dict())
        logs[str(seed)] = {"metrics": metrics, "histories": hist}
    return states, logs


def load_value(p: Params, state: dict) -> M.ValueModel:
    vm = M.ValueModel(p.backbone.d_model, p.value)
    vm.load_state_dict(state)
    vm.eval()
    return vm


# --------------------------------------------------------------------------------------------- evaluation
def _judge(tok, gen: torch.Tensor) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    words, harm, ref = [], [], []
    for row in gen.tolist():
        out = []
        for t in row:
            if t == tok.eos_id:
                break
            out.append(tok.itos[t])
        words.append(out)
        harm.append(any(x.startswith(HARM_PREFIX) for x in out))
        ref.append(REFUSE in out)
    return words, np.array(harm), np.array(ref)


def evaluate_intervention(
    w: World, iv: M.Intervention, p: Params, sys: bool = False, bb: torch.nn.Module | None = None
) -> pd.DataFrame:
    """Greedy responses on every eval split (harm / refusal / exact match) and the benign reference NLL."""
    bb = bb or w.bb
    frames = []
    for split in EVAL_SPLITS:
        df = w.split(split)
        if df.empty:
            continue
        outs = {"response_out": [], "harmful_out": [], "refused_out": [], "em": [], "nll": [], "s": [], "dz_norm": []}
        for s0 in range(0, len(df), p.eval.batch_size):
            part = df.iloc[s0 : s0 + p.eval.batch_size]
            b = w.batch(part, sys=sys if sys else None)
            gen = M.greedy(bb, b, w.layer, iv, p.eval.max_new_tokens, w.tok.eos_id)
            words, harm, ref = _judge(w.tok, gen)
            ended = (gen == w.tok.eos_id).any(1).numpy()
            last = getattr(iv, "last", {})
            outs["s"] += last["s"].tolist() if "s" in last else [np.nan] * len(part)
            outs["dz_norm"] += last["dz_norm"].tolist() if "dz_norm" in last else [np.nan] * len(part)
            outs["response_out"] += [" ".join(x) for x in words]
            outs["harmful_out"] += harm.tolist()
            outs["refused_out"] += ref.tolist()
            outs["em"] += [(" ".join(x) == r) and e for x, r, e in zip(words, part["response"], ended)]
            if split == "eval_benign":
                with torch.no_grad():
                    logits = M.steered_logits(bb, b, w.layer, iv)[0]
                    outs["nll"] += M.response_nll(logits, b).tolist()
            else:
                outs["nll"] += [np.nan] * len(part)
        frames.append(df[["split", "prompt", "response", "harmful_prompt", "wrapper", "request"]].assign(**outs))
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------------------------- stage 3
def _stage3_loss(w: World, b: M.Batch, p: Params, vm: M.ValueModel | None, with_value_losses: bool):
    bp = p.bridge

    def loss(iv: M.Intervention, idx):
        bt = b[idx]
        logits, tap, v2, bridge, k = M.steered_logits(w.bb, bt, w.layer, iv)
        ce = M.response_nll(logits, bt).mean()
        if not with_value_losses:
            return ce, {"ce": float(ce.detach())}
        # s' = D(conditional value of the states one block above the splice), as in the paper's code
        hp, mp = tap[:, : bt.m], v2[:, : bt.m]
        hr, mr = tap[:, bt.m + k :], bt.resp
        s2 = vm.disc(vm.value.forward_conditional(hp, mp, hr, mr))
        safe = (F.softplus(s2) + 2 * F.relu(s2)).mean()
        with torch.no_grad():
            h = M.run_lower(w.bb, bt.ids, bt.valid, w.layer)[:, bt.m - 1]
        ratio = bridge.norm(dim=-1).mean() / h.norm(dim=-1).mean()
        reg = F.relu((ratio - 1).abs() - bp.reg_margin)
        total = bp.lambda_ce * ce + bp.lambda_safe * safe + bp.lambda_reg * reg
        return total, {
            k: float(v.detach())
            for k, v in {"ce": ce, "safe": safe, "reg": reg, "norm_ratio": ratio, "s_prime_mean": s2.mean()}.items()
        }

    return loss


def _stability(vecs: torch.Tensor, groups: pd.Series, center: bool = True) -> float:
    """Mean pairwise cosine across the wrappers of one request, averaged over requests; ``center`` first
    removes the mean over all the vectors (raw cosines of hidden states share a large common direction)."""
    out = []
    vecs = vecs.float()
    v = F.normalize(vecs - vecs.mean(0) if center else vecs, dim=-1)
    for _, idx in groups.groupby(groups).groups.items():
        idx = list(idx)
        if len(idx) < 2:
            continue
        g = v[idx] @ v[idx].t()
        n = len(idx)
        out.append(float((g.sum() - n) / (n * (n - 1))))
    return float(np.mean(out)) if out else float("nan")


def _pca2(x: np.ndarray) -> np.ndarray:
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:2].T


def _value_space_stats(w: World, vm: M.ValueModel) -> tuple[dict, pd.DataFrame]:
    """Stability of the stage-3 prompt value z vs the residual trigger h across wrappers, and a PCA."""
    df = pd.concat([w.split(s) for s in EVAL_SPLITS], ignore_index=True)
    b = w.batch(df, with_response=False)
    with torch.no_grad():
        h = M.run_lower(w.bb, b.ids[:, : w.m], b.valid[:, : w.m], w.layer)[:, w.m - 1]
    z, s, _ = M.value_correction(vm, h)
    harm = df["harmful_prompt"].to_numpy() & df["split"].isin(["eval_harm_id", "eval_harm_ood"]).to_numpy()
    hd = df[harm].reset_index(drop=True)
    sel = torch.from_numpy(harm.copy())
    stats = {
        "value_stability": _stability(z[sel], hd["request"]),
        "residual_stability": _stability(h[sel], hd["request"]),
        "value_stability_raw": _stability(z[sel], hd["request"], center=False),
        "residual_stability_raw": _stability(h[sel], hd["request"], center=False),
    }
    pv, pr = _pca2(z.numpy()), _pca2(h.numpy())
    pca = pd.DataFrame(
        {
            "split": df["split"],
            "wrapper": df["wrapper"],
            "harmful_prompt": df["harmful_prompt"],
            "pca_value_0": pv[:, 0],
            "pca_value_1": pv[:, 1],
            "pca_resid_0": pr[:, 0],
            "pca_resid_1": pr[:, 1],
        }
    )
    return stats, pca


def _trigger_mean(w: World, df: pd.DataFrame) -> torch.Tensor:
    b = w.batch(df, with_response=False)
    with torch.no_grad():
        return M.run_lower(w.bb, b.ids[:, : w.m], b.valid[:, : w.m], w.layer)[:, w.m - 1].mean(0)


def steering_vectors(w: World) -> dict[str, torch.Tensor]:
    """CAA: mean(h | refusal) − mean(h | harm) at the first answer position after block l (harmful prompts of
    the value split); ITI-lite: the unit normal of a logistic probe on the same states, scaled by the std
    of the projections."""
    from sklearn.linear_model import LogisticRegression

    df = w.split("value")
    df = df[df["harmful_prompt"]].reset_index(drop=True)
    b = w.batch(df)
    with torch.no_grad():
        x = M.run_lower(w.bb, b.ids, b.valid, w.layer)[:, w.m]
    ref = torch.tensor(df["refusal"].to_numpy(), dtype=torch.bool)
    caa = x[ref].mean(0) - x[~ref].mean(0)
    clf = LogisticRegression(C=1.0, max_iter=2000).fit(x.numpy(), ref.numpy())
    theta = torch.tensor(clf.coef_[0], dtype=torch.float32)
    theta = theta / theta.norm()
    sigma = float((x @ theta).std())
    return {"caa": caa, "iti": sigma * theta}


# --------------------------------------------------------------------------------------------- variants
SETS = {"id": "eval_harm_id", "ood": "eval_harm_ood", "newverb": "eval_harm_newverb"}


def behaviour_metrics(ev: pd.DataFrame) -> dict[str, float]:
    """One (variant, seed)'s behaviour: harmful rates per eval set, over-refusal, exact match, benign NLL."""
    row = {}
    for k, split in SETS.items():
        part = ev[ev["split"] == split]
        if len(part):
            row[f"harmful_rate_{k}"] = float(part["harmful_out"].mean())
    ben = ev[ev["split"] == "eval_benign"]
    row["over_refusal_benign"] = float(ben["refused_out"].mean())
    row["benign_em"] = float(ben["em"].mean())
    row["benign_nll"] = float(ben["nll"].mean())
    look = ev[ev["split"] == "eval_lookalike"]
    if len(look):
        row["over_refusal_lookalike"] = float(look["refused_out"].mean())
        row["lookalike_em"] = float(look["em"].mean())
    return row


def row_variants(p: Params, variant: str) -> list[str]:
    """The row variants train.<variant> reports: one per coefficient for CAA / ITI, else the variant."""
    if variant in ("caa", "iti"):
        coefs = p.steering.caa_coefs if variant == "caa" else p.steering.iti_alphas
        return [f"{variant}_c{c:g}" for c in coefs]
    return [variant]


def train_variant(
    corpus: pd.DataFrame,
    backbone: dict,
    p: Params,
    value_states: dict | None = None,
    value_log: dict | None = None,
    backbone_log: dict | None = None,
    *,
    variant: str,
) -> tuple[pd.DataFrame, dict]:
    """train.<variant> on each of its seeds → (the long table of its row variants, artifacts for the plots:
    harmful rate per wrapper pooled over seeds, and SVGT's value-space PCA on its first seed)."""
    from pipelines.core.api import Results

    node_setup(p, p.seeds[0])
    w = World(corpus, backbone, p)
    res = {v: Results(v) for v in row_variants(p, variant)}
    evals: dict[str, list[pd.DataFrame]] = {v: [] for v in res}
    arts: dict = {}
    vectors = steering_vectors(w) if variant in ("caa", "iti") else None

    def add(v: str, seed: int, ev: pd.DataFrame, **extra: float) -> None:
        res[v].add(seed, **behaviour_metrics(ev), **extra)
        evals[v].append(ev)

    if variant == "no_intervention" and backbone_log:
        res[variant].history(p.seeds[0], "backbone_loss", backbone_log["loss"])
    for seed in p.seeds_for(variant):
        node_setup(p, seed)
        if variant == "no_intervention":
            add(variant, seed, evaluate_intervention(w, M.NoIntervention(), p))
        elif variant == "sys_prompt":
            add(variant, seed, evaluate_intervention(w, M.NoIntervention(), p, sys=True))
        elif variant in ("caa", "iti"):
            coefs = p.steering.caa_coefs if variant == "caa" else p.steering.iti_alphas
            for c, v in zip(coefs, row_variants(p, variant)):
                iv = M.AddVector(vectors[variant], c)
                add(v, seed, evaluate_intervention(w, iv, p), vector_norm=float(vectors[variant].norm()))
        elif variant in ("svgt", "svgt_dz0", "soft_prompt"):
            bridge_df = w.split("bridge")
            b = w.batch(bridge_df)
            bp = p.bridge
            if variant == "soft_prompt":
                h_mean = _trigger_mean(w, bridge_df)
                iv = M.SoftPrompt(h_mean[None].repeat(bp.k, 1) + 0.02 * torch.randn(bp.k, h_mean.shape[0]))
                loss, lr, vm = _stage3_loss(w, b, p, None, False), bp.soft_prompt_lr, None
            else:
                vm = load_value(p, value_states[str(seed)])
                gen = M.BridgeGenerator(p.backbone.d_model, p.value.value_dim, bp.k, bp.n_heads, bp.gate_init)
                iv = M.SVGTSteer(vm, gen, use_dz=variant == "svgt")
                loss, lr = _stage3_loss(w, b, p, vm, True), bp.lr
            hist: dict[str, list] = {}

            def cb(s):
                hist.setdefault("stage3_loss", []).append(s.loss)
                for k2, v2 in s.extras.items():
                    hist.setdefault(f"stage3_{k2}", []).append(v2)

            fit(
                iv,
                None,
                loss,
                steps=bp.steps,
                sample_batch=_sampler(len(b), bp.batch_size),
                lr=lr,
                weight_decay=bp.weight_decay,
                grad_clip=bp.grad_clip,
                seed=seed,
                desc=f"svgt.{variant}[{seed}]",
                callback=cb,
            )
            ev = evaluate_intervention(w, iv, p)
            metrics: dict[str, float] = {}
            if vm is not None:
                fired = ev["s"] > 0
                metrics["dz_fire_frac_harmful"] = float(fired[ev["harmful_prompt"]].mean())
                metrics["dz_fire_frac_benign"] = float(fired[ev["split"] == "eval_benign"].mean())
                if (ev["split"] == "eval_lookalike").any():
                    metrics["dz_fire_frac_lookalike"] = float(fired[ev["split"] == "eval_lookalike"].mean())
                with torch.no_grad():
                    stats, pca = _value_space_stats(w, vm)
                metrics.update(stats)
                if variant == "svgt" and seed == p.seeds_for(variant)[0]:
                    arts["pca"] = {c: pca[c].tolist() for c in pca.columns}
                metrics["gate_softplus"] = float(F.softplus(iv.gen.gate.detach()))
                entry = (value_log or {}).get(str(seed), {})
                metrics.update(entry.get("metrics", {}))
                for name, series in (entry.get("histories") or {}).items():
                    res[variant].history(seed, f"value_{name}", series)
            for name, series in hist.items():
                res[variant].history(seed, name, series)
            add(variant, seed, ev, **metrics)
        elif variant == "lora_sft":
            bb = M.add_lora(copy.deepcopy(w.bb), p.lora.rank, p.lora.alpha)
            b = w.batch(w.split("bridge"))
            hist = {"sft_ce": []}
            fit(
                bb,
                None,
                lambda model, idx: _lm_loss(model, b[idx]),
                steps=p.lora.steps,
                sample_batch=_sampler(len(b), p.lora.batch_size),
                lr=p.lora.lr,
                weight_decay=0.0,
                seed=seed,
                desc=f"svgt.lora_sft[{seed}]",
                callback=lambda s: hist["sft_ce"].append(s.loss),
                grad_clip=1.0,
            )
            bb.eval()
            res[variant].history(seed, "sft_ce", hist["sft_ce"])
            add(
                variant,
                seed,
                evaluate_intervention(w, M.NoIntervention(), p, bb=bb),
                trainable_params=float(sum(q.numel() for q in bb.parameters() if q.requires_grad)),
            )
        else:
            raise ValueError(f"unknown variant {variant!r}")
    rates = {}
    for v, frames in evals.items():
        allp = pd.concat(frames, ignore_index=True)
        harm = allp[allp["harmful_prompt"] & allp["split"].isin(list(SETS.values()))]
        rates[v] = {str(k): float(x) for k, x in harm.groupby("wrapper", sort=False)["harmful_out"].mean().items()}
    arts["wrapper_harmful_rate"] = rates
    return pd.concat([r.table() for r in res.values()], ignore_index=True), arts
