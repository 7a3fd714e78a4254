"""The paper's RLHF angle, offline and synthetic: Bradley–Terry reward models trained on pairwise
preferences, read as label-ranking models Q = PL(exp(r / T)) over the K responses of a prompt, scored for
ranking calibration against full human rankings; correlation of calibration with pairwise (RewardBench
style) accuracy, and temperature scaling as recalibration at identical accuracy."""

from __future__ import annotations

import logging
import zlib

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import fit, node_setup, stream_seed
from pipelines.rankcal import calibration as C
from pipelines.rankcal import ranking as R
from pipelines.rankcal.params import Params

log = logging.getLogger(__name__)


class World:
    """Prompts x ~ N(0, I_d); response features φ_k = tanh(A x + e_k); true utility
    u = w*ᵀφ + 0.5 tanh(v*ᵀφ); human rankings ~ PL(exp(β u))."""

    def __init__(self, d: int, beta: float, seed: int) -> None:
        g = np.random.default_rng(seed)
        self.A = g.normal(0, np.sqrt(1 / d), size=(d, d))
        self.w = g.normal(0, np.sqrt(2.25 / d), size=d)
        self.v = g.normal(0, np.sqrt(9 / d), size=d)
        self.d, self.beta = d, beta

    def sample(self, n: int, K: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(features (n, K, d), utilities (n, K), orderings (n, K))."""
        x = rng.normal(size=(n, self.d))
        phi = np.tanh((x @ self.A.T)[:, None, :] + rng.normal(size=(n, K, self.d)))
        u = phi @ self.w + 0.5 * np.tanh(phi @ self.v)
        return phi, u, R.sample_pl(self.beta * u, rng)


def one_pair_each(phi: np.ndarray, orderings: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One random response pair per prompt, labelled from its ranking: (winner φ, loser φ)."""
    n, K, _ = phi.shape
    a = rng.integers(0, K, n)
    b = (a + rng.integers(1, K, n)) % K  # a different response
    pos = np.argsort(orderings, axis=1)
    a_wins = pos[np.arange(n), a] < pos[np.arange(n), b]
    win = np.where(a_wins, a, b)
    lose = np.where(a_wins, b, a)
    return phi[np.arange(n), win], phi[np.arange(n), lose]


def make_rm(arch: str, d: int, hidden: list[int]) -> torch.nn.Module:
    if arch == "linear":
        return torch.nn.Linear(d, 1)
    layers: list[torch.nn.Module] = []
    width = d
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def train_rm(
    win: np.ndarray,
    lose: np.ndarray,
    arch: str,
    hidden: list[int],
    lr: float,
    weight_decay: float,
    steps: int,
    seed: int,
) -> torch.nn.Module:
    """Bradley–Terry loss −log σ(r(winner) − r(loser)), full-batch AdamW (core.training.fit)."""
    torch.manual_seed(seed)
    net = make_rm(arch, win.shape[1], hidden)  # float32: ~4x faster than float64 on these tiny nets
    n = len(win)
    both = torch.as_tensor(np.concatenate([win, lose]), dtype=torch.float32)  # one forward per step

    def bt_loss(model, batch):
        r = model(batch).squeeze(-1)
        return torch.nn.functional.softplus(-(r[:n] - r[n:])).mean()

    fit(
        net,
        None,
        bt_loss,
        sample_batch=lambda step, gen: (both,),
        steps=steps,
        lr=lr,
        optimizer="adamw",
        weight_decay=weight_decay,
        grad_clip=None,
        seed=seed,
        desc=f"rankcal.rm_{arch}",
    )
    return net


def fit_bt_temperature(margins: np.ndarray, t_min: float, t_max: float) -> float:
    """T minimising the BT NLL of validation reward margins r_w − r_l divided by T (bounded search)."""
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(
        lambda lt: float(np.logaddexp(0, -margins / np.exp(lt)).mean()),
        bounds=(np.log(t_min), np.log(t_max)),
        method="bounded",
        options={"xatol": 1e-4},
    )
    return float(np.exp(res.x))


def pairwise_accuracy(rewards: np.ndarray, orderings: np.ndarray) -> float:
    """Over every response pair of every prompt: does the preferred response score higher (tie: ½)."""
    K = rewards.shape[1]
    pos = np.argsort(orderings, axis=1)
    acc = []
    for i in range(K):
        for j in range(i + 1, K):
            pref_i = pos[:, i] < pos[:, j]
            diff = np.where(pref_i, rewards[:, i] - rewards[:, j], rewards[:, j] - rewards[:, i])
            acc.append((diff > 0) + 0.5 * (diff == 0))
    return float(np.mean(acc))


def train_reward_model(p: Params, variant: str) -> pd.DataFrame:
    """One reward-model configuration (``variant`` = ``rm_<name>``) at every training size and seed: one
    row per seed × size × {raw, temperature-scaled} with accuracy and calibration metrics. Every
    configuration sees the same prompts, preferences and test rankings (a stream per seed)."""
    r = p.rlhf
    name = variant.removeprefix("rm_")
    c, cfg = next((i, m) for i, m in enumerate(r.models) if m.name == name)
    world = World(r.n_features, r.beta, r.world_seed)
    K = r.k_responses
    rows = []
    for seed in p.seeds:
        node_setup(p, seed)
        rng = np.random.default_rng([seed, 17])  # the data: shared by every reward model
        phi_tr, _, o_tr = world.sample(max(r.n_pairs), K, rng)
        win, lose = one_pair_each(phi_tr, o_tr, rng)
        phi_va, _, o_va = world.sample(r.n_val, K, rng)
        vwin, vlose = one_pair_each(phi_va, o_va, rng)
        phi_te, u_te, o_te = world.sample(r.n_test, K, rng)
        y_te = R.perm_index(o_te)
        oracle = pairwise_accuracy(u_te, o_te)
        for k, n in enumerate(r.n_pairs):
            net = train_rm(
                win[:n],
                lose[:n],
                cfg.arch,
                r.hidden,
                r.lr,
                cfg.weight_decay,
                cfg.steps,
                stream_seed(seed, f"reward_model/{c}/{k}"),
            )
            with torch.no_grad():
                f32 = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
                rew = net(f32(phi_te)).squeeze(-1).double().numpy()
                margins = (net(f32(vwin)) - net(f32(vlose))).squeeze(-1).double().numpy()
            T = fit_bt_temperature(margins, r.t_min, r.t_max)
            for ts, temp in ((False, 1.0), (True, T)):
                scaled = rew / temp
                Q = R.pl_table(scaled)
                # the debiasing redraws: one stream per (seed, reward model, size, scaling)
                ece_rng = np.random.default_rng([seed, 18, zlib.crc32(name.encode()), n, int(ts)])
                ece, _ = C.calibration_metrics(
                    Q,
                    y_te,
                    K,
                    n_bins=p.ece.n_bins,
                    n_debias=p.ece.n_debias,
                    full_cw_max_m=p.ece.full_cw_max_m,
                    rng=ece_rng,
                    notions=("pair", "top1_conf", "full_conf"),
                )
                rows.append(
                    {
                        "variant": f"{name}_n{n}" + ("_ts" if ts else ""),
                        "rm": f"{name}_n{n}",
                        "seed": seed,
                        "ts": ts,
                        "n_pairs": n,
                        "temperature": temp,
                        "pair_accuracy": pairwise_accuracy(scaled, o_te),
                        "oracle_accuracy": oracle,
                        "nll": float(-np.log(Q[np.arange(len(y_te)), y_te]).mean()),
                        **ece,
                    }
                )
        log.info("rankcal rlhf: seed %s, reward model %s at %d sizes", seed, name, len(r.n_pairs))
    return pd.DataFrame(rows)
