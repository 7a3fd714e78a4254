"""Train stage of TESS: the method, its ablations and every baseline, on every seed, with the same
backbone, budget, optimiser and early stopping (card: Model, Baselines). Returns test predictions."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from pipelines.core.params import parse
from pipelines.core.runtime import get_device, seed_everything, set_threads
from pipelines.core.training import fit
from pipelines.tess.lexicon import LABELS, MAX_LABELS, PRIMITIVES
from pipelines.tess.model import DLinear, PatchTST

log = logging.getLogger(__name__)
UNIMODAL = ("naive", "seasonal_naive", "dlinear", "patchtst")


@dataclass
class Arrays:
    x: torch.Tensor            # (n, L) history, RevIN-normalised by its own mean / std
    y: torch.Tensor            # (n, H) future in the same units (the metric's scale)
    ids: np.ndarray
    idx: dict[str, torch.Tensor]


def normalise(windows: pd.DataFrame) -> Arrays:
    w = windows.sort_values("window_id")
    x = np.stack(w["x"].to_numpy()).astype("float32")
    y = np.stack(w["y"].to_numpy()).astype("float32")
    mu, sd = x.mean(1, keepdims=True), x.std(1, keepdims=True) + 1e-5
    split = w["split"].to_numpy()
    idx = {s: torch.from_numpy(np.flatnonzero(split == s)) for s in ("train", "val", "test")}
    return Arrays(torch.from_numpy((x - mu) / sd), torch.from_numpy((y - mu) / sd), w["window_id"].to_numpy(), idx)


def gt_index(gt: pd.DataFrame, ids: np.ndarray) -> np.ndarray:
    g = gt.set_index("window_id").loc[ids]
    return np.stack([g[prim].map({lab: i for i, lab in enumerate(LABELS[prim])}).to_numpy() for prim in PRIMITIVES], 1)


def primitive_features(extr: pd.DataFrame, level: str, ids: np.ndarray, train_idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """probs (n, K, M), margin standardised with train statistics per primitive, entropy, top label."""
    e = extr[extr["level"] == level]
    probs, margin, ent, top = [], [], [], []
    for prim in PRIMITIVES:
        ep = e[e["primitive"] == prim].set_index("window_id").loc[ids]
        probs.append(np.stack(ep["probs"].to_numpy()))
        margin.append(ep["margin"].to_numpy())
        ent.append(ep["entropy"].to_numpy())
        top.append(ep["label"].map({lab: i for i, lab in enumerate(LABELS[prim])}).to_numpy())
    m = np.stack(margin, 1)
    tr = train_idx.numpy()
    mz = (m - m[tr].mean(0)) / (m[tr].std(0) + 1e-6)   # margin scales differ by backend: standardise
    return {"probs": torch.tensor(np.stack(probs, 1), dtype=torch.float32),
            "margin_z": torch.tensor(mz, dtype=torch.float32),
            "entropy": torch.tensor(np.stack(ent, 1), dtype=torch.float32),
            "top": torch.tensor(np.stack(top, 1))}


def oracle_features(gt_idx: np.ndarray) -> dict[str, torch.Tensor]:
    """Ground-truth primitives as one-hot distributions (the explicit 'oracle' run only)."""
    n = len(gt_idx)
    probs = torch.zeros(n, len(PRIMITIVES), MAX_LABELS)
    probs.scatter_(2, torch.from_numpy(gt_idx)[..., None], 1.0)
    return {"probs": probs, "margin_z": torch.zeros(n, len(PRIMITIVES)), "entropy": torch.zeros(n, len(PRIMITIVES)),
            "top": torch.from_numpy(gt_idx)}


def shuffled(feats: dict[str, torch.Tensor], idx: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Negative control: each split's extractions permuted across its windows."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    out = {k: v.clone() for k, v in feats.items()}
    for part in idx.values():
        perm = part[torch.randperm(len(part), generator=gen)]
        for k in out:
            out[k][part] = feats[k][perm]
    return out


def hard(feats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = dict(feats)
    out["probs"] = torch.zeros_like(feats["probs"]).scatter_(2, feats["top"][..., None], 1.0)
    return out


def _predict(model, a: Arrays, part: torch.Tensor, inputs: dict[str, torch.Tensor], gate_mode: str | None,
             device) -> tuple[torch.Tensor, torch.Tensor | None]:
    outs, gates = [], []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(part), 512):
            b = part[s:s + 512]
            kw = {k: v[b].to(device) for k, v in inputs.items()}
            if gate_mode is not None:
                o, g, _ = model(a.x[b].to(device), **kw, gate_mode=gate_mode, return_gate=True)
                gates.append(g.cpu())
            else:
                o = model(a.x[b].to(device), **kw)
            outs.append(o.cpu())
    return torch.cat(outs), (torch.cat(gates) if gates else None)


def train_one(model, a: Arrays, inputs: dict[str, torch.Tensor], p, seed: int, desc: str,
              gate_mode: str | None = None, gate_target: torch.Tensor | None = None) -> dict:
    """Fit with the shared loop (AdamW, early stopping on val MSE, NaN guard); MSE + λ·BCE(gate) for TESS."""
    device = get_device()
    model.to(device)
    keys = list(inputs)
    tr = a.idx["train"]
    tensors = [a.x[tr], a.y[tr], *(inputs[k][tr] for k in keys)]
    use_gate_loss = gate_mode == "learned" and gate_target is not None and p.train.lambda_gate > 0
    if use_gate_loss:
        tensors.append(gate_target[tr])

    def loss_fn(m, x, y, *rest):
        kw = {k: v.to(device) for k, v in zip(keys, rest[:len(keys)])}
        x, y = x.to(device), y.to(device)
        if gate_mode is None:
            return torch.nn.functional.mse_loss(m(x, **kw), y)
        out, _, logit = m(x, **kw, gate_mode=gate_mode, return_gate=True)
        loss = torch.nn.functional.mse_loss(out, y)
        if use_gate_loss:
            loss = loss + p.train.lambda_gate * torch.nn.functional.binary_cross_entropy_with_logits(
                logit, rest[-1].to(device))
        return loss

    def val_mse(m):
        pred, _ = _predict(m, a, a.idx["val"], inputs, gate_mode, device)
        return float(((pred - a.y[a.idx["val"]]) ** 2).mean())

    t0 = time.perf_counter()
    res = fit(model, tensors, loss_fn, val_score=val_mse, epochs=p.train.epochs, lr=p.train.lr,
              weight_decay=p.train.weight_decay, batch_size=p.train.batch_size, patience=p.train.patience,
              seed=seed, desc=desc)
    seconds = time.perf_counter() - t0
    return {"model": model.cpu(), "epochs": res.epochs_run, "best_val_mse": res.best_val, "train_seconds": seconds}


def _backbone(p, L: int, H: int, text: str = "none", text_dim: int = 0) -> PatchTST:
    m = p.model
    return PatchTST(L, H, m.d_model, m.n_heads, m.n_layers, m.d_ff, m.patch_len, m.stride, m.dropout,
                    text=text, text_dim=text_dim, gate_hidden=m.gate_hidden)


def _rows(variant: str, seed: int, ids: np.ndarray, pred: torch.Tensor) -> list[dict]:
    return [{"variant": variant, "seed": seed, "window_id": int(w), "pred": pr.numpy().astype("float32")}
            for w, pr in zip(ids, pred)]


def plan(p) -> dict[str, list[int]]:
    """Which variants run on which seeds (ablations and compressed levels on the first seed by default)."""
    all_s, first = list(p.seeds), ([p.seeds[0]] if p.eval.single_seed_variants else list(p.seeds))
    levels = ["B", "C", "D", "E"]
    plan = {v: all_s for v in ("naive", "seasonal_naive", "dlinear", "patchtst", "tfidf_ridge", "fusion_A",
                               "xattn_A", "tess", "tess_nogate")}
    plan.update({v: first for v in ("oracle", "shuffled", "tess_prototype", "fusion_D", "xattn_D")})
    plan["tess_D"] = first
    if p.eval.sweeps:                                   # the full A–E ladder and hard labels
        plan.update({f"tess_{lv}": first for lv in levels})
        plan.update({f"{b}_{lv}": first for b in ("fusion", "xattn") for lv in ("B", "C", "E")})
        plan["tess_hard"] = first
    return plan


def train_baselines(windows: pd.DataFrame, texts: pd.DataFrame, emb: dict, raw: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Unimodal (naive, seasonal naive, DLinear, PatchTST) and raw-text baselines (sentence fusion,
    token cross-attention, TF-IDF + ridge on PatchTST's residual)."""
    p = parse("tess", raw)
    set_threads(p.threads)
    a = normalise(windows)
    L, H = a.x.shape[1], a.y.shape[1]
    te = a.idx["test"]
    todo = {v: s for v, s in plan(p).items() if not v.startswith("tess") and v not in ("oracle", "shuffled")}
    preds, log_rows = [], []
    period = p.data.period
    season = a.x[:, L - period:][:, torch.arange(H) % period]
    for seed in p.seeds:
        preds += _rows("naive", seed, a.ids[te], a.x[te, -1:].expand(-1, H))
        preds += _rows("seasonal_naive", seed, a.ids[te], season[te])
        seed_everything(seed)
        r = train_one(DLinear(L, H), a, {}, p, seed, f"dlinear s{seed}")
        preds += _rows("dlinear", seed, a.ids[te], _predict(r["model"], a, te, {}, None, "cpu")[0])
        log_rows.append({"variant": "dlinear", "seed": seed, **{k: r[k] for k in ("epochs", "best_val_mse", "train_seconds")}})
        seed_everything(seed)
        r = train_one(_backbone(p, L, H), a, {}, p, seed, f"patchtst s{seed}")
        all_idx = torch.arange(len(a.ids))
        pt_all = _predict(r["model"], a, all_idx, {}, None, "cpu")[0]
        preds += _rows("patchtst", seed, a.ids[te], pt_all[te])
        log_rows.append({"variant": "patchtst", "seed": seed, **{k: r[k] for k in ("epochs", "best_val_mse", "train_seconds")}})
        preds += _rows("tfidf_ridge", seed, a.ids[te], _tfidf_ridge(texts, a, pt_all))
        for variant, seeds in todo.items():
            if seed not in seeds or not variant.startswith(("fusion_", "xattn_")):
                continue
            kind, level = variant.split("_")
            e = emb[level]
            assert np.array_equal(e["window_id"].numpy(), a.ids), "text embeddings misaligned with windows"
            inputs = ({"sent": e["sent"]} if kind == "fusion" else
                      {"tokens": e["tokens"].float(), "token_mask": e["mask"]})
            dim = e["sent"].shape[1] if kind == "fusion" else e["tokens"].shape[2]
            seed_everything(seed)
            r = train_one(_backbone(p, L, H, kind, dim), a, inputs, p, seed, f"{variant} s{seed}")
            pred, _ = _predict(r["model"], a, te, inputs, None, "cpu")
            preds += _rows(variant, seed, a.ids[te], pred)
            row = {"variant": variant, "seed": seed, **{k: r[k] for k in ("epochs", "best_val_mse", "train_seconds")}}
            if kind == "xattn":
                row["attn_cue_ratio"] = attention_cue_ratio(r["model"], a, te, inputs, e["cue"])
            log_rows.append(row)
    return pd.DataFrame(preds), pd.DataFrame(log_rows)


def attention_cue_ratio(model, a: Arrays, part: torch.Tensor, inputs: dict, cue: torch.Tensor) -> float:
    """Attention mass on the narrative (cue) tokens divided by their share of the text tokens: 1 means the
    model attends to cues no more than to redundant tokens (card: over-attention probe)."""
    masses, shares = [], []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(part), 512):
            b = part[s:s + 512]
            model(a.x[b], **{k: v[b] for k, v in inputs.items()})
            w = model.last_attention.mean(1)                     # (B, T) averaged over patch queries
            c, m = cue[b].float(), inputs["token_mask"][b].float()
            masses.append((w * c).sum(1))
            shares.append(c.sum(1) / m.sum(1).clamp(min=1))
    mass, share = torch.cat(masses), torch.cat(shares)
    ok = share > 0
    return float((mass[ok] / share[ok]).mean())


def _tfidf_ridge(texts: pd.DataFrame, a: Arrays, base_all: torch.Tensor) -> torch.Tensor:
    """TF-IDF of the level-A text → ridge on PatchTST's residual (alpha chosen on val)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import Ridge

    t = texts[texts["level"] == "A"].set_index("window_id").loc[a.ids, "text"].to_numpy()
    tr, va, te = (a.idx[s].numpy() for s in ("train", "val", "test"))
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    Xtr = vec.fit_transform(t[tr])
    resid = (a.y - base_all).numpy()
    best = None
    for alpha in (0.1, 1.0, 10.0, 100.0):
        model = Ridge(alpha=alpha).fit(Xtr, resid[tr])
        val = float((((base_all[va].numpy() + model.predict(vec.transform(t[va]))) - a.y[va].numpy()) ** 2).mean())
        if best is None or val < best[0]:
            best = (val, model)
    return base_all[te] + torch.from_numpy(best[1].predict(vec.transform(t[te])).astype("float32"))


def train_tess(windows: pd.DataFrame, gt: pd.DataFrame, extr_lexicon: pd.DataFrame, extr_proto: pd.DataFrame,
               extr_llm: pd.DataFrame | None, raw: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """TESS and its ablations: no gate, oracle primitives, shuffled primitives, prototype backend,
    compressed text levels (and hard labels under eval.sweeps)."""
    p = parse("tess", raw)
    set_threads(p.threads)
    a = normalise(windows)
    L, H = a.x.shape[1], a.y.shape[1]
    te, tr = a.idx["test"], a.idx["train"]
    g_idx = gt_index(gt, a.ids)
    main = {"lexicon": extr_lexicon, "prototype": extr_proto, "llm": extr_llm}[p.extractor.backend]
    if main is None or len(main) == 0:
        raise ValueError("tess.extractor.backend is 'llm' but no LLM extractions were produced")

    def feats(source: pd.DataFrame, level: str = "A"):
        return primitive_features(source, level, a.ids, tr)

    todo = {v: s for v, s in plan(p).items() if v.startswith("tess") or v in ("oracle", "shuffled")}
    preds, log_rows, gate_rows = [], [], []
    for seed in p.seeds:
        for variant, seeds in todo.items():
            if seed not in seeds:
                continue
            gate_mode = "learned"
            if variant == "tess":
                f = feats(main)
            elif variant == "tess_nogate":
                f, gate_mode = feats(main), "one"
            elif variant == "oracle":
                f, gate_mode = oracle_features(g_idx), "one"
            elif variant == "shuffled":
                f = shuffled(feats(main), a.idx, seed)
            elif variant == "tess_prototype":
                f = feats(extr_proto)
            elif variant == "tess_hard":
                f = hard(feats(main))
            else:                                           # tess_B ... tess_E
                f = feats(main, variant.split("_")[1])
            correct = (f["top"] == torch.from_numpy(g_idx)).float()   # gate target; used on train only
            inputs = {k: v for k, v in f.items() if k != "top"}
            seed_everything(seed)
            r = train_one(_backbone(p, L, H, "tess"), a, inputs, p, seed, f"{variant} s{seed}",
                          gate_mode=gate_mode, gate_target=correct)
            pred, gate = _predict(r["model"], a, te, inputs, gate_mode, "cpu")
            preds += _rows(variant, seed, a.ids[te], pred)
            log_rows.append({"variant": variant, "seed": seed, **{k: r[k] for k in ("epochs", "best_val_mse", "train_seconds")}})
            if gate_mode == "learned":
                for k, prim in enumerate(PRIMITIVES):
                    gate_rows.append(pd.DataFrame({"variant": variant, "seed": seed, "window_id": a.ids[te],
                                                   "primitive": prim, "gate": gate[:, k].numpy(),
                                                   "correct": correct[te, k].numpy()}))
    gates = pd.concat(gate_rows, ignore_index=True) if gate_rows else pd.DataFrame(
        columns=["variant", "seed", "window_id", "primitive", "gate", "correct"])
    return pd.DataFrame(preds), pd.DataFrame(log_rows), gates
