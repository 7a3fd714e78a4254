"""Observation sets of the three domains and their exactly enumerated admissible sets (seeded; one
stream per seed × domain × configuration, so adding a configuration never changes another's draws).

Each observation set comes from a ground truth drawn uniformly from the domain's space, so |A| ≥ 1:
causal — a DAG and o distinct perturbed nodes; voxel3d — k top-view cells (k uniform in
[min_blocks, max_blocks]) with heights 1..H; boolean — an expression and r observed input rows (r
uniform in [min_rows, max_rows]).

A user may supply observation sets instead (full env): see :func:`read_user_observations`.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.hypospace.domains import domain_for
from pipelines.hypospace.params import Params

OBS_COLUMNS = ["domain", "config", "domain_config", "seed", "obs_id", "obs", "n_admissible", "space_size", "truth"]


def configurations(p: Params, domain: str) -> list[tuple[str, str, dict]]:
    """(label, domain_config json, generator settings) of every configuration of a domain."""
    d = p.domains
    if domain == "causal":
        return [
            (f"n{n}_o{o}", json.dumps({"n": n}), {"n_obs": o})
            for n in d.causal.n_nodes
            for o in d.causal.n_observations
            if o <= n
        ]
    if domain == "voxel3d":
        return [(f"H{h}", json.dumps({"grid": d.voxel3d.grid, "max_height": h}), {}) for h in d.voxel3d.max_heights]
    if domain == "boolean":
        b = d.boolean
        return [
            (
                f"{ops}_d{b.max_depth}",
                json.dumps({"variables": b.variables, "operator_set": ops, "max_depth": b.max_depth}),
                {},
            )
            for ops in b.operator_sets
        ]
    raise ValueError(f"unknown domain {domain!r}")


def _sets(p: Params, domain: str) -> int:
    return getattr(p.domains, domain).sets_per_config


def admissible_of(domain: str, dom, obs: dict) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(keys, complexity, stratum) of every hypothesis in A(obs), by the domain's enumerator."""
    if domain == "voxel3d":
        hs = dom.admissible_heights(np.array(obs["top"]))
        keys = ["/".join("".join(str(int(x)) for x in row) for row in h.reshape(dom.g, dom.g)) for h in hs]
        blocks = hs.sum(1)
        return keys, blocks.astype(float), blocks
    idx = dom.admissible(obs)
    return [dom.keys[i] for i in idx], dom.complexity(idx), dom.stratum(idx)


def _draw(domain: str, dom, rng: np.random.Generator, settings: dict, p: Params) -> tuple[dict, str]:
    """One observation set and its ground-truth key."""
    if domain == "causal":
        t = int(rng.integers(dom.space_size))
        nodes = rng.choice(dom.n, size=settings["n_obs"], replace=False)
        return dom.make_obs(t, nodes), dom.keys[t]
    if domain == "voxel3d":
        v = p.domains.voxel3d
        k = int(rng.integers(v.min_blocks, v.max_blocks + 1))
        cells = rng.choice(dom.g * dom.g, size=k, replace=False)
        h = np.zeros(dom.g * dom.g, dtype=int)
        h[cells] = rng.integers(1, dom.H + 1, size=k)
        h = h.reshape(dom.g, dom.g)
        return {"grid": dom.g, "max_height": dom.H, "top": (h > 0).astype(int).tolist()}, "/".join(
            "".join(map(str, row)) for row in h
        )
    b = p.domains.boolean
    t = int(rng.integers(dom.space_size))
    r = int(rng.integers(b.min_rows, b.max_rows + 1))
    rows = rng.choice(2 ** len(dom.variables), size=r, replace=False)
    return dom.make_obs(t, rows), dom.keys[t]


def build_domain(p: Params, domain: str, user: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(observation sets, admissible sets) of one domain over every seed and configuration."""
    obs_rows, adm = [], []
    for seed in p.seeds:
        if user is not None:
            items = [(r.config, r.domain_config, json.loads(r.obs), r.obs_id) for r in user.itertuples()]
        else:
            items = []
            for label, cfg, settings in configurations(p, domain):
                dom = domain_for(domain, cfg)
                rng = np.random.default_rng([seed, zlib.crc32(domain.encode()), zlib.crc32(label.encode())])
                for i in range(_sets(p, domain)):
                    obs, truth = _draw(domain, dom, rng, settings, p)
                    items.append((label, cfg, obs, f"{domain}/{label}/s{seed}/{i}", truth))
        for it in items:
            label, cfg, obs, oid = it[:4]
            truth = it[4] if len(it) > 4 else ""
            try:
                dom = domain_for(domain, cfg) if user is None else domain_for(domain, json.dumps(json.loads(cfg)))
                keys, cx, st = admissible_of(domain, dom, obs)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise InputDataError(
                    f"dataset 'hypospace.{domain}_obs': observation set {oid}: columns "
                    f"'domain_config' / 'obs' do not describe a {domain} instance ({exc!r}; "
                    "see src/pipelines/hypospace/README.md)"
                ) from None
            if not keys:
                raise InputDataError(
                    f"dataset 'hypospace.{domain}_obs': observation set {oid} admits no "
                    "hypothesis (inconsistent observations)"
                )
            oid = oid if user is None else f"{oid}/s{seed}"
            obs_rows.append(
                {
                    "domain": domain,
                    "config": label,
                    "domain_config": cfg,
                    "seed": int(seed),
                    "obs_id": oid,
                    "obs": json.dumps(obs),
                    "n_admissible": len(keys),
                    "space_size": int(dom.space_size),
                    "truth": truth,
                }
            )
            adm.append(
                pd.DataFrame(
                    {
                        "obs_id": oid,
                        "seed": int(seed),
                        "key": keys,
                        "complexity": cx,
                        "stratum": np.asarray(st, dtype=np.int64),
                    }
                )
            )
    return pd.DataFrame(obs_rows, columns=OBS_COLUMNS), pd.concat(adm, ignore_index=True)


USER_SCHEMA = TableSchema(
    "hypospace.user_observations",
    {"domain": "str", "config": "str", "domain_config": "json", "obs_id": "str", "obs": "json"},
    no_missing=("domain", "config", "domain_config", "obs_id", "obs"),
)


def read_user_observations(path: str | Path, domain: str) -> pd.DataFrame:
    """User observation sets (full env): a CSV with columns domain, config (a label), domain_config (JSON
    of the domain's settings, e.g. {"n": 5}), obs_id and obs (JSON, the format of the generated sets;
    see README), checked (:data:`USER_SCHEMA`, every row) before anything runs; rows of other domains are then
    ignored."""
    ds = f"{USER_SCHEMA.dataset} ({path})"
    df = read_user_file(
        path, key="hypospace.user_observations", schema=USER_SCHEMA.refine(dataset=ds), kind="csv", dtype=str
    )
    return df[df["domain"] == domain]


ADMISSIBLE_COLUMNS = ["obs_id", "seed", "key", "complexity", "stratum"]


def make_domain_data(p: Params, domain: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(observation sets, admissible sets) of one domain; empty tables when the domain is not enabled (the
    pipeline has a data node per domain, whatever this run enables)."""
    if domain not in p.domains.enabled:
        return pd.DataFrame(columns=OBS_COLUMNS), pd.DataFrame(columns=ADMISSIBLE_COLUMNS)
    user = read_user_observations(p.user_observations, domain) if p.user_observations else None
    if user is not None and user.empty:
        user = None
    return build_domain(p, domain, user)


def domain_data(domain: str):
    """The ``data.<domain>`` node function: ``make_domain_data`` with its domain fixed (type hints kept,
    so Kedro still validates ``params:hypospace`` into ``Params``)."""

    def make(p: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
        return make_domain_data(p, domain)

    make.__name__ = make.__qualname__ = f"make_domain_data[{domain}]"
    return make
