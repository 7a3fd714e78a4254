"""Train one variant on its stream, all seeds side by side as replicas, through core's training loop
(``fit`` with ``sample_batch``: one stream sample per step, batch size 1; the update rule is a callable
optimizer on λ, unclipped).

- continual variants (bimu, bayesbinn, bayesbinn_official, online): T permuted-digit tasks in one pass;
  after each task every seen task is evaluated (task-agnostic), with the posterior variance and saturation;
  at the end OOD detection against an unseen permutation and uniform noise.
- active variants (al_vr, al_random, al_all): BiMU on an imbalanced, domain-shifted stream that queries a
  label (and backprops) only when its rule says so; the labels-to-accuracy curve on a balanced test set.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch

from pipelines.bimu.model import (
    BinaryBayesNet,
    GaussianNet,
    LambdaRule,
    MesuRule,
    MetaAdam,
    NoiseBlocks,
    bayesbinn_delta,
    bimu_delta,
    binary_net_loss,
    hard_probs,
    online_delta,
    relaxed_loss,
    ste_sign,
    uncertainty,
)
from pipelines.bimu.params import ACTIVE, CONTINUAL, Params
from pipelines.core.api import fit, node_setup

DETERMINISTIC = ("ste_adam", "metaplastic")
SATURATED = 0.99  # |tanh λ| above this: the weight is (nearly) deterministic
log = logging.getLogger(__name__)


def _gens(seeds, salt: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(int(s) * 1_000_003 + salt) for s in seeds]


def update_rule(p: Params, variant: str):
    """(init, rule) of a λ-update variant; ``rule(λ, ∂L/∂λ) -> Δλ``."""
    if variant in ("bimu", *ACTIVE):
        b = p.bimu
        lm = p.active.lm if variant in ACTIVE and p.active.lm is not None else b.lm
        return "uniform", functools.partial(
            bimu_delta, lm=lm, eta=b.eta, eta_max=b.eta_max, kappa=b.kappa, n_mem=b.n_mem, relaxation=b.relaxation
        )
    if variant in ("bayesbinn", "bayesbinn_official"):
        b = getattr(p, variant)
        return "zero", functools.partial(bayesbinn_delta, lr=b.lr, prior_strength=b.prior_strength)
    if variant == "online":
        return "uniform", functools.partial(online_delta, lr=p.online.lr)
    raise ValueError(f"unknown variant {variant!r}")


def posterior_stats(net: BinaryBayesNet) -> tuple[np.ndarray, np.ndarray]:
    """Per replica: mean Bernoulli variance mean(1 − tanh² λ) and the share of saturated weights."""
    t = torch.cat([lam.detach().flatten(1) for lam in net.lams()], 1).tanh()
    return (1 - t * t).mean(1).numpy(), (t.abs() > SATURATED).float().mean(1).numpy()


def _accuracy(probs: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    return (probs.mean(1).argmax(-1) == y).float().mean(-1).numpy()


def _auc(id_score: np.ndarray, ood_score: np.ndarray) -> float:
    """OOD AUROC (OOD = positive, higher score = more uncertain). A NaN score is a failed detection, never
    credited: a NaN ID score ranks above every OOD score and a NaN OOD score below every ID score, so every
    pair holding a NaN counts 0 and NaNs can only lower the AUC (logged with their counts)."""
    from sklearn.metrics import roc_auc_score

    id_score, ood_score = np.asarray(id_score, float), np.asarray(ood_score, float)
    nan_id, nan_ood = np.isnan(id_score), np.isnan(ood_score)
    if nan_id.any() or nan_ood.any():
        log.warning(
            "bimu OOD AUC: %d of %d ID and %d of %d OOD uncertainty scores are NaN, counted as misses",
            nan_id.sum(),
            len(id_score),
            nan_ood.sum(),
            len(ood_score),
        )
        finite = np.r_[id_score[~nan_id], ood_score[~nan_ood]]
        lo, hi = (finite.min() - 1, finite.max() + 1) if finite.size else (0.0, 1.0)
        id_score, ood_score = np.where(nan_id, hi, id_score), np.where(nan_ood, lo, ood_score)
    return float(roc_auc_score(np.r_[np.zeros(len(id_score)), np.ones(len(ood_score))], np.r_[id_score, ood_score]))


class Learner:
    """What a continual variant trains: its network, optimizer, relaxed loss, MC predictions and posterior
    statistics (Bernoulli λ for BiMU / BayesBiNN / online; Gaussian μ, σ for MESU)."""

    def __init__(self, stream: dict, p: Params, variant: str, salt: int):
        node_setup(p, int(p.seeds[0]))
        seeds = stream["seeds"]
        if list(seeds) != list(p.seeds):
            raise ValueError(
                f"node 'bimu.train.{variant}': the stream was built for seeds {seeds}, this run "
                f"has {list(p.seeds)}; rerun the data node"
            )
        self.p, self.variant = p, variant
        x_in = stream["al_x"] if variant in ACTIVE else stream["x_train"]
        r, d, c, h, k = len(seeds), x_in.shape[-1], stream["n_classes"], p.model.hidden, p.model.k_train
        self.eval_gens = _gens(seeds, salt + 2)
        if variant == "mesu":
            m = p.mesu
            self.net = GaussianNet(r, d, h, c, m.sigma_init, _gens(seeds, salt))
            self.make_opt = lambda params: MesuRule(
                params, m.grad_clamp, lr_mu=m.lr_mu, lr_sigma=m.lr_sigma, sigma_prior=m.sigma_prior, n_mem=m.n_mem
            )
            self.eps_gens = _gens(seeds, salt + 1)
            return
        if variant in ("ste_adam", "metaplastic"):  # λ holds the latent real weights W; w = sign(W)
            self.net = BinaryBayesNet(r, d, h, c, "uniform", _gens(seeds, salt))
            meta = p.ste.meta_m if variant == "metaplastic" else 0.0
            self.make_opt = lambda params: MetaAdam(params, lr=p.ste.lr, m=meta)
            return
        init, rule = update_rule(p, variant)
        self.net = BinaryBayesNet(r, d, h, c, init, _gens(seeds, salt))
        self.noise = NoiseBlocks((r, k, h, d), (r, k, c, h), p.model.noise_block, _gens(seeds, salt + 1))
        self.make_opt = lambda params: LambdaRule(params, rule)

    def _eps(self, k: int, gens) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.net
        return (
            torch.stack([torch.randn((k, *n.mu1.shape[1:]), generator=g) for g in gens]),
            torch.stack([torch.randn((k, *n.mu2.shape[1:]), generator=g) for g in gens]),
        )

    def loss(self, m, x, y, i):
        if self.variant == "mesu":
            e1, e2 = self._eps(self.p.model.k_train, self.eps_gens)
            logp = torch.log_softmax(m.logits(x[:, None], e1, e2)[:, :, 0], -1)  # R K C
            return -logp.gather(-1, y[:, None, None].expand(-1, logp.shape[1], 1)).mean(1).sum()
        if self.variant in DETERMINISTIC:
            return binary_net_loss(ste_sign(m.lam1).unsqueeze(1), ste_sign(m.lam2).unsqueeze(1), x, y).sum()
        n1, n2 = self.noise(i)
        return relaxed_loss(m.lam1, m.lam2, x, y, n1, n2, self.p.model.tau).sum()

    @torch.no_grad()
    def probs(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """(R, K, N, C) softmax outputs of K posterior samples (hard ±1 weights for the binary nets)."""
        if self.variant == "mesu":
            e1, e2 = self._eps(k, self.eval_gens)
            return torch.softmax(self.net.logits(x, e1, e2), -1)
        if self.variant in DETERMINISTIC:  # one deterministic net: w = sign(W) (sigmoid(±∞) samples it exactly)
            return hard_probs(self.net.lam1 * 1e9, self.net.lam2 * 1e9, x, 1, self.eval_gens)
        return hard_probs(self.net.lam1, self.net.lam2, x, k, self.eval_gens)

    def stats(self) -> dict[str, np.ndarray]:
        if self.variant == "mesu":
            s2 = torch.cat([self.net.sig1.detach().flatten(1), self.net.sig2.detach().flatten(1)], 1) ** 2
            return {"mean_sigma2_over_prior": (s2 / self.p.mesu.sigma_prior**2).mean(1).numpy()}
        if self.variant in DETERMINISTIC:
            return {}
        v, sat = posterior_stats(self.net)
        return {"mean_bernoulli_var": v, "frac_saturated": sat}

    def snapshot(self) -> torch.Tensor:
        return torch.cat([q.detach().flatten(1) for q in self.net.parameters()], 1).clone()


def train_continual(stream: dict, p: Params, variant: str) -> dict:
    lrn = Learner(stream, p, variant, salt=11)
    c, seeds = p.continual, stream["seeds"]
    perms, orders = stream["task_perms"], stream["task_orders"]  # (R, T+1, D), (R, T, n)
    xtr, ytr, xte, yte = stream["x_train"], stream["y_train"], stream["x_test"], stream["y_test"]
    r, t_n, n = len(seeds), c.n_tasks, c.n_per_task
    # the whole stream, replica-major: (R, T·n, D) and (R, T·n); task t's pixels permuted by perms[:, t]
    xo = xtr[orders]  # (R, T, n, D)
    xs = xo.gather(-1, perms[:, :t_n, None, :].expand_as(xo)).reshape(r, t_n * n, -1)
    ys = ytr[orders].reshape(r, t_n * n)
    x_task = lambda j: xte[:, perms[:, j]].permute(1, 0, 2)  # noqa: E731  (R, N, D) of task j
    acc = np.full((t_n, t_n, r), np.nan)  # [after task, on task, replica]
    stats, snaps = {k: np.zeros((t_n, r)) for k in lrn.stats()}, []

    def callback(info):
        if (info.step + 1) % n:
            return
        t = (info.step + 1) // n - 1
        for j in range(t + 1):
            acc[t, j] = _accuracy(lrn.probs(x_task(j), p.model.k_eval), yte)
        for k, v in lrn.stats().items():
            stats[k][t] = v
        snaps.append(lrn.snapshot())

    fit(
        lrn.net,
        None,
        lrn.loss,
        sample_batch=lambda i, g: (xs[:, i], ys[:, i], i),
        steps=t_n * n,
        grad_clip=None,
        callback=callback,
        optimizer=lrn.make_opt,
        seed=int(p.seeds[0]),
        desc=f"bimu.{variant}",
    )

    # OOD at the end: ID = the latest task's test set; OOD = an unseen permutation, and uniform noise
    lo, hi = stream["x_range"]
    gn = torch.Generator().manual_seed(int(seeds[0]) + 77)
    sets = {
        "id": x_task(t_n - 1),
        "perm": x_task(t_n),
        "noise": lo + (hi - lo) * torch.rand((r, len(xte), xte.shape[1]), generator=gn),
    }
    unc = {k: uncertainty(lrn.probs(v, p.model.k_eval)) for k, v in sets.items()}
    current = np.array([acc[t, t] for t in range(t_n)])  # newest-task accuracy (T, R)
    a, b = (min(w, t_n) for w in c.plasticity_window)
    final = []
    for i, s in enumerate(seeds):
        f = {
            "seed": int(s),
            "acc_current_task": float(current[-1, i]),
            "acc_mean_seen": float(np.mean(acc[-1, :, i])),
            "acc_mean_last5": float(np.mean(acc[-1, max(0, t_n - 5) :, i])),
            "plasticity_gap": float(current[a - 1 : b, i].max() - current[-1, i]),
            "peak_drop": float(current[:, i].max() - current[-1, i]),
            **{k: float(v[-1, i]) for k, v in stats.items()},
        }
        for kind in ("epistemic", "aleatoric"):
            for o in ("perm", "noise"):
                f[f"ood_auc_{kind}_{o}"] = _auc(unc["id"][kind][i].numpy(), unc[o][kind][i].numpy())
            f[f"ood_auc_{kind}_min"] = min(f[f"ood_auc_{kind}_perm"], f[f"ood_auc_{kind}_noise"])
        final.append(f)
    return {
        "family": "continual",
        "variant": variant,
        "final": final,
        "seeds": list(seeds),
        "acc_matrix": acc.tolist(),
        "per_task": {
            "acc_current_task": current.tolist(),
            "acc_mean_seen": np.nanmean(acc, 1).tolist(),
            **{k: v.tolist() for k, v in stats.items()},
        },
        "posterior_by_task": torch.stack(snaps),
    }  # (T, R, n_params) snapshots


def budget_threshold(rate: float, budget: float, gamma: float, k: int | None) -> float:
    """The official budget-tracking VR threshold: e = rate − B, τ = clip(round(K(B + sign(e)|e|^γ))/K, 0, 1).
    ``k=None``: no rounding (a continuous score normalised to [0, 1])."""
    e = rate - budget
    tau = budget + np.sign(e) * abs(e) ** gamma
    return float(np.clip(round(k * tau) / k if k else tau, 0.0, 1.0))


def train_active(stream: dict, p: Params, variant: str) -> dict:
    lrn = Learner(stream, p, variant, salt=23)
    net, noise = lrn.net, lrn.noise
    a, seeds = p.active, stream["seeds"]
    r, c = len(seeds), stream["n_classes"]
    ytr, yte = stream["y_train"], stream["y_test"]
    steps = a.n_domains * a.n_per_domain
    xs, xt = stream["al_x"], stream["al_x_test"]  # (R, steps, F) and (R, n_domains·N, F), see data.py
    ys = ytr[stream["stream_index"]]
    yt = yte.repeat(a.n_domains)
    pi = stream["class_weights"].numpy()
    q_gens, labels = _gens(seeds, 31), np.zeros(r, dtype=np.int64)
    curve = {"step": [], "n_labels": [], "acc_mix": [], "bal_acc": []}

    def test_scores():
        with torch.no_grad():
            pred = lrn.probs(xt, p.model.k_eval).mean(1).argmax(-1)
        recall = np.stack([(pred[:, yt == k] == k).float().mean(1).numpy() for k in range(c)], 1)  # (R, C)
        return recall @ pi, recall.mean(1)

    def decide(x, i) -> torch.Tensor:
        if variant == "al_all":
            return torch.ones(r, dtype=torch.bool)
        if variant == "al_random":
            return torch.stack([torch.rand((), generator=g) < a.budget for g in q_gens])
        with torch.no_grad():
            u = uncertainty(hard_probs(net.lam1, net.lam2, x[:, None], a.k_query, q_gens))
        if variant == "al_vr":
            score, k = u["vr"][:, 0], a.k_query  # VR ∈ {0, 1/K, ..., 1}: quantised threshold
        else:  # entropy or mutual information, / log2 C ∈ [0, 1]
            total = u["aleatoric"] + u["epistemic"]
            score, k = (total if variant == "al_entropy" else u["epistemic"])[:, 0] / np.log2(c), None
        rate = labels / max(i, 1)
        tau = torch.tensor([budget_threshold(float(q), a.budget, a.gamma, k) for q in rate])
        return score >= tau - 1e-9

    def loss_fn(m, x, y, i):
        q = decide(x, i)
        labels[:] += q.numpy()
        if not bool(q.any()):  # nothing queried: no label, no backprop, no update
            return (m.lam1.sum() + m.lam2.sum()) * 0
        n1, n2 = noise(i)
        return (relaxed_loss(m.lam1, m.lam2, x, y, n1, n2, p.model.tau) * q).sum()

    def callback(info):
        if (info.step + 1) % a.eval_every and info.step + 1 != steps:
            return
        mix, bal = test_scores()
        curve["step"].append(info.step + 1)
        curve["n_labels"].append(labels.tolist())
        curve["acc_mix"].append(mix.tolist())
        curve["bal_acc"].append(bal.tolist())

    fit(
        net,
        None,
        loss_fn,
        sample_batch=lambda i, g: (xs[:, i], ys[:, i], i),
        steps=steps,
        grad_clip=None,
        callback=callback,
        optimizer=lrn.make_opt,
        seed=int(p.seeds[0]),
        desc=f"bimu.{variant}",
    )
    final = [
        {
            "seed": int(s),
            "acc_mix": curve["acc_mix"][-1][i],
            "bal_acc": curve["bal_acc"][-1][i],
            "n_labels": int(labels[i]),
            "n_updates": int(labels[i]),
            "query_rate": float(labels[i] / steps),
        }
        for i, s in enumerate(seeds)
    ]
    return {"family": "active", "variant": variant, "final": final, "seeds": list(seeds), "curve": curve}


def train_variant(stream: dict, p: Params, variant: str):
    """One variant's long results table (per seed: the final metrics; the per-task quantities, step = task
    index, or the labels-to-accuracy curve, step = stream step, as histories) and its raw arrays for the
    plots (accuracy matrix, per-task series or curve, and the λ snapshots after every task)."""
    if variant in CONTINUAL:
        raw = train_continual(stream, p, variant)
    elif variant in ACTIVE:
        raw = train_active(stream, p, variant)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return results_table(raw), {k: v for k, v in raw.items() if k != "final"}


def results_table(raw: dict):
    from pipelines.core.api import Results

    res = Results(raw["variant"])
    for i, f in enumerate(raw["final"]):
        seed = f["seed"]
        res.add(seed, **{k: v for k, v in f.items() if k != "seed"})
        if raw["family"] == "continual":
            for k, series in raw["per_task"].items():
                res.history(seed, k, [row[i] for row in series], steps=range(1, len(series) + 1))
        else:
            c = raw["curve"]
            for k in ("bal_acc", "acc_mix", "n_labels"):
                res.history(seed, k, [row[i] for row in c[k]], steps=c["step"])
    return res.table()
