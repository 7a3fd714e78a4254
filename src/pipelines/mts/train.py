"""Training of every `mts` variant with core's loop: plain weighted classifiers (real only, uniform,
classifier filter, oracle) and the bi-level meta-learned weighting (MW-Net-style loss input or the MTS
features, at a small or large batch); the offline features (SD_* position in an embedding space, pre_*
training dynamics of a no-selection run)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import fit, node_setup
from pipelines.mts.model import MLP, MetaNet, cls_features, ess, meta_objective, normalise, zscore
from pipelines.mts.params import BASELINES, QUALITIES, Params, Selector

SD = ["SD_cos_real_centroid", "SD_cos_syn_centroid", "SD_top_real", "SD_top_syn", "SD_knn_agree", "SD_median_dist"]
PRE = ["pre_py_mean", "pre_py_std", "pre_forgets", "pre_py_final"]
OFFLINE = SD + PRE


@dataclass
class Split:
    """One seed's tensors: the training pool (real train + synthetic), the meta set and the test set."""

    x: torch.Tensor
    y: torch.Tensor
    is_syn: torch.Tensor
    quality: np.ndarray
    xm: torch.Tensor
    ym: torch.Tensor
    xt: torch.Tensor
    yt: torch.Tensor
    n_classes: int


def split_of(pool: pd.DataFrame, seed: int) -> Split:
    d = pool[pool["seed"] == seed]
    xc = [c for c in d.columns if c.startswith("x")]

    def t(part):
        s = d[d["split"] == part]
        return (torch.tensor(s[xc].to_numpy(np.float32)), torch.tensor(s["y"].to_numpy(np.int64)))

    tr = d[d["split"] == "train"]
    (x, y), (xm, ym), (xt, yt) = t("train"), t("meta"), t("test")
    return Split(
        x,
        y,
        torch.tensor(tr["is_syn"].to_numpy(bool)),
        tr["quality"].to_numpy(str),
        xm,
        ym,
        xt,
        yt,
        int(d["y"].max()) + 1,
    )


def epoch_sampler(n: int, bs: int):
    """Minibatch indices: a fresh seeded permutation each epoch, the last partial batch dropped."""
    bs = min(bs, n)
    per = max(n // bs, 1)
    state: dict = {}

    def sample(step: int, gen: torch.Generator):
        if step % per == 0:
            state["perm"] = torch.randperm(n, generator=gen)
        j = step % per
        return (state["perm"][j * bs : (j + 1) * bs],)

    return sample, per


def sgd_factory(p: Params, holder: dict, lr: float | None = None):
    def make(params):
        holder["opt"] = torch.optim.SGD(
            params, lr=lr or p.classifier.lr, momentum=p.classifier.momentum, weight_decay=p.classifier.weight_decay
        )
        return holder["opt"]

    return make


def train_plain(
    p: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    seed: int,
    steps: int,
    w: torch.Tensor | None = None,
    callback=None,
    desc: str = "mts",
    holder: dict | None = None,
) -> MLP:
    """A classifier on (x, y) with fixed per-sample weights w (None: all 1), batch-normalised like MTS."""
    torch.manual_seed(seed)
    clf = MLP(x.shape[1], p.classifier.hidden, n_classes)
    sample, _ = epoch_sampler(len(x), p.classifier.batch_size)

    def loss_fn(model, idx):
        losses = F.cross_entropy(model(x[idx]), y[idx], reduction="none")
        return losses.mean() if w is None else (normalise(w[idx]) * losses).mean()

    fit(
        clf,
        None,
        loss_fn,
        steps=steps,
        sample_batch=sample,
        optimizer=sgd_factory(p, {} if holder is None else holder),
        grad_clip=None,
        seed=seed,
        desc=desc,
        callback=callback,
    )
    return clf


def baseline_steps(p: Params, n_pool: int) -> int:
    """Every non-meta variant gets the uniform baseline's step budget (epochs over the whole pool)."""
    return p.classifier.epochs * max(n_pool // min(p.classifier.batch_size, n_pool), 1)


def accuracy(clf: MLP, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((clf(x).argmax(1) == y).float().mean())


# ---------------------------------------------------------------- offline features (SD_*, pre_*)


def sd_features(s: Split, p: Params, seed: int) -> np.ndarray:
    """Position of each pool sample in an embedding space (PCA fit on the real training data stands in
    for the generator's encoder): cosine to the real / synthetic centroid of its labelled class, mean of
    the top-k same-class real / synthetic cosines, distance-weighted k-NN label agreement, median
    distance to the same-class real samples."""
    from sklearn.decomposition import PCA

    x, y, syn = s.x.numpy().astype(np.float64), s.y.numpy(), s.is_syn.numpy()
    real = ~syn
    k_dim = min(p.features.embed_dim, int(real.sum()) - 1, x.shape[1])
    pca = PCA(n_components=k_dim, random_state=seed).fit(x[real])
    z = pca.transform(x)
    zn = z / (np.linalg.norm(z, axis=1, keepdims=True) + 1e-12)
    cos = zn @ zn.T
    np.fill_diagonal(cos, np.nan)  # never compare a sample to itself
    dist = np.sqrt(np.maximum((z**2).sum(1)[:, None] + (z**2).sum(1)[None] - 2 * z @ z.T, 0))
    np.fill_diagonal(dist, np.inf)
    n, out = len(y), np.zeros((len(y), len(SD)))
    same = y[:, None] == y[None, :]
    for j, group in enumerate((real, syn)):
        cent = np.zeros((s.n_classes, z.shape[1]))
        for c in range(s.n_classes):
            m = group & (y == c)
            if m.any():
                cent[c] = z[m].mean(0)
        cn = cent / (np.linalg.norm(cent, axis=1, keepdims=True) + 1e-12)
        out[:, j] = (zn * cn[y]).sum(1)
        c_same = np.where(same & group[None, :], cos, -np.inf)
        c_same = np.nan_to_num(c_same, nan=-np.inf)
        k = p.features.top_k
        top = -np.sort(-c_same, axis=1)[:, :k]
        top = np.where(np.isfinite(top), top, np.nan)
        out[:, 2 + j] = np.nan_to_num(np.nanmean(top, axis=1) if top.size else np.zeros(n), nan=0.0)
    nn_idx = np.argsort(dist, axis=1)[:, : p.features.knn]
    wk = 1.0 / (np.take_along_axis(dist, nn_idx, 1) + 1e-6)
    out[:, 4] = (wk * (y[nn_idx] == y[:, None])).sum(1) / wk.sum(1)
    dr = np.where(same & real[None, :], dist, np.nan)
    dr[~np.isfinite(dr)] = np.nan
    med = np.nanmedian(np.where(np.isnan(dr).all(1, keepdims=True), 0.0, dr), axis=1)
    out[:, 5] = np.nan_to_num(med, nan=0.0)
    return out


def pre_features(s: Split, p: Params, seed: int) -> np.ndarray:
    """Training dynamics of a classifier trained without selection, tracked every epoch on the whole
    pool: mean and std of p(y), forgetting events (correct → wrong between epochs), final p(y)."""
    n = len(s.y)
    bs = min(p.classifier.batch_size, n)
    per = max(n // bs, 1)
    probs, correct = [], []

    def track(info):
        if (info.step + 1) % per == 0:
            with torch.no_grad():
                pr = F.softmax(info.model(s.x), 1)
            probs.append(pr[torch.arange(n), s.y].numpy())
            correct.append((pr.argmax(1) == s.y).numpy())

    train_plain(p, s.x, s.y, s.n_classes, seed, p.features.pre_epochs * per, callback=track, desc="mts.pre_features")
    pr, co = np.stack(probs), np.stack(correct)
    forgets = (co[:-1] & ~co[1:]).sum(0) if len(co) > 1 else np.zeros(n)
    return np.stack([pr.mean(0), pr.std(0), forgets, pr[-1]], 1)


def make_features(pool: pd.DataFrame, p: Params) -> pd.DataFrame:
    """The offline features of every training-pool sample, per seed, in the pool's row order."""
    frames = []
    for seed in p.seeds:
        node_setup(p, seed)
        s = split_of(pool, seed)
        f = np.concatenate([sd_features(s, p, seed), pre_features(s, p, seed)], 1)
        if not np.isfinite(f).all():
            raise FloatingPointError(f"node 'mts.data.features': non-finite offline features (seed {seed})")
        df = pd.DataFrame(f, columns=OFFLINE)
        df["seed"] = seed
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------- the bi-level (meta) weighting


class Selection:
    """The meta-net input for a batch: the per-sample loss (MW-Net) or the MTS features (offline
    z-scored SD_*/pre_*, batch-normalised online CLS_*, the is-synthetic flag, the class one-hot)."""

    def __init__(self, s: Split, offline: np.ndarray, kind: str):
        self.s, self.kind = s, kind
        off = torch.tensor(offline, dtype=torch.float32)
        self.offline = zscore(off)
        self.onehot = F.one_hot(s.y, s.n_classes).float()
        self.flag = s.is_syn.float()[:, None]

    @property
    def dim(self) -> int:
        if self.kind == "loss":
            return 1
        return self.offline.shape[1] + 2 + self.onehot.shape[1] + (1 if self.kind == "full" else 0)

    def __call__(self, clf: MLP, theta, idx: torch.Tensor) -> torch.Tensor:
        from torch.func import functional_call

        x, y = self.s.x[idx], self.s.y[idx]
        with torch.no_grad():
            if self.kind == "loss":
                out = functional_call(clf, {k: t.detach() for k, t in theta.items()}, (x,))
                return F.cross_entropy(out, y, reduction="none")[:, None]
            cls = zscore(cls_features(clf, x, y, self.s.xm, self.s.ym))
            parts = [self.offline[idx], cls, self.onehot[idx]]
            if self.kind == "full":
                parts.append(self.flag[idx])
            return torch.cat(parts, 1)


def train_meta(p: Params, s: Split, offline: np.ndarray, sel: Selector, seed: int, name: str):
    """Bi-level weighting: each step updates the meta-net φ by the meta-gradient through a virtual step
    of the classifier (its real SGD-momentum state), then the classifier takes its real step on the loss
    weighted by the updated (detached) weights. Returns the classifier, the raw weight each pool sample
    got at its last visit, the number of meta steps and a per-epoch history."""
    torch.manual_seed(seed)
    n = len(s.y)
    feats = Selection(s, offline, sel.features)
    clf = MLP(s.x.shape[1], p.classifier.hidden, s.n_classes)
    metanet = MetaNet(feats.dim, p.meta.hidden, p.meta.w_floor)
    phi_opt = torch.optim.Adam(metanet.parameters(), lr=p.meta.lr)
    holder: dict = {}
    sample, per = epoch_sampler(n, sel.batch_size)
    steps = (sel.epochs or p.classifier.epochs) * per
    meta_gen = torch.Generator().manual_seed(10_000 + seed)
    last_w = torch.full((n,), float("nan"))
    hist: dict[str, list] = {f"w_{q}": [] for q in ("real", *QUALITIES)} | {"ess_frac": []}
    ess_epoch: list[float] = []

    def loss_fn(model, idx):
        opt = holder["opt"]
        theta = dict(model.named_parameters())
        buffers = {k: opt.state[t].get("momentum_buffer") for k, t in theta.items()}
        mi = torch.randperm(len(s.ym), generator=meta_gen)[: p.meta.meta_batch]
        # the meta step: one step of core's loop on φ (Adam, persistent state) with the objective whose
        # φ-gradient is the meta-gradient through the virtual step; then the real step below uses the
        # updated φ
        fit(
            metanet,
            None,
            lambda net, _i: meta_objective(
                model,
                theta,
                net,
                lambda th: feats(model, th, idx),
                s.x[idx],
                s.y[idx],
                s.xm[mi],
                s.ym[mi],
                lr=p.meta.virtual_lr,
                momentum=p.classifier.momentum,
                weight_decay=p.classifier.weight_decay,
                buffers=buffers,
                method=p.meta.grad,
                fd_eps=p.meta.fd_eps,
            ),
            steps=1,
            sample_batch=lambda _s, _g: (idx,),
            optimizer=lambda _ps: phi_opt,
            grad_clip=None,
            seed=seed,
            desc=f"mts.{name}.meta_step",
            progress=False,
        )
        with torch.no_grad():
            w = metanet(feats(model, theta, idx))
        if not torch.isfinite(w).all():
            raise FloatingPointError(f"node 'mts.train.{name}': non-finite sample weights (seed {seed})")
        last_w[idx] = w
        ess_epoch.append(ess(w) / len(w))
        losses = F.cross_entropy(model(s.x[idx]), s.y[idx], reduction="none")
        return (normalise(w) * losses).mean()

    def record(info):
        if (info.step + 1) % per == 0:
            for q in ("real", *QUALITIES):
                m = (s.quality == q) & ~np.isnan(last_w.numpy())
                hist[f"w_{q}"].append(float(last_w.numpy()[m].mean()) if m.any() else float("nan"))
            hist["ess_frac"].append(float(np.mean(ess_epoch)))
            ess_epoch.clear()

    fit(
        clf,
        None,
        loss_fn,
        steps=steps,
        sample_batch=sample,
        optimizer=sgd_factory(p, holder, sel.lr),
        grad_clip=None,
        seed=seed,
        desc=f"mts.{name}",
        callback=record,
    )
    return clf, last_w.numpy(), steps, hist


# ---------------------------------------------------------------- one variant, every seed


def _auc(weights: np.ndarray, quality: np.ndarray) -> float:
    """How well the weights separate good from bad synthetic samples (ROC AUC; ties count half)."""
    from scipy.stats import rankdata

    syn = quality != "real"
    w, good = weights[syn], quality[syn] == "good"
    ok = ~np.isnan(w)
    w, good = w[ok], good[ok]
    if good.all() or not good.any():
        return float("nan")
    r = rankdata(w)
    n1, n0 = good.sum(), (~good).sum()
    return float((r[good].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def train_variant(pool: pd.DataFrame, features: pd.DataFrame, p: Params, variant: str):
    """train.<variant>: ``variant`` on each seed → (its long table: metrics per seed and the first seed's
    per-epoch weight history, the raw per-sample final weights by seed for the plots)."""
    from pipelines.core.api import Results

    sel = p.selectors.get(variant)
    seeds = [sd for sd in p.seeds if sel is None or sel.seeds is None or sd in sel.seeds]
    res = Results(variant)
    weights: dict[str, list] = {"seed": [], "quality": [], "is_syn": [], "weight": []}
    for seed in seeds:
        node_setup(p, seed)
        t0 = time.perf_counter()
        s = split_of(pool, seed)
        n, steps, hist = len(s.y), baseline_steps(p, len(s.y)), None
        if variant == "real_only":
            w = (~s.is_syn).float()
            keep = ~s.is_syn
            clf = train_plain(p, s.x[keep], s.y[keep], s.n_classes, seed, steps, desc=f"mts.{variant}")
        elif variant == "uniform":
            w = torch.ones(n)
            clf = train_plain(p, s.x, s.y, s.n_classes, seed, steps, desc=f"mts.{variant}")
        elif variant == "oracle":
            w = torch.tensor(np.isin(s.quality, ["real", "good"])).float()
            clf = train_plain(p, s.x[w > 0], s.y[w > 0], s.n_classes, seed, steps, desc=f"mts.{variant}")
        elif variant == "classifier_filter":
            real = ~s.is_syn
            judge = train_plain(p, s.x[real], s.y[real], s.n_classes, seed, steps, desc="mts.filter_judge")
            with torch.no_grad():
                conf = F.softmax(judge(s.x), 1)[torch.arange(n), s.y]
            w = (real | (conf > p.filter_confidence)).float()
            clf = train_plain(p, s.x[w > 0], s.y[w > 0], s.n_classes, seed, steps, desc=f"mts.{variant}")
        elif sel is not None:
            off = features[features["seed"] == seed][OFFLINE].to_numpy()
            if len(off) != n:
                raise ValueError(
                    f"node 'mts.train.{variant}': {len(off)} feature rows for {n} pool rows "
                    f"(seed {seed}); rerun data.features with the same parameters"
                )
            clf, w_np, steps, hist = train_meta(p, s, off, sel, seed, variant)
            w = torch.tensor(w_np)
        else:
            raise ValueError(f"unknown variant {variant!r} (baselines {list(BASELINES)} or a selector)")
        wn = w.numpy().astype(float)
        row = {
            "test_acc": accuracy(clf, s.xt, s.yt),
            "weight_quality_auc": _auc(wn, s.quality),
            "meta_steps": steps if sel is not None else 0,
            "train_steps": steps,
            "syn_kept_frac": float(np.nanmean(wn[s.is_syn.numpy()] > 0.5)) if s.is_syn.any() else 0.0,
            "wall_time_s": time.perf_counter() - t0,
        }
        for q in ("real", *QUALITIES):
            m = s.quality == q
            row[f"w_mean_{q}"] = float(np.nanmean(wn[m])) if m.any() else float("nan")
        for q in QUALITIES[1:]:  # which kind of bad sample the weights catch
            m = np.isin(s.quality, ["good", q])
            row[f"auc_good_vs_{q}"] = _auc(wn[m], s.quality[m])
        res.add(seed, **row)
        if hist is not None and seed == seeds[0]:  # the per-epoch weight history of the first seed
            for k, vals in hist.items():
                res.history(seed, k, vals)
        weights["seed"] += [seed] * n
        weights["quality"] += [str(q) for q in s.quality]
        weights["is_syn"] += [bool(b) for b in s.is_syn.numpy()]
        weights["weight"] += [float(x) for x in wn]
    return res.table(), {"weights": weights}
