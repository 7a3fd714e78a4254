"""Train stage of TESS: one function, ``train_variant``, trains any variant (the method, its ablations, every
baseline) on the seeds ``plan`` gives it, with the same backbone, budget, optimiser and early stopping
(card: Model, Baselines). Core builds one ``train.<variant>`` node per variant from it (spec.py).

Every variant returns its long results table and its predictions as tensors (test windows; PatchTST also
the train and val windows, which TF-IDF + ridge and MiniLM + ridge fit their residual on). The variants that read text also
predict the closed-vocabulary test rendering with the same fitted model (``<variant>_seen`` rows): the train
and val texts of the two renderings are identical, so a second fit would be the same fit."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import fit, node_setup
from pipelines.tess.lexicon import LABELS, MAX_LABELS, PRIMITIVES
from pipelines.tess.model import DLinear, PatchTST
from pipelines.tess.params import Params

log = logging.getLogger(__name__)
UNIMODAL = ("naive", "seasonal_naive", "dlinear", "patchtst")
RAW_TEXT = ("tfidf_ridge", "minilm_ridge", "fusion_A", "xattn_A")
OFFLINE_BACKENDS = ("minilm_head", "lexicon", "prototype")
SEEN = "_seen"  # suffix of the closed-vocabulary condition's report rows
RIDGE_ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
PRED_COLUMNS = ["variant", "seed", "window_id", "pred"]
LOG_COLUMNS = ["variant", "seed"]


@dataclass
class Arrays:
    x: torch.Tensor  # (n, L) history, RevIN-normalised by its own mean / std
    y: torch.Tensor  # (n, H) future in the same units (the metric's scale)
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


def primitive_features(
    extr: pd.DataFrame, level: str, ids: np.ndarray, train_idx: torch.Tensor, rendering: str = "open"
) -> dict[str, torch.Tensor]:
    """probs (n, K, M), margin standardised with train statistics per primitive, entropy, top label.

    ``rendering="seen"``: the windows of the closed-vocabulary test rendering take its extractions, every
    other window keeps the open rendering's (the train and val texts of the two renderings are identical)."""
    e = extr[extr["level"] == level]
    if "rendering" in e:
        e_open = e[e["rendering"] == "open"]
        if rendering == "seen":
            e_seen = e[e["rendering"] == "seen"]
            e_open = pd.concat([e_open[~e_open["window_id"].isin(set(e_seen["window_id"]))], e_seen])
        e = e_open
    probs, margin, ent, top = [], [], [], []
    for prim in PRIMITIVES:
        ep = e[e["primitive"] == prim].set_index("window_id").loc[ids]
        probs.append(np.stack(ep["probs"].to_numpy()))
        margin.append(ep["margin"].to_numpy())
        ent.append(ep["entropy"].to_numpy())
        top.append(ep["label"].map({lab: i for i, lab in enumerate(LABELS[prim])}).to_numpy())
    m = np.stack(margin, 1).astype(float)
    tr = train_idx.numpy()
    mz = (m - m[tr].mean(0)) / (m[tr].std(0) + 1e-6)  # margin scales differ by backend: standardise
    return {
        "probs": torch.tensor(np.stack(probs, 1), dtype=torch.float32),
        "margin_z": torch.tensor(mz, dtype=torch.float32),
        "entropy": torch.tensor(np.stack(ent, 1).astype(float), dtype=torch.float32),
        "top": torch.tensor(np.stack(top, 1).astype(np.int64)),
    }


def oracle_features(gt_idx: np.ndarray) -> dict[str, torch.Tensor]:
    """Ground-truth primitives as one-hot distributions (the explicit 'oracle' run only)."""
    n = len(gt_idx)
    probs = torch.zeros(n, len(PRIMITIVES), MAX_LABELS)
    probs.scatter_(2, torch.from_numpy(gt_idx)[..., None], 1.0)
    return {
        "probs": probs,
        "margin_z": torch.zeros(n, len(PRIMITIVES)),
        "entropy": torch.zeros(n, len(PRIMITIVES)),
        "top": torch.from_numpy(gt_idx),
    }


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


def _predict(
    model, a: Arrays, part: torch.Tensor, inputs: dict[str, torch.Tensor], gate_mode: str | None, device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    outs, gates = [], []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(part), 512):
            b = part[s : s + 512]
            kw = {k: v[b].to(device) for k, v in inputs.items()}
            if gate_mode is not None:
                o, g, _ = model(a.x[b].to(device), **kw, gate_mode=gate_mode, return_gate=True)
                gates.append(g.cpu())
            else:
                o = model(a.x[b].to(device), **kw)
            outs.append(o.cpu())
    return torch.cat(outs), (torch.cat(gates) if gates else None)


def train_one(
    model,
    a: Arrays,
    inputs: dict[str, torch.Tensor],
    p: Params,
    seed: int,
    desc: str,
    device,
    gate_mode: str | None = None,
    gate_target: torch.Tensor | None = None,
) -> dict:
    """Fit with the shared loop (AdamW, early stopping on val MSE, NaN guard); MSE + λ·BCE(gate) for TESS."""
    model.to(device)
    keys = list(inputs)
    tr = a.idx["train"]
    tensors = [a.x[tr], a.y[tr], *(inputs[k][tr] for k in keys)]
    use_gate_loss = gate_mode == "learned" and gate_target is not None and p.train.lambda_gate > 0
    if use_gate_loss:
        tensors.append(gate_target[tr])

    def loss_fn(m, x, y, *rest):
        kw = {k: v.to(device) for k, v in zip(keys, rest[: len(keys)])}
        x, y = x.to(device), y.to(device)
        if gate_mode is None:
            return torch.nn.functional.mse_loss(m(x, **kw), y)
        out, _, logit = m(x, **kw, gate_mode=gate_mode, return_gate=True)
        loss = torch.nn.functional.mse_loss(out, y)
        if use_gate_loss:
            loss = loss + p.train.lambda_gate * torch.nn.functional.binary_cross_entropy_with_logits(
                logit, rest[-1].to(device)
            )
        return loss

    def val_mse(m):
        pred, _ = _predict(m, a, a.idx["val"], inputs, gate_mode, device)
        return float(((pred - a.y[a.idx["val"]]) ** 2).mean())

    t0 = time.perf_counter()
    res = fit(
        model,
        tensors,
        loss_fn,
        val_score=val_mse,
        epochs=p.train.epochs,
        lr=p.train.lr,
        weight_decay=p.train.weight_decay,
        batch_size=p.train.batch_size,
        patience=p.train.patience,
        seed=seed,
        desc=desc,
        grad_clip=1.0,
    )
    seconds = time.perf_counter() - t0
    return {"model": model.cpu(), "epochs": res.epochs_run, "best_val_mse": res.best_val, "train_seconds": seconds}


def _backbone(p: Params, L: int, H: int, text: str = "none", text_dim: int = 0) -> PatchTST:
    m = p.model
    return PatchTST(
        L,
        H,
        m.d_model,
        m.n_heads,
        m.n_layers,
        m.d_ff,
        m.patch_len,
        m.stride,
        m.dropout,
        text=text,
        text_dim=text_dim,
        gate_hidden=m.gate_hidden,
    )


def _rows(variant: str, seed: int, ids: np.ndarray, pred: torch.Tensor, **arrays: torch.Tensor) -> list[dict]:
    return [
        {
            "variant": variant,
            "seed": seed,
            "window_id": int(w),
            "pred": pr.numpy().astype("float32"),
            **{k: v[i].numpy().astype("float32") for k, v in arrays.items()},
        }
        for i, (w, pr) in enumerate(zip(ids, pred))
    ]


# ------------------------------------------------------------------------------------------------ the plan
def backend_variants(p: Params) -> dict[str, str]:
    """TESS with each extractor: ``tess`` reads the configured backend, ``tess_<b>`` each other offline one."""
    main = p.extractor.backend
    return {"tess": main, **{f"tess_{b}": b for b in OFFLINE_BACKENDS if b != main}}


def backend_of(variant: str, p: Params) -> str | None:
    """The extractions a TESS variant reads (None: the oracle reads the ground truth)."""
    if variant == "oracle":
        return None
    return backend_variants(p).get(variant, p.extractor.backend)


def plan(p: Params) -> dict[str, list[int]]:
    """Which variants run on which seeds (ablations and compressed levels on the first seed by default)."""
    all_s, first = list(p.seeds), ([p.seeds[0]] if p.eval.single_seed_variants else list(p.seeds))
    out = {v: all_s for v in (*UNIMODAL, *RAW_TEXT, "tess", "tess_nogate")}
    out.update(
        {
            v: first
            for v in (
                "oracle",
                "shuffled",
                *(v for v in backend_variants(p) if v != "tess"),
                "tess_D",
                "fusion_D",
                "xattn_D",
            )
        }
    )
    if p.eval.sweeps:  # the full A–E ladder and hard labels
        out.update({f"tess_{lv}": first for lv in ("B", "C", "E")})
        out.update({f"{b}_{lv}": first for b in ("fusion", "xattn") for lv in ("B", "C", "E")})
        out["tess_hard"] = first
    return out


def family(variant: str) -> str:
    if variant in UNIMODAL or variant in ("tfidf_ridge", "minilm_ridge"):
        return variant
    if variant.startswith(("fusion_", "xattn_")):
        return "neural_text"
    return "tess"


def has_seen_condition(variant: str, p: Params) -> bool:
    """The variants also scored on the closed-vocabulary test rendering (prediction only, no refit)."""
    return variant in backend_variants(p) or variant in ("tfidf_ridge", "minilm_ridge", "fusion_A")


def variant_inputs(p: Params, variant: str) -> dict[str, str]:
    """The datasets the ``train.<variant>`` node reads, by argument of :func:`train_variant` (core adds
    ``p``); the ridge baselines read PatchTST's predictions (its artifacts), ``tess`` the texts too (its
    gate's AUROC on the randomly rendered texts)."""
    base = {"windows": "windows"}
    fam = family(variant)
    if fam in UNIMODAL:
        return base
    if fam == "tfidf_ridge":
        return {**base, "texts": "texts", "texts_seen": "texts_seen", "base": "patchtst_artifacts_tensors"}
    if fam == "minilm_ridge":
        return {**base, "emb": "text_emb_tensors", "base": "patchtst_artifacts_tensors"}
    if fam == "neural_text":
        return {**base, "emb": "text_emb_tensors"}
    backend = backend_of(variant, p)
    out = {**base, "gt": "primitives_gt", **({"texts": "texts"} if variant == "tess" else {})}
    return out if backend is None else {**out, "extractions": f"extractions_{backend}"}


# ------------------------------------------------------------------------------------------------ variants
def train_variant(
    p: Params,
    windows: pd.DataFrame,
    variant: str,
    gt: pd.DataFrame | None = None,
    texts: pd.DataFrame | None = None,
    texts_seen: pd.DataFrame | None = None,
    emb: dict | None = None,
    base: dict | None = None,
    extractions: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, dict]:
    """The node ``train.<variant>``: the variant's long results table (its rows and those of its
    ``<variant>_seen`` condition: test MSE / MAE, fit time, attention and gate diagnostics per seed) and its
    test predictions as tensors (PatchTST's: every window, the ridge baselines' base)."""
    from pipelines.tess.evaluate import prediction_tensors, results_table

    preds, logs = predict_variant(p, windows, variant, gt, texts, texts_seen, emb, base, extractions)
    return results_table(windows, variant, preds, logs, texts), prediction_tensors(preds, variant)


def predict_variant(
    p: Params,
    windows: pd.DataFrame,
    variant: str,
    gt: pd.DataFrame | None = None,
    texts: pd.DataFrame | None = None,
    texts_seen: pd.DataFrame | None = None,
    emb: dict | None = None,
    base: dict | None = None,
    extractions: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train one variant on its seeds; returns (predictions, fit log). Each seed starts from
    ``node_setup(p, seed)``, so a variant node gives the same result alone, resumed or in a full run."""
    seeds = plan(p)[variant]
    a = normalise(windows)
    fam = family(variant)
    preds, logs = [], []
    for seed in seeds:
        device = node_setup(p, seed)
        if fam in ("naive", "seasonal_naive"):
            preds += _naive(variant, a, p, seed)
            logs.append({"variant": variant, "seed": seed})
        elif fam in ("dlinear", "patchtst"):
            r, rows = _unimodal(variant, a, p, seed, device)
            preds += rows
            logs.append(r)
        elif fam in ("tfidf_ridge", "minilm_ridge"):
            rows, r = _text_ridge(variant, a, seed, base, texts, texts_seen, emb, p)
            preds += rows
            logs.append(r)
        elif fam == "neural_text":
            if variant.split("_")[1] not in emb:
                log.warning("tess: %s skipped (no level-%s texts)", variant, variant.split("_")[1])
                break
            rows, r = _neural_text(variant, a, emb, p, seed, device)
            preds += rows
            logs.append(r)
        else:
            out = _tess(variant, a, gt, extractions, p, seed, device)
            if out is None:
                break
            rows, r = out
            preds += rows
            logs.append(r)
    pred_df = pd.DataFrame(preds) if preds else pd.DataFrame(columns=PRED_COLUMNS)
    log_df = pd.DataFrame(logs) if logs else pd.DataFrame(columns=LOG_COLUMNS)
    return pred_df, log_df


def _naive(variant: str, a: Arrays, p: Params, seed: int) -> list[dict]:
    L, H = a.x.shape[1], a.y.shape[1]
    te = a.idx["test"]
    if variant == "naive":
        return _rows(variant, seed, a.ids[te], a.x[te, -1:].expand(-1, H))
    period = p.data.period
    season = a.x[:, L - period :][:, torch.arange(H) % period]
    return _rows(variant, seed, a.ids[te], season[te])


def _fit_log(variant: str, seed: int, r: dict, **extra) -> dict:
    return {"variant": variant, "seed": seed, **{k: r[k] for k in ("epochs", "best_val_mse", "train_seconds")}, **extra}


def _unimodal(variant: str, a: Arrays, p: Params, seed: int, device) -> tuple[dict, list[dict]]:
    """DLinear: test windows. PatchTST: every window (its train/val predictions are the ridge baselines' base)."""
    L, H = a.x.shape[1], a.y.shape[1]
    model = DLinear(L, H) if variant == "dlinear" else _backbone(p, L, H)
    r = train_one(model, a, {}, p, seed, f"{variant} s{seed}", device)
    part = a.idx["test"] if variant == "dlinear" else torch.arange(len(a.ids))
    pred = _predict(r["model"], a, part, {}, None, "cpu")[0]
    return _fit_log(variant, seed, r), _rows(variant, seed, a.ids[part.numpy()], pred)


def _neural_text(variant: str, a: Arrays, emb: dict, p: Params, seed: int, device) -> tuple[list[dict], dict]:
    """Sentence fusion (MiniLM sentence embedding added to the patch tokens) or token cross-attention."""
    L, H = a.x.shape[1], a.y.shape[1]
    te = a.idx["test"]
    kind, level = variant.split("_")
    e = emb[level]
    assert np.array_equal(e["window_id"].numpy(), a.ids), "text embeddings misaligned with windows"
    inputs = {"sent": e["sent"]} if kind == "fusion" else {"tokens": e["tokens"].float(), "token_mask": e["mask"]}
    dim = e["sent"].shape[1] if kind == "fusion" else e["tokens"].shape[2]
    r = train_one(_backbone(p, L, H, kind, dim), a, inputs, p, seed, f"{variant} s{seed}", device)
    pred, _ = _predict(r["model"], a, te, inputs, None, "cpu")
    rows = _rows(variant, seed, a.ids[te], pred)
    extra = {}
    if kind == "xattn":
        extra["attn_cue_ratio"] = attention_cue_ratio(r["model"], a, te, inputs, e["cue"])
    if has_seen_condition(variant, p) and f"seen_{level}" in emb:
        seen = _seen_inputs(emb, level, a, inputs)
        rows += _rows(variant + SEEN, seed, a.ids[te], _predict(r["model"], a, te, seen, None, "cpu")[0])
    return rows, _fit_log(variant, seed, r, **extra)


def _seen_inputs(emb: dict, level: str, a: Arrays, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` with the sentence embeddings of the closed-vocabulary test rendering on its windows."""
    s = emb[f"seen_{level}"]
    pos = {int(w): i for i, w in enumerate(a.ids)}
    rows = torch.tensor([pos[int(w)] for w in s["window_id"]])
    sent = inputs["sent"].clone()
    sent[rows] = s["sent"]
    return {**inputs, "sent": sent}


def attention_cue_ratio(model, a: Arrays, part: torch.Tensor, inputs: dict, cue: torch.Tensor) -> float:
    """Attention mass on the narrative (cue) tokens divided by their share of the text tokens: 1 means the
    model attends to cues no more than to redundant tokens (card: over-attention probe)."""
    masses, shares = [], []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(part), 512):
            b = part[s : s + 512]
            model(a.x[b], **{k: v[b] for k, v in inputs.items()})
            w = model.last_attention.mean(1)  # (B, T) averaged over patch queries
            c, m = cue[b].float(), inputs["token_mask"][b].float()
            masses.append((w * c).sum(1))
            shares.append(c.sum(1) / m.sum(1).clamp(min=1))
    mass, share = torch.cat(masses), torch.cat(shares)
    ok = share > 0
    return float((mass[ok] / share[ok]).mean())


def _ridge_on_residual(X: np.ndarray, resid: np.ndarray, base: np.ndarray, y: np.ndarray, tr, va):
    """Ridge from text features to the residual y − base; alpha chosen on the val windows' MSE."""
    from sklearn.linear_model import Ridge

    best = None
    for alpha in RIDGE_ALPHAS:
        model = Ridge(alpha=alpha).fit(X[tr], resid[tr])
        val = float((((base[va] + model.predict(X[va])) - y[va]) ** 2).mean())
        if best is None or val < best[0]:
            best = (val, alpha, model)
    return best


def _text_ridge(
    variant: str,
    a: Arrays,
    seed: int,
    base: dict,
    texts: pd.DataFrame | None,
    texts_seen: pd.DataFrame | None,
    emb: dict | None,
    p: Params,
) -> tuple[list[dict], dict]:
    """TF-IDF of the level-A text, or the minilm_head extractor's input for it (the mean of its clauses'
    MiniLM embeddings, as MiniLM gives them: a first run standardised them, as the head does, and the
    unbounded ridge read-out then blew up on unseen paraphrases) → ridge on PatchTST's residual (same
    seed), alpha chosen on val."""
    b = base[f"seed{seed}"]  # PatchTST's predictions of every window, same seed
    pos = {int(w): i for i, w in enumerate(b["window_id"].tolist())}
    base_all = b["pred"].numpy()[[pos[int(w)] for w in a.ids]].astype("float32")
    y = a.y.numpy()
    tr, va, te = (a.idx[s].numpy() for s in ("train", "val", "test"))
    seen_X = None
    if variant == "tfidf_ridge":
        from sklearn.feature_extraction.text import TfidfVectorizer

        t = texts[texts["level"] == "A"].set_index("window_id").loc[a.ids, "text"].to_numpy()
        vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
        vec.fit(t[tr])
        X = vec.transform(t)
        ts = texts_seen[texts_seen["level"] == "A"] if texts_seen is not None and len(texts_seen) else None
        if ts is not None and len(ts):
            seen_text = pd.Series(t, index=a.ids)
            seen_text.loc[ts["window_id"].to_numpy()] = ts["text"].to_numpy()
            seen_X = vec.transform(seen_text.to_numpy())
    else:  # the minilm_head extractor's input: the clause-mean embeddings
        assert np.array_equal(emb["A"]["window_id"].numpy(), a.ids), "text embeddings misaligned with windows"
        X = emb["A"]["clauses"].numpy().astype("float64")
        if "seen_A" in emb:
            seen_X = X.copy()
            pos = {int(w): i for i, w in enumerate(a.ids)}
            seen_X[[pos[int(w)] for w in emb["seen_A"]["window_id"]]] = emb["seen_A"]["clauses"].numpy()
    val, alpha, model = _ridge_on_residual(X, y - base_all, base_all, y, tr, va)
    pred = torch.from_numpy((base_all[te] + model.predict(X[te])).astype("float32"))
    rows = _rows(variant, seed, a.ids[te], pred)
    if seen_X is not None:
        pred_s = torch.from_numpy((base_all[te] + model.predict(seen_X[te])).astype("float32"))
        rows += _rows(variant + SEEN, seed, a.ids[te], pred_s)
    return rows, {"variant": variant, "seed": seed, "alpha": alpha, "best_val_mse": val}


def _tess(
    variant: str, a: Arrays, gt: pd.DataFrame, extr: pd.DataFrame | None, p: Params, seed: int, device
) -> tuple[list[dict], dict] | None:
    """TESS and its ablations: no gate, oracle primitives, shuffled primitives, each extractor backend,
    compressed text levels (and hard labels under eval.sweeps)."""
    L, H = a.x.shape[1], a.y.shape[1]
    te, tr = a.idx["test"], a.idx["train"]
    g_idx = gt_index(gt, a.ids)
    level = variant.split("_")[1] if variant in {f"tess_{lv}" for lv in "BCDE"} else "A"
    if variant != "oracle":
        if extr is None or len(extr) == 0:
            raise ValueError(f"tess: variant {variant} has no extractions from backend '{backend_of(variant, p)}'")
        if level not in set(extr["level"]):
            log.warning("tess: %s skipped (no level-%s texts)", variant, level)
            return None
    gate_mode = "learned"
    seen_f = None
    if variant == "oracle":
        f, gate_mode = oracle_features(g_idx), "one"
    else:
        f = primitive_features(extr, level, a.ids, tr)
        if variant == "tess_nogate":
            gate_mode = "one"
        elif variant == "shuffled":
            f = shuffled(f, a.idx, seed)
        elif variant == "tess_hard":
            f = hard(f)
        if has_seen_condition(variant, p) and "rendering" in extr and (extr["rendering"] == "seen").any():
            seen_f = primitive_features(extr, level, a.ids, tr, rendering="seen")
    gt_t = torch.from_numpy(g_idx)
    correct = (f["top"] == gt_t).float()  # gate target; used on train only
    inputs = {k: v for k, v in f.items() if k != "top"}
    r = train_one(
        _backbone(p, L, H, "tess"),
        a,
        inputs,
        p,
        seed,
        f"{variant} s{seed}",
        device,
        gate_mode=gate_mode,
        gate_target=correct,
    )
    pred, gate = _predict(r["model"], a, te, inputs, gate_mode, "cpu")
    gates = {"gate": gate, "correct": correct[te]} if gate_mode == "learned" else {}
    rows = _rows(variant, seed, a.ids[te.numpy()], pred, **gates)
    if seen_f is not None:
        s_inputs = {k: v for k, v in seen_f.items() if k != "top"}
        pred_s, gate_s = _predict(r["model"], a, te, s_inputs, gate_mode, "cpu")
        gates_s = {"gate": gate_s, "correct": (seen_f["top"] == gt_t).float()[te]} if gate_mode == "learned" else {}
        rows += _rows(variant + SEEN, seed, a.ids[te.numpy()], pred_s, **gates_s)
    return rows, _fit_log(variant, seed, r)
