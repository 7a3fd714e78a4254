"""The GSNR study: the signal-to-noise ratio of the meta-gradient ∇_φ L_meta over independent minibatch
draws, against the batch size, at a fixed early point (θ after a few uniform epochs, φ at init)."""

from __future__ import annotations

import pandas as pd
import torch

from pipelines.core.api import node_setup
from pipelines.mts.model import MLP, MetaNet, gsnr, meta_gradient
from pipelines.mts.params import Params
from pipelines.mts.train import OFFLINE, Selection, epoch_sampler, split_of, train_plain

COLUMNS = ["selector", "features", "batch_size", "gsnr_median", "gsnr_aggregate", "n_coords", "draws", "fd_cosine"]


def _cos(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    u, v = torch.cat([t.flatten() for t in a]), torch.cat([t.flatten() for t in b])
    return float(u @ v / (u.norm() * v.norm() + 1e-30))


def measure_gsnr(pool: pd.DataFrame, features: pd.DataFrame, p: Params) -> pd.DataFrame:
    g = p.gsnr
    if not g.enabled:
        return pd.DataFrame(columns=COLUMNS)
    seed = g.seed if g.seed in p.seeds else p.seeds[0]
    node_setup(p, seed)
    s = split_of(pool, seed)
    off = features[features["seed"] == seed][OFFLINE].to_numpy()
    n = len(s.y)
    holder: dict = {}
    _, per = epoch_sampler(n, p.classifier.batch_size)
    if g.warm_epochs:
        clf = train_plain(p, s.x, s.y, s.n_classes, seed, g.warm_epochs * per, desc="mts.gsnr_warm", holder=holder)
        opt = holder["opt"]
        buffers = {k: opt.state[t].get("momentum_buffer") for k, t in clf.named_parameters()}
    else:
        torch.manual_seed(seed)
        clf, buffers = MLP(s.x.shape[1], p.classifier.hidden, s.n_classes), {}
    theta = {k: t.detach() for k, t in clf.named_parameters()}
    rows = []
    for name in g.selectors:
        sel = p.selectors[name]
        feats = Selection(s, off, sel.features)
        torch.manual_seed(seed)
        metanet = MetaNet(feats.dim, p.meta.hidden, p.meta.w_floor)
        gen = torch.Generator().manual_seed(20_000 + seed)
        for b in g.batch_sizes:
            bb = min(b, n)
            draws, fd_cos = [], float("nan")
            for i in range(g.draws):
                idx = torch.randperm(n, generator=gen)[:bb]
                mi = torch.randperm(len(s.ym), generator=gen)[: p.meta.meta_batch]
                kw = dict(
                    lr=p.meta.virtual_lr,
                    momentum=p.classifier.momentum,
                    buffers=buffers,
                    weight_decay=p.classifier.weight_decay,
                    fd_eps=p.meta.fd_eps,
                )
                args = (
                    clf,
                    theta,
                    metanet,
                    lambda th, idx=idx: feats(clf, th, idx),
                    s.x[idx],
                    s.y[idx],
                    s.xm[mi],
                    s.ym[mi],
                )
                gr = meta_gradient(*args, method=p.meta.grad, **kw)
                if i == 0:  # the official finite-difference HVP against the exact unroll, same draw
                    other = "finite_difference" if p.meta.grad == "exact" else "exact"
                    fd_cos = _cos(gr, meta_gradient(*args, method=other, **kw))
                draws.append(torch.cat([t.flatten() for t in gr]))
            r = gsnr(torch.stack(draws))
            rows.append(
                {
                    "selector": name,
                    "features": sel.features,
                    "batch_size": b,
                    "gsnr_median": r["median"],
                    "gsnr_aggregate": r["aggregate"],
                    "n_coords": r["n_coords"],
                    "draws": g.draws,
                    "fd_cosine": fd_cos,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)
