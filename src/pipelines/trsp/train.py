"""One ``train.<variant>`` node per placement algorithm: it places the stops on every instance of the grid
(city × (k, γ), gadgets, user data), measures each solution (social cost, exact JR factor, core factors)
and, for the variants listed in ``adversarial.variants``, runs the adversarial hill-climbing search
against the JR proxy. A failure names the variant and the instance that caused it."""

from __future__ import annotations

import logging
import math
import time
import zlib

import numpy as np
import pandas as pd

from pipelines.core.api import Results, json_records, node_setup
from pipelines.trsp import algorithms as A
from pipelines.trsp import measures as Ms
from pipelines.trsp.data import to_instances
from pipelines.trsp.instance import Instance, from_points
from pipelines.trsp.params import Params, hybrid_lambda

log = logging.getLogger(__name__)
JR_BOUND = 1 + math.sqrt(2)


class PlacementError(RuntimeError):
    """An algorithm or a measure failed (or produced a non-finite value) on an instance; names both."""


def solve(inst: Instance, variant: str, p: Params, rng: np.random.Generator) -> list[int]:
    mode, f = p.deviation, p.jr_group_factor
    lam = hybrid_lambda(variant)
    if lam is not None:
        return A.hybrid(inst, lam, mode, f)
    if variant == "eca":
        return A.eca(inst, mode, f)
    if variant in ("eca_nofill", "pair_gc_nofill"):  # ablation: the expansion's own stops, no leftover fill
        combos = variant == "eca_nofill"
        return A.expanding(inst, inst.k, mode, f, use_walk=combos, use_combos=combos).stops
    if variant == "gc_trsp":
        return A.gc_trsp(inst)
    if variant == "pair_gc":
        return A.pair_gc(inst, mode, f)
    if variant == "kmedian":
        return A.kmedian(inst, p.kmedian.restarts, rng, p.kmedian.max_passes)
    if variant == "random":
        return A.random_stops(inst, rng)
    if variant == "busiest":
        return A.busiest(inst)
    raise ValueError(f"unknown variant {variant!r}")


def measure(inst: Instance, S: list[int], p: Params, core: bool) -> dict[str, float]:
    """Per-solution metrics; the core factors only when ``core`` (t3: a lower bound on a shortlist)."""
    cost = inst.cost(S)
    out = {
        "n_stops": float(len(S)),
        "social_cost_mean": float(cost.mean()),
        "social_cost_p90": float(np.quantile(cost, 0.9)),
        "frac_using_shuttle": float(np.mean(cost < inst.walk - 1e-12)),
        "walk_mean": float(inst.walk.mean()),
        "jr_beta_hat": Ms.jr_factor(inst, S, p.deviation, p.jr_group_factor),
    }
    if inst.groups is not None and (inst.groups == "minority").any():
        out["minority_cost_mean"] = float(cost[inst.groups == "minority"].mean())
    if core:
        for a in p.core.alphas:
            out[f"core_t2_a{a:g}"] = Ms.core_t2(inst, S, a)
        if p.core.t3:
            short = Ms.shortlist(inst, S, p.core.shortlist)
            for a in p.core.alphas:
                out[f"core_t3_a{a:g}"] = Ms.core_t3(inst, S, a, short)
    return out


def _checked(variant: str, name: str, fn, *args):
    try:
        res = fn(*args)
    except Exception as exc:  # noqa: BLE001 - re-raised naming the variant and the instance
        raise PlacementError(f"trsp.train.{variant}: instance '{name}': {type(exc).__name__}: {exc}") from exc
    if isinstance(res, dict):
        bad = [k for k, v in res.items() if isinstance(v, float) and math.isnan(v)]
        if bad:
            raise PlacementError(f"trsp.train.{variant}: instance '{name}': NaN in {bad}")
    return res


def place(inst: Instance, meta: dict, variant: str, p: Params, rng: np.random.Generator) -> list[dict]:
    """Rows (one per draw; the random baseline draws ``random_draws`` times, JR only)."""
    draws = p.random_draws if variant == "random" else 1
    rows = []
    for d in range(draws):
        t0 = time.perf_counter()
        S = _checked(variant, inst.name, solve, inst, variant, p, rng)
        runtime = time.perf_counter() - t0
        if len(S) > inst.k or len(set(S)) != len(S):
            raise PlacementError(
                f"trsp.train.{variant}: instance '{inst.name}': {len(S)} stops {S} for a budget of k = {inst.k}"
            )
        m = _checked(variant, inst.name, measure, inst, S, p, variant != "random")
        rows.append({**meta, "variant": variant, "draw": d, "stops": " ".join(map(str, S)), "runtime_s": runtime, **m})
    return rows


# --------------------------------------------------------------------------- adversarial search
def adversarial_start(rng: np.random.Generator, a, kind: str = "clustered") -> dict:
    """A start instance. ``clustered``: riders between 3 origin and 3 destination clusters (σ = 0.1 L),
    uniform candidates. ``hubs``: riders between 2–5 hub points (jitter 0.05 km, the gadget's), candidates
    on the hubs, their midpoints and uniform points: the coincident groups and ties of the gadgets."""
    n = int(rng.integers(a.n_min, a.n_max + 1))
    k = int(rng.choice(a.ks))
    gamma = float(rng.choice(a.gammas))
    L = a.plane_km
    if kind == "hubs":
        h = int(rng.integers(2, 6))
        H = rng.uniform(0, L, (h, 2))
        s = H[rng.integers(0, h, n)] + rng.normal(0, 0.05, (n, 2))
        t = H[rng.integers(0, h, n)] + rng.normal(0, 0.05, (n, 2))
        i, j = np.triu_indices(h, 1)
        cand = np.vstack([H, (H[i] + H[j]) / 2, rng.uniform(0, L, (a.m, 2))])[: a.m]
        return {"s": s, "t": t, "cand": cand, "k": k, "gamma": gamma}
    src, dst = rng.uniform(0, L, (3, 2)), rng.uniform(0, L, (3, 2))
    s = src[rng.integers(0, 3, n)] + rng.normal(0, 0.1 * L, (n, 2))
    t = dst[rng.integers(0, 3, n)] + rng.normal(0, 0.1 * L, (n, 2))
    cand = rng.uniform(0, L, (a.m, 2))
    return {"s": s, "t": t, "cand": cand, "k": k, "gamma": gamma}


def _instance(state: dict, metric: str, name: str) -> Instance:
    return from_points(state["s"], state["t"], state["cand"], state["k"], state["gamma"], metric, name)


def _proxy(inst: Instance, S: list[int], p: Params, objective: str) -> float:
    if objective == "jr":
        return Ms.jr_proxy(inst, S, p.deviation, p.jr_group_factor)
    # (α = 2)-core over pairs: groups of ⌈4n/k⌉, the clustering route's guarantee (README: "Definitions")
    return Ms.jr_proxy(inst, S, "set", 4.0)


def adversarial_search(variant: str, p: Params, seed: int, objective: str = "jr") -> list[dict]:
    """Hill-climb instance coordinates to raise the variant's JR proxy (``jr``: max over pairs of the g-th
    largest cost_i(S)/ride_i(p, q)) or the same for (α = 2)-core groups over pairs (``core``); every
    accepted instance is measured exactly (β̂_JR and the |T| = 2 core factor with α = 2). Start instances
    and proposals depend on (seed, restart) only, so every variant faces the same starts."""
    a = p.adversarial
    rows = []
    for r in range(a.restarts):
        name = f"adv_{objective}_s{seed}_r{r}"
        state = adversarial_start(np.random.default_rng([seed, 3, r]), a, a.starts[r % len(a.starts)])
        prop = np.random.default_rng([seed, 4, r])
        best, best_jr, best_core, last = -np.inf, 1.0, 1.0, None
        for step in range(a.steps + 1):
            if step == 0:
                cand_state = state
            else:  # move one point: a Gaussian step, or part of the way towards a point of its kind
                key = ("s", "t", "cand")[int(prop.integers(0, 3))]
                x = state[key].copy()
                i, j = prop.integers(0, len(x), 2)
                if prop.random() < 0.5:
                    x[i] += prop.normal(0, a.step_km, 2)
                else:
                    x[i] += prop.uniform(0.3, 1.0) * (x[j] - x[i])
                cand_state = {**state, key: x}
            where = f"{name} step {step}"
            inst = _checked(variant, where, _instance, cand_state, p.metric, name)
            S = _checked(variant, where, solve, inst, variant, p, np.random.default_rng([seed, 5, r, step]))
            proxy = _checked(variant, where, _proxy, inst, S, p, objective)
            if proxy >= best:
                state, best = cand_state, proxy
                jr = _checked(variant, where, Ms.jr_factor, inst, S, p.deviation, p.jr_group_factor)
                core = _checked(variant, where, Ms.core_t2, inst, S, 2.0)
                best_jr, best_core = max(best_jr, jr), max(best_core, core)
                last = {
                    "instance": name,
                    "family": "adversarial_step",
                    "objective": objective,
                    "seed": seed,
                    "k": state["k"],
                    "gamma": state["gamma"],
                    "param": float(step),
                    "variant": variant,
                    "draw": step,
                    "stops": " ".join(map(str, S)),
                    "jr_beta_hat": jr,
                    "core_t2_a2": core,
                    "proxy": proxy,
                    "n_agents": float(inst.n),
                }
                rows.append(last)
        if last is not None:
            rows.append(
                {
                    **last,
                    "family": "adversarial",
                    "param": float(a.steps),
                    "draw": 0,
                    "jr_beta_hat": best_jr,
                    "core_t2_a2": best_core,
                    "proxy": best,
                }
            )
    return rows


def train_variant(instances: pd.DataFrame, graph: pd.DataFrame, p: Params, variant: str):
    """Every instance placed and measured by ``variant`` (plus its adversarial search). Returns the long
    results table (per-seed summaries: :func:`pipelines.trsp.evaluate.seed_rows`; the adversarial search of
    the plot seed as histories) and the raw rows, one per solved instance (the artifacts the plots and the
    JR-violation totals read). ``graph``: the user's road graph (empty: plane metric only)."""
    from pipelines.trsp.evaluate import adversarial_histories, seed_rows

    rows: list[dict] = []
    node_setup(p)
    try:
        built = to_instances(instances, p.metric, graph)
    except Exception as exc:  # noqa: BLE001 - an InstanceError names the instance
        raise PlacementError(f"trsp.train.{variant}: {type(exc).__name__}: {exc}") from exc
    for meta, inst in built:
        rng = np.random.default_rng([int(meta["seed"]), 7, zlib.crc32(str(meta["instance"]).encode())])
        rows += place(inst, meta, variant, p, rng)
    if variant in p.adversarial.variants:
        for seed in p.seeds:
            for objective in p.adversarial.objectives:
                rows += adversarial_search(variant, p, seed, objective)
    out = pd.DataFrame(rows)
    log.info("trsp.%s: %d rows, JR max %.3f", variant, len(out), out["jr_beta_hat"].max())
    res = Results(variant).add_rows(seed_rows(out))
    for metric, (steps, values) in adversarial_histories(out, p).items():
        res.history(p.plot_seed, metric, values, steps)
    return res.table(), json_records(out)
