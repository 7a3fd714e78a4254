"""One node per variant (``train.<variant>``): the same dual encoder, optimiser and number of gradient
steps for every variant, trained with InfoNCE through ``core.training.fit`` in its ``steps`` /
``sample_batch`` mode; each variant only decides how the epoch's batches are built (and the mining
variants add one mined negative per query). Epoch 0 is the same random epoch for every variant (a batcher
needs a model to score with); graphs and clusters are refreshed every ``graph.refresh_every`` epochs."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import InputDataError, StepInfo, fit, node_setup
from pipelines.hobit import batching as B
from pipelines.hobit.data import seed_arrays
from pipelines.hobit.model import DualEncoder, infonce
from pipelines.hobit.params import Params, Variant
from pipelines.hobit.retrieval import evaluate_encoder, relevant_counts, top_documents


class EpochBatcher:
    """Builds the batches of each epoch for one variant and records what it cost and what it built."""

    def __init__(
        self,
        spec: Variant,
        p: Params,
        model: DualEncoder,
        q: torch.Tensor,
        d: torch.Tensor,
        facts: np.ndarray,
        seed: int,
        clock,
    ) -> None:
        self.spec, self.p, self.model, self.q, self.d, self.facts, self.seed = spec, p, model, q, d, facts, seed
        self.clock = clock
        self.n, self.b = len(q), p.model.batch_size
        self.graph: B.ScoreGraph | None = None
        self.hgraph: B.HobitGraph | None = None
        self.labels: np.ndarray | None = None
        self.static: list[np.ndarray] | None = None
        self.batches: list[np.ndarray] = []
        self.mined: np.ndarray | None = None
        self.log: dict[str, list[float]] = {
            "batching_s": [],
            "fn_per_batch": [],
            "fn_query_rate": [],
            "batch_f_mean": [],
            "forced_fills": [],
        }
        self.last_f: np.ndarray = np.empty(0)
        self.history: list[list[np.ndarray]] | None = None  # every epoch's batches, when kept

    def _encode(self) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.model.encode_q(self.q), self.model.encode_d(self.d)

    def _refresh_graph(self) -> None:
        qe, de = self._encode()
        g = self.p.graph
        self.graph = B.knn_graph(qe, de, self.p.model.tau, g.knn_m, g.chunk)
        self.hgraph = None

    def build(self, epoch: int) -> None:
        s, p = self.spec, self.p
        rng = np.random.default_rng([self.seed, 1000 + epoch])  # epoch 0: the same batches for every variant
        t0 = self.clock()
        forced, fvals = 0, None
        self.mined = None
        if epoch == 0:
            self.batches = B.random_batches(self.n, self.b, rng)
        else:
            refresh = (epoch - 1) % p.graph.refresh_every == 0
            reuse_static = s.batcher == "hobit" and s.static and self.static is not None
            need_graph = (
                (s.batcher in ("hobit", "batchsampler") and not reuse_static)
                or s.mining
                or (s.batcher == "b3" and self.labels is None)
            )
            if need_graph and (self.graph is None or refresh):
                self._refresh_graph()
            if s.batcher == "random":
                self.batches = B.random_batches(self.n, self.b, rng)
            elif s.batcher == "hobit":
                if reuse_static:
                    self.batches = [self.static[i] for i in rng.permutation(len(self.static))]
                else:
                    if self.hgraph is None:
                        h = p.hobit
                        delta = h.delta_cos / p.model.tau if s.filter in ("score", "ids_score") else None
                        groups = self.facts if s.filter in ("ids", "ids_score") else None
                        self.hgraph = B.hobit_graph(self.graph, delta, h.exp_clip, groups)
                    self.batches, fvals, forced = B.hobit_epoch(
                        self.hgraph, self.b, rng, s.phi, s.anchors or p.hobit.anchors, s.objective
                    )
                    if s.static:
                        self.static = list(self.batches)
            elif s.batcher == "kmeans":
                if self.labels is None or refresh:
                    from threadpoolctl import threadpool_limits

                    with threadpool_limits(limits=torch.get_num_threads()):
                        self.labels = B.kmeans_labels(
                            self._encode()[0].cpu().numpy(), max(self.n // self.b, 1), self.seed
                        )
                self.batches = B.cluster_batches(self.labels, self.b, rng)
            elif s.batcher == "b3":
                if self.labels is None:  # built once, from the epoch-1 encoder (B3's teacher)
                    bl = p.baselines
                    self.labels = B.louvain_labels(self.graph, bl.b3_k, bl.b3_skip_top, bl.b3_resolution, self.seed)
                self.batches = B.cluster_batches(self.labels, self.b, rng)
            elif s.batcher == "batchsampler":
                self.batches = B.walk_batches(
                    self.graph.idx[:, : p.baselines.walk_k], self.b, p.baselines.walk_restart, rng
                )
            if s.mining:
                self.mined = B.mine_negatives(self.graph, p.baselines.mine_rank_lo, p.baselines.mine_rank_hi, rng)
        self.log["batching_s"].append(self.clock() - t0)
        if self.history is not None:
            self.history.append(list(self.batches))
        fn_pairs, fn_rate = B.false_negatives(self.batches, self.facts, self.mined)
        self.log["fn_per_batch"].append(fn_pairs)
        self.log["fn_query_rate"].append(fn_rate)
        self.log["forced_fills"].append(float(forced))
        if fvals is not None:
            self.last_f = fvals
        self.log["batch_f_mean"].append(float(np.mean(fvals)) if fvals is not None and len(fvals) else float("nan"))

    def batch(self, k: int) -> tuple[torch.Tensor, ...]:
        idx = torch.as_tensor(self.batches[k], device=self.q.device)
        if self.mined is None:
            return self.q[idx], self.d[idx]
        neg = torch.as_tensor(self.mined[self.batches[k]], device=self.q.device)
        return self.q[idx], self.d[idx], self.d[neg], neg[None, :] == idx[:, None]


def in_batch_negative_scores(
    model: DualEncoder, q: torch.Tensor, d: torch.Tensor, batches: list[np.ndarray], n: int, seed: int
) -> list[float]:
    """A sample of ``n`` (query, in-batch negative) cosines over the given batches, under ``model``."""
    rng = np.random.default_rng([seed, 77])
    out = []
    with torch.no_grad():
        for bt in batches:
            idx = torch.as_tensor(bt, device=q.device)
            cos = (model.encode_q(q[idx]) @ model.encode_d(d[idx]).T).cpu().numpy()
            out.append(cos[~np.eye(len(bt), dtype=bool)])
    vals = np.concatenate(out)
    return [round(float(x), 5) for x in rng.choice(vals, size=min(n, len(vals)), replace=False)]


def train_one(
    pairs: pd.DataFrame, p: Params, variant: str, seed: int, keep: bool
) -> tuple[dict, pd.DataFrame | None, dict]:
    """One seed of one variant: its metrics row, per-epoch history and (``keep``) diagnostics and batches."""
    spec = p.variants[variant]
    device = node_setup(p, seed)
    arr = seed_arrays(pairs, seed)
    q = torch.as_tensor(arr["q_train"], device=device)
    d = torch.as_tensor(arr["d_train"], device=device)
    n, b, m = len(q), p.model.batch_size, p.model
    if n < b:
        raise InputDataError(f"dataset 'hobit.pairs' (seed {seed}): {n} train pairs, fewer than one batch of {b}")
    spe = n // b
    model = DualEncoder(q.shape[1], d.shape[1], m.hidden, m.out_dim).to(device)
    cpu_clock = device.type == "cpu" and torch.get_num_threads() == 1
    clock = time.process_time if cpu_clock else time.perf_counter
    batcher = EpochBatcher(spec, p, model, q, d, arr["fact_train"], seed, clock)
    if keep:
        batcher.history = []
    ep = {"train_loss": [], "hardness": [], "train_s": [], "val_recall_at_1": []}
    acc = {"loss": 0.0, "hard": 0.0, "secs": 0.0, "k": 0}
    qv, ct = torch.as_tensor(arr["q_val"], device=device), torch.as_tensor(arr["corpus"], device=device)
    n_rel = relevant_counts(arr["fact_val"], arr["fact_corpus"])
    if not (n_rel > 0).any():
        raise InputDataError(
            f"dataset 'hobit.pairs' (seed {seed}): no validation pairs (split 'val'), which early "
            "stopping and the convergence gate read"
        )

    def sample_batch(step: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        epoch, k = divmod(step, spe)
        if k == 0:
            batcher.build(epoch)
        return batcher.batch(k)

    def on_step(info: StepInfo) -> None:
        acc["loss"] += info.loss
        acc["hard"] += info.extras.get("hardness", float("nan"))
        acc["secs"] += info.cpu_seconds if cpu_clock else info.seconds
        acc["k"] += 1
        if (info.step + 1) % spe == 0:
            ep["train_loss"].append(acc["loss"] / acc["k"])
            ep["hardness"].append(acc["hard"] / acc["k"])
            ep["train_s"].append(acc["secs"])
            acc.update(loss=0.0, hard=0.0, secs=0.0, k=0)

    def val_score(mdl: DualEncoder) -> float:
        """Validation recall@1 after an epoch (the validation queries against the whole corpus), negated:
        early stopping keeps the best epoch's weights; the test pairs are read only once, at the end."""
        top1 = top_documents(mdl.encode_q(qv), mdl.encode_d(ct), 1)[:, 0]
        hit = arr["fact_corpus"][top1] == arr["fact_val"]
        r1 = float((hit / np.maximum(n_rel, 1))[n_rel > 0].mean())
        ep["val_recall_at_1"].append(r1)
        return -r1

    fr = fit(
        model,
        None,
        lambda mdl, *bt: infonce(mdl, m.tau, *bt),
        steps=m.epochs * spe,
        sample_batch=sample_batch,
        val_score=val_score,
        val_every=spe,
        patience=m.patience,
        optimizer="adam",
        lr=m.lr,
        scheduler=linear_decay if m.schedule == "linear_decay" else None,
        weight_decay=m.weight_decay,
        grad_clip=m.grad_clip,
        seed=seed,
        desc=f"hobit.{variant} seed {seed}",
        callback=on_step,
    )

    metrics = evaluate_encoder(model, arr, device, tuple(p.eval.ks))
    lg = batcher.log
    bs = float(np.mean(lg["batching_s"][1:]))
    ts = float(np.mean(ep["train_s"]))
    row = {
        **metrics,
        "fn_per_batch": float(np.mean(lg["fn_per_batch"][1:])),
        "fn_query_rate": float(np.mean(lg["fn_query_rate"][1:])),
        "hardness": float(np.mean(ep["hardness"][1:])),
        "train_loss_final": ep["train_loss"][-1],
        "batching_s_per_epoch": bs,
        "train_s_per_epoch": ts,
        "overhead_ratio": bs / ts if ts > 0 else float("nan"),
        "batching_frac_of_epoch": bs / (bs + ts) if bs + ts > 0 else float("nan"),
        "docs_per_step": float(2 * b if spec.mining else b),
        "steps": float(fr.steps_run),
        "epochs_run": float(len(ep["val_recall_at_1"])),
        "best_epoch": float(fr.best_epoch // spe - 1),
        "val_recall_at_1": float(max(ep["val_recall_at_1"])),
        "val_late_rise": late_rise(ep["val_recall_at_1"], p.model.flat_window),
        "forced_fills": float(np.sum(lg["forced_fills"])),
    }
    if spec.batcher == "hobit":
        row["batch_f_mean"] = float(np.nanmean(lg["batch_f_mean"][1:]))
    history = {**ep, **{k: v for k, v in lg.items() if k != "forced_fills"}}
    extra = {}
    table = None
    if keep:
        extra["neg_scores"] = in_batch_negative_scores(model, q, d, batcher.batches, p.eval.hist_sample, seed)
        extra["batch_f"] = [round(float(x), 5) for x in batcher.last_f]
        table = batch_table(batcher, seed)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {"seed": seed, "row": row, "history": history, **extra}, table, state


def linear_decay(opt: torch.optim.Optimizer, total_steps: int):
    """The learning rate falls linearly from its peak to 0 over the whole epoch budget (DPR's schedule,
    without warm-up); with early stopping a run may stop before it reaches 0."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, 1 - k / max(total_steps, 1)))


def late_rise(curve: list[float], window: float) -> float:
    """How much a per-epoch validation curve still rises over the last ``window`` share of the epochs run:
    the least-squares slope over those epochs (and the one before them) times the epochs they span (the
    convergence gate's measure, robust to epoch-to-epoch noise; <= 0 when flat or falling)."""
    n = len(curve)
    start = max(n - 1 - int(np.ceil(window * n)), 0)
    y = np.asarray(curve[start:], float)
    if len(y) < 2:
        return float("nan")
    x = np.arange(len(y), dtype=float)
    return float(np.polyfit(x, y, 1)[0] * (len(y) - 1))


def batch_table(batcher: EpochBatcher, seed: int) -> pd.DataFrame:
    """Every epoch's batches (epoch, batch, position, example, fact), for inspection."""
    frames = []
    for epoch, bt in enumerate(batcher.history or []):
        ex = np.concatenate(bt)
        frames.append(
            pd.DataFrame(
                {
                    "seed": seed,
                    "epoch": epoch,
                    "batch": np.repeat(np.arange(len(bt)), [len(x) for x in bt]),
                    "position": np.concatenate([np.arange(len(x)) for x in bt]),
                    "example": ex,
                    "fact": batcher.facts[ex],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


CURVES = ("val_recall_at_1", "train_loss", "hardness", "fn_per_batch", "batching_s", "train_s")  # per epoch


def train_variant(pairs: pd.DataFrame, p: Params, variant: str):
    """The node ``train.<variant>``: every seed of one variant. Returns its long table (per-seed metrics and
    per-epoch curves ``CURVES``) and its artifacts: the first seed's diagnostics (``neg_scores``, ``batch_f``)
    and batches of every epoch (``batches``, columns of ``batch_table``; for HOBIT the first b/2 of a batch
    are its anchors), and the encoders' state dicts by seed (``encoders``)."""
    from pipelines.core.api import Results

    spec = p.variants[variant]
    seeds = p.seeds[:1] if spec.first_seed_only else p.seeds
    res, table, states, first = Results(variant), None, {}, {}
    for i, seed in enumerate(seeds):
        run, tab, state = train_one(pairs, p, variant, seed, keep=i == 0)
        res.add(seed, **run["row"])
        for k in CURVES:
            res.history(seed, k, run["history"][k])
        if i == 0:
            first = {k: run.get(k) or [] for k in ("neg_scores", "batch_f")}
        states[str(seed)] = state
        table = tab if tab is not None else table
    batches = {c: torch.from_numpy(table[c].to_numpy()) for c in table.columns} if table is not None else {}
    return res.table(), {**first, "batches": batches, "encoders": states}
