"""One ``train.<sampler>`` node per sampler: for every seed, domain and observation set it asks the sampler
N = ⌈m·|A|⌉ times (capped by ``protocol.max_queries``; for the LLM samplers also by ``llm.max_queries`` and
``llm.max_sets_per_config``), validates every proposal with the domain's validator and keeps them all
and scores each set (V, U, R: ``evaluate.set_metrics``); the results table and the per-set metrics are
its outputs (the proposals themselves are not kept)."""

from __future__ import annotations

import json
import logging
import math
import zlib

import numpy as np
import pandas as pd

from pipelines.core.api import json_records, node_setup
from pipelines.hypospace.domains import domain_for
from pipelines.hypospace.params import LLM_VARIANTS, Params
from pipelines.hypospace.samplers import llm_client, llm_proposals, offline_proposals, preference

log = logging.getLogger(__name__)

COLUMNS = ["seed", "domain", "config", "obs_id", "query", "key", "parsed", "valid", "n_budget", "attempts", "text"]


def query_budget(n_admissible: int, p: Params, variant: str) -> tuple[int, int]:
    """(N used, N = ⌈m·|A|⌉ before any cap)."""
    n = math.ceil(p.protocol.query_multiplier * n_admissible - 1e-9)
    used = n if p.protocol.max_queries is None else min(n, p.protocol.max_queries)
    if variant in LLM_VARIANTS:
        used = min(used, p.llm.max_queries)
    return used, n


def sample_set(p: Params, variant: str, seed: int, row, adm: pd.DataFrame, client=None) -> pd.DataFrame:
    """All proposals of one sampler for one observation set, validated."""
    dom = domain_for(row.domain, row.domain_config)
    obs = json.loads(row.obs)
    keys = adm["key"].tolist()
    n_used, n_budget = query_budget(len(keys), p, variant)
    rng = np.random.default_rng([seed, zlib.crc32(variant.encode()), zlib.crc32(row.obs_id.encode())])
    if variant in LLM_VARIANTS:
        strata = sorted(set(adm["stratum"].tolist())) if variant == "llm_stratified" else None
        answers = llm_proposals(dom, obs, n_used, client, p.llm, p.protocol.history_window, seed, row.obs_id, strata)
        texts = [a[0] for a in answers]
        objs = [a[1] for a in answers]
        attempts = [a[2] for a in answers]
        props = [dom.key(o) if o is not None else None for o in objs]
    else:
        eta = (
            preference(keys, seed, p.samplers.eta_scale)
            if variant in ("mode_collapse", "history_avoid", "stratified", "noisy")
            else np.zeros(len(keys))
        )
        props = offline_proposals(
            variant,
            dom,
            keys,
            adm["complexity"].to_numpy(float),
            adm["stratum"].to_numpy(),
            n_used,
            rng,
            eta,
            p.samplers,
            p.protocol.history_window,
        )
        objs, texts, attempts = [None] * len(props), [""] * len(props), [1] * len(props)
    verdict: dict[str, bool] = {}
    valid = []
    for k, o in zip(props, objs):
        if k is None:
            valid.append(False)
            continue
        if k not in verdict:  # the validator recomputes from the hypothesis object, once per distinct key
            verdict[k] = bool(dom.validate(o if o is not None else dom.from_key(k), obs))
        valid.append(verdict[k])
    return pd.DataFrame(
        {
            "seed": seed,
            "domain": row.domain,
            "config": row.config,
            "obs_id": row.obs_id,
            "query": np.arange(len(props)),
            "key": [k if k is not None else "" for k in props],
            "parsed": [k is not None for k in props],
            "valid": valid,
            "n_budget": n_budget,
            "attempts": attempts,
            "text": texts,
        },
        columns=COLUMNS,
    )


def proposals_of(p: Params, variant: str, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The proposals of one sampler over every seed, domain and observation set. ``tables`` holds
    ``<domain>_obs`` and ``<domain>_admissible`` of every enabled domain."""
    client = llm_client(p.llm) if variant in LLM_VARIANTS else None
    frames = []
    for seed in p.seeds:
        node_setup(p, int(seed))
        for domain in p.domains.enabled:
            obs = tables[f"{domain}_obs"]
            obs = obs[obs["seed"] == seed]
            if variant in LLM_VARIANTS:  # the LLM budget: the first sets of each configuration
                obs = obs.groupby("config", sort=False).head(p.llm.max_sets_per_config)
            adm = tables[f"{domain}_admissible"]
            by_set = dict(tuple(adm[adm["seed"] == seed].groupby("obs_id", sort=False)))
            for row in obs.itertuples():
                frames.append(sample_set(p, variant, int(seed), row, by_set[row.obs_id], client))
        log.info("hypospace.%s: seed %s done", variant, seed)
    if client is not None:
        log.info("hypospace.llm: %d requests sent, %d answered from the cache", client.calls, client.cache_hits)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def queried_sets(p: Params, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The observation sets some planned sampler queries (all of them unless every sampler is an LLM one,
    which sees the first ``llm.max_sets_per_config`` of each configuration), with their |A| bin: what the
    top bins are chosen from."""
    from pipelines.hypospace.evaluate import size_bin

    obs = pd.concat([tables[f"{d}_obs"] for d in p.domains.enabled], ignore_index=True)
    if all(v in LLM_VARIANTS for v in p.variants):
        obs = obs.groupby(["seed", "domain", "config"], sort=False).head(p.llm.max_sets_per_config)
    return obs.assign(bin=size_bin(obs["n_admissible"]) if len(obs) else [])


def train_variant(
    causal_obs: pd.DataFrame,
    causal_admissible: pd.DataFrame,
    voxel3d_obs: pd.DataFrame,
    voxel3d_admissible: pd.DataFrame,
    boolean_obs: pd.DataFrame,
    boolean_admissible: pd.DataFrame,
    p: Params,
    variant: str,
):
    """The node ``train.<variant>``: the sampler's proposals on every set, validated, scored (V, U, R per
    set): the long results table (per seed, by domain and |A| bin) and the per-set metrics (artifacts).
    A disabled domain's tables are empty."""
    from pipelines.hypospace.evaluate import results_table, set_metrics, top_bins

    tables = {
        "causal_obs": causal_obs,
        "causal_admissible": causal_admissible,
        "voxel3d_obs": voxel3d_obs,
        "voxel3d_admissible": voxel3d_admissible,
        "boolean_obs": boolean_obs,
        "boolean_admissible": boolean_admissible,
    }
    m = set_metrics(p, variant, proposals_of(p, variant, tables), tables)
    table = results_table(m, variant, top_bins(queried_sets(p, tables), p))
    return table, json_records(m)
